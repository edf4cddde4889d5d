"""Another session watches a running fit through fit_progress and fit_config_progress."""
from __future__ import annotations

import threading
import time

import pytest

from ..helpers import load_mnist_rows, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

CONFIGS = 3
ITERATIONS = 3
PARTITIONS = 2


@pytest.fixture(scope="module")
def watched(session_conn):
    """2,000 MNIST training and 400 validation rows over 2 partitions; 3 configs, batch 16."""
    conn = session_conn
    load_mnist_rows(conn, *(("w_train", 0, 2000), ("w_test", 2000, 2400)))
    q(conn, "DROP TABLE IF EXISTS w_p, w_p_summary, w_v, w_v_summary, w_arch, w_mst, "
            "w_mst_summary, w_out, w_out_info, w_out_summary")
    q(conn, "SELECT training_preprocessor_dl('w_train', 'w_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, %s, 3)", (PARTITIONS,))
    q(conn, "SELECT validation_preprocessor_dl('w_test', 'w_v', 'y', 'x', 'w_p')")
    q(conn, "SELECT load_keras_model('w_arch', %s)", (mlp_json(32),))
    compiles = [f"loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})', "
                "metrics=['accuracy']" for lr in (0.001, 0.003, 0.01)]
    q(conn, "SELECT load_model_selection_table('w_arch', 'w_mst', ARRAY[1], %s, "
            "ARRAY['batch_size=16'])", (compiles,))
    return conn


