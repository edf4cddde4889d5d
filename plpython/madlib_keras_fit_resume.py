from cerebro_db.entrypoints.training import madlib_keras_fit_resume
return madlib_keras_fit_resume(plpy, "@extschema@", fit_id=fit_id)
