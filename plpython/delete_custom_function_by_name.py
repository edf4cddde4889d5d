from cerebro_db.entrypoints.compat import delete_custom_function
return delete_custom_function(plpy, "@extschema@", object_table=object_table, name=name)
