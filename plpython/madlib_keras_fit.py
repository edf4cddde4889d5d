from cerebro_db.entrypoints.training import madlib_keras_fit
return madlib_keras_fit(
    plpy, "@extschema@",
    source_table=source_table, model=model, model_arch_table=model_arch_table,
    model_id=model_id, compile_params=compile_params, fit_params=fit_params,
    num_iterations=num_iterations, use_gpus=use_gpus, validation_table=validation_table,
    metrics_compute_frequency=metrics_compute_frequency, warm_start=warm_start, name=name,
    description=description, object_table=object_table, random_state=random_state)
