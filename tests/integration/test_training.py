"""madlib_keras_fit_multiple_model on the real server: outputs, the unit log, sequential
equivalence by replay, reproducibility, the ring policy, chunked states and failures."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cerebro_db.scheduling import check_invariants

from ..helpers import ROOT, load_mnist_rows, mlp_json, q, worker_sessions_gone

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILES = [
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']",
    ("loss='categorical_crossentropy', optimizer='SGD(lr=0.1, momentum=0.9)', "
    "metrics=['accuracy', 'top_k_categorical_accuracy']"),
]
FITS = ["batch_size=32", "batch_size=100, epochs=2"]


@pytest.fixture(scope="module")
def mnist(session_conn):
    """1,200 MNIST training and 400 test rows, packed over 2 partitions; 4 configs."""
    conn = session_conn
    load_mnist_rows(conn, *(("mn_train", 0, 1200), ("mn_test", 1200, 1600)))
    q(conn, "DROP TABLE IF EXISTS mn_p, mn_p_summary, mn_v, mn_v_summary, mn_arch, mn_mst, "
            "mn_mst_summary")
    q(conn, "SELECT training_preprocessor_dl('mn_train', 'mn_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, 2, 3)")
    q(conn, "SELECT validation_preprocessor_dl('mn_test', 'mn_v', 'y', 'x', 'mn_p')")
    q(conn, "SELECT load_keras_model('mn_arch', %s)", (mlp_json(16),))
    q(conn, "SELECT load_model_selection_table('mn_arch', 'mn_mst', ARRAY[1], %s, %s)",
      (COMPILES, FITS))
    return conn


def fit(conn, out, *extra, seed=5, policy="mop", policy_params=None, validation="mn_v",
        mst="mn_mst", iterations=2, freq=1):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('mn_p', %s, %s, %s, FALSE, %s, %s, FALSE, "
            "NULL, NULL, TRUE, %s, %s, %s)",
      (out, mst, iterations, validation, freq, policy, policy_params, seed))
    return q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s "
                   "ORDER BY fit_id DESC LIMIT 1", (out,))[0][0]



def unit_log(conn, fit_id):
    rows = q(conn, """SELECT mst_key, epoch, partition, worker, kind,
                             extract(epoch FROM started_at), extract(epoch FROM ended_at)
                        FROM cerebro_db.units WHERE fit_id = %s AND kind <> 'eval_valid'
                       ORDER BY started_at""", (fit_id,))
    return [{"config": r[0], "epoch": r[1], "partition": r[2], "worker": r[3],
                 "kind": "train" if r[4] == "train" else "eval", "start": float(r[5]),
                 "end": float(r[6]), "ok": True} for r in rows]


def test_outputs_metrics_and_unit_log(mnist):
    conn = mnist
    fit_id = fit(conn, "mn_out")
    info = q(conn, "SELECT mst_key, model_id, model_type, metrics_type, loss_type, "
                   "array_length(training_loss, 1), array_length(validation_loss, 1), "
                   "training_metrics_final, validation_metrics_final, validation_loss_final, "
                   "metrics_iters, training_metrics_all FROM mn_out_info ORDER BY mst_key")
    assert [r[0] for r in info] == [1, 2, 3, 4]
    for r in info:
        assert r[1] == 1 and r[2] == "madlib_keras" and r[4] == "categorical_crossentropy"
        assert r[5] == 2 and r[6] == 2 and r[10] == [1, 2]
        # well above chance (0.1); SGD(lr=0.1, momentum=0.9) at batch 32 on 1,200 rows is
        # noisy: training accuracy 0.43 .. 0.72 over seeds 5 .. 9 (0.49 .. 0.65 with the
        # earlier independent visit orders)
        assert 0.35 < r[7] <= 1.0 and 0.35 < r[8] <= 1.0 and r[9] > 0
    assert info[2][3] == ["accuracy", "top_k_categorical_accuracy"]
    assert len(info[2][11]) == 2 and len(info[2][11][0]) == 2  # iterations x metrics
    out = q(conn, "SELECT mst_key, length(model_weights) FROM mn_out ORDER BY 1")
    assert out == [(k, 4 * (784 * 16 + 16 + 16 * 10 + 10)) for k in (1, 2, 3, 4)]
    summ = q(conn, "SELECT source_table, validation_table, model_info, num_iterations, "
                   "metrics_compute_frequency, num_classes, y_class_values, normalizing_const, "
                   "metrics_iters, madlib_version FROM mn_out_summary")[0]
    assert summ[:8] == ("mn_p", "mn_v", "mn_out_info", 2, 1, [10], list(range(10)), 255.0)
    assert summ[8] == [1, 2]
    log = unit_log(conn, fit_id)
    check_invariants(log, num_partitions=2, epochs=2, eval_epochs={1, 2})
    prog = q(conn, "SELECT status, units_done, total_units FROM cerebro_db.fit_progress "
                   "WHERE fit_id = %s", (fit_id,))[0]
    assert prog == ("done", 16, 16)
    per = q(conn, "SELECT mst_key, epochs_done, best_valid_loss IS NOT NULL FROM "
                  "cerebro_db.fit_config_progress WHERE fit_id = %s ORDER BY 1", (fit_id,))
    assert per == [(k, 2, True) for k in (1, 2, 3, 4)]
    # no worker session is left behind
    assert worker_sessions_gone(conn)
    # the validation loss in _info is the row-weighted mean of the logged eval units
    vl = q(conn, "SELECT sum(loss * rows) / sum(rows) FROM cerebro_db.units WHERE fit_id = %s "
                 "AND mst_key = 1 AND epoch = 2 AND kind = 'eval_valid'", (fit_id,))[0][0]
    assert abs(vl - info[0][9]) < 1e-9


REPLAY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import psycopg2
    from cerebro_db import training, state
    from cerebro_db.worker import unit_seed
    training.configure_runtime(1)
    dsn, fit_id = sys.argv[1], int(sys.argv[2])
    conn = psycopg2.connect(dsn)
    cur = conn.cursor()
    cur.execute("SELECT random_state FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,))
    seed = cur.fetchone()[0]
    cur.execute("SELECT __dist_key__, x, x_shape, y, y_shape FROM mn_p ORDER BY buffer_id")
    parts = {}
    for k, xb, xs, yb, ys in cur.fetchall():
        parts.setdefault(k, []).append(training.decode_buffer(bytes(xb), xs, bytes(yb), ys))
    data = {k: (np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v]))
            for k, v in parts.items()}
    cur.execute("SELECT mst_key, compile_params, fit_params, model_arch::text FROM "
                "cerebro_db.fit_configs WHERE fit_id = %s", (fit_id,))
    out = {}
    for mst, cp, fp, arch in cur.fetchall():
        cur.execute("SELECT epoch, partition FROM cerebro_db.units WHERE fit_id = %s AND "
                    "mst_key = %s AND kind = 'train' ORDER BY started_at", (fit_id, mst))
        visits = cur.fetchall()
        init = training.initial_state(arch, cp, unit_seed(seed, mst, 0, 0, 1))
        units = [(*data[p], unit_seed(seed, mst, e, p)) for e, p in visits]
        final = state.decode_state(training.replay(arch, cp, fp, init, units))
        cur.execute("SELECT model_weights FROM mn_out WHERE mst_key = %s", (mst,))
        stored = np.frombuffer(bytes(cur.fetchone()[0]), "<f4")
        mine = np.concatenate([np.asarray(w, "<f4").ravel() for w in final.weights])
        out[mst] = [len(visits), bool(np.array_equal(stored, mine)),
                    float(np.abs(stored - mine).max())]
    print(json.dumps(out))
""")


