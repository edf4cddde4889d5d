from cerebro_db.entrypoints.compat import load_custom_function
return load_custom_function(plpy, "@extschema@", object_table=object_table,
                            reference=reference, name=name, description=description)
