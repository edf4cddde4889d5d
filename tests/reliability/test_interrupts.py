"""Interrupts and concurrency of fits against the real server.

* a query cancel of the coordinator (pg_cancel_backend, statement_timeout) and
  cerebro_db_cancel_fit stop the fit promptly: 57014, the fit 'cancelled', no worker session
  left, committed units kept, and madlib_keras_fit_resume finishes it;
* DROP TABLE / TRUNCATE / ALTER TABLE RENAME of the source table while a fit runs fail the
  fit within seconds (40P01, naming the DDL's session) instead of hanging, and the DDL
  then goes through;
* the control session terminated mid-fit is reopened: the fit finishes done;
* a stopped (SIGSTOP) worker is detected by default from the measured unit times;
* the 'done' mark follows the caller's transaction: ROLLBACK leaves a resumable fit whose
  resume writes the outputs, COMMIT leaves it done with its outputs.

Units linger where a test wants them through the superuser-only cerebro_db.test_hook
(see cerebro_db/worker.py); every test runs as a superuser (the ``admin`` connection).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from ..helpers import connect, mlp_json, q, worker_sessions_gone
from .conftest import load_mnist

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

PARTITIONS = 2
ITERATIONS = 2
COMPILES = [("loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.05)', "
             "metrics=['accuracy']"),
            ("loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
             "metrics=['accuracy']")]
TOTAL_TRAIN = len(COMPILES) * ITERATIONS * PARTITIONS


@pytest.fixture(scope="module")
def it(admin):
    """400 Fashion-MNIST rows packed over 2 partitions, 100 validation rows, 2 configurations
    of a tiny MLP."""
    q(admin, "DROP TABLE IF EXISTS it_rows, it_vrows, it_p, it_p_summary, it_v, it_v_summary, "
             "it_arch, it_mst, it_mst_summary")
    load_mnist(admin, "it_rows", 0, 400)
    load_mnist(admin, "it_vrows", 400, 500)
    pack(admin, "it_p")
    q(admin, "SELECT validation_preprocessor_dl('it_vrows', 'it_v', 'y', 'x', 'it_p')")
    q(admin, "SELECT load_keras_model('it_arch', %s)", (mlp_json(hidden=4),))
    q(admin, "SELECT load_model_selection_table('it_arch', 'it_mst', ARRAY[1], %s, %s)",
      (COMPILES, ["batch_size=50"]))
    return admin


def pack(conn, table):
    q(conn, f"DROP TABLE IF EXISTS {table}, {table}_summary")
    q(conn, "SELECT training_preprocessor_dl('it_rows', %s, 'y', 'x', NULL, 255.0, NULL, NULL, "
            "%s, 5)", (table, PARTITIONS))


def drop_outputs(conn, out):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")


FIT_SQL = ("SELECT madlib_keras_fit_multiple_model(%s, %s, 'it_mst', %s, FALSE, 'it_v', 1, "
           "FALSE, NULL, NULL, TRUE, 'mop', NULL, 7)")


def fit(conn, out, source="it_p"):
    q(conn, FIT_SQL, (source, out, ITERATIONS))


def hook_sql(*points) -> str:
    """The statement that sets cerebro_db.test_hook to ``points`` in a session."""
    return ("SELECT set_config('cerebro_db.test_hook', "
            f"'{json.dumps(list(points))}', false)")


def last_fit(conn, out):
    r = q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s ORDER BY "
                "fit_id DESC LIMIT 1", (out,))
    return r[0][0] if r else None


def train_units(conn, fit_id):
    return q(conn, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND kind = 'train'",
             (fit_id,))[0][0]


def check_done(conn, fit_id, out):
    """Done, every unit once, outputs with every configuration."""
    assert q(conn, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    rows = q(conn, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                   "cerebro_db.units WHERE fit_id = %s GROUP BY 1 ORDER BY 1", (fit_id,))
    assert rows == [("eval_train", TOTAL_TRAIN, TOTAL_TRAIN),
                    ("eval_valid", TOTAL_TRAIN, TOTAL_TRAIN),
                    ("train", TOTAL_TRAIN, TOTAL_TRAIN)]
    assert q(conn, f"SELECT count(*) FROM {out}")[0][0] == len(COMPILES)
    assert q(conn, f"SELECT count(*) FROM {out}_info")[0][0] == len(COMPILES)


class Background:
    """A fit run in another connection (a thread), as a user's session would."""

    def __init__(self, dbname, out, source="it_p", setup=()):
        self.conn = connect(dbname)
        self.conn.autocommit = True
        self.pid = self.conn.get_backend_pid()
        for sql in setup:
            q(self.conn, sql)
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self.out, self.source = out, source
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        t = time.monotonic()
        try:
            fit(self.conn, self.out, self.source)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e
        self.seconds = time.monotonic() - t

    def start(self):
        self.t0 = time.monotonic()
        self.thread.start()
        return self

    def join(self, timeout):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the fit did not end"

    def close(self):
        """Close the connection; a fit still running (a failed test) is ended first."""
        if self.thread.is_alive():
            end_backend(self.conn.info.dbname, self.pid)
            self.thread.join(60)
        self.conn.close()


