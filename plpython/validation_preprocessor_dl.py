from cerebro_db.entrypoints.preprocessing import validation_preprocessor_dl
return validation_preprocessor_dl(
    plpy, "@extschema@",
    source_table=source_table, output_table=output_table,
    dependent_varname=dependent_varname, independent_varname=independent_varname,
    training_preprocessor_table=training_preprocessor_table, buffer_size=buffer_size,
    distribution_rules=distribution_rules, num_partitions=num_partitions)
