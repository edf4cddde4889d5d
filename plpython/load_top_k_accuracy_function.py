from cerebro_db.entrypoints.compat import load_top_k_accuracy_function
return load_top_k_accuracy_function(plpy, "@extschema@", object_table=object_table, k=k)