def end_backend(dbname, pid):
    c = connect(dbname)
    c.autocommit = True
    try:
        q(c, "SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        c.close()


def wait_for(pred, timeout=120.0, what="condition"):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def started(conn, out, n0, units=1):
    """The fit of ``out`` after fit_id n0 once it committed ``units`` training units (0:
    once it is registered)."""
    def pred():
        r = q(conn, "SELECT f.fit_id, count(u.*) FROM cerebro_db.fits f LEFT JOIN "
                    "cerebro_db.units u ON u.fit_id = f.fit_id AND u.kind = 'train' WHERE "
                    "f.fit_id > %s AND f.model_output_table = %s GROUP BY 1", (n0, out))
        return r[0][0] if r and r[0][1] >= units else None
    return wait_for(pred, what=f"{units} units of {out}")


def max_fit(conn):
    return q(conn, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]


SLOW_EPOCH2 = {"point": "before_train", "epoch": 2, "seconds": 300}


def cancelled_then_resumed(conn, fit_id, out, min_units=1):
    st, msg = q(conn, "SELECT status, message FROM cerebro_db.fits WHERE fit_id = %s",
                (fit_id,))[0]
    assert st == "cancelled", (st, msg)
    assert f"madlib_keras_fit_resume({fit_id})" in msg
    assert q(conn, "SELECT status FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (fit_id,)) == [("cancelled",)]
    assert worker_sessions_gone(conn, 15.0)
    done = train_units(conn, fit_id)
    assert min_units <= done < TOTAL_TRAIN
    assert q(conn, "SELECT to_regclass(%s) IS NULL", (out,))[0][0]
    q(conn, "RESET cerebro_db.test_hook")
    q(conn, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    check_done(conn, fit_id, out)


def test_pg_cancel_backend_cancels_the_fit(it, rel_db):
    """pg_cancel_backend of the coordinator (its units sleeping in epoch 2) ends the fit
    within seconds with 57014; the fit is cancelled, its sessions closed, and a resume
    finishes it."""
    out = "it_pc"
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[
        hook_sql(SLOW_EPOCH2)])
    bg.start()
    try:
        fit_id = started(it, out, n0, units=PARTITIONS)
        wait_for(lambda: q(it, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                               "LIKE 'cerebro_db %% worker %%' AND wait_event = 'PgSleep'")[0][0],
                 what="a unit sleeping in epoch 2")
        t = time.monotonic()
        assert q(it, "SELECT pg_cancel_backend(%s)", (bg.pid,))[0][0]
        bg.join(60)
        assert time.monotonic() - t < 15
    finally:
        bg.close()
    assert isinstance(bg.error, psycopg2.Error)
    assert bg.error.pgcode == "57014", bg.error.pgerror
    assert bg.error.pgerror.startswith("ERROR:  canceling statement due to user request\n"), \
        bg.error.pgerror  # no PL/Python prefix (spiexceptions.QueryCanceled: ...)
    assert bg.error.diag.message_hint.endswith(f"madlib_keras_fit_resume({fit_id})."), \
        bg.error.pgerror
    cancelled_then_resumed(it, fit_id, out)


def test_a_resume_is_cancellable_while_its_workers_start(it, rel_db):
    """A resume takes the fit over as soon as its sessions are open: while its (cold) worker
    sessions still run their checks, the fit shows 'running' and cerebro_db_cancel_fit
    returns true and stops it (57014), where it used to show 'cancelled' for those seconds
    and return false, and the resume then ran to its end."""
    out = "it_rc"
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[hook_sql(SLOW_EPOCH2)])
    bg.start()
    try:
        fit_id = started(it, out, n0, units=PARTITIONS)
        assert q(it, "SELECT cerebro_db_cancel_fit(%s)", (fit_id,)) == [(True,)]
        bg.join(60)
    finally:
        bg.close()
    assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("cancelled",)]
    conn = connect(rel_db)  # a new session: no kept worker sessions, so a cold start
    conn.autocommit = True
    errors: list[BaseException] = []

    def resume():
        try:
            q(conn, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            errors.append(e)

    t = threading.Thread(target=resume, daemon=True)
    t.start()
    try:
        wait_for(lambda: q(it, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                               "AND application_name LIKE 'cerebro_db %%' "
                               "AND query LIKE '%%__check_fit%%'")[0][0],
                 what="the resume's workers checking the fit")
        assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
            [("running",)]
        assert q(it, "SELECT cerebro_db_cancel_fit(%s)", (fit_id,)) == [(True,)]
        t.join(60)
        assert not t.is_alive()
    finally:
        if t.is_alive():
            end_backend(rel_db, conn.get_backend_pid())
            t.join(60)
        conn.close()
    assert len(errors) == 1 and getattr(errors[0], "pgcode", None) == "57014", errors
    assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("cancelled",)]
    q(it, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    check_done(it, fit_id, out)


def test_statement_timeout_cancels_the_fit(it, rel_db):
    """statement_timeout of the calling session bounds the whole fit: 57014 after the
    timeout, not a fit that runs on (and reports done) past it. (Where the timeout lands,
    in epoch 1 or in the sleeping epoch 2, depends on the machine's load.)"""
    out = "it_st"
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[
        hook_sql(SLOW_EPOCH2),
        "SET statement_timeout = '20s'"])
    bg.start()
    try:
        fit_id = started(it, out, n0, units=0)
        bg.join(90)
    finally:
        bg.close()
    assert isinstance(bg.error, psycopg2.Error)
    assert bg.error.pgcode == "57014", bg.error.pgerror
    assert bg.error.pgerror.startswith("ERROR:  canceling statement due to statement "
                                       "timeout\n"), bg.error.pgerror
    assert bg.seconds < 35, bg.seconds
    cancelled_then_resumed(it, fit_id, out, min_units=0)


