"""Fault tolerance of fits against the real server, with real faults: worker sessions
killed (pg_terminate_backend) mid-unit and during their state save, a worker backend
frozen (SIGSTOP) past cerebro_db.unit_timeout, the retry bound, and the coordinator's own
session killed then the fit resumed. After each: the fit is done, the unit log holds every
unit exactly once, and every configuration's weights equal (bitwise) an uninterrupted run
with the same random_state and a single-process replay of its logged visit order.

Units are made to linger at a named point by the superuser-only setting
cerebro_db.test_hook (see cerebro_db/worker.py), so a kill lands where the test wants it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cerebro_db.scheduling import check_invariants

from ..helpers import ROOT, connect, load_mnist_rows, mlp_json, q, worker_sessions_gone
from .test_training import COMPILES, REPLAY, unit_log

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

SEED = 11
ITERATIONS = 2
PARTITIONS = 2
CONFIGS = 2
TOTAL_TRAIN = CONFIGS * ITERATIONS * PARTITIONS


@pytest.fixture(scope="module")
def fl(session_conn):
    """800 MNIST rows over 2 partitions, 200 validation rows, 2 configurations."""
    conn = session_conn
    load_mnist_rows(conn, *(("fl_train", 0, 800), ("fl_test", 800, 1000)))
    q(conn, "DROP TABLE IF EXISTS fl_p, fl_p_summary, fl_v, fl_v_summary, fl_arch, fl_mst, "
            "fl_mst_summary")
    q(conn, "SELECT training_preprocessor_dl('fl_train', 'fl_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, %s, 3)", (PARTITIONS,))
    q(conn, "SELECT validation_preprocessor_dl('fl_test', 'fl_v', 'y', 'x', 'fl_p')")
    q(conn, "SELECT load_keras_model('fl_arch', %s)", (mlp_json(hidden=8),))
    q(conn, "SELECT load_model_selection_table('fl_arch', 'fl_mst', ARRAY[1], %s, %s)",
      (COMPILES, ["batch_size=50"]))
    return conn


def run_fit(conn, out):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('fl_p', %s, 'fl_mst', %s, FALSE, 'fl_v', "
            "1, FALSE, NULL, NULL, TRUE, 'mop', NULL, %s)", (out, ITERATIONS, SEED))
    return last_fit(conn, out)


def last_fit(conn, out):
    return q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s "
                   "ORDER BY fit_id DESC LIMIT 1", (out,))[0][0]


@pytest.fixture(scope="module")
def baseline(fl):
    """An uninterrupted run with the same seed: mst_key -> weights."""
    fit_id = run_fit(fl, "fl_base")
    assert q(fl, "SELECT count(*) FROM cerebro_db.unit_failures WHERE fit_id = %s",
             (fit_id,))[0][0] == 0
    return weights(fl, "fl_base")


def weights(conn, out):
    return {k: bytes(w) for k, w in q(conn, f"SELECT mst_key, model_weights FROM {out}")}


def same_as_baseline(conn, out, baseline) -> list[int]:
    got = weights(conn, out)
    assert sorted(got) == sorted(baseline)
    return [k for k in sorted(got) if got[k] == baseline[k]]


def check_log(conn, fit_id):
    """Every unit exactly once (train, eval_train, eval_valid), and the MOP invariants."""
    rows = q(conn, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                   "cerebro_db.units WHERE fit_id = %s GROUP BY 1 ORDER BY 1", (fit_id,))
    n_eval = CONFIGS * ITERATIONS * PARTITIONS
    assert rows == [("eval_train", n_eval, n_eval), ("eval_valid", n_eval, n_eval),
                    ("train", TOTAL_TRAIN, TOTAL_TRAIN)]
    check_invariants(unit_log(conn, fit_id), num_partitions=PARTITIONS, epochs=ITERATIONS,
                     eval_epochs={1, 2})
    assert q(conn, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]


def replay_equal(dsn, fit_id, out):
    """Each config's stored weights equal a single-process replay of its logged visits."""
    script = REPLAY.replace("FROM mn_p ORDER", "FROM fl_p ORDER").replace(
        "FROM mn_out WHERE", f"FROM {out} WHERE")
    assert script.count("fl_p") == 1 and script.count(out) == 1
    r = subprocess.run([sys.executable, "-c", script, dsn, str(fit_id)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: v[0] for k, v in res.items()} == {str(k): ITERATIONS * PARTITIONS
                                                  for k in range(1, CONFIGS + 1)}
    return [int(k) for k, v in res.items() if v[1]]


class Killer(threading.Thread):
    """Terminates every worker session found sleeping in the test hook (another
    connection, as an operator would), recording what it killed."""

    def __init__(self, dbname: str, action=None) -> None:
        super().__init__(daemon=True)
        self.dbname = dbname
        self.stop = threading.Event()
        self.killed: list[tuple[int, str]] = []
        self.action = action or (lambda cur, pid: cur.execute(
            "SELECT pg_terminate_backend(%s)", (pid,)))

    def run(self) -> None:
        c = connect(self.dbname)
        c.autocommit = True
        seen: set[int] = set()
        try:
            with c.cursor() as cur:
                while not self.stop.is_set():
                    cur.execute("SELECT pid, query FROM pg_stat_activity WHERE application_name "
                                "LIKE 'cerebro_db %% worker %%' AND wait_event = 'PgSleep'")
                    for pid, query in cur.fetchall():
                        if pid not in seen:
                            seen.add(pid)
                            self.action(cur, pid)
                            self.killed.append((pid, query))
                    time.sleep(0.05)
        finally:
            c.close()


def hook(conn, *points):
    q(conn, "SELECT set_config('cerebro_db.test_hook', %s, false)", (json.dumps(list(points)),))


def test_worker_sessions_killed_mid_unit_and_during_save(fl, baseline, dbname, dsn, tables):
    """Kills at three points: before training (mid-unit), after the state save and unit row
    but before commit (during the save), and in an evaluation unit (five worker sessions in
    all), plus the control session once. Each unit is retried on a fresh session; the
    result is the uninterrupted one."""
    tables += ["fl_kill", "fl_kill_info"]
    hook(fl, {"point": "before_train", "mst_key": 1, "epoch": 1, "seconds": 60},
         {"point": "after_save", "mst_key": 2, "epoch": 2, "seconds": 60},
         {"point": "eval", "mst_key": 2, "epoch": 1, "partition": 0, "seconds": 60})
    ctl_killed: list[int] = []

    def kill_ctl_then_worker(cur, pid):
        # the first time, the control session goes too (it records the failure next)
        if not ctl_killed:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name LIKE "
                        "'cerebro_db %% worker ctl'")
            for (c,) in cur.fetchall():
                cur.execute("SELECT pg_terminate_backend(%s)", (c,))
                ctl_killed.append(c)
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))

    killer = Killer(dbname, action=kill_ctl_then_worker)
    killer.start()
    try:
        fit_id = run_fit(fl, "fl_kill")
    finally:
        killer.stop.set()
        killer.join()
        q(fl, "RESET cerebro_db.test_hook")
    # mst 1 epoch 1: both partitions' first attempts slept; mst 2 epoch 2: both too; one eval
    assert len(killer.killed) == 5, killer.killed
    assert len(ctl_killed) == 1
    fails = q(fl, "SELECT mst_key, epoch, partition, kind, attempt, worker_pid FROM "
                  "cerebro_db.unit_failures WHERE fit_id = %s ORDER BY failed_at", (fit_id,))
    assert len(fails) == 5 and all(f[4] == 0 for f in fails)
    assert sorted(f[5] for f in fails) == sorted(p for p, _ in killer.killed)
    assert {(f[0], f[1], f[3]) for f in fails} == {(1, 1, "train"), (2, 2, "train"),
                                                    (2, 1, "eval")}
    check_log(fl, fit_id)
    # the state saved by the killed after_save attempts was rolled back: the units log
    # (hence the replay) has each unit once, and the weights are the uninterrupted ones
    assert same_as_baseline(fl, "fl_kill", baseline) == [1, 2]
    assert replay_equal(dsn, fit_id, "fl_kill") == [1, 2]
    assert worker_sessions_gone(fl)


