from cerebro_db.entrypoints.automl import madlib_keras_automl
return madlib_keras_automl(
    plpy, "@extschema@",
    source_table=source_table, model_output_table=model_output_table,
    model_arch_table=model_arch_table, model_selection_table=model_selection_table,
    model_id_list=model_id_list, compile_params_grid=compile_params_grid,
    fit_params_grid=fit_params_grid, automl_method=automl_method, automl_params=automl_params,
    random_state=random_state, object_table=object_table, use_gpus=use_gpus,
    validation_table=validation_table, metrics_compute_frequency=metrics_compute_frequency,
    name=name, description=description, use_caching=use_caching)