def test_another_session_watches_a_running_fit(watched, dsn):
    errors: list[BaseException] = []

    def run() -> None:
        c = psycopg2.connect(dsn)
        c.autocommit = True
        try:
            q(c, "SELECT madlib_keras_fit_multiple_model('w_p', 'w_out', 'w_mst', %s, FALSE, "
                 "'w_v', 1, FALSE, NULL, NULL, TRUE, 'mop', NULL, 7)", (ITERATIONS,))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)
        finally:
            c.close()

    before = q(watched, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    thread = threading.Thread(target=run)
    thread.start()
    watcher = watched  # connection 2: the module's session connection
    fit_id = None
    snapshots: list[tuple] = []
    per_config: list[list[tuple]] = []
    deadline = time.monotonic() + 600
    while thread.is_alive() and time.monotonic() < deadline:
        if fit_id is None:
            rows = q(watcher, "SELECT fit_id FROM cerebro_db.fits WHERE fit_id > %s AND "
                              "model_output_table = 'w_out'", (before,))
            fit_id = rows[0][0] if rows else None
        if fit_id is not None:
            snap = q(watcher, "SELECT status, units_done, total_units, best_loss, eta, percent, "
                              "best_mst_key, elapsed FROM cerebro_db.fit_progress "
                              "WHERE fit_id = %s", (fit_id,))
            cfg = q(watcher, "SELECT mst_key, epochs_done, units_done, total_units, "
                             "current_epoch, best_train_loss, best_valid_loss FROM "
                             "cerebro_db.fit_config_progress WHERE fit_id = %s ORDER BY 1",
                    (fit_id,))
            if snap and snap[0][0] == "running":
                snapshots.append(snap[0])
                per_config.append(cfg)
        time.sleep(0.05)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the fit did not finish"
    if errors:
        raise errors[0]
    assert fit_id is not None, "the fit never appeared in cerebro_db.fits"

    total = CONFIGS * ITERATIONS * PARTITIONS
    running = [s for s in snapshots if s[1] > 0]
    assert len(running) >= 2, f"saw too few running snapshots with work done: {snapshots}"
    done_counts = [s[1] for s in snapshots]
    assert done_counts == sorted(done_counts), "units_done went backwards"
    assert len(set(done_counts)) >= 2, "units_done never grew while watched"
    for status, done, tot, best, eta, percent, best_key, elapsed in snapshots:
        assert tot == total and 0 <= done <= tot
        assert elapsed.total_seconds() >= 0
        if done > 0:
            assert best is not None and best > 0 and best_key in (1, 2, 3)
            assert eta is not None and eta.total_seconds() >= 0
            assert float(percent) == pytest.approx(round(100.0 * done / total, 1))
    # per configuration (all registered before the first unit): its units add up to (at
    # least, read later) the fit's, an epoch appears while running
    for snap, cfg in zip(snapshots, per_config):
        if snap[1] == 0:
            continue
        assert [r[0] for r in cfg] == [1, 2, 3]
        assert sum(r[2] for r in cfg) >= snap[1]  # read just after fit_progress
        for _, epochs_done, units, tot, epoch, best_train, _ in cfg:
            assert tot == ITERATIONS * PARTITIONS and epochs_done == units // PARTITIONS
            assert (epoch is None) == (units == 0) and (best_train is None) == (units == 0)
            if epoch is not None:
                assert 1 <= epoch <= ITERATIONS and epochs_done <= epoch
    assert any(r[4] is not None for cfg in per_config for r in cfg)
    assert any(r[1] >= 1 for cfg in per_config for r in cfg), "no config finished an epoch"

    final = q(watcher, "SELECT status, units_done, total_units, eta, best_loss, best_valid_loss, "
                       "best_mst_key FROM cerebro_db.fit_progress WHERE fit_id = %s", (fit_id,))
    status, done, tot, eta, best, best_valid, best_key = final[0]
    assert (status, done, tot, eta) == ("done", total, total, None)
    # the best loss is the best validation loss of a whole epoch, as the _info table has it
    info = q(watcher, "SELECT mst_key, validation_loss FROM w_out_info")
    best_info = min((loss, k) for k, losses in info for loss in losses)
    assert best == best_valid == pytest.approx(best_info[0], rel=1e-6)
    assert best_key == best_info[1]
    assert q(watcher, "SELECT best_loss_kind FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (fit_id,)) == [("validation",)]
    cfg = q(watcher, "SELECT epochs_done, units_done, current_epoch FROM "
                     "cerebro_db.fit_config_progress WHERE fit_id = %s", (fit_id,))
    assert cfg == [(ITERATIONS, ITERATIONS * PARTITIONS, ITERATIONS)] * CONFIGS


def test_without_validation_the_best_loss_is_an_evaluated_training_loss(watched):
    """Without validation data best_loss is the best training loss of a whole evaluated
    epoch (what the _info table and the fit's notice report), not the smallest loss of one
    training unit on one partition."""
    conn = watched
    q(conn, "DROP TABLE IF EXISTS w_nv, w_nv_info, w_nv_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('w_p', 'w_nv', 'w_mst', 2, FALSE, NULL, 1, "
            "FALSE, NULL, NULL, TRUE, 'mop', NULL, 7)")
    fit_id = q(conn, "SELECT fit_id FROM w_nv_info LIMIT 1")[0][0]
    best, key, evaluated = q(conn, "SELECT best_loss, best_mst_key, best_eval_train_loss "
                                   "FROM cerebro_db.fit_progress WHERE fit_id = %s",
                             (fit_id,))[0]
    info = q(conn, "SELECT mst_key, training_loss FROM w_nv_info")
    best_info = min((loss, k) for k, losses in info for loss in losses)
    assert best == evaluated == pytest.approx(best_info[0], rel=1e-6)
    assert key == best_info[1]
    assert q(conn, "SELECT best_loss_kind FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (fit_id,)) == [("training",)]
    per_config = dict(q(conn, "SELECT mst_key, best_eval_train_loss FROM "
                              "cerebro_db.fit_config_progress WHERE fit_id = %s", (fit_id,)))
    assert per_config == pytest.approx({k: min(losses) for k, losses in info}, rel=1e-6)
    q(conn, "DROP TABLE w_nv, w_nv_info, w_nv_summary")
