from cerebro_db.entrypoints.units import run_slot
return run_slot(plpy, "@extschema@", tag=tag, fit_id=fit_id, worker=worker, seq=seq,
                last=last, wake=wake)