def test_cerebro_db_cancel_fit(it, rel_db, admin):
    """cerebro_db_cancel_fit from another session: false for a fit that is not running,
    hidden from another role (42704), true for the running fit, which stops with 57014
    within seconds; cancelled, resumable, no worker session left."""
    out = "it_cf"
    drop_outputs(it, out)
    with pytest.raises(psycopg2.Error) as e:
        q(it, "SELECT cerebro_db_cancel_fit(NULL)")
    assert e.value.pgcode == "22004"
    with pytest.raises(psycopg2.Error) as e:
        q(it, "SELECT cerebro_db_cancel_fit(987654321)")
    assert e.value.pgcode == "42704"
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[
        hook_sql(SLOW_EPOCH2)])
    bg.start()
    role = f"it_other_{os.getpid()}"
    q(admin, f'CREATE ROLE "{role}" LOGIN')
    q(admin, f'GRANT USAGE ON SCHEMA cerebro_db TO "{role}"')
    try:
        fit_id = started(it, out, n0, units=PARTITIONS)
        other = connect(rel_db, role, autocommit=True)
        try:
            with pytest.raises(psycopg2.Error) as e:
                q(other, "SELECT cerebro_db.cerebro_db_cancel_fit(%s)", (fit_id,))
            assert e.value.pgcode == "42704"
        finally:
            other.close()
        t = time.monotonic()
        assert q(it, "SELECT cerebro_db_cancel_fit(%s)", (fit_id,)) == [(True,)]
        bg.join(60)
        assert time.monotonic() - t < 15
    finally:
        bg.close()
        q(admin, f'DROP OWNED BY "{role}"')
        q(admin, f'DROP ROLE "{role}"')
    assert isinstance(bg.error, psycopg2.Error)
    assert bg.error.pgcode == "57014", bg.error.pgerror
    assert bg.error.pgerror.startswith(f"ERROR:  canceling fit {fit_id}"), bg.error.pgerror
    assert q(it, "SELECT cerebro_db_cancel_fit(%s)", (fit_id,)) == [(False,)]
    cancelled_then_resumed(it, fit_id, out)
    assert q(it, "SELECT cancel_requested FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [(None,)]


@pytest.mark.parametrize("ddl", ["DROP TABLE {t}", "TRUNCATE {t}",
                                 "ALTER TABLE {t} RENAME TO {t}_renamed",
                                 "VACUUM FULL cerebro_db.fits"])
def test_ddl_on_the_source_during_a_fit_fails_it_not_hangs(it, rel_db, ddl):
    """DDL on the source table (or a DBA's VACUUM FULL of a catalog table) while a fit runs
    queues behind the fit's lock and the workers and the control session queue behind the
    DDL: the fit fails within seconds (40P01, naming the DDL's session) and the DDL then
    completes (the VACUUM FULL hung the fit for good before: its control session waited
    inside dblink)."""
    src = "it_ddl"
    out = "it_ddl_out"
    pack(it, src)
    q(it, f"DROP TABLE IF EXISTS {src}_renamed")
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, source=src, setup=[
        hook_sql({"point": "before_train", "epoch": 2, "seconds": 2})])
    bg.start()
    ddl_conn = connect(rel_db)
    ddl_conn.autocommit = True
    ddl_pid = ddl_conn.get_backend_pid()
    ddl_error: list[BaseException] = []
    ddl_done = threading.Event()

    def run_ddl():
        try:
            q(ddl_conn, ddl.format(t=src))
        except BaseException as e:  # noqa: BLE001
            ddl_error.append(e)
        ddl_done.set()

    try:
        fit_id = started(it, out, n0, units=PARTITIONS)  # both workers past their start
        t = time.monotonic()
        threading.Thread(target=run_ddl, daemon=True).start()
        bg.join(60)
        took = time.monotonic() - t
        assert ddl_done.wait(30), "the DDL did not complete after the fit failed"
    finally:
        bg.close()
        if not ddl_done.wait(10):
            end_backend(rel_db, ddl_pid)
        ddl_conn.close()
    assert not ddl_error, ddl_error
    assert isinstance(bg.error, psycopg2.Error), bg.error
    assert bg.error.pgcode == "40P01", bg.error.pgerror
    assert f"session {ddl_pid}" in bg.error.pgerror
    assert ddl.split()[0] in bg.error.pgerror  # the blocking statement is named
    assert took < 20, took
    if "cerebro_db.fits" in ddl:
        # the failure cannot be recorded while the VACUUM holds the fits table: the fit shows
        # 'interrupted' (running, no coordinator), and resumes like one; 'running' until the
        # closed caller's backend has gone (a moment on a loaded machine)
        end = time.monotonic() + 15
        while True:
            status = q(it, "SELECT status FROM cerebro_db.fit_progress WHERE fit_id = %s",
                       (fit_id,))[0][0]
            if status != "running" or time.monotonic() > end:
                break
            time.sleep(0.2)
        assert status in ("failed", "interrupted"), status
    else:
        assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
            [("failed",)]
    assert worker_sessions_gone(it, 15.0)
    q(it, f"DROP TABLE IF EXISTS {src}, {src}_renamed, {src}_summary")


