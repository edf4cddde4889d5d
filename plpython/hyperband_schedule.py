from cerebro_db.entrypoints.automl import hyperband_schedule
return hyperband_schedule(plpy, "@extschema@", schedule_table=schedule_table, r=r, eta=eta,
                          skip_last=skip_last)
