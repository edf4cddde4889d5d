-- Model configurations: products, grids, random search, dedup, append, errors.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
\set keras2_mlp `cat tests/fixtures/keras2/mlp_batch_input_shape.json`
SELECT load_keras_model('arch', :'keras2_mlp', NULL, 'a');
SELECT load_keras_model('arch', :'keras2_mlp', NULL, 'b');
SELECT load_model_selection_table('arch', 'mst', ARRAY[1, 2],
    ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01, amsgrad=False)', metrics=['accuracy']$$,
          $$optimizer='adam(learning_rate=0.01,amsgrad=False)',loss='categorical_crossentropy',metrics=['accuracy']$$,
          $$loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.1, momentum=0.9, nesterov=True, name="my sgd")', metrics=['accuracy', 'top_k_categorical_accuracy']$$],
    ARRAY['batch_size=64, epochs=1', 'epochs=1, batch_size=64', 'batch_size=128']);
SELECT * FROM mst ORDER BY mst_key;
SELECT * FROM mst_summary;

SELECT generate_model_configs('arch', 'mst_grid', ARRAY[1],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [
        {'optimizer': ['SGD'], 'lr': [0.01, 0.1], 'momentum': [0.9, 0.99]},
        {'optimizer': ['Adam'], 'lr': [0.001]}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [32, 64], 'epochs': [1]}$$);
SELECT mst_key, model_id, compile_params, fit_params FROM mst_grid ORDER BY mst_key;
-- the same grid again adds nothing; a random search appends
SELECT generate_model_configs('arch', 'mst_grid', ARRAY[1],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [
        {'optimizer': ['SGD'], 'lr': [0.01, 0.1], 'momentum': [0.9, 0.99]},
        {'optimizer': ['Adam'], 'lr': [0.001]}], 'metrics': ['accuracy']}$$,
    $${'batch_size': [32, 64], 'epochs': [1]}$$);
SELECT generate_model_configs('arch', 'mst_grid', ARRAY[1, 2],
    $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [
        {'optimizer': ['SGD'], 'lr': [0.0001, 0.1, 'log'], 'momentum': [0.9, 0.995, 'log_near_one']}],
      'metrics': ['accuracy']}$$,
    $${'batch_size': [16, 128]}$$, 'rand', 3, 7);
SELECT count(*) AS configs FROM mst_grid;

-- errors
SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY['']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[9], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY['']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer='Adamax(lr=0.1, decay=-0.01)'$$], ARRAY['']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer=__import__('os').system('id')$$], ARRAY['']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse' optimizer='SGD'$$], ARRAY['']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY['batch_size=0']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY['validation_split=0.2']);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY[NULL]);
SELECT load_model_selection_table('arch', 'mst2', ARRAY[1], ARRAY[$$loss='mse', optimizer='SGD'$$], ARRAY[''], 'objs');
SELECT generate_model_configs('arch', 'mst2', ARRAY[1], $${'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.001, 0.1, 'log']}]}$$, $${'batch_size': [8]}$$);
SELECT generate_model_configs('arch', 'mst2', ARRAY[1], $${'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD']}]}$$, $${'batch_size': [8]}$$, 'random');
SELECT generate_model_configs('arch', 'mst2', ARRAY[1], $${'loss': ['mse']$$, $${'batch_size': [8]}$$);
SELECT generate_model_configs('arch', 'mst2', ARRAY[1], $${'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD']}]}$$, $${'batch_size': [8]}$$, 'bayes');
SELECT count(*) AS leftover_tables FROM pg_class WHERE relname LIKE 'mst2%';
