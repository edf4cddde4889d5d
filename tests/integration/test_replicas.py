"""Replicated partitions and elastic fits against the real server.

- cerebro_db.replicas = 2 on 2 partitions: worker 1's session is killed mid-unit and
  cannot reconnect (test hook); it leaves the fit, worker 0 (which holds both partitions)
  finishes it;
- cerebro_db_fit_workers from another session grows a running fit from 2 workers to 3, then
  shrinks it to 1: units run on the new worker after the change, none on retired workers
  after they left, and no unit fails for it.

Each time every configuration's weights equal (bitwise) an uninterrupted run with the same
random_state (the visit order and unit seeds depend on the seed only).
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from cerebro_db.scheduling import check_invariants

from ..helpers import connect, load_mnist_rows, mlp_json, q, worker_sessions_gone
from .test_faults import Killer
from .test_training import COMPILES, unit_log

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

SEED = 23
ITERATIONS = 3
PARTITIONS = 2
CONFIGS = 2
TOTAL_TRAIN = CONFIGS * ITERATIONS * PARTITIONS


@pytest.fixture(scope="module")
def rp(session_conn):
    """600 MNIST rows over 2 partitions, 2 configurations."""
    conn = session_conn
    load_mnist_rows(conn, ("rp_train", 0, 600))
    q(conn, "DROP TABLE IF EXISTS rp_p, rp_p_summary, rp_arch, rp_mst, rp_mst_summary")
    q(conn, "SELECT training_preprocessor_dl('rp_train', 'rp_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, %s, 3)", (PARTITIONS,))
    q(conn, "SELECT load_keras_model('rp_arch', %s)", (mlp_json(hidden=8),))
    q(conn, "SELECT load_model_selection_table('rp_arch', 'rp_mst', ARRAY[1], %s, %s)",
      (COMPILES, ["batch_size=50"]))
    yield conn
    q(conn, "DROP TABLE IF EXISTS rp_train, rp_p, rp_p_summary, rp_arch, rp_mst, "
            "rp_mst_summary, rp_base, rp_base_info, rp_base_summary")


def fit(conn, out):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('rp_p', %s, 'rp_mst', %s, FALSE, NULL, "
            "NULL, FALSE, NULL, NULL, TRUE, 'mop', NULL, %s)", (out, ITERATIONS, SEED))
    return last_fit(conn, out)


def last_fit(conn, out):
    return q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s "
                   "ORDER BY fit_id DESC LIMIT 1", (out,))[0][0]


def weights(conn, out):
    return {k: bytes(w) for k, w in q(conn, f"SELECT mst_key, model_weights FROM {out}")}


@pytest.fixture(scope="module")
def baseline(rp):
    fit(rp, "rp_base")
    return weights(rp, "rp_base")


def check_log(conn, fit_id):
    rows = q(conn, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                   "cerebro_db.units WHERE fit_id = %s GROUP BY 1 ORDER BY 1", (fit_id,))
    n_eval = CONFIGS * PARTITIONS
    assert rows == [("eval_train", n_eval, n_eval), ("train", TOTAL_TRAIN, TOTAL_TRAIN)]
    check_invariants(unit_log(conn, fit_id), num_partitions=PARTITIONS, epochs=ITERATIONS,
                     eval_epochs={ITERATIONS})
    assert q(conn, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]


def fit_workers(conn, fit_id):
    return {w: (sorted(p), s) for w, p, s in q(
        conn, "SELECT worker, partitions, status FROM cerebro_db.fit_workers WHERE fit_id = %s",
        (fit_id,))}


def hook(conn, *points):
    q(conn, "SELECT set_config('cerebro_db.test_hook', %s, false)", (json.dumps(list(points)),))


def test_lost_worker_leaves_and_its_replica_serves(rp, baseline, dbname, tables):
    """r = 2, p = 2: worker 1's first unit is killed and its session refused a reconnect;
    the unit is retried on worker 0, which finishes the fit alone."""
    tables += ["rp_lost", "rp_lost_info"]
    hook(rp, {"point": "before_train", "worker": 1, "seconds": 60},
         {"point": "recover", "worker": 1})
    q(rp, "SET cerebro_db.replicas = 2")
    killer = Killer(dbname)
    killer.start()
    try:
        fit_id = fit(rp, "rp_lost")
    finally:
        killer.stop.set()
        killer.join()
        q(rp, "RESET cerebro_db.test_hook")
        q(rp, "RESET cerebro_db.replicas")
    assert len(killer.killed) == 1
    fails = q(rp, "SELECT worker, attempt, worker_pid FROM cerebro_db.unit_failures WHERE "
                  "fit_id = %s", (fit_id,))
    assert fails == [(1, 0, killer.killed[0][0])]
    assert q(rp, "SELECT DISTINCT worker FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,)) == [(0,)]
    assert fit_workers(rp, fit_id) == {0: ([0, 1], "closed"), 1: ([0, 1], "lost")}
    assert q(rp, "SELECT options->>'replicas' FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [("2",)]
    check_log(rp, fit_id)
    assert weights(rp, "rp_lost") == baseline
    assert worker_sessions_gone(rp)


def wait_for(conn, sql, args, timeout=240.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = q(conn, sql, args)
        if r and r[0][0]:
            return r[0][0]
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {sql}")


def test_workers_added_and_removed_while_the_fit_runs(rp, baseline, dbname, tables):
    """2 workers; another session asks for 3 after the first unit, then for 1 once the new
    worker has trained a unit. Every unit's first attempt lingers 1 s so the fit is still
    running when the requests come."""
    tables += ["rp_el", "rp_el_info"]
    c2 = connect(dbname)
    c2.autocommit = True
    hook(c2, {"point": "before_train", "seconds": 1})
    errors: list[BaseException] = []
    n0 = q(rp, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]

    def go():
        try:
            fit(c2, "rp_el")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    try:
        fit_id = wait_for(rp, "SELECT max(fit_id) FROM cerebro_db.fits WHERE fit_id > %s AND "
                              "model_output_table = 'rp_el'", (n0,))
        wait_for(rp, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))
        grown_at = q(rp, "SELECT clock_timestamp()")[0][0]
        q(rp, "SELECT cerebro_db_fit_workers(%s, 3)", (fit_id,))
        wait_for(rp, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND worker = 2",
                 (fit_id,))
        assert q(rp, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND kind = "
                     "'train'", (fit_id,))[0][0] < TOTAL_TRAIN, "the fit ended too early"
        q(rp, "SELECT cerebro_db_fit_workers(%s, 1)", (fit_id,))
        t.join(300)
    finally:
        q(c2, "RESET cerebro_db.test_hook")
    assert not t.is_alive() and not errors, errors
    c2.close()
    check_log(rp, fit_id)
    assert weights(rp, "rp_el") == baseline
    assert q(rp, "SELECT count(*) FROM cerebro_db.unit_failures WHERE fit_id = %s",
             (fit_id,)) == [(0,)]
    # the default replicas: the data fits, so every worker holds both partitions
    assert fit_workers(rp, fit_id) == {0: ([0, 1], "closed"), 1: ([0, 1], "removed"),
                                       2: ([0, 1], "removed")}
    # the new worker only ran units after it was asked for
    assert q(rp, "SELECT min(started_at) > %s FROM cerebro_db.units WHERE fit_id = %s AND "
                 "worker = 2", (grown_at, fit_id)) == [(True,)]
    # no unit started on a retired worker after it left
    late = q(rp, "SELECT u.worker, count(*) FROM cerebro_db.units u JOIN cerebro_db.fit_workers "
                 "w USING (fit_id, worker) WHERE u.fit_id = %s AND w.status = 'removed' AND "
                 "u.started_at > w.updated_at GROUP BY 1", (fit_id,))
    assert late == []
    assert q(rp, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND worker = 0 AND "
                 "started_at > (SELECT max(updated_at) FROM cerebro_db.fit_workers WHERE "
                 "fit_id = %s AND status = 'removed')", (fit_id, fit_id))[0][0] > 0
    assert worker_sessions_gone(rp)


def test_default_replicas_follow_the_cache_budget(rp, baseline, tables):
    """Unset (or 'auto'), cerebro_db.replicas gives every worker both partitions when the
    data (600 x 784 features, 1.9 MB) fits a worker's cache budget, else 1; the ring keeps
    to 1 (its schedule is MADlib's). Same models whatever the setting."""
    tables += ["rp_r1", "rp_r1_info", "rp_r1_summary", "rp_small", "rp_small_info",
               "rp_small_summary"]
    base = last_fit(rp, "rp_base")
    opts = "SELECT options->>'replicas' FROM cerebro_db.fits WHERE fit_id = %s"
    assert q(rp, opts, (base,)) == [("2",)]
    assert fit_workers(rp, base) == {0: ([0, 1], "closed"), 1: ([0, 1], "closed")}
    q(rp, "SET cerebro_db.replicas = 1")
    try:
        one = fit(rp, "rp_r1")
    finally:
        q(rp, "RESET cerebro_db.replicas")
    assert q(rp, opts, (one,)) == [("1",)]
    assert fit_workers(rp, one) == {0: ([0], "closed"), 1: ([1], "closed")}
    assert weights(rp, "rp_r1") == baseline
    q(rp, "SET cerebro_db.cache_memory = '1MB'; SET cerebro_db.replicas = 'auto'")
    try:
        small = fit(rp, "rp_small")
    finally:
        q(rp, "RESET cerebro_db.cache_memory; RESET cerebro_db.replicas")
    assert q(rp, opts, (small,)) == [("1",)]
    assert weights(rp, "rp_small") == baseline


def test_fit_workers_refuses(rp, baseline):
    fit_id = last_fit(rp, "rp_base")
    with pytest.raises(psycopg2.Error) as e:
        q(rp, "SELECT cerebro_db_fit_workers(%s, 2)", (fit_id,))
    assert e.value.pgcode == "55000" and "is not running" in e.value.pgerror
    with pytest.raises(psycopg2.Error) as e:
        q(rp, "SELECT cerebro_db_fit_workers(987654321, 2)")
    assert e.value.pgcode == "42704"
    with pytest.raises(psycopg2.Error) as e:
        q(rp, "SELECT cerebro_db_fit_workers(%s, 0)", (fit_id,))
    assert e.value.pgcode == "22023" and "num_workers" in e.value.pgerror
    with pytest.raises(psycopg2.Error) as e:
        q(rp, "SET cerebro_db.replicas = 'two'; SELECT madlib_keras_fit_multiple_model("
              "'rp_p', 'rp_bad', 'rp_mst', 1)")
    q(rp, "RESET cerebro_db.replicas")
    assert e.value.pgcode == "22023" and "cerebro_db.replicas" in e.value.pgerror
    assert "cerebro_db_fit_workers(fit_id, num_workers)" in \
        q(rp, "SELECT cerebro_db_fit_workers()")[0][0]
