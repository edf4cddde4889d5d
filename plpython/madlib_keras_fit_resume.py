from cerebro_db.entrypoints.resume import madlib_keras_fit_resume
return madlib_keras_fit_resume(plpy, "@extschema@", fit_id=fit_id)