def test_sequential_equivalence_by_replay(mnist, dsn):
    """Each config's weights equal one process replaying its logged visit order (bitwise)."""
    fit_id = q(mnist, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                      "'mn_out' AND status = 'done'")[0][0]
    assert fit_id is not None, "run after test_outputs_metrics_and_unit_log"
    r = subprocess.run([sys.executable, "-c", REPLAY, dsn, str(fit_id)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: v[0] for k, v in res.items()} == {str(k): 4 for k in (1, 2, 3, 4)}
    assert all(v[1] for v in res.values()), res


def test_same_seed_same_metrics_and_ring_policy(mnist):
    a = q(mnist, "SELECT mst_key, training_loss, validation_loss FROM mn_out_info ORDER BY 1")
    fit_id = fit(mnist, "mn_out2", iterations=2, freq=1)
    b = q(mnist, "SELECT mst_key, training_loss, validation_loss FROM mn_out2_info ORDER BY 1")
    assert a == b
    # the visit orders were planned from the static cost estimate stored with the fit (what
    # a resume plans them from): same architecture, so batch_size=32 costs more than 100
    costs = q(mnist, "SELECT options->'policy_params'->'config_costs' FROM cerebro_db.fits "
                     "WHERE fit_id = %s", (fit_id,))[0][0]
    batch = dict(q(mnist, "SELECT mst_key::text, fit_params FROM mn_mst"))
    assert sorted(costs) == sorted(batch)
    small = [costs[k] for k, f in batch.items() if "batch_size=32" in f]
    large = [costs[k] for k, f in batch.items() if "batch_size=100" in f]
    assert small and large and min(small) > max(large), (costs, batch)
    fit_id = fit(mnist, "mn_ring", policy="ring", policy_params="reset_optimizer_per_hop=True",
                 validation=None, iterations=2, freq=None)
    log = unit_log(mnist, fit_id)
    check_invariants(log, num_partitions=2, epochs=2, eval_epochs={2})
    # the ring has a barrier after every hop: no train unit of hop h+1 starts before every
    # unit of hop h ended
    train = sorted((u for u in log if u["kind"] == "train"), key=lambda u: u["start"])
    hops = [train[i:i + 4] for i in range(0, len(train), 4)]
    for h1, h2 in zip(hops, hops[1:]):
        assert max(u["end"] for u in h1) <= min(u["start"] for u in h2) + 1e-3
    assert q(mnist, "SELECT count(*), bool_and(validation_loss IS NULL) FROM mn_ring_info") == \
        [(4, True)]


def test_chunked_state_and_sparse_and_regression(mnist, tables):
    """Small chunk size: states span many rows; sparse and mse losses train too."""
    tables += ["mn_mst2", "mn_mst2_summary", "mn_chunk", "mn_chunk_info", "mn_chunk_summary"]
    q(mnist, "SELECT load_model_selection_table('mn_arch', 'mn_mst2', ARRAY[1], %s, %s)",
      (["loss='sparse_categorical_crossentropy', optimizer='Adam', metrics=['accuracy']",
        "loss='mse', optimizer='SGD(learning_rate=0.05)', metrics=['mae']"],
       ["batch_size=64"]))
    q(mnist, "SET cerebro_db.state_chunk_size = 16384")
    try:
        fit_id = fit(mnist, "mn_chunk", mst="mn_mst2", iterations=1, freq=None)
    finally:
        q(mnist, "RESET cerebro_db.state_chunk_size")
    chunks = q(mnist, "SELECT mst_key, count(*) FROM cerebro_db.model_states WHERE fit_id = %s "
                      "GROUP BY 1 ORDER BY 1", (fit_id,))
    # Adam: weights and two slots (~150 KB) -> 10 chunks; plain SGD: weights (~50 KB) -> 4
    assert chunks == [(1, 10), (2, 4)]
    info = q(mnist, "SELECT mst_key, loss_type, training_metrics_final, training_loss_final "
                    "FROM mn_chunk_info ORDER BY 1")
    assert info[0][1] == "sparse_categorical_crossentropy" and info[0][2] > 0.2  # chance: 0.1
    assert info[1][1] == "mse" and 0 < info[1][3] < 0.2


def test_nan_loss_is_recorded_not_a_crash(mnist, tables):
    tables += ["mn_mst3", "mn_mst3_summary", "mn_nan", "mn_nan_info", "mn_nan_summary"]
    q(mnist, "SELECT load_model_selection_table('mn_arch', 'mn_mst3', ARRAY[1], %s, %s)",
      (["loss='categorical_crossentropy', optimizer='SGD(learning_rate=1e12)'"],
       ["batch_size=64"]))
    fit(mnist, "mn_nan", mst="mn_mst3", iterations=1, freq=None, validation=None)
    loss = q(mnist, "SELECT training_loss_final FROM mn_nan_info")[0][0]
    assert math.isnan(loss)


BAD = [
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'mn_out', 'mn_mst', 1)", "42P07",
     "already exists"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'no_mst', 1)", "42P01",
     "no_mst"),
    ("SELECT madlib_keras_fit_multiple_model('mn_train', 'bad_o', 'mn_mst', 1)", "42P01",
     "summary"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 0)", "22023",
     "num_iterations"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', NULL)", "22004",
     "num_iterations"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 2, FALSE, NULL, 3)",
     "22023", "metrics_compute_frequency"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 1, TRUE)", "0A000",
     "GPU"),
    (("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 1, FALSE, NULL, NULL, "
     "FALSE, NULL, NULL, FALSE, 'fifo')"), "22023", "scheduling policy"),
    (("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 1, FALSE, NULL, NULL, "
     "FALSE, NULL, NULL, FALSE, 'ring', 'x=__import__(\"os\")')"), "22023", "policy_params"),
    ("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 1, FALSE, 'mn_p; --')",
     "42602", "validation_table"),
    (("SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst', 1, FALSE, NULL, NULL, "
     "TRUE)"), "42P01", "warm_start"),
]


