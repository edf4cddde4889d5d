"""MADlib's smaller behaviours: numeric pred_type overloads,
gpu_configuration, generate_model_configs re-creating a dropped summary, NULL metrics
without metrics, MADlib's AutoML _summary columns and the TensorBoard callback confined to
the DBA's directory."""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ..helpers import error_of, q

pytestmark = pytest.mark.db

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']"
NO_METRICS = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)'"

# Apache MADlib's madlib_keras_automl _summary columns, in its order (madlib_keras_automl.py_in,
# generate_model_output_summary_table), for a dependent variable named class_text
MADLIB_AUTOML_SUMMARY = [
    "source_table", "validation_table", "model", "model_info", "dependent_varname",
    "independent_varname", "model_arch_table", "model_selection_table", "automl_method",
    "automl_params", "random_state", "object_table", "use_gpus", "metrics_compute_frequency",
    "name", "description", "start_training_time", "end_training_time", "madlib_version",
    "num_classes", "class_text_class_values", "dependent_vartype", "normalizing_const"]


def columns(c, table):
    return [r[0] for r in q(c, "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                               "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,))]


@pytest.fixture(scope="module")
def fitted(madlib_conn):
    c = madlib_conn
    q(c, "SELECT madlib.load_model_selection_table('model_arch_library', 'mi_mst', ARRAY[1], "
         "ARRAY[%s, %s], ARRAY['batch_size=8'])", (COMPILE, NO_METRICS))
    q(c, "SELECT madlib.madlib_keras_fit_multiple_model('iris_packed', 'mi_out', 'mi_mst', 1, "
         "FALSE, 'iris_val', NULL, FALSE, NULL, NULL, TRUE, 'mop', NULL, 5)")
    return c


def test_predict_with_numeric_pred_type(fitted):
    c = fitted
    for name, pred_type, as_text in (("top", "3", "'3'"), ("thr", "0.5", "'0.5'")):
        q(c, f"SELECT madlib.madlib_keras_predict('mi_out', 'iris', 'id', 'attributes', "
             f"'pred_{name}', pred_type => {pred_type}, mst_key => 1)")
        q(c, f"SELECT madlib.madlib_keras_predict('mi_out', 'iris', 'id', 'attributes', "
             f"'pred_{name}_text', {as_text}, FALSE, 1)")
        got = q(c, f"SELECT * FROM pred_{name} ORDER BY 1, 2, 3")
        assert got and got == q(c, f"SELECT * FROM pred_{name}_text ORDER BY 1, 2, 3")
    assert q(c, "SELECT count(*), count(DISTINCT id) FROM pred_top") == [(180, 60)]
    # the byom form too (positional numeric pred_type)
    q(c, "SELECT madlib.load_keras_model('byom_arch', model_arch, model_weights) "
         "FROM mi_out WHERE mst_key = 1")
    q(c, "SELECT madlib.madlib_keras_predict_byom('byom_arch', 1, 'iris', 'id', "
         "'attributes', 'pred_byom', 2, NULL, ARRAY['a', 'b', 'c'])")
    assert q(c, "SELECT count(*), count(DISTINCT id) FROM pred_byom") == [(120, 60)]
    assert q(c, "SELECT 'madlib.' || oid::regprocedure::text FROM pg_proc WHERE proname = "
                "'madlib_keras_predict' AND pronamespace = 'madlib'::regnamespace ORDER BY 1") \
        == [(s,) for s in sorted([
            "madlib.madlib_keras_predict(character varying)",
            ("madlib.madlib_keras_predict(character varying,character varying,character varying,"
            "character varying,character varying,character varying,boolean,integer)"),
            ("madlib.madlib_keras_predict(character varying,character varying,character varying,"
            "character varying,character varying,double precision,boolean,integer)"),
            ("madlib.madlib_keras_predict(character varying,character varying,character varying,"
            "character varying,character varying,integer,boolean,integer)")])]
    e = error_of(c, "SELECT madlib.madlib_keras_predict('mi_out', 'iris', 'id', 'attributes', "
                    "'pred_bad', pred_type => 1.5, mst_key => 1)")
    assert e.pgcode == "22023" and "pred_type" in e.pgerror


