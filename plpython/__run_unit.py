from cerebro_db.entrypoints.units import run_unit
return run_unit(plpy, "@extschema@", fit_id=fit_id, mst_key=mst_key, epoch=epoch,
                partition=part, worker=worker, kind=kind, options=options)
