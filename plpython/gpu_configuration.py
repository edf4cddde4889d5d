from cerebro_db.entrypoints.compat import gpu_configuration
return gpu_configuration(plpy, "@extschema@", output_table=output_table, source=source)
