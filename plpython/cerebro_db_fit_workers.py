from cerebro_db.entrypoints.training import cerebro_db_fit_workers
return cerebro_db_fit_workers(plpy, "@extschema@", fit_id=fit_id, num_workers=num_workers)
