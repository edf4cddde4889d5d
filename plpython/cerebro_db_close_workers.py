from cerebro_db.entrypoints.training import cerebro_db_close_workers
return cerebro_db_close_workers(plpy, "@extschema@")
