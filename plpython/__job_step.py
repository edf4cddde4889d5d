from cerebro_db.entrypoints.jobs import job_step
return job_step(plpy, "@extschema@", job_name=job_name, run_id=run_id, step=step)
