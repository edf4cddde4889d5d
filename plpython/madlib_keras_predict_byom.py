from cerebro_db.entrypoints.inference import madlib_keras_predict_byom
return madlib_keras_predict_byom(
    plpy, "@extschema@", model_arch_table=model_arch_table, model_id=model_id,
    test_table=test_table, id_col=id_col, independent_varname=independent_varname,
    output_table=output_table, pred_type=pred_type, use_gpus=use_gpus,
    class_values=class_values, normalizing_const=normalizing_const,
    dependent_count=dependent_count)
