from cerebro_db.entrypoints.jobs import unschedule_model_selection
return unschedule_model_selection(plpy, "@extschema@", job_name=job_name)
