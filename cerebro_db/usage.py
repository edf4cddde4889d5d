"""Short usage texts returned by ``fn('help')`` / ``fn()``."""
from __future__ import annotations

USAGE: dict[str, str] = {
    "training_preprocessor_dl": """\
training_preprocessor_dl: pack rows into training buffers

SELECT training_preprocessor_dl(
    source_table,          -- table of examples
    output_table,          -- packed table to create (and <output_table>_summary)
    dependent_varname,     -- label column(s), comma separated: scalar classes (text,
                           --   boolean, integer, real, double, numeric; one-hot encoded,
                           --   NULL is a class) or a numeric array already one-hot
    independent_varname,   -- feature column(s): numeric arrays, comma separated
    buffer_size,           -- rows per buffer (NULL: MADlib's rule)
    normalizing_const,     -- features are divided by it (default 1.0)
    num_classes,           -- INTEGER[], pads the one-hot width per label (NULL: distinct count)
    distribution_rules,    -- 'all_segments' (default)
    num_partitions,        -- parallel partitions for training (NULL: setting
                           --   cerebro_db.num_partitions, else the server's core count)
    random_state,          -- seed of the shuffle (NULL: random, recorded in the summary)
    regression_targets     -- dependent columns (comma separated) kept as float32 regression
                           --   targets, scalar or array, instead of one-hot (NULL: none)
);
Buffers as MADlib: shuffled row i goes to buffer i / buffer_size, buffer b to partition
b % num_partitions (a partition may stay empty).
Output columns: __dist_key__, <x> BYTEA (float32), <y> BYTEA (int16 one-hot or float32),
<x>_shape, <y>_shape INTEGER[], buffer_id.""",
    "validation_preprocessor_dl": """\
validation_preprocessor_dl: pack validation rows like a training table

SELECT validation_preprocessor_dl(
    source_table, output_table, dependent_varname, independent_varname,
    training_preprocessor_table,  -- output of training_preprocessor_dl: class values,
                                  --   normalizing constant and partitions come from it
    buffer_size,                  -- rows per buffer (NULL: MADlib's rule)
    distribution_rules,           -- 'all_segments' (default)
    num_partitions                -- NULL: as the training table (a fit validates only
                                  --   with that; another count is for appending the
                                  --   rows to the training table, as scheduled jobs do)
);""",
    "load_keras_model": """\
load_keras_model: add a Keras architecture to an architecture table

SELECT load_keras_model(
    keras_model_arch_table,  -- created on first use
    model_arch,              -- JSON from model.to_json() (Keras 3 or tf.keras 2.x)
    model_weights,           -- optional BYTEA: flat float32 of model.get_weights()
    name, description        -- optional
);
Table columns: model_id SERIAL, model_arch JSON, model_weights BYTEA, name, description,
__internal_madlib_id__.""",
    "delete_keras_model": """\
delete_keras_model: remove an architecture

SELECT delete_keras_model(keras_model_arch_table, model_id);
The table is dropped once it is empty.""",
    "load_model_selection_table": """\
load_model_selection_table: model ids x compile params x fit params

SELECT load_model_selection_table(
    model_arch_table, model_selection_table,
    model_id_list,        -- INTEGER[]
    compile_params_list,  -- VARCHAR[], e.g. $$optimizer='Adam(learning_rate=0.001)',
                          --   loss='categorical_crossentropy', metrics=['accuracy']$$
    fit_params_list,      -- VARCHAR[], e.g. 'batch_size=64, epochs=1'
    object_table          -- custom functions by name (load_custom_function); NULL: none
);
Table: mst_key SERIAL, model_id, compile_params, fit_params; plus <table>_summary.""",
    "generate_model_configs": """\
generate_model_configs: grid or random search over parameter grids

SELECT generate_model_configs(
    model_arch_table, model_selection_table, model_id_list,
    compile_params_grid,  -- e.g. $${'loss': ['categorical_crossentropy'],
                          --   'optimizer_params_list': [{'optimizer': ['Adam'],
                          --   'lr': [0.0001, 0.01, 'log']}], 'metrics': ['accuracy']}$$
    fit_params_grid,      -- e.g. $${'batch_size': [32, 64], 'epochs': [1]}$$
    search_type,          -- 'grid' (default) or 'random'
    num_configs,          -- random search only
    random_state,         -- random search only
    object_table          -- custom functions by name (load_custom_function); NULL: none
);
[low, high, 'linear'|'log'|'log_near_one'] is a distribution (random search); any other
list is a set of choices. Appends to an existing table of the same architecture table.""",
    "madlib_keras_fit_multiple_model": """\
madlib_keras_fit_multiple_model: train many configurations by model hopper parallelism

SELECT madlib_keras_fit_multiple_model(
    source_table,               -- packed by training_preprocessor_dl
    model_output_table,         -- creates it, <name>_summary and <name>_info
    model_selection_table,      -- from load_model_selection_table / generate_model_configs
    num_iterations,             -- passes of every configuration over all partitions
    use_gpus,                   -- FALSE (no GPU on this server)
    validation_table,           -- packed by validation_preprocessor_dl (optional)
    metrics_compute_frequency,  -- metrics every N iterations (NULL: at the end)
    warm_start,                 -- continue from <model_output_table>'s weights
    name, description,
    use_caching,                -- NULL (default): keep decoded partitions in worker memory
                                --   within SET cerebro_db.cache_memory (default: half the
                                --   machine's memory / workers), stream the rest; TRUE: keep
                                --   all; FALSE: keep nothing (read buffer by buffer)
    scheduling_policy,          -- 'mop' (default, randomized, no barriers) or 'ring'
    policy_params,              -- e.g. 'reset_optimizer_per_hop=True' for 'ring'
    random_state                -- seed of initial weights, shuffles and the schedule
);
One worker session per partition trains one unit (a configuration's pass over its
partition) at a time; model states hop between them. Progress: SELECT * FROM
cerebro_db.fit_progress;
Faults: a unit whose worker session dies is retried on a fresh session (at most
cerebro_db.max_unit_retries times, default 3; failed attempts in cerebro_db.unit_failures);
a unit that stalls (no answer after max(cerebro_db.unit_timeout_floor, default 60 s,
10 x the median of its configuration's unit times)) is ended and retried; SET
cerebro_db.unit_timeout = <seconds> for a fixed limit, 0 for none. A fit whose own session
died is 'interrupted'; one stopped by a cancel (pg_cancel_backend, statement_timeout,
cerebro_db_cancel_fit(fit_id)) is 'cancelled': continue either with
madlib_keras_fit_resume(fit_id). The fit is marked done in the calling transaction.
Replicas: SET cerebro_db.replicas = r: worker w holds partitions w .. w+r-1 mod p and,
with nothing left on its own partition, takes units of the others it holds; a worker that
cannot reconnect leaves and the others serve its partitions. Default 'auto': r = p when
all partitions (training and validation, decoded) fit one worker's cerebro_db.cache_memory
budget, else 1 (always 1 for 'ring'). Change a
running fit's worker count from another session with cerebro_db_fit_workers(fit_id, n);
workers are listed in cerebro_db.fit_workers.""",
    "madlib_keras_fit": """\
madlib_keras_fit: train one configuration

SELECT madlib_keras_fit(
    source_table, model, model_arch_table, model_id, compile_params, fit_params,
    num_iterations, use_gpus, validation_table, metrics_compute_frequency, warm_start,
    name, description, object_table (custom functions), random_state);
Sequential SGD over the partitions (one worker session holds them all). Writes <model>
(model_weights, model_arch) and <model>_summary (with the metrics).""",
    "madlib_keras_fit_resume": """\
madlib_keras_fit_resume: continue an interrupted, cancelled or failed fit

SELECT madlib_keras_fit_resume(fit_id);
fit_id: from SELECT fit_id, status, message FROM cerebro_db.fits. The units the fit
committed are kept and every configuration continues from its last committed state; the
outputs are written as the original call would have. With a fixed random_state the result
equals an uninterrupted run. A fit whose coordinator session is still alive cannot be
resumed.""",
    "cerebro_db_fit_workers": """\
cerebro_db_fit_workers: change the number of worker sessions of a running fit

SELECT cerebro_db_fit_workers(fit_id, num_workers);
From another session while the fit runs (its owner, or a superuser). Between units the
coordinator opens new worker sessions (worker w < p holds partitions w .. w+r-1 mod p, r =
cerebro_db.replicas; later ones hold every partition) or retires the highest-numbered
workers once their unit in flight ends. The change applies from the next unit on; units
never fail for it. See SELECT * FROM cerebro_db.fit_workers WHERE fit_id = ...""",
    "madlib_keras_evaluate": """\
madlib_keras_evaluate: loss and metrics of a trained model

SELECT madlib_keras_evaluate(model_table, test_table, output_table, use_gpus, mst_key);
test_table is packed by validation_preprocessor_dl; mst_key picks a model of a
fit_multiple output. Output: loss, metric, metrics_type, loss_type, metrics.""",
    "madlib_keras_predict": """\
madlib_keras_predict: predict raw rows, in batches

SELECT madlib_keras_predict(model_table, test_table, id_col, independent_varname,
    output_table, pred_type, use_gpus, mst_key);
pred_type: 'response' (top class), 'prob' (every class, default), a number in (0, 1)
(classes at least that probable) or an integer k (top k). Output, long format:
<id_col>, class_name, class_value, prob, rank (no rank for 'response').""",
    "madlib_keras_predict_byom": """\
madlib_keras_predict_byom: predict with your own model from an architecture table

SELECT madlib_keras_predict_byom(model_arch_table, model_id, test_table, id_col,
    independent_varname, output_table, pred_type, use_gpus, class_values,
    normalizing_const, dependent_count);
class_values: ARRAY['a','b'] or ARRAY[ARRAY['a','b']] (MADlib 1.x and 2.x forms).""",
    "madlib_keras_automl": """\
madlib_keras_automl: AutoML over a search space, on model hopper parallelism

SELECT madlib_keras_automl(
    source_table,               -- packed by training_preprocessor_dl
    model_output_table,         -- creates it, <name>_summary and <name>_info
    model_arch_table,           -- from load_keras_model
    model_selection_table,      -- created: left holding the best configuration
    model_id_list,              -- INTEGER[] of architectures to search over
    compile_params_grid,        -- as generate_model_configs; [low, high, 'log'] ranges allowed
    fit_params_grid,
    automl_method,              -- 'hyperband' (default), 'hyperopt', 'asha', 'mltuner',
                                --   'grid', 'random'
    automl_params,              -- hyperband 'R=6, eta=3, skip_last=0';
                                -- hyperopt 'num_configs=20, num_iterations=5, algorithm=tpe';
                                -- asha 'min_r=1, max_r=9, eta=3, brackets=1, max_configs=27,
                                --   time_budget=0'; see the README for mltuner, grid, random
    random_state,               -- makes the run reproducible
    object_table,               -- custom functions by name (load_custom_function)
    use_gpus, validation_table, metrics_compute_frequency, name, description, use_caching
);
Configurations are ranked by validation loss when validation_table is given, else by
training loss. Decisions as they happen: SELECT * FROM cerebro_db.automl_decisions;
trials: cerebro_db.automl_trials.""",
    "gpu_configuration": """\
gpu_configuration: the GPUs the database server sees

SELECT gpu_configuration(
    output_table,  -- created: hostname ('localhost'), gpu_descr (one row per GPU)
    source         -- 'tensorflow' (default, NULL) or 'nvidia' (nvidia-smi -L)
);""",
    "load_custom_function": """\
load_custom_function: register a custom loss or metric function by reference

SELECT load_custom_function(
    object_table,  -- created on first use; unqualified: in the extension's schema (MADlib)
    reference,     -- 'module.path:function' or 'module.path:function(key=literal, ...)',
                   --   a Python object in a module installed in the server's environment
    name,          -- the name compile_params use: loss='name', metrics=['name']
    description
);
The module (or a parent package) must be allowed by a superuser:
INSERT INTO <extension schema>.custom_function_modules (module, grantee) VALUES ('mypkg', 'public');
Pickled objects (MADlib's BYTEA form) are refused: user bytes are never unpickled.
Pass object_table to load_model_selection_table / generate_model_configs / madlib_keras_fit /
madlib_keras_automl; evaluate and predict read it from the model's summary.""",
    "load_top_k_accuracy_function": """\
load_top_k_accuracy_function: add the metric top_<k>_accuracy to an object table

SELECT load_top_k_accuracy_function(object_table, k);
Then compile_params: metrics=['top_3_accuracy'] with object_table passed to the fit.""",
    "delete_custom_function": """\
delete_custom_function: remove a custom function from an object table

SELECT delete_custom_function(object_table, id);
SELECT delete_custom_function(object_table, name);
The table is dropped once it is empty.""",
    "hyperband_schedule": """\
hyperband_schedule: the brackets Hyperband runs for R, eta and skip_last

SELECT hyperband_schedule(schedule_table, r, eta DEFAULT 3, skip_last DEFAULT 0);
Output: s (bracket), i (round), n_i (configurations), r_i (iterations each).""",
    "schedule_model_selection": """\
schedule_model_selection: a model selection job, run now and then (pg_cron) or by hand

SELECT schedule_model_selection(
    job_name,              -- unique name of the job
    schedule,              -- pg_cron schedule ('0 3 * * *'); NULL: run it yourself with
                           --   CALL run_model_selection_job(job_name)
    source_table,          -- rows to train on (packed again by every run)
    packed_table,          -- the job's packed table (created and owned by the job)
    dependent_varname, independent_varname,
    model_output_table,    -- published (with _summary, _info) under this stable name
    model_selection_table, -- method 'fit': the configurations; 'automl': the output
    method,                -- 'fit' (madlib_keras_fit_multiple_model) or 'automl'
    fit_options,           -- JSONB of the training function's other named arguments,
                           --   e.g. '{"num_iterations": 5, "validation_table": "v"}'
    preprocess_options,    -- JSONB of training_preprocessor_dl's named arguments
    key_column,            -- a growing key: later runs pack only rows above the last key
    warm_start,            -- start from the previous run's weights (method 'fit')
    retries,               -- failed attempts retried this many times (default 0)
    retry_delay            -- wait between attempts (default '1 minute')
);
Returns the job id. Jobs: model_selection_jobs; runs: job_runs.""",
    "unschedule_model_selection": """\
unschedule_model_selection: remove a job and its pg_cron entry

SELECT unschedule_model_selection(job_name);
Its outputs, packed table and job_runs history stay.""",
}
