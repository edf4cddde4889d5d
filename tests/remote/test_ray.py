"""Fits on a real local Ray cluster (``ray start --head`` on loopback, 2 CPUs; the actors log
in to the database with the test role's password from their PGPASSFILE): the same SQL fit
gives bitwise the weights of the sessions executor for a fixed seed, its units ran in the
Ray actors' processes and every actor is gone after the fit; a small AutoML run; an actor
process killed mid-unit loses only that unit, which is retried on a new actor, and the fit
still gives the sessions executor's weights."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from .conftest import fit, q, weights

pytestmark = pytest.mark.db

pytest.importorskip("ray")


CGRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': "
         "['Adam'], 'lr': [0.001, 0.05, 'log']}], 'metrics': ['accuracy']}")


def use(conn, executor):
    if executor is None:
        q(conn, "RESET cerebro_db.executor")
    else:
        q(conn, "SET cerebro_db.executor = %s", (executor,))


def wait_until(pred, timeout: float = 60.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < end, f"{what} not met within {timeout:g} s"
        time.sleep(0.1)


class ActorWatch(threading.Thread):
    """Records the pids of the cluster's actor processes while a fit runs."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.cluster, self.seen, self.halt = cluster, set(), threading.Event()
        self.t0, self.first = time.monotonic(), {}  # pid: (seconds from start, command line)

    def run(self) -> None:
        while not self.halt.is_set():
            pids = self.cluster.worker_pids()
            if set(pids) - self.seen:
                cmds = self.cluster.pids()
                for p in set(pids) - self.seen:
                    self.first[p] = (round(time.monotonic() - self.t0, 2), cmds.get(p))
            self.seen.update(pids)
            self.halt.wait(0.1)

    def stop(self) -> set[int]:
        self.halt.set()
        self.join()
        return self.seen


@pytest.fixture(scope="module")
def sessions_weights(role):
    c = role.connect()
    fit(c, "ray_eq_sessions")
    w = weights(c, "ray_eq_sessions")
    c.close()
    return w


def unit_counts(admin, fit_id):
    return q(admin, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)), "
                    "array_agg(DISTINCT owner::text) FROM cerebro_db.units WHERE fit_id = %s "
                    "GROUP BY 1 ORDER BY 1", (fit_id,))


def test_ray_fit_equals_sessions_fit(role, radmin, ray_cluster, sessions_weights):
    c = role.connect()
    use(c, ray_cluster.client_address)
    watch = ActorWatch(ray_cluster)
    watch.start()
    try:
        fit_id = fit(c, "ray_eq")
    finally:
        seen = watch.stop()
        use(c, None)
    assert any(f"units of this fit run on {ray_cluster.client_address}" in n
               for n in c.notices), c.notices
    assert weights(c, "ray_eq") == sessions_weights
    rows = unit_counts(radmin, fit_id)
    assert [(k, n, d) for k, n, d, _ in rows] == [("eval_train", 4, 4), ("train", 4, 4)]
    assert all(o == [role.name] for *_, o in rows)
    # the units ran in the actors' processes, one per worker slot
    pids = {p for (p,) in q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                            (fit_id,))}
    assert len(pids) == 2 and pids <= seen, (pids, seen)
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    # the fit released its actors
    wait_until(lambda: ray_cluster.worker_pids() == [], 30, "actors gone")
    text = " ".join(str(r) for r in q(radmin, "SELECT f::text FROM cerebro_db.fits f WHERE "
                                              "fit_id = %s", (fit_id,)))
    assert role.password not in text + " ".join(c.notices)
    c.close()


def test_automl_on_ray(role, radmin, ray_cluster):
    c = role.connect()
    q(c, "DROP TABLE IF EXISTS ray_am, ray_am_info, ray_am_summary, ray_am_mst, "
         "ray_am_mst_summary")
    use(c, ray_cluster.client_address)
    try:
        q(c, "SELECT madlib_keras_automl('rm_p', 'ray_am', 'rm_arch', 'ray_am_mst', ARRAY[1], "
             "%s, %s, 'hyperband', 'R=2, eta=2, skip_last=1', 5)",
          (CGRID, "{'batch_size': [50]}"))
    finally:
        use(c, None)
    assert any(f"units of this fit run on {ray_cluster.client_address}" in n
               for n in c.notices), c.notices
    fit_id = q(c, "SELECT max(fit_id) FROM ray_am_info")[0][0]
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    info = q(c, "SELECT mst_key, training_loss_final FROM ray_am_info ORDER BY mst_key")
    assert len(info) == 2 and all(loss is not None for _, loss in info)
    # every training unit once
    dup = q(radmin, "SELECT count(*) - count(DISTINCT (mst_key, epoch, partition)) FROM "
                    "cerebro_db.units WHERE fit_id = %s AND kind = 'train'", (fit_id,))[0][0]
    assert dup == 0
    wait_until(lambda: ray_cluster.worker_pids() == [], 30, "actors gone")
    c.close()