def test_control_session_terminated_mid_fit_is_reopened(it, rel_db):
    """pg_terminate_backend of the fit's control session while units run: the control
    session is opened again and the fit finishes done."""
    out = "it_ctl"
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[
        hook_sql({"point": "before_train", "epoch": 2, "seconds": 2})])
    bg.start()
    try:
        started(it, out, n0, units=1)
        ctl = wait_for(lambda: q(it, "SELECT pid FROM pg_stat_activity WHERE application_name "
                                     "LIKE 'cerebro_db %% worker ctl' AND pid <> %s",
                                 (bg.pid,)), what="the control session")
        assert q(it, "SELECT pg_terminate_backend(%s)", (ctl[0][0],))[0][0]
        bg.join(120)
    finally:
        bg.close()
    assert bg.error is None, bg.error
    fit_id = last_fit(it, out)
    check_done(it, fit_id, out)
    assert worker_sessions_gone(it, 15.0)


def test_stopped_worker_is_detected_by_default(it, rel_db):
    """A worker backend stopped (SIGSTOP) mid-unit, with cerebro_db.unit_timeout unset:
    the unit counts as stalled after max(floor, 10 x the median of its configuration's unit
    times), its session is terminated and the unit runs again; the fit finishes done."""
    out = "it_stall"
    drop_outputs(it, out)
    stopped: list[int] = []
    n0 = max_fit(it)
    bg = Background(rel_db, out, setup=[
        hook_sql({"point": "before_train", "mst_key": 1, "epoch": 2, "partition": 1,
                  "seconds": 1}),
        "SET cerebro_db.unit_timeout_floor = 3"])
    stop = threading.Event()

    def freezer():
        c = connect(rel_db)
        c.autocommit = True
        try:
            while not stop.is_set() and not stopped:
                for (pid,) in q(c, "SELECT pid FROM pg_stat_activity WHERE application_name "
                                   "LIKE 'cerebro_db %% worker %%' AND wait_event = 'PgSleep'"):
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except PermissionError:
                        return
                    stopped.append(pid)
                    break
                time.sleep(0.05)
        finally:
            c.close()

    def watchdog():  # without stall detection the fit would hang: let it go after 90 s
        if not stop.wait(90):
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)

    th = threading.Thread(target=freezer, daemon=True)
    wd = threading.Thread(target=watchdog, daemon=True)
    th.start()
    wd.start()
    bg.start()
    try:
        bg.join(150)
    finally:
        stop.set()
        th.join()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        bg.close()
    if not stopped:
        pytest.skip("this test cannot signal the server's processes")
    assert bg.error is None, bg.error
    fit_id = last_fit(it, out)
    assert fit_id > n0
    fails = q(it, "SELECT mst_key, epoch, partition, worker_pid, message FROM "
                  "cerebro_db.unit_failures WHERE fit_id = %s AND worker_pid = %s",
              (fit_id, stopped[0]))
    assert len(fails) == 1 and fails[0][:3] == (1, 2, 1), fails
    assert "stalled" in fails[0][4]
    check_done(it, fit_id, out)
    assert bg.seconds < 80, bg.seconds