def test_gpu_configuration_reports_what_the_server_sees(madlib_conn):
    import tensorflow as tf

    c = madlib_conn
    q(c, "SELECT madlib.gpu_configuration('gpu_tf')")
    q(c, "SELECT madlib.gpu_configuration('gpu_nv', 'nvidia')")
    for t in ("gpu_tf", "gpu_nv"):
        assert columns(c, t) == ["hostname", "gpu_descr"]
    rows = q(c, "SELECT hostname, gpu_descr FROM gpu_tf")
    assert len(rows) == len(tf.config.list_physical_devices("GPU"))  # none on this machine
    assert all(h == "localhost" for h, _ in rows)
    e = error_of(c, "SELECT madlib.gpu_configuration('gpu_x', 'cuda')")
    assert e.pgcode == "22023" and "source" in e.pgerror
    e = error_of(c, "SELECT madlib.gpu_configuration('gpu_tf')")
    assert e.pgcode == "42P07"
    assert "gpu_descr" in q(c, "SELECT madlib.gpu_configuration()")[0][0]


def test_generate_model_configs_recreates_a_dropped_summary(madlib_conn):
    c = madlib_conn
    grid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
            "[{'optimizer': ['SGD'], 'lr': [0.1, 0.01]}], 'metrics': ['accuracy']}")
    q(c, "SELECT madlib.generate_model_configs('model_arch_library', 'gm_mst', ARRAY[1], %s, "
         "$${'batch_size': [8]}$$)", (grid,))
    q(c, "DROP TABLE gm_mst_summary")
    q(c, "SELECT madlib.generate_model_configs('model_arch_library', 'gm_mst', ARRAY[1], %s, "
         "$${'batch_size': [16]}$$)", (grid,))
    assert q(c, "SELECT count(*) FROM gm_mst") == [(4,)]
    assert q(c, "SELECT model_arch_table, object_table FROM gm_mst_summary") == \
        [("model_arch_library", None)]


def test_no_metrics_gives_null_like_madlib(fitted):
    c = fitted
    row = q(c, "SELECT metrics_type, training_metrics_final, training_metrics, "
               "validation_metrics_final, validation_metrics, training_metrics_all "
               "FROM mi_out_info WHERE mst_key = 2")[0]
    assert row == (None, None, None, None, None, None)
    with_metrics = q(c, "SELECT metrics_type, array_length(training_metrics, 1) "
                        "FROM mi_out_info WHERE mst_key = 1")[0]
    assert with_metrics == (["accuracy"], 1)
    q(c, "SELECT madlib.madlib_keras_evaluate('mi_out', 'iris_val', 'mi_eval', NULL, 2)")
    assert q(c, "SELECT metric, metrics_type, metrics, loss > 0 FROM mi_eval") == \
        [(None, None, None, True)]
    q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'mi_single', 'model_arch_library', 1, "
         "%s, 'batch_size=8', 1)", (NO_METRICS,))
    assert q(c, "SELECT metrics_type, training_metrics_final, training_metrics FROM "
                "mi_single_summary") == [(None, None, None)]


