from cerebro_db.entrypoints.selection import generate_model_configs
return generate_model_configs(
    plpy, "@extschema@",
    model_arch_table=model_arch_table, model_selection_table=model_selection_table,
    model_id_list=model_id_list, compile_params_grid=compile_params_grid,
    fit_params_grid=fit_params_grid, search_type=search_type, num_configs=num_configs,
    random_state=random_state, object_table=object_table)
