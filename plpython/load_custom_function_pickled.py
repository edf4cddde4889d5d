from cerebro_db.entrypoints.compat import load_custom_function_pickled
return load_custom_function_pickled(plpy, "@extschema@", object_table=object_table,
                                    object=object, name=name, description=description)
