from cerebro_db.entrypoints.units import check_fit
return check_fit(plpy, "@extschema@", spec=spec)
