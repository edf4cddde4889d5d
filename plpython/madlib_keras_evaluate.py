from cerebro_db.entrypoints.inference import madlib_keras_evaluate
return madlib_keras_evaluate(
    plpy, "@extschema@", model_table=model_table, test_table=test_table,
    output_table=output_table, use_gpus=use_gpus, mst_key=mst_key)
