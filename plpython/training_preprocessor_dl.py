from cerebro_db.entrypoints.preprocessing import training_preprocessor_dl
return training_preprocessor_dl(
    plpy, "@extschema@",
    source_table=source_table, output_table=output_table,
    dependent_varname=dependent_varname, independent_varname=independent_varname,
    buffer_size=buffer_size, normalizing_const=normalizing_const, num_classes=num_classes,
    distribution_rules=distribution_rules, num_partitions=num_partitions,
    random_state=random_state, regression_targets=regression_targets)
