from cerebro_db.entrypoints.jobs import schedule_model_selection
return schedule_model_selection(
    plpy, "@extschema@",
    job_name=job_name, schedule=schedule, source_table=source_table, packed_table=packed_table,
    dependent_varname=dependent_varname, independent_varname=independent_varname,
    model_output_table=model_output_table, model_selection_table=model_selection_table,
    method=method, fit_options=fit_options, preprocess_options=preprocess_options,
    key_column=key_column, warm_start=warm_start, retries=retries, retry_delay=retry_delay)