def test_summary_frequency_and_elapsed_time_as_madlib(fitted):
    """Left out, metrics_compute_frequency is num_iterations in the _summary (MADlib's);
    metrics_elapsed_time is, per iteration, when its training ended (seconds from the fit's
    start: the last training unit of the iteration), so it grows with the iterations even
    where the evaluations ran later, bundled (madlib_keras_fit evaluates after training)."""
    c = fitted
    assert q(c, "SELECT num_iterations, metrics_compute_frequency FROM mi_out_summary") == \
        [(1, 1)]
    q(c, "DROP TABLE IF EXISTS mi_times, mi_times_summary")
    q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'mi_times', 'model_arch_library', 1, "
         "%s, 'batch_size=8', 4, FALSE, 'iris_val')", (COMPILE,))
    freq, iters, elapsed, fit_id = q(c, "SELECT metrics_compute_frequency, metrics_iters, "
                                        "metrics_elapsed_time, fit_id FROM mi_times_summary")[0]
    assert (freq, iters) == (4, [4])
    q(c, "DROP TABLE mi_times, mi_times_summary")
    q(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'mi_times', 'model_arch_library', 1, "
         "%s, 'batch_size=8', 4, FALSE, 'iris_val', 1)", (COMPILE,))
    iters, elapsed, fit_id = q(c, "SELECT metrics_iters, metrics_elapsed_time, fit_id "
                                  "FROM mi_times_summary")[0]
    assert iters == [1, 2, 3, 4] and len(elapsed) == 4
    assert all(a < b for a, b in zip(elapsed, elapsed[1:])), elapsed
    trained = q(c, "SELECT epoch, extract(epoch FROM max(u.ended_at) - f.started_at)::float8 "
                   "FROM madlib.units u JOIN madlib.fits f USING (fit_id) WHERE fit_id = %s "
                   "AND u.kind = 'train' GROUP BY epoch, f.started_at ORDER BY epoch", (fit_id,))
    assert [e for e, _ in trained] == [1, 2, 3, 4]
    for (_, t), got in zip(trained, elapsed):
        assert abs(t - got) < 0.5, (trained, elapsed)
    q(c, "DROP TABLE mi_times, mi_times_summary")


def test_automl_summary_has_madlibs_columns(madlib_conn):
    c = madlib_conn
    q(c, "SELECT madlib.madlib_keras_automl('iris_packed', 'am_out', 'model_arch_library', "
         "'am_out_mst', ARRAY[1], $${'loss': ['categorical_crossentropy'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.01]}], "
         "'metrics': ['accuracy']}$$, $${'batch_size': [8]}$$, 'grid', 'num_iterations=2', 4)")
    assert columns(c, "am_out_summary") == MADLIB_AUTOML_SUMMARY
    # left out, the frequency is the most epochs a trial trained (MADlib's: R, num_iterations)
    assert q(c, "SELECT metrics_compute_frequency FROM am_out_summary") == [(2,)]
    fit_id, rs = q(c, "SELECT i.fit_id, s.random_state FROM am_out_info i, am_out_summary s")[0]
    assert rs == "4"
    opts = q(c, "SELECT options->>'best_mst_key', options->>'num_trials' FROM madlib.fits "
                "WHERE fit_id = %s", (fit_id,))[0]
    assert opts == (str(q(c, "SELECT mst_key FROM am_out_mst")[0][0]), "1")


SETTING = "cerebro_db.tensorboard_log_dir"


def _reload(c, value):
    if value is None:
        q(c, f"ALTER SYSTEM RESET {SETTING}")
    else:
        q(c, f"ALTER SYSTEM SET {SETTING} = %s", (value,))
    q(c, "SELECT pg_reload_conf()")
    for _ in range(50):
        got = q(c, "SELECT current_setting(%s, true)", (SETTING,))[0][0]
        if got == (value or ""):  # a reset placeholder reads as '' in an existing session
            return
        time.sleep(0.1)
    raise AssertionError(f"{SETTING} did not reload: {got!r}")


