from cerebro_db.entrypoints.models import delete_keras_model
return delete_keras_model(
    plpy, "@extschema@", keras_model_arch_table=keras_model_arch_table, model_id=model_id)
