"""Fits on a real local Dask cluster (a scheduler and two worker processes on loopback,
logging in to the database with the test role's password from their PGPASSFILE): the same
SQL fit gives bitwise the weights of the sessions executor for a fixed seed, its units
ran in the Dask worker processes, and no password reaches a table or a notice."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from .conftest import fit, q, weights

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def use(conn, executor):
    if executor is None:
        q(conn, "RESET cerebro_db.executor")
    else:
        q(conn, "SET cerebro_db.executor = %s", (executor,))


@pytest.fixture(scope="module")
def sessions_weights(role):
    c = role.connect()
    fit(c, "eq_sessions")
    w = weights(c, "eq_sessions")
    c.close()
    return w


def test_the_test_cluster_listens_on_loopback_only(dask_cluster):
    """Test servers listen on loopback only: ``--no-dashboard`` alone left the scheduler's
    HTTP server on 0.0.0.0:8787 and each worker's on 0.0.0.0 (an outside pass; the
    README's commands said the same)."""
    addrs = dask_cluster.listening()
    assert len(addrs) >= 3, addrs  # the scheduler and each worker, at least
    assert {a.rsplit(":", 1)[0] for a in addrs} <= {"127.0.0.1", "::ffff:127.0.0.1"}, addrs


def test_dask_fit_equals_sessions_fit(role, radmin, dask_cluster, sessions_weights):
    c = role.connect()
    url = "dask://" + dask_cluster.address.split("://")[1]
    use(c, url)
    try:
        fit_id = fit(c, "eq_dask")
    finally:
        use(c, None)
    assert any("units of this fit run on dask://" in n for n in c.notices), c.notices
    # the catalog says what ran the units, and so does the fit's start notice
    assert q(radmin, "SELECT options->>'executor' FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [(url,)]
    assert any(f"2 remote workers on {url}" in n for n in c.notices), c.notices
    assert weights(c, "eq_dask") == sessions_weights
    # every unit once, run by the Dask worker processes' connections as the calling role
    rows = q(radmin, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)), "
                     "array_agg(DISTINCT owner::text) FROM cerebro_db.units WHERE fit_id = %s "
                     "GROUP BY 1 ORDER BY 1", (fit_id,))
    assert [(k, n, d) for k, n, d, _ in rows] == [("eval_train", 4, 4), ("train", 4, 4)]
    assert all(o == [role.name] for *_, o in rows)
    dask_pids = set(dask_cluster.worker_pids().values())
    assert {p for (p,) in q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                            (fit_id,))} <= dask_pids
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    # nothing secret left anywhere the fit wrote
    text = " ".join(str(r) for r in q(radmin, "SELECT f::text FROM cerebro_db.fits f WHERE "
                                              "fit_id = %s", (fit_id,)))
    text += " ".join(c.notices)
    assert role.password not in text
    c.close()


def test_dask_worker_killed_mid_unit(su_role, role, radmin, dask_cluster, sessions_weights):
    """A Dask worker process killed (SIGKILL) while it runs a unit: that unit comes back
    lost and is run again on a live worker (the nanny's restarted process or the other);
    the fit ends done with every unit logged once and the same weights."""
    c = su_role.connect()
    # role's tables first, the output in su_role's own schema
    q(c, f'SET search_path = "{role.name}", "{su_role.name}", public, cerebro_db')
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps(
        {"point": "before_train", "seconds": 30, "mst_key": 1, "epoch": 1, "partition": 0}),))
    out: dict = {}

    def run():
        try:
            out["fit_id"] = fit(c, f'"{su_role.name}".kill_dask')
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        victim = None
        end = time.monotonic() + 120
        while victim is None and time.monotonic() < end and t.is_alive():
            rows = q(radmin, "SELECT w.pid FROM pg_stat_activity a JOIN cerebro_db.fits f ON "
                             "a.application_name LIKE 'cerebro_db ' || "
                             "(f.options->>'executor_tag') || ' worker %%' JOIN "
                             "cerebro_db.fit_workers w ON w.fit_id = f.fit_id AND "
                             "a.application_name = 'cerebro_db ' || (f.options->>'executor_tag') "
                             "|| ' worker ' || w.worker WHERE a.usename = %s AND "
                             "a.wait_event = 'PgSleep'", (su_role.name,))
            if rows:
                victim = rows[0][0]
            else:
                time.sleep(0.2)
        assert victim is not None, ("no unit reached the test hook", q(
            radmin, "SELECT application_name, state, wait_event, query FROM pg_stat_activity "
                    "WHERE usename = %s", (su_role.name,)), str(out.get("error"))[-1500:])
        assert victim in dask_cluster.worker_pids().values()
        os.kill(victim, signal.SIGKILL)
    finally:
        t.join(timeout=300)
    assert not t.is_alive()
    assert "error" not in out, out.get("error")
    fit_id = out["fit_id"]
    rows = q(radmin, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                     "cerebro_db.units WHERE fit_id = %s GROUP BY 1 ORDER BY 1", (fit_id,))
    assert rows == [("eval_train", 4, 4), ("train", 4, 4)]
    fails = q(radmin, "SELECT mst_key, epoch, partition, worker_pid, message FROM "
                      "cerebro_db.unit_failures WHERE fit_id = %s", (fit_id,))
    assert [(m, e, p, pid) for m, e, p, pid, _ in fails] == [(1, 1, 0, victim)], fails
    assert "was lost" in fails[0][4] and su_role.password not in fails[0][4]
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    assert weights(c, f'"{su_role.name}".kill_dask') == sessions_weights
    q(c, "RESET cerebro_db.test_hook")
    use(c, None)
    c.close()
    dask_cluster.wait_workers(2)


