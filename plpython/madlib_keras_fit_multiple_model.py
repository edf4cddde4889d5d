from cerebro_db.entrypoints.training import madlib_keras_fit_multiple_model
return madlib_keras_fit_multiple_model(
    plpy, "@extschema@",
    source_table=source_table, model_output_table=model_output_table,
    model_selection_table=model_selection_table, num_iterations=num_iterations,
    use_gpus=use_gpus, validation_table=validation_table,
    metrics_compute_frequency=metrics_compute_frequency, warm_start=warm_start, name=name,
    description=description, use_caching=use_caching, scheduling_policy=scheduling_policy,
    policy_params=policy_params, random_state=random_state)