def test_rollback_of_the_calling_transaction_leaves_a_resumable_fit(it):
    """BEGIN; fit; ROLLBACK leaves no outputs and a fit that is not done: it shows as
    interrupted and a resume writes the outputs (no unit trained again). BEGIN; fit;
    COMMIT leaves it done with its outputs."""
    out = "it_tx"
    drop_outputs(it, out)
    it.autocommit = False
    try:
        fit(it, out)
        fit_id = last_fit(it, out)
        it.rollback()
    finally:
        it.autocommit = True
    assert q(it, "SELECT to_regclass(%s) IS NULL", (out,))[0][0]
    st = q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,))[0][0]
    assert st == "running"  # with no coordinator: the outputs were not committed
    assert q(it, "SELECT status FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (fit_id,)) == [("interrupted",)]
    assert train_units(it, fit_id) == TOTAL_TRAIN
    last_unit = q(it, "SELECT max(unit_id) FROM cerebro_db.units WHERE fit_id = %s",
                  (fit_id,))[0][0]
    q(it, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    check_done(it, fit_id, out)
    assert q(it, "SELECT max(unit_id) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,))[0][0] == last_unit

    out2 = "it_tx2"
    drop_outputs(it, out2)
    it.autocommit = False
    try:
        fit(it, out2)
        fit_id2 = last_fit(it, out2)
        it.commit()
    finally:
        it.autocommit = True
    check_done(it, fit_id2, out2)
    with pytest.raises(psycopg2.Error) as e:
        q(it, "SELECT madlib_keras_fit_resume(%s)", (fit_id2,))
    assert e.value.pgcode == "55000" and "already done" in e.value.pgerror


def test_table_locked_by_the_calling_transaction_fails_the_fit_not_hangs(it):
    """The calling transaction itself holds a lock the workers need (here LOCK TABLE of the
    source): the workers wait for the coordinator, which waits for them; the fit fails
    within seconds with 40P01 instead of hanging."""
    out = "it_self"
    drop_outputs(it, out)
    n0 = max_fit(it)
    it.autocommit = False
    t = time.monotonic()
    try:
        q(it, "LOCK TABLE it_p IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg2.Error) as e:
            fit(it, out)
    finally:
        it.rollback()
        it.autocommit = True
    assert e.value.pgcode == "40P01", e.value.pgerror
    assert "the transaction calling the fit holds" in e.value.pgerror
    assert time.monotonic() - t < 60
    fit_id = last_fit(it, out)
    assert fit_id > n0
    assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("failed",)]
    assert worker_sessions_gone(it, 15.0)


@pytest.mark.parametrize("setting,value", [
    ("cerebro_db.unit_timeout", "abc"), ("cerebro_db.unit_timeout", "-1"),
    ("cerebro_db.unit_timeout_floor", "nan"), ("cerebro_db.unit_timeout_factor", "-2"),
    ("cerebro_db.unit_timeout_first", "infinity")])
def test_bad_stall_settings_are_refused_before_any_work(it, setting, value):
    out = "it_bad"
    drop_outputs(it, out)
    n0 = max_fit(it)
    q(it, "SELECT set_config(%s, %s, false)", (setting, value))
    try:
        with pytest.raises(psycopg2.Error) as e:
            fit(it, out)
    finally:
        q(it, f"RESET {setting}")
    assert e.value.pgcode == "22023", e.value.pgerror
    assert setting in e.value.pgerror and repr(value) in e.value.pgerror
    assert max_fit(it) == n0
    assert q(it, "SELECT to_regclass(%s) IS NULL", (out,))[0][0]


def test_a_packed_table_changed_during_a_fit_fails_it(it, rel_db):
    """An outside pass: a DELETE on the packed table during a fit takes no lock the fit
    holds; its units trained partition 1 on its rows, then on none, and the fit ended done.
    Now the fit compares its data's digest at its end with the one at its start: 55000,
    the fit failed, no output written."""
    src, out = "it_chg", "it_chg_out"
    pack(it, src)
    drop_outputs(it, out)
    n0 = max_fit(it)
    bg = Background(rel_db, out, source=src, setup=[
        hook_sql({"point": "before_train", "epoch": 2, "seconds": 2})])
    bg.start()
    try:
        fit_id = started(it, out, n0, units=PARTITIONS)
        q(it, f"DELETE FROM {src} WHERE __dist_key__ = 1")
        bg.join(120)
    finally:
        bg.close()
    assert isinstance(bg.error, psycopg2.Error), bg.error
    assert bg.error.pgcode == "55000", bg.error.pgerror
    assert f'"{src}" changed while fit {fit_id} trained on it' in bg.error.pgerror
    assert q(it, "SELECT to_regclass(%s)", (out,)) == [(None,)]
    assert q(it, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("failed",)]
    # its workers are recorded closed with it (they stayed 'active' after a failure)
    assert q(it, "SELECT count(*) FILTER (WHERE status = 'active'), count(*) FROM "
                 "cerebro_db.fit_workers WHERE fit_id = %s", (fit_id,)) == [(0, PARTITIONS)]
    q(it, f"DROP TABLE IF EXISTS {src}, {src}_summary")
