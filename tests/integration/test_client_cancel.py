"""Cancelling from the client and the CLI (cerebro_db_cancel_fit): a running fit stops, is
'cancelled', resumes to the end; a job's cancelled fit fails the run and is not retried."""
from __future__ import annotations

import threading
import time

import pytest

from ..helpers import mlp_json, q, worker_sessions_gone
from .test_client import CLI, cli, url  # noqa: F401 - url is a fixture
from .test_jobs import add_rows, runs

pytestmark = pytest.mark.db


@pytest.fixture(scope="module")
def data(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary, kp, kp_summary, kout, "
            "kout_summary, kout_info CASCADE")
    q(conn, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(conn, 0, 2000)
    q(conn, "SELECT training_preprocessor_dl('jsrc', 'kp', 'y', 'x', NULL, 1.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('jarch', 'jmst', ARRAY[1], ARRAY["
            "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
            "metrics=['accuracy']$$, $$loss='categorical_crossentropy', "
            "optimizer='SGD(learning_rate=0.1)', metrics=['accuracy']$$], "
            "ARRAY['batch_size=4'])")
    yield conn
    q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name = 'cancelme'")
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary, kp, kp_summary, kout, "
            "kout_summary, kout_info, jcp, jcp_summary CASCADE")


def start(target) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def first_units(conn, after: int, n: int = 1) -> int:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        rows = q(conn, "SELECT p.fit_id, p.units_done FROM cerebro_db.fit_progress p "
                       "WHERE p.fit_id > %s AND p.status = 'running'", (after,))
        if rows and rows[0][1] >= n:
            return rows[0][0]
        time.sleep(0.2)
    raise AssertionError("the fit did not start")


def test_cancel_from_the_cli_then_resume(data, url):  # noqa: F811
    from cerebro_db.client import Client, ClientError

    conn, client = data, Client(url)
    before = q(conn, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    t, errors = start(lambda: client.call(
        "madlib_keras_fit_multiple_model", source_table="kp", model_output_table="kout",
        model_selection_table="jmst", num_iterations=30, random_state=3))
    fid = first_units(conn, before)
    r = cli(url, "cancel", str(fid))
    assert r.returncode == 0 and "cancel requested" in r.stdout, r.stderr
    t.join(120)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ClientError)
    assert errors[0].sqlstate == "57014"
    assert client.progress(fid)["status"] == "cancelled"
    assert worker_sessions_gone(conn, 15.0)
    r = cli(url, "cancel", str(fid))
    assert r.returncode == 3 and "not running" in r.stdout
    assert cli(url, "watch", str(fid)).returncode == 3
    assert q(conn, "SELECT to_regclass('kout')")[0][0] is None
    r = cli(url, "resume", str(fid), timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == f"fit {fid}: done", r.stderr
    assert cli(url, "watch", str(fid)).returncode == 0
    assert q(conn, "SELECT count(*) FROM kout")[0][0] == 2


def test_a_cancelled_job_fit_fails_the_run_without_retry(data, url):  # noqa: F811
    from cerebro_db.client import Client

    conn, client = data, Client(url)
    client.schedule_model_selection(
        "cancelme", None, source_table="jsrc", packed_table="jcp", dependent_varname="y",
        independent_varname="x", model_output_table="jcout", model_selection_table="jmst",
        fit_options={"num_iterations": 30}, preprocess_options={"num_partitions": 2},
        retries=2, retry_delay="0 seconds")
    before = q(conn, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    t, errors = start(lambda: client.run_job("cancelme"))
    fid = first_units(conn, before)
    assert client.cancel(fid) is True
    t.join(120)
    # the failed run fails the call too, after recording it (as pg_cron then sees it)
    assert not t.is_alive() and len(errors) == 1, errors
    assert 'model selection job "cancelme" failed' in str(errors[0])
    (r,) = runs(conn, "cancelme")
    assert (r["status"], r["attempts"], r["fit_id"]) == ("failed", 1, fid)
    assert "57014" in r["message"] and "(not retried)" in r["message"]
    assert q(conn, "SELECT to_regclass('jcout')")[0][0] is None
    r = cli(url, "jobs", "cancelme", "--runs", "--format", "json")
    assert r.returncode == 0 and '"status":"failed"' in r.stdout


def test_ctrl_c_in_the_client_cancels_the_fit(data, url):  # noqa: F811
    """SIGINT to a program waiting in Client.call cancels the fit on the server (it ran to
    its end before: psycopg2 waited inside libpq)."""
    import signal
    import subprocess
    import sys

    conn = data
    before = q(conn, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job's\n"
        "from cerebro_db.client import Client, ClientError\n"
        "try:\n"
        "    Client(sys.argv[1]).call('madlib_keras_fit_multiple_model', source_table='kp',\n"
        "        model_output_table='kout_int', model_selection_table='jmst',\n"
        "        num_iterations=30, random_state=3)\n"
        "except ClientError as e:\n"
        "    print('error', e.sqlstate)\n"
        "    sys.exit(7)\n"
        "print('returned')\n")
    p = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        fid = first_units(conn, before)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 7 and out.strip() == "error 57014", (out, err[-2000:])
    assert q(conn, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fid,)) == \
        [("cancelled",)]
    assert q(conn, "SELECT to_regclass('kout_int')")[0][0] is None
    assert worker_sessions_gone(conn, 15.0)


def test_a_call_changes_nothing_process_wide(data, url, dbname):  # noqa: F811
    """While Client.call waits, another thread's psycopg2 COPY works and the program's own
    wait callback stays (psycopg2's process-wide wait callback broke both, a red-team pass)."""
    import io

    import psycopg2.extensions

    from cerebro_db.client import Client

    from ..helpers import connect

    errors: list[BaseException] = []
    stop = threading.Event()

    def copy_loop() -> None:
        c = connect(dbname, autocommit=True)
        try:
            with c.cursor() as cur:
                cur.execute("CREATE TEMP TABLE cp (a int)")
                while not stop.is_set():
                    cur.copy_expert("COPY cp FROM STDIN", io.StringIO("1\n2\n"))
                    time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - inspected by the test
            errors.append(e)
        finally:
            c.close()

    t = threading.Thread(target=copy_loop)
    t.start()
    try:
        Client(url).call("madlib_keras_fit_multiple_model", source_table="kp",
                         model_output_table="kout_thr", model_selection_table="jmst",
                         num_iterations=2, random_state=3)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert psycopg2.extensions.get_wait_callback() is None
    q(data, "DROP TABLE IF EXISTS kout_thr, kout_thr_summary, kout_thr_info")