CGRID = "{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], 'metrics': ['accuracy']}"


def automl(conn, out):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary, {out}_mst, "
            f"{out}_mst_summary")
    q(conn, "SELECT madlib_keras_automl('rm_p', %s, 'rm_arch', %s, ARRAY[1], %s, %s, 'grid', "
            "'num_iterations=1', %s, NULL, FALSE, NULL, NULL)",
      (out, out + "_mst", CGRID, "{'batch_size': [50, 100]}", 5))
    return q(conn, f"SELECT max(fit_id) FROM {out}_info")[0][0]


def test_automl_on_dask(role, radmin, dask_cluster):
    """AutoML (grid) on Dask: the same configurations as on sessions, each trained on every
    partition once, on the Dask workers. (AutoML's visit order follows which worker is free
    first, so its weights are not compared bitwise.)"""
    c = role.connect()
    automl(c, "am_sessions")
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    try:
        fit_id = automl(c, "am_dask")
    finally:
        use(c, None)
    assert any("units of this fit run on dask://" in n for n in c.notices)
    cols = "mst_key, model_id, compile_params, fit_params"
    assert q(c, f"SELECT {cols} FROM am_dask_info ORDER BY 1") == \
        q(c, f"SELECT {cols} FROM am_sessions_info ORDER BY 1")
    assert len(weights(c, "am_dask")) == 2
    assert q(radmin, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                     "cerebro_db.units WHERE fit_id = %s AND kind = 'train' GROUP BY 1",
             (fit_id,)) == [("train", 4, 4)]
    dask_pids = set(dask_cluster.worker_pids().values())
    assert {p for (p,) in q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                            (fit_id,))} <= dask_pids
    c.close()


def test_cancel_releases_remote_resources(su_role, role, radmin, dask_cluster):
    """cerebro_db_cancel_fit while a unit runs on Dask: the fit ends cancelled, the unit's
    database backend is ended (nothing more is committed), and the scheduler holds no task
    of the fit once its client is closed."""
    c = su_role.connect()
    q(c, f'SET search_path = "{role.name}", "{su_role.name}", public, cerebro_db')
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps(
        {"point": "before_train", "seconds": 60, "mst_key": 1, "epoch": 1}),))
    out: dict = {}
    n0 = q(radmin, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]

    def run():
        try:
            fit(c, f'"{su_role.name}".cancel_dask')
        except psycopg2.Error as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        sleeping, fit_id = [], None
        end = time.monotonic() + 120
        while not sleeping and time.monotonic() < end and t.is_alive():
            # this fit's unit (an earlier test's killed unit may still sleep in its backend)
            rows = q(radmin, "SELECT f.fit_id, a.application_name FROM cerebro_db.fits f JOIN "
                             "pg_stat_activity a ON a.application_name LIKE 'cerebro_db ' || "
                             "(f.options->>'executor_tag') || ' worker %%' WHERE "
                             "f.fit_id > %s AND f.owner = %s AND a.wait_event = 'PgSleep'",
                     (n0, su_role.name))
            if rows:
                fit_id, sleeping = rows[0][0], [(rows[0][1],)]
            time.sleep(0.2)
        assert sleeping, "no unit reached the test hook"
        q(radmin, "SELECT cerebro_db.cerebro_db_cancel_fit(%s)", (fit_id,))
    finally:
        t.join(timeout=120)
    assert not t.is_alive(), q(radmin, "SELECT pid, application_name, state, wait_event, "
                                       "left(query, 200) FROM pg_stat_activity WHERE "
                                       "usename = %s", (su_role.name,))
    assert out["error"].pgcode == "57014", out["error"].pgerror
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("cancelled",)]
    units = q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))
    end = time.monotonic() + 30
    while True:
        left = q(radmin, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                 (sleeping[0][0],))[0][0]
        with dask_cluster.client() as dc:
            tasks = dc.run_on_scheduler(lambda dask_scheduler: sorted(
                (k, ts.state) for k, ts in dask_scheduler.tasks.items()))
        if (left, tasks) == (0, []) or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert (left, tasks) == (0, [])
    time.sleep(1)
    assert q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,)) == units
    q(c, "RESET cerebro_db.test_hook")
    use(c, None)
    c.close()


