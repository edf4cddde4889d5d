from cerebro_db.entrypoints.inference import madlib_keras_predict
return madlib_keras_predict(
    plpy, "@extschema@", model_table=model_table, test_table=test_table, id_col=id_col,
    independent_varname=independent_varname, output_table=output_table, pred_type=pred_type,
    use_gpus=use_gpus, mst_key=mst_key)