@pytest.mark.slow
def test_killed_actor_mid_fit_loses_one_unit(role, su_role, radmin, ray_cluster,
                                             sessions_weights):
    """The superuser's fit (on the role's tables) holds unit (1, epoch 2, partition 0) at
    ``before_train`` for 20 s on its first attempt; the actor running it is killed
    (SIGKILL) there. The unit is logged as a failure, retried on a new actor, and the fit
    ends with every unit once and the sessions executor's weights."""
    su = su_role.connect()
    q(radmin, f'GRANT USAGE ON SCHEMA "{role.name}" TO "{su_role.name}"')
    # the role's tables (rm_p, rm_mst and the rm_arch its summary names) first
    q(su, f'SET search_path = "{su_role.name}", "{role.name}", public, cerebro_db')
    hook = {"point": "before_train", "mst_key": 1, "epoch": 2, "partition": 0, "seconds": 20}
    q(su, "SELECT set_config('cerebro_db.test_hook', %s, false)", (json.dumps([hook]),))
    use(su, ray_cluster.client_address)
    out: dict = {}

    def run() -> None:
        try:
            out["fit_id"] = fit(su, "ray_kill")
        except Exception as e:  # noqa: BLE001 - reported by the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    watch = ActorWatch(ray_cluster)
    watch.start()
    t.start()
    try:
        # the hooked unit sleeps in its remote worker's database session
        def hooked():
            assert t.is_alive(), f"the fit ended before the kill: {out}"
            return q(radmin, "SELECT application_name FROM pg_stat_activity WHERE usename = %s "
                             "AND query LIKE %s", (su_role.name, "%pg_sleep%"))

        app = wait_until(hooked, 120, "hooked unit")[0][0]
        worker = int(app.rsplit(" ", 1)[1])
        fit_id = q(radmin, "SELECT max(fit_id) FROM cerebro_db.fits WHERE owner = %s",
                   (su_role.name,))[0][0]
        pid = q(radmin, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s AND "
                        "worker = %s", (fit_id, worker))[0][0]
        assert pid in ray_cluster.worker_pids()
        os.kill(pid, signal.SIGKILL)
        t.join(240)
        assert not t.is_alive(), "the fit did not end"
    finally:
        seen = watch.stop()
        q(su, "RESET cerebro_db.test_hook")
        use(su, None)
    assert "error" not in out, out.get("error")
    assert out["fit_id"] == fit_id
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    failures = q(radmin, "SELECT mst_key, epoch, partition, message FROM "
                         "cerebro_db.unit_failures WHERE fit_id = %s", (fit_id,))
    assert [(k, e, p) for k, e, p, _ in failures] == [(1, 2, 0)], failures
    assert "lost" in failures[0][3]
    rows = unit_counts(radmin, fit_id)
    assert [(k, n, d) for k, n, d, _ in rows] == [("eval_train", 4, 4), ("train", 4, 4)]
    # a new actor took the killed one's slot
    assert pid in seen and len(seen) == 3, (
        pid, watch.first, su.notices,
        q(radmin, "SELECT worker, pid, status FROM cerebro_db.fit_workers WHERE fit_id = %s",
          (fit_id,)))
    # the killed actor's database backend (asleep in the hook) was ended, not left to run
    assert q(radmin, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                     "wait_event = 'PgSleep'", (su_role.name,)) == [(0,)]
    assert weights(su, "ray_kill") == sessions_weights
    wait_until(lambda: ray_cluster.worker_pids() == [], 30, "actors gone")
    su.close()


