-- Architectures: both JSON dialects, weights checks, delete.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
\set keras2_mlp `cat tests/fixtures/keras2/mlp_batch_input_shape.json`
\set keras2_cnn `cat tests/fixtures/keras2/cnn_mnist.json`
SELECT load_keras_model('model_arch', :'keras2_mlp', NULL, 'mlp', 'tf.keras 2 MLP');
SELECT load_keras_model('model_arch', :'keras2_cnn', NULL, 'cnn');
SELECT model_id, name, description, model_weights IS NULL AS no_weights,
       __internal_madlib_id__ LIKE '__cerebro_db_%' AS has_internal_id
  FROM model_arch ORDER BY model_id;
-- weights: 4 bytes per parameter
SELECT load_keras_model('model_arch', :'keras2_mlp', decode(repeat('00', 4 * 7), 'hex'));
SELECT load_keras_model('model_arch', '{"class_name": "Dense", "config": {"units": 3}}');
SELECT load_keras_model('model_arch', 'not json');
SELECT load_keras_model('model_arch', NULL);
SELECT load_keras_model('"bad name', :'keras2_mlp');
SELECT delete_keras_model('model_arch', 42);
SELECT delete_keras_model('model_arch', 1);
SELECT delete_keras_model('model_arch', 2);
SELECT to_regclass('model_arch') IS NULL AS dropped_when_empty;
SELECT delete_keras_model('model_arch', 1);
