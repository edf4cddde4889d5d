-- AutoML on the demo's Fashion-MNIST tables (run `make demo` first), one example per
-- procedure:  scripts/cerebro.sh psql -f demo/automl.sql
-- Each run writes <out>, <out>_summary, <out>_info and <out>_mst (the best configuration);
-- decisions appear in cerebro_db.automl_decisions while the run goes on.
\set ON_ERROR_STOP 1
\set cgrid '{''loss'': [''categorical_crossentropy''], ''optimizer_params_list'': [{''optimizer'': [''Adam''], ''lr'': [0.0001, 0.01, ''log'']}], ''metrics'': [''accuracy'']}'
\set fgrid '{''batch_size'': [64, 256]}'
SET client_min_messages = warning;
DROP TABLE IF EXISTS hb_out, hb_out_info, hb_out_summary, hb_out_mst, hb_out_mst_summary,
    ho_out, ho_out_info, ho_out_summary, ho_out_mst, ho_out_mst_summary,
    asha_out, asha_out_info, asha_out_summary, asha_out_mst, asha_out_mst_summary,
    mlt_out, mlt_out_info, mlt_out_summary, mlt_out_mst, mlt_out_mst_summary,
    rs_out, rs_out_info, rs_out_summary, rs_out_mst, rs_out_mst_summary, hb_schedule;
SET client_min_messages = notice;

-- Hyperband: the brackets first, then the run (R = 3 iterations at most, eta = 3)
SELECT hyperband_schedule('hb_schedule', 3, 3);
SELECT * FROM hb_schedule ORDER BY s DESC, i;
SELECT madlib_keras_automl('fashion_train_packed', 'hb_out', 'fashion_arch', 'hb_out_mst',
    ARRAY[1], :'cgrid', :'fgrid', 'hyperband', 'R=3, eta=3', 42,
    validation_table => 'fashion_test_packed');
SELECT mst_key, s, i, metrics_iters, round(validation_metrics_final::numeric, 4) AS acc
  FROM hb_out_info ORDER BY validation_loss_final;

-- Hyperopt (TPE through the hyperopt package), batches of one configuration per worker
SELECT madlib_keras_automl('fashion_train_packed', 'ho_out', 'fashion_arch', 'ho_out_mst',
    ARRAY[1], :'cgrid', :'fgrid', 'hyperopt', 'num_configs=4, num_iterations=1, algorithm=tpe',
    42, validation_table => 'fashion_test_packed');
SELECT mst_key, compile_params, round(validation_metrics_final::numeric, 4) AS acc
  FROM ho_out_info ORDER BY validation_loss_final;

-- ASHA: promote the top 1/eta of a rung as soon as possible, no rung barrier
SELECT madlib_keras_automl('fashion_train_packed', 'asha_out', 'fashion_arch', 'asha_out_mst',
    ARRAY[1], :'cgrid', :'fgrid', 'asha', 'min_r=1, max_r=3, eta=3, max_configs=6', 42,
    validation_table => 'fashion_test_packed');
SELECT mst_key, rung, metrics_iters, round(validation_metrics_final::numeric, 4) AS acc
  FROM asha_out_info ORDER BY rung DESC, validation_loss_final;

-- MLtuner: tune the learning rate of one configuration by forking branches of its state
SELECT madlib_keras_automl('fashion_train_packed', 'mlt_out', 'fashion_arch', 'mlt_out_mst',
    ARRAY[1], $${'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'],
                 'metrics': ['accuracy']}$$, $${'batch_size': [128]}$$, 'mltuner',
    'num_configs=1, num_iterations=3, num_branches=2, search_steps=1, max_trial_epochs=1',
    42, validation_table => 'fashion_test_packed');
SELECT mst_key, role, learning_rate, metrics_iters, round(validation_metrics_final::numeric, 4)
  AS acc FROM mlt_out_info ORDER BY mst_key;

-- Random search: the one-shot instance of the same template ('grid' enumerates a grid)
SELECT madlib_keras_automl('fashion_train_packed', 'rs_out', 'fashion_arch', 'rs_out_mst',
    ARRAY[1, 2], :'cgrid', :'fgrid', 'random', 'num_configs=4, num_iterations=1', 42,
    validation_table => 'fashion_test_packed');
SELECT * FROM rs_out_mst;