@pytest.mark.parametrize("sql,code,words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_arguments_fail_before_any_work(mnist, sql, code, words):
    n = q(mnist, "SELECT count(*) FROM cerebro_db.fits")[0][0]
    with pytest.raises(psycopg2.Error) as e:
        q(mnist, sql)
    assert e.value.pgcode == code, e.value.pgerror
    assert words in e.value.pgerror
    assert q(mnist, "SELECT count(*) FROM cerebro_db.fits")[0][0] == n
    assert q(mnist, "SELECT to_regclass('bad_o') IS NULL")[0][0]


def test_shape_mismatch_is_caught_before_training(mnist, tables):
    tables += ["mn_arch_bad", "mn_mst_bad", "mn_mst_bad_summary"]
    q(mnist, "SELECT load_keras_model('mn_arch_bad', %s)", (mlp_json(16, inputs=100),))
    q(mnist, "SELECT load_model_selection_table('mn_arch_bad', 'mn_mst_bad', ARRAY[1], %s, %s)",
      ([COMPILES[0]], ["batch_size=32"]))
    with pytest.raises(psycopg2.Error) as e:
        q(mnist, "SELECT madlib_keras_fit_multiple_model('mn_p', 'bad_o', 'mn_mst_bad', 1)")
    assert e.value.pgcode == "42804" and "expects input shape [100]" in e.value.pgerror


def test_worker_failure_is_a_clear_error_with_traceback(mnist, tables):
    """A failure inside a worker (a model whose output cannot take the labels) becomes an SQL error with the worker's traceback; no output tables remain,
    the fit is marked failed and every worker session is closed."""
    tables += ["mn_arch_f", "mn_mst_f", "mn_mst_f_summary"]
    import keras

    # the last dimension matches the 10 classes, so the static check passes; at run time the
    # (n, 4, 10) output cannot take (n, 10) one-hot labels and Keras raises in the worker
    arch = keras.Sequential([keras.Input((784,)), keras.layers.Reshape((4, 196)),
                             keras.layers.Dense(10, activation="softmax")]).to_json()
    q(mnist, "SELECT load_keras_model('mn_arch_f', %s)", (arch,))
    q(mnist, "SELECT load_model_selection_table('mn_arch_f', 'mn_mst_f', ARRAY[1], %s, %s)",
      (["loss='categorical_crossentropy', optimizer='Adam'"], ["batch_size=32"]))
    with pytest.raises(psycopg2.Error) as e:
        q(mnist, "SELECT madlib_keras_fit_multiple_model('mn_p', 'fail_o', 'mn_mst_f', 1)")
    err = e.value
    assert "worker" in err.pgerror and "failed on configuration 1" in err.pgerror
    assert err.diag.message_detail and "Traceback" in err.diag.message_detail
    assert q(mnist, "SELECT to_regclass('fail_o') IS NULL AND to_regclass('fail_o_info') IS NULL")[0][0]
    st = q(mnist, "SELECT status, message IS NOT NULL FROM cerebro_db.fits "
                  "WHERE model_output_table = 'fail_o'")
    assert st == [("failed", True)]
    assert worker_sessions_gone(mnist)


def test_fit_single_config_predict_and_evaluate(mnist, tables):
    tables += ["mn_m", "mn_m_summary", "mn_pr", "mn_pr2", "mn_pr3", "mn_pr4", "mn_ev",
               "mn_ev2", "mn_byom_arch", "mn_pr5"]
    q(mnist, "DROP TABLE IF EXISTS mn_m, mn_m_summary")
    q(mnist, "SELECT madlib_keras_fit('mn_p', 'mn_m', 'mn_arch', 1, %s, 'batch_size=32', 2, "
             "FALSE, 'mn_v', 1, NULL, 'one', 'single model', NULL, 9)", (COMPILES[0],))
    summ = q(mnist, "SELECT model_id, compile_params, fit_params, model_type, "
                    "array_length(training_loss, 1), validation_metrics_final, name, "
                    "num_iterations FROM mn_m_summary")[0]
    assert summ[:5] == (1, COMPILES[0], "batch_size=32", "madlib_keras", 2)
    assert summ[5] > 0.5 and summ[6:] == ("one", 2)
    assert q(mnist, "SELECT count(*) FROM mn_m")[0][0] == 1
    # evaluate agrees with the fit's own validation metrics
    q(mnist, "SELECT madlib_keras_evaluate('mn_m', 'mn_v', 'mn_ev')")
    ev = q(mnist, "SELECT loss, metric, metrics_type, loss_type FROM mn_ev")[0]
    vl = q(mnist, "SELECT validation_loss_final, validation_metrics_final FROM mn_m_summary")[0]
    assert abs(ev[0] - vl[0]) < 1e-5 and abs(ev[1] - vl[1]) < 1e-6
    assert ev[2:] == (["accuracy"], "categorical_crossentropy")
    # predict: response accuracy equals the evaluated accuracy; prob rows sum to one
    q(mnist, "SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'mn_pr', 'response')")
    acc = q(mnist, "SELECT avg((p.class_value::int = t.y)::int) FROM mn_pr p "
                   "JOIN mn_test t USING (id)")[0][0]
    assert abs(float(acc) - ev[1]) < 1e-6
    cols = [r[0] for r in q(mnist, "SELECT attname FROM pg_attribute WHERE attrelid = "
                                   "'mn_pr'::regclass AND attnum > 0 ORDER BY attnum")]
    assert cols == ["id", "class_name", "class_value", "prob"]
    q(mnist, "SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'mn_pr2')")
    sums = q(mnist, "SELECT count(*), min(s), max(s) FROM (SELECT id, sum(prob) s, "
                    "count(*) c FROM mn_pr2 GROUP BY id) x")[0]
    assert sums[0] == 400 and abs(sums[1] - 1) < 1e-4 and abs(sums[2] - 1) < 1e-4
    q(mnist, "SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'mn_pr3', '3')")
    assert q(mnist, "SELECT count(*), max(rank) FROM mn_pr3")[0] == (1200, 3)
    q(mnist, "SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'mn_pr4', '0.5')")
    assert q(mnist, "SELECT bool_and(prob >= 0.5), count(DISTINCT id) <= 400 FROM mn_pr4")[0] \
        == (True, True)
    # the same model through an architecture table with weights (BYOM)
    w = q(mnist, "SELECT model_weights, model_arch::text FROM mn_m")[0]
    q(mnist, "SELECT load_keras_model('mn_byom_arch', %s, %s)", (w[1], w[0]))
    q(mnist, "SELECT madlib_keras_predict_byom('mn_byom_arch', 1, 'mn_test', 'id', 'x', "
             "'mn_pr5', 'response', NULL, ARRAY[ARRAY['0','1','2','3','4','5','6','7','8','9']], "
             "255.0)")
    assert q(mnist, "SELECT count(*) FROM mn_pr5 a JOIN mn_pr b USING (id) WHERE "
                    "a.class_value = b.class_value")[0][0] == 400
    # errors
    for sql, code in (
        ("SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'mn_pr', 'response')",
         "42P07"),
        ("SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'bad_o', 'best')", "22023"),
        ("SELECT madlib_keras_predict('mn_m', 'mn_test', 'nope', 'x', 'bad_o')", "42703"),
        ("SELECT madlib_keras_predict('mn_out', 'mn_test', 'id', 'x', 'bad_o')", "22004"),
        ("SELECT madlib_keras_evaluate('mn_m', 'mn_test', 'bad_o')", "42P01"),
        ("SELECT madlib_keras_evaluate('mn_m', 'mn_v', 'bad_o', TRUE)", "0A000"),
        ("SELECT madlib_keras_predict('mn_m', 'mn_test', 'id', 'x', 'bad_o', 'prob', TRUE)",
         "0A000"),
        (("SELECT madlib_keras_predict_byom('mn_byom_arch', 1, 'mn_test', 'id', 'x', 'bad_o', "
          "'prob', TRUE)"), "0A000"),
        ("SELECT madlib_keras_fit('mn_p', 'mn_m', 'mn_arch', 1, 'loss=1', '', 1)", "22023"),
    ):
        with pytest.raises(psycopg2.Error) as e:
            q(mnist, sql)
        assert e.value.pgcode == code, (sql, e.value.pgerror)
        assert q(mnist, "SELECT to_regclass('bad_o') IS NULL")[0][0]


def test_warm_start_continues_from_saved_weights(mnist):
    before = q(mnist, "SELECT mst_key, training_loss_final FROM mn_out_info ORDER BY 1")
    fit(mnist, "mn_out_ws", iterations=1, freq=None, validation=None)
    q(mnist, "SELECT madlib_keras_fit_multiple_model('mn_p', 'mn_out_ws', 'mn_mst', 1, FALSE, "
             "NULL, NULL, TRUE, NULL, NULL, TRUE, 'mop', NULL, 5)")
    after = q(mnist, "SELECT mst_key, training_loss_final, warm_start FROM mn_out_ws_info "
                     "JOIN mn_out_ws_summary ON true ORDER BY 1")
    assert len(after) == 4 and all(r[2] for r in after)
    # two iterations in two calls reach a lower loss than one iteration alone would
    one = q(mnist, "SELECT training_loss[1] FROM mn_out_info ORDER BY mst_key")
    assert sum(r[1] for r in after) < sum(r[0] for r in one)
    assert before  # the first fit is untouched


def test_transfer_learning_starts_from_arch_table_weights(mnist, tables):
    """Non-NULL model_weights in the architecture table initialise the model: with a
    negligible learning rate the trained weights are the loaded ones."""
    tables += ["mn_arch_tl", "mn_mst_tl", "mn_mst_tl_summary", "mn_tl", "mn_tl_info",
               "mn_tl_summary"]
    import keras

    keras.utils.set_random_seed(123)
    m = keras.models.model_from_json(mlp_json(16))
    w = np.concatenate([a.ravel() for a in m.get_weights()]).astype("<f4").tobytes()
    q(mnist, "SELECT load_keras_model('mn_arch_tl', %s, %s)", (m.to_json(), psycopg2.Binary(w)))
    q(mnist, "SELECT load_model_selection_table('mn_arch_tl', 'mn_mst_tl', ARRAY[1], %s, %s)",
      (["loss='categorical_crossentropy', optimizer='SGD(learning_rate=1e-12)'"],
       ["batch_size=64"]))
    fit(mnist, "mn_tl", mst="mn_mst_tl", iterations=1, freq=None, validation=None)
    got = np.frombuffer(bytes(q(mnist, "SELECT model_weights FROM mn_tl")[0][0]), "<f4")
    want = np.frombuffer(w, "<f4")
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-6
    assert np.abs(want).max() > 0.01  # the loaded weights are not a trivial start


def test_a_done_fits_states_go_when_the_roles_next_fit_starts(mnist):
    """A done fit keeps its final states while its caller's transaction may still roll back
    (a resume then writes the outputs from them); the role's next fit deletes them once
    the done mark is committed, and leaves a fit whose caller rolled back resumable."""
    def states(fit_id):
        return q(mnist, "SELECT count(*) FROM cerebro_db.model_states WHERE fit_id = %s",
                 (fit_id,))[0][0]

    first = fit(mnist, "mn_purge1", iterations=1, freq=None)
    assert states(first) > 0
    q(mnist, "BEGIN")
    rolled = fit(mnist, "mn_purge2", iterations=1, freq=None)
    q(mnist, "ROLLBACK")
    second = fit(mnist, "mn_purge3", iterations=1, freq=None)
    assert states(first) == 0 and states(second) > 0
    assert q(mnist, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s",
             (rolled,)) == [("interrupted",)]
    assert states(rolled) > 0
    q(mnist, "SELECT madlib_keras_fit_resume(%s)", (rolled,))
    assert q(mnist, "SELECT count(*) FROM mn_purge2")[0][0] == 4
    assert q(mnist, "SELECT count(*) FROM mn_purge1")[0][0] == 4  # outputs stay whole
