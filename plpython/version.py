from cerebro_db.entrypoints.compat import version
return version(plpy, "@extschema@")