def test_tensorboard_confined_to_the_dba_directory(madlib_conn):
    c = madlib_conn
    fit = ("SELECT madlib.madlib_keras_fit('iris_packed', %s, 'model_arch_library', 1, "
           f"$${COMPILE}$$, %s, 1)")
    tb = "batch_size=8, callbacks=[TensorBoard(log_dir={!r}, histogram_freq=1)]"
    base = Path(tempfile.mkdtemp(prefix="cerebro_tb_"))
    os.chmod(base, 0o777)  # the server's OS user writes here
    try:
        e = error_of(c, fit, ("tb_out", tb.format("run1")))  # nothing configured
        assert e.pgcode == "42501" and SETTING in e.diag.message_hint
        q(c, f"SET {SETTING} = %s", (str(base),))  # a session's own value does not count
        e = error_of(c, fit, ("tb_out", tb.format("run1")))
        assert e.pgcode == "42501"
        q(c, f"RESET {SETTING}")
        _reload(c, str(base))
        for bad in ("/etc", "../escape", "run1/../../escape", str(base) + "_sibling"):
            e = error_of(c, fit, ("tb_out", tb.format(bad)))
            assert e.pgcode == "42501" and "outside the configured log directory" in e.pgerror
        assert q(c, "SELECT to_regclass('tb_out'), to_regclass('tb_out_summary')") == \
            [(None, None)]
        os.symlink("/tmp", base / "link")  # a link out of the directory is followed, refused
        e = error_of(c, fit, ("tb_out", tb.format("link/x")))
        assert e.pgcode == "42501"
        if importlib.util.find_spec("tensorboard") is None:  # the server's environment
            e = error_of(c, fit, ("tb_out", tb.format("run1")))
            assert e.pgcode == "0A000" and "needs the tensorboard package" in e.pgerror
            assert q(c, "SELECT to_regclass('tb_out')") == [(None,)]
        else:
            q(c, fit, ("tb_out", tb.format("run1")))
            fit_id = q(c, "SELECT max(fit_id) FROM madlib.fits WHERE model_output_table = "
                          "'tb_out'")[0][0]
            events = list((base / "run1" / f"fit_{fit_id}" / "mst_key_1").rglob("events.*"))
            assert events, list(base.rglob("*"))
            q(c, fit, ("tb_out2", tb.format(str(base / "abs"))))  # absolute, inside: fine
            assert list((base / "abs").rglob("events.out.*"))
        e = error_of(c, "SELECT madlib.madlib_keras_fit('iris_packed', 'tb_bad', "
                        "'model_arch_library', 1, %s, "
                        "'callbacks=[ModelCheckpoint(filepath=\"/tmp/x\")]', 1)", (COMPILE,))
        assert e.pgcode == "22023" and "callback 'ModelCheckpoint' is not allowed" in e.pgerror
    finally:
        _reload(c, None)
        shutil.rmtree(base, ignore_errors=True)


def test_rows_of_another_shape_and_mst_key_of_one_model_are_refused(madlib_conn):
    """As MADlib (madlib_keras_predict.sql_in, madlib_keras_evaluate.sql_in): rows of 2 x 3
    values are not taken for a model of 3 x 2 inputs (a reshape would scramble them), at
    prediction and before a fit writes anything; flat rows and a size-1 dimension still
    are. An mst_key for the output of madlib_keras_fit (one model) is an error."""
    import keras

    c = madlib_conn
    arch = keras.Sequential([keras.Input((3, 2)), keras.layers.Flatten(),
                             keras.layers.Dense(2, activation="softmax")]).to_json()
    q(c, "DROP TABLE IF EXISTS sh, sh_t, sh_p, sh_p_summary, sh_t_p, sh_t_p_summary, sh_arch, "
         "sh_m, sh_m_summary, sh_pred, sh_eval")
    q(c, "CREATE TABLE sh AS SELECT i AS id, ARRAY[[i, i], [i, i], [i, i]]::real[] AS x, "
         "(i % 2)::text AS y FROM generate_series(1, 20) i")
    q(c, "CREATE TABLE sh_t AS SELECT i AS id, ARRAY[[i, i, i], [i, i, i]]::real[] AS x, "
         "(i % 2)::text AS y FROM generate_series(1, 20) i")
    q(c, "SELECT madlib.load_keras_model('sh_arch', %s)", (arch,))
    q(c, "SELECT madlib.training_preprocessor_dl('sh', 'sh_p', 'y', 'x')")
    q(c, "SELECT madlib.training_preprocessor_dl('sh_t', 'sh_t_p', 'y', 'x')")
    fit = ("SELECT madlib.madlib_keras_fit(%s, 'sh_m', 'sh_arch', 1, "
           "$$loss='categorical_crossentropy', optimizer='adam'$$, 'batch_size=5', 1)")
    n0 = q(c, "SELECT count(*) FROM madlib.fits")[0][0]
    e = error_of(c, fit, ("sh_t_p",))
    assert e.pgcode == "42804" and "packed data has rows of shape [2, 3]" in e.pgerror, e.pgerror
    assert q(c, "SELECT count(*) FROM madlib.fits")[0][0] == n0
    q(c, fit, ("sh_p",))
    e = error_of(c, "SELECT madlib.madlib_keras_predict('sh_m', 'sh_t', 'id', 'x', 'sh_pred', "
                    "'response')")
    assert e.pgcode == "42804" and "shape (2, 3) per row" in e.pgerror, e.pgerror
    assert q(c, "SELECT to_regclass('sh_pred')") == [(None,)]
    q(c, "CREATE TABLE sh_flat AS SELECT id, ARRAY[id, id, id, id, id, id]::real[] AS x "
         "FROM sh")
    q(c, "SELECT madlib.madlib_keras_predict('sh_m', 'sh_flat', 'id', 'x', 'sh_pred', "
         "'response')")
    assert q(c, "SELECT count(*) FROM sh_pred") == [(20,)]
    e = error_of(c, "SELECT madlib.madlib_keras_evaluate('sh_m', 'sh_p', 'sh_eval', NULL, 42)")
    assert e.pgcode == "22023" and "mst_key is given (42)" in e.pgerror, e.pgerror
    q(c, "DROP TABLE sh, sh_t, sh_flat, sh_p, sh_p_summary, sh_t_p, sh_t_p_summary, sh_arch, "
         "sh_m, sh_m_summary, sh_pred")


