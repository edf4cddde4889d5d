-- cerebro_db demo: Fashion-MNIST from the database to packed buffers, architectures and
-- model configurations, all through SQL. Run by `make demo` (tables fashion_train and
-- fashion_test are loaded by demo/load_data.py first).
\set ON_ERROR_STOP on
\pset footer off
SET client_min_messages = notice;

\echo '== 1. the raw tables (one image per row: id, y = class 0..9, x = 784 pixels)'
SELECT 'fashion_train' AS table, count(*) AS rows FROM fashion_train
UNION ALL SELECT 'fashion_test', count(*) FROM fashion_test;

-- a re-run starts from a clean slate
DROP TABLE IF EXISTS fashion_train_packed, fashion_train_packed_summary,
    fashion_test_packed, fashion_test_packed_summary, fashion_arch, fashion_mst,
    fashion_mst_summary;

\echo '== 2. pack rows into buffers over 2 partitions (pixels / 255, seeded shuffle)'
\timing on
SELECT training_preprocessor_dl('fashion_train', 'fashion_train_packed', 'y', 'x',
                                NULL, 255.0, NULL, NULL, 2, 42);
SELECT validation_preprocessor_dl('fashion_test', 'fashion_test_packed', 'y', 'x',
                                  'fashion_train_packed');
\timing off
SELECT __dist_key__, buffer_id, x_shape, y_shape,
       pg_size_pretty(length(x)::bigint) AS x_bytes
  FROM fashion_train_packed ORDER BY buffer_id;
SELECT y_class_values, num_classes, buffer_size, normalizing_const, num_partitions
  FROM fashion_train_packed_summary;

\echo '== 3. two architectures: an MLP and a small CNN (Keras JSON)'
\set mlp `"$CEREBRO_PY" demo/archs.py mlp 2>/dev/null`
\set cnn `"$CEREBRO_PY" demo/archs.py cnn 2>/dev/null`
SELECT load_keras_model('fashion_arch', :'mlp', NULL, 'mlp', '784-128-64-10 MLP');
SELECT load_keras_model('fashion_arch', :'cnn', NULL, 'cnn', '2 conv + dense');
SELECT model_id, name, description FROM fashion_arch ORDER BY model_id;

\echo '== 4. a grid of configurations: 2 models x 2 learning rates x 2 batch sizes'
SELECT generate_model_configs(
    'fashion_arch', 'fashion_mst', ARRAY[1, 2],
    $${'loss': ['categorical_crossentropy'],
       'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.003]}],
       'metrics': ['accuracy']}$$,
    $${'batch_size': [64, 128], 'epochs': [1]}$$);
SELECT * FROM fashion_mst ORDER BY mst_key;

\echo '== 5. train all 8 configurations by model hopper parallelism (2 worker sessions,'
\echo '      2 iterations, validation metrics every iteration)'
DROP TABLE IF EXISTS fashion_models, fashion_models_info, fashion_models_summary,
    fashion_predictions;
\timing on
SELECT madlib_keras_fit_multiple_model(
    'fashion_train_packed', 'fashion_models', 'fashion_mst', 2,
    use_gpus => FALSE, validation_table => 'fashion_test_packed',
    metrics_compute_frequency => 1, use_caching => TRUE, random_state => 42);
\timing off

\echo '== 6. the configurations ranked by validation accuracy'
SELECT i.mst_key, a.name AS model, m.compile_params, m.fit_params,
       round(i.training_loss_final::numeric, 4) AS train_loss,
       round(i.validation_loss_final::numeric, 4) AS valid_loss,
       round(i.validation_metrics_final::numeric, 4) AS valid_accuracy
  FROM fashion_models_info i
  JOIN fashion_mst m USING (mst_key)
  JOIN fashion_arch a ON a.model_id = m.model_id
 ORDER BY i.validation_metrics_final DESC;

\echo '== 7. predict a handful of test images with the best model'
SELECT mst_key AS best FROM fashion_models_info
 ORDER BY validation_metrics_final DESC LIMIT 1 \gset
CREATE TEMP TABLE few AS SELECT * FROM fashion_test WHERE id < 8;
SELECT madlib_keras_predict('fashion_models', 'few', 'id', 'x', 'fashion_predictions',
                            'response', FALSE, :best);
SELECT p.id, (ARRAY['T-shirt/top','Trouser','Pullover','Dress','Coat','Sandal','Shirt',
                    'Sneaker','Bag','Ankle boot'])[p.class_value::int + 1] AS predicted,
       (ARRAY['T-shirt/top','Trouser','Pullover','Dress','Coat','Sandal','Shirt',
              'Sneaker','Bag','Ankle boot'])[t.y + 1] AS actual,
       round(p.prob::numeric, 3) AS probability
  FROM fashion_predictions p JOIN few t USING (id) ORDER BY p.id;

\echo '== the fit as the catalog recorded it'
SELECT fit_id, status, policy, units_done, total_units, elapsed FROM fit_progress
 ORDER BY fit_id DESC LIMIT 1;