def test_stalled_remote_unit_is_ended_and_retried(su_role, role, radmin, dask_cluster,
                                                  sessions_weights):
    """A unit past cerebro_db.unit_timeout on Dask: its database backend is terminated, the
    unit comes back lost and runs again; the fit is done with the same weights."""
    c = su_role.connect()
    q(c, f'SET search_path = "{role.name}", "{su_role.name}", public, cerebro_db')
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    q(c, "SET cerebro_db.unit_timeout = 15")
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps(
        {"point": "before_train", "seconds": 120, "mst_key": 1, "epoch": 2, "partition": 1}),))
    try:
        t0 = time.monotonic()
        fit_id = fit(c, f'"{su_role.name}".stall_dask')
        assert time.monotonic() - t0 < 100
    finally:
        q(c, "RESET cerebro_db.test_hook")
        q(c, "RESET cerebro_db.unit_timeout")
        use(c, None)
    fails = q(radmin, "SELECT mst_key, epoch, partition, message FROM cerebro_db.unit_failures "
                      "WHERE fit_id = %s", (fit_id,))
    assert [f[:3] for f in fails] == [(1, 2, 1)], fails
    assert "cerebro_db.unit_timeout (15 s)" in fails[0][3]
    assert q(radmin, "SELECT count(*), count(DISTINCT (mst_key, epoch, partition, kind)) FROM "
                     "cerebro_db.units WHERE fit_id = %s", (fit_id,)) == [(8, 8)]
    assert weights(c, f'"{su_role.name}".stall_dask') == sessions_weights
    c.close()


def test_workers_added_and_removed_on_dask(su_role, role, radmin, dask_cluster,
                                           sessions_weights):
    """cerebro_db_fit_workers from another session grows a Dask fit from 2 workers to 3
    (a new remote worker slot), then shrinks it to 1; no unit fails, the weights are the
    sessions executor's."""
    c = su_role.connect()
    q(c, f'SET search_path = "{role.name}", "{su_role.name}", public, cerebro_db')
    use(c, "dask://" + dask_cluster.address.split("://")[1])
    q(c, "SET cerebro_db.replicas = 2")
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps({"point": "before_train", "seconds": 1}),))
    n0 = q(radmin, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    errors: list = []

    def go():
        try:
            fit(c, f'"{su_role.name}".elastic_dask')
        except psycopg2.Error as e:
            errors.append(e)

    def wait_for(sql, args):
        end = time.monotonic() + 120
        while time.monotonic() < end:
            r = q(radmin, sql, args)
            if r and r[0][0]:
                return r[0][0]
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for: {sql}")

    t = threading.Thread(target=go)
    t.start()
    try:
        fit_id = wait_for("SELECT max(fit_id) FROM cerebro_db.fits WHERE fit_id > %s AND "
                          "owner = %s", (n0, su_role.name))
        wait_for("SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))
        q(radmin, "SELECT cerebro_db.cerebro_db_fit_workers(%s, 3)", (fit_id,))
        wait_for("SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND worker = 2",
                 (fit_id,))
        q(radmin, "SELECT cerebro_db.cerebro_db_fit_workers(%s, 1)", (fit_id,))
    finally:
        t.join(timeout=300)
        for s in ("test_hook", "replicas"):
            q(c, f"RESET cerebro_db.{s}")
        use(c, None)
    assert not t.is_alive() and not errors, errors
    assert q(radmin, "SELECT count(*), count(DISTINCT (mst_key, epoch, partition, kind)) FROM "
                     "cerebro_db.units WHERE fit_id = %s", (fit_id,)) == [(8, 8)]
    assert q(radmin, "SELECT count(*) FROM cerebro_db.unit_failures WHERE fit_id = %s",
             (fit_id,)) == [(0,)]
    statuses = dict(q(radmin, "SELECT worker, status FROM cerebro_db.fit_workers WHERE "
                              "fit_id = %s", (fit_id,)))
    assert statuses == {0: "closed", 1: "removed", 2: "removed"}, statuses
    dask_pids = set(dask_cluster.worker_pids().values())
    assert {p for (p,) in q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                            (fit_id,))} <= dask_pids
    assert weights(c, f'"{su_role.name}".elastic_dask') == sessions_weights
    c.close()