def test_prediction_is_refused_when_a_batch_would_not_fit(madlib_conn):
    """Prediction had no memory guard (a red-team pass): an UpSampling2D(64) model makes
    4.2 million values a row, so a batch of 200 rows (of the 256 predict runs at once) is
    over memory / 32 bytes here: refused (54000) before it runs. A model whose input has
    undefined dimensions cannot be checked and is refused (0A000)."""
    import keras
    import numpy as np

    from cerebro_db import keras_arch

    c = madlib_conn
    per_row = 32 * 32 + 2048 * 2048 + 1 + 2
    rows = keras_arch.physical_memory() // keras_arch.BYTES_PER_BATCH_VALUE // per_row + 1
    assert rows <= 256, "this machine has too much memory for the test's model"
    up = keras.Sequential([keras.Input((32, 32, 1)), keras.layers.UpSampling2D(64),
                           keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    flexible = keras.Sequential([keras.Input((None, None, 1)),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    weights = np.zeros(4, np.float32).tobytes()
    q(c, "DROP TABLE IF EXISTS pg_arch, pg_rows, pg_out")
    q(c, "SELECT madlib.load_keras_model('pg_arch', %s, %s)", (up.to_json(), weights))
    q(c, "SELECT madlib.load_keras_model('pg_arch', %s, %s)", (flexible.to_json(), weights))
    q(c, "CREATE TABLE pg_rows AS SELECT i AS id, array_fill(0.5::real, ARRAY[32, 32, 1]) "
         "AS x FROM generate_series(1, %s) i", (rows,))
    e = error_of(c, "SELECT madlib.madlib_keras_predict_byom('pg_arch', 1, 'pg_rows', 'id', "
                    "'x', 'pg_out')")
    assert e.pgcode == "54000" and f"a batch of {rows:,} rows" in e.pgerror, e.pgerror
    assert q(c, "SELECT to_regclass('pg_out')") == [(None,)]
    e = error_of(c, "SELECT madlib.madlib_keras_predict_byom('pg_arch', 2, 'pg_rows', 'id', "
                    "'x', 'pg_out')")
    assert e.pgcode == "0A000" and "undefined dimensions" in e.pgerror, e.pgerror
    q(c, "DROP TABLE pg_arch, pg_rows")