def fail_by_retry_bound(conn, dbname: str, call) -> pytest.ExceptionInfo:
    """Run ``call`` (a fit) with cerebro_db.max_unit_retries = 1 while configuration 2's
    epoch-2 unit loses its worker session twice (a hook holds it, :class:`Killer` ends the
    session): the fit fails; returns what it raised."""
    hook(conn, {"point": "before_train", "mst_key": 2, "epoch": 2, "attempt": 0, "seconds": 60},
         {"point": "before_train", "mst_key": 2, "epoch": 2, "attempt": 1, "seconds": 60})
    q(conn, "SET cerebro_db.max_unit_retries = 1")
    killer = Killer(dbname)
    killer.start()
    try:
        with pytest.raises(psycopg2.Error) as e:
            call()
    finally:
        killer.stop.set()
        killer.join()
        q(conn, "RESET cerebro_db.test_hook")
        q(conn, "RESET cerebro_db.max_unit_retries")
    return e


def test_retry_bound_fails_the_fit_then_resume_finishes_it(fl, baseline, dbname, tables):
    """With max_unit_retries = 1 a unit whose session dies twice fails the fit (a clear
    error); madlib_keras_fit_resume then finishes it from the catalog."""
    tables += ["fl_bound", "fl_bound_info"]
    e = fail_by_retry_bound(fl, dbname, lambda: run_fit(fl, "fl_bound"))
    assert e.value.pgcode == "08006", e.value.pgerror
    assert "lost its worker session 2 times" in e.value.pgerror
    fit_id = last_fit(fl, "fl_bound")
    st = q(fl, "SELECT status, message FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,))[0]
    assert st[0] == "failed" and "lost its worker session" in st[1]
    done_before = q(fl, "SELECT count(*), max(unit_id) FROM cerebro_db.units WHERE fit_id = %s "
                        "AND kind = 'train'", (fit_id,))[0]
    assert 0 < done_before[0] < TOTAL_TRAIN
    assert worker_sessions_gone(fl)
    q(fl, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    check_log(fl, fit_id)
    assert q(fl, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND kind = 'train' "
                 "AND unit_id <= %s", (fit_id, done_before[1]))[0][0] == done_before[0]
    assert same_as_baseline(fl, "fl_bound", baseline) == [1, 2]
    assert q(fl, "SELECT resumes FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == [(1,)]
    with pytest.raises(psycopg2.Error) as e:
        q(fl, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    assert e.value.pgcode == "55000" and "already done" in e.value.pgerror


def test_frozen_worker_is_ended_after_unit_timeout(fl, baseline, dbname, tables):
    """A worker backend stopped by SIGSTOP hangs its unit; after cerebro_db.unit_timeout the
    coordinator terminates the session and runs the unit on a fresh one."""
    tables += ["fl_hang", "fl_hang_info"]
    stopped: list[int] = []

    def freeze(cur, pid):
        try:
            os.kill(pid, signal.SIGSTOP)
        except PermissionError:
            return
        stopped.append(pid)

    hook(fl, {"point": "before_train", "mst_key": 1, "epoch": 2, "partition": 1,
              "seconds": 1})
    q(fl, "SET cerebro_db.unit_timeout = 20")
    killer = Killer(dbname, action=freeze)
    killer.start()
    try:
        fit_id = run_fit(fl, "fl_hang")
    finally:
        killer.stop.set()
        killer.join()
        for pid in stopped:  # let it see its termination and exit
            os.kill(pid, signal.SIGCONT)
        q(fl, "RESET cerebro_db.test_hook")
        q(fl, "RESET cerebro_db.unit_timeout")
    if not stopped:
        pytest.skip("this test cannot signal the server's processes")
    fails = q(fl, "SELECT mst_key, epoch, partition, worker_pid, message FROM "
                  "cerebro_db.unit_failures WHERE fit_id = %s", (fit_id,))
    assert len(fails) == 1 and fails[0][:4] == (1, 2, 1, stopped[0])
    assert "unit_timeout (20 s)" in fails[0][4]
    check_log(fl, fit_id)
    assert same_as_baseline(fl, "fl_hang", baseline) == [1, 2]
    assert worker_sessions_gone(fl)


def test_coordinator_killed_then_resumed(fl, baseline, dbname, dsn, tables):
    """The coordinator's session is terminated after some units committed; the fit shows as
    interrupted; madlib_keras_fit_resume finishes it without redoing committed units, and
    the weights equal the uninterrupted run's."""
    tables += ["fl_res", "fl_res_info"]
    c2 = connect(dbname)
    c2.autocommit = True
    pid = c2.get_backend_pid()
    # epoch-2 units wait a little, so on a fast machine the fit is still running when the
    # test kills its coordinator (the resumed run has no hook and does not wait)
    hook(c2, {"point": "before_train", "epoch": 2, "seconds": 4})
    errors: list[BaseException] = []

    def go():
        try:
            run_fit(c2, "fl_res")
        except BaseException as e:  # noqa: BLE001 - expected: the session is killed
            errors.append(e)

    n0 = q(fl, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    t = threading.Thread(target=go, daemon=True)
    t.start()
    end = time.monotonic() + 300
    fit_id = None
    while time.monotonic() < end:
        r = q(fl, "SELECT f.fit_id, count(u.*) FROM cerebro_db.fits f LEFT JOIN "
                  "cerebro_db.units u ON u.fit_id = f.fit_id AND u.kind = 'train' WHERE "
                  "f.fit_id > %s AND f.model_output_table = 'fl_res' GROUP BY 1", (n0,))
        if r and r[0][1] >= 3:
            fit_id = r[0][0]
            break
        time.sleep(0.05)
    assert fit_id is not None, "the fit never got going"
    assert q(fl, "SELECT coordinator_pid FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,))[0][0] == pid
    with pytest.raises(psycopg2.Error) as e:  # a live fit cannot be taken over
        q(fl, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    assert e.value.pgcode == "55006" and "still running" in e.value.pgerror
    q(fl, "SELECT pg_terminate_backend(%s)", (pid,))
    t.join(60)
    assert errors and not t.is_alive()
    end = time.monotonic() + 30
    while q(fl, "SELECT status FROM cerebro_db.fit_progress WHERE fit_id = %s",
            (fit_id,))[0][0] != "interrupted":
        assert time.monotonic() < end
        time.sleep(0.1)
    assert q(fl, "SELECT to_regclass('fl_res') IS NULL")[0][0]
    # orphaned workers may still be finishing a unit; the resume ends them first
    q(fl, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    done_before = q(fl, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND kind = "
                        "'train' AND started_at < (SELECT resumed_at FROM cerebro_db.fits "
                        "WHERE fit_id = %s)", (fit_id, fit_id))[0][0]
    assert 3 <= done_before < TOTAL_TRAIN
    check_log(fl, fit_id)
    assert same_as_baseline(fl, "fl_res", baseline) == [1, 2]
    assert replay_equal(dsn, fit_id, "fl_res") == [1, 2]
    info = q(fl, "SELECT mst_key, array_length(training_loss, 1), "
                 "array_length(validation_loss, 1) FROM fl_res_info ORDER BY 1")
    assert info == [(1, 2, 2), (2, 2, 2)]
    base = q(fl, "SELECT mst_key, training_loss, validation_loss FROM fl_base_info ORDER BY 1")
    got = q(fl, "SELECT mst_key, training_loss, validation_loss FROM fl_res_info ORDER BY 1")
    assert got == base
    assert worker_sessions_gone(fl)
    c2.close()


def test_resume_refuses_unknown_fits(fl):
    with pytest.raises(psycopg2.Error) as e:
        q(fl, "SELECT madlib_keras_fit_resume(987654321)")
    assert e.value.pgcode == "42704"
    with pytest.raises(psycopg2.Error) as e:
        q(fl, "SELECT madlib_keras_fit_resume(NULL::bigint)")
    assert e.value.pgcode == "22004"
    assert "madlib_keras_fit_resume(fit_id)" in q(fl, "SELECT madlib_keras_fit_resume()")[0][0]


def test_a_retried_unit_that_its_lost_session_committed_is_taken_from_the_log(fl, baseline):
    """A worker killed (or a stalled session terminated) just after its unit committed: the
    retry finds the unit in the log and answers with the logged result instead of running
    it again (two outside passes saw such fits fail on units_once_idx). Without the retry
    mark, the second run's row hits the unique index; its state is rolled back and the
    logged result stands as well."""
    fit_id = last_fit(fl, "fl_base")
    states = "SELECT version, chunk, md5(data) FROM cerebro_db.model_states WHERE fit_id = %s " \
             "ORDER BY 1, 2"
    before = q(fl, states, (fit_id,))
    logged = q(fl, "SELECT loss, rows FROM cerebro_db.units WHERE fit_id = %s AND mst_key = 1 "
                   "AND epoch = 1 AND partition = 0 AND kind = 'train'", (fit_id,))[0]
    n_units = q(fl, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))
    for opts in ('{"attempt": 1}', "{}"):
        res = json.loads(q(fl, "SELECT cerebro_db.__run_unit(%s, 1, 1, 0, 0, 'train', %s)",
                           (fit_id, opts))[0][0])
        assert res["ok"] and res["from_log"], res
        assert (res["loss"], res["rows"]) == logged
    res = json.loads(q(fl, "SELECT cerebro_db.__run_unit(%s, 2, 2, 1, 0, 'eval', %s)",
                       (fit_id, '{"attempt": 2, "eval_kinds": ["eval_train", "eval_valid"]}'))
                     [0][0])
    assert res["ok"] and res["from_log"] and sorted(res["evals"]) == ["eval_train",
                                                                      "eval_valid"], res
    assert res["evals"]["eval_valid"]["rows"] == 100  # 200 validation rows, half here
    assert q(fl, states, (fit_id,)) == before
    assert q(fl, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,)) \
        == n_units


def test_a_fit_whose_registration_fails_leaves_no_fit_behind(fl):
    """The fit's row and its configurations are one transaction: a failure while the second
    configuration is inserted leaves neither (an outside pass cancelled a fit during its
    registration, sent one statement a configuration, and a resume then finished it as
    done with 3 of its 7 models)."""
    conn = fl
    out = "fl_reg"
    q(conn, f"""CREATE FUNCTION public.fail_second() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 IF NEW.mst_key = {CONFIGS} THEN
                   RAISE EXCEPTION 'registration fails here';
                 END IF;
                 RETURN NEW;
               END $$""")
    q(conn, "CREATE TRIGGER fail_second BEFORE INSERT ON cerebro_db.fit_configs "
            "FOR EACH ROW EXECUTE FUNCTION public.fail_second()")
    try:
        with pytest.raises(psycopg2.Error, match="registration fails here"):
            run_fit(conn, out)
    finally:
        q(conn, "DROP TRIGGER fail_second ON cerebro_db.fit_configs")
        q(conn, "DROP FUNCTION public.fail_second()")
    assert q(conn, "SELECT count(*) FROM cerebro_db.fits WHERE model_output_table LIKE %s",
             (f"%{out}",)) == [(0,)]
    assert q(conn, "SELECT count(*) FROM cerebro_db.fit_configs c WHERE NOT EXISTS (SELECT 1 "
                   "FROM cerebro_db.fits f WHERE f.fit_id = c.fit_id)") == [(0,)]
    assert q(conn, "SELECT to_regclass(%s)", (out,)) == [(None,)]
    worker_sessions_gone(conn)