def test_cancel_releases_ray_actors(su_role, role, radmin, ray_cluster):
    """cerebro_db_cancel_fit while a unit runs on Ray: the fit ends cancelled (57014), the
    unit's database backend is ended (nothing more is committed) and every actor of the fit
    is gone."""
    c = su_role.connect()
    q(c, f'SET search_path = "{su_role.name}", "{role.name}", public, cerebro_db')
    use(c, ray_cluster.client_address)
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps(
        {"point": "before_train", "seconds": 60, "mst_key": 1, "epoch": 1}),))
    out: dict = {}

    def run() -> None:
        try:
            fit(c, f'"{su_role.name}".ray_cancel')
        except Exception as e:  # noqa: BLE001 - checked below
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        def sleeping():
            assert t.is_alive(), f"the fit ended before the cancel: {out}"
            return q(radmin, "SELECT application_name FROM pg_stat_activity WHERE "
                             "usename = %s AND wait_event = 'PgSleep'", (su_role.name,))

        app = wait_until(sleeping, 120, "hooked unit")[0][0]
        assert len(ray_cluster.worker_pids()) == 2
        fit_id = q(radmin, "SELECT max(fit_id) FROM cerebro_db.fits WHERE owner = %s",
                   (su_role.name,))[0][0]
        q(radmin, "SELECT cerebro_db.cerebro_db_cancel_fit(%s)", (fit_id,))
        t.join(120)
        assert not t.is_alive(), "the fit did not end"
    finally:
        q(c, "RESET cerebro_db.test_hook")
        use(c, None)
    assert getattr(out.get("error"), "pgcode", None) == "57014", out
    assert q(radmin, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("cancelled",)]
    units = q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))
    wait_until(lambda: ray_cluster.worker_pids() == [], 30, "actors gone")
    try:
        wait_until(lambda: q(radmin, "SELECT count(*) FROM pg_stat_activity WHERE "
                                     "application_name = %s", (app,))[0][0] == 0, 30,
                   "the unit's backend ended")
    except AssertionError:
        raise AssertionError(str(q(radmin, "SELECT pid, usename, application_name, state, "
                                           "wait_event, backend_start, query FROM "
                                           "pg_stat_activity WHERE usename = %s",
                                   (su_role.name,))) + " app=" + app) from None
    time.sleep(1)
    assert q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,)) == units
    c.close()


@pytest.mark.slow
def test_workers_on_ray_grow_refused_when_full_then_shrink(su_role, role, radmin, ray_cluster,
                                                           sessions_weights):
    """cerebro_db_fit_workers from another session asks a Ray fit (on a 2-CPU cluster, both
    CPUs taken) for a third worker: the cluster has no free CPU, so the join is refused at
    once (worker 2 'lost') and the fit goes on; then it shrinks to 1 worker. No unit fails,
    the weights are the sessions executor's."""
    c = su_role.connect()
    q(c, f'SET search_path = "{su_role.name}", "{role.name}", public, cerebro_db')
    use(c, ray_cluster.client_address)
    q(c, "SET cerebro_db.replicas = 2")
    q(c, "SET cerebro_db.test_hook = %s", (json.dumps({"point": "before_train", "seconds": 1}),))
    n0 = q(radmin, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    out: dict = {}

    def go() -> None:
        try:
            fit(c, f'"{su_role.name}".elastic_ray')
        except Exception as e:  # noqa: BLE001 - checked below
            out["error"] = e

    def one(sql, args):
        r = q(radmin, sql, args)
        return r[0][0] if r and r[0][0] else None

    t = threading.Thread(target=go, daemon=True)
    t.start()
    try:
        fit_id = wait_until(lambda: one("SELECT max(fit_id) FROM cerebro_db.fits WHERE "
                                        "fit_id > %s AND owner = %s", (n0, su_role.name)),
                            120, "the fit")
        wait_until(lambda: one("SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
                               (fit_id,)), 120, "a unit")
        q(radmin, "SELECT cerebro_db.cerebro_db_fit_workers(%s, 3)", (fit_id,))
        wait_until(lambda: one("SELECT status FROM cerebro_db.fit_workers WHERE fit_id = %s "
                               "AND worker = 2 AND status = 'lost'", (fit_id,)), 60,
                   "worker 2 refused")
        q(radmin, "SELECT cerebro_db.cerebro_db_fit_workers(%s, 1)", (fit_id,))
        t.join(300)
    finally:
        for s in ("test_hook", "replicas"):
            q(c, f"RESET cerebro_db.{s}")
        use(c, None)
    assert not t.is_alive() and "error" not in out, out
    assert q(radmin, "SELECT count(*), count(DISTINCT (mst_key, epoch, partition, kind)) FROM "
                     "cerebro_db.units WHERE fit_id = %s", (fit_id,)) == [(8, 8)]
    assert q(radmin, "SELECT count(*) FROM cerebro_db.unit_failures WHERE fit_id = %s",
             (fit_id,)) == [(0,)]
    assert q(radmin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND worker = 2",
             (fit_id,)) == [(0,)]
    statuses = dict(q(radmin, "SELECT worker, status FROM cerebro_db.fit_workers WHERE "
                              "fit_id = %s", (fit_id,)))
    assert statuses == {0: "closed", 1: "removed", 2: "lost"}, statuses
    assert weights(c, f'"{su_role.name}".elastic_ray') == sessions_weights
    wait_until(lambda: ray_cluster.worker_pids() == [], 30, "actors gone")
    c.close()
