from cerebro_db.entrypoints.selection import load_model_selection_table
return load_model_selection_table(
    plpy, "@extschema@",
    model_arch_table=model_arch_table, model_selection_table=model_selection_table,
    model_id_list=model_id_list, compile_params_list=compile_params_list,
    fit_params_list=fit_params_list, object_table=object_table)
