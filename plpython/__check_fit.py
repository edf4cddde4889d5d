from cerebro_db.entrypoints.worker import check_fit
return check_fit(plpy, "@extschema@", spec=spec)
