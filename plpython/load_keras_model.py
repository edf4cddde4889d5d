from cerebro_db.entrypoints.models import load_keras_model
return load_keras_model(
    plpy, "@extschema@",
    keras_model_arch_table=keras_model_arch_table, model_arch=model_arch,
    model_weights=model_weights, name=name, description=description)
