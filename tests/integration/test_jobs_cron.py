"""Scheduled model selection on the embedded server's pg_cron (loaded by scripts/cerebro.sh,
metadata in the database cron.database_name; jobs target the test database with
cron.schedule_in_database over a dblink session)."""
from __future__ import annotations

import time

import pytest

from ..helpers import connect, mlp_json, q
from .test_jobs import add_rows, runs

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


@pytest.fixture(scope="module")
def cron_conn(session_conn):
    """A connection to pg_cron's database, with the extension created there."""
    db = q(session_conn, "SELECT current_setting('cron.database_name', true)")[0][0]
    if db is None:
        pytest.skip("the server does not load pg_cron (restart it with scripts/cerebro.sh start)")
    c = connect(db)
    c.autocommit = True
    q(c, "CREATE EXTENSION IF NOT EXISTS pg_cron")
    yield c
    c.close()


@pytest.fixture(scope="module")
def tiny(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary CASCADE")
    q(conn, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(conn, 0, 200)
    q(conn, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('jarch', 'jmst', ARRAY[1], ARRAY["
            "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
            "metrics=['accuracy']$$], ARRAY['batch_size=16'])")
    yield conn
    # a test that failed half-way must not leave pg_cron running a job on a dropped database
    q(conn, "SELECT unschedule_model_selection(job_name) FROM cerebro_db.jobs "
            "WHERE job_name LIKE 'cron%%'")
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary, cpacked, cpacked_summary, "
            "cout, cout_summary, cout_info CASCADE")


def schedule(conn, name: str, when: str) -> int:
    return q(conn, """SELECT schedule_model_selection(%s, %s, 'jsrc', 'cpacked', 'y', 'x',
        'cout', 'jmst', fit_options => '{"num_iterations": 1, "random_state": 5}',
        preprocess_options => '{"num_partitions": 2, "random_state": 3}',
        key_column => 'id')""", (name, when))[0][0]


def test_schedule_makes_and_unschedule_removes_the_pg_cron_job(tiny, cron_conn):
    conn = tiny
    db = q(conn, "SELECT current_database()")[0][0]
    schedule(conn, "cron_a", "30 3 * * *")
    cron_id, cron_db = q(conn, "SELECT cron_jobid, cron_database FROM cerebro_db.jobs "
                               "WHERE job_name = 'cron_a'")[0]
    row = q(cron_conn, "SELECT schedule, command, database, username, active, jobname "
                       "FROM cron.job WHERE jobid = %s", (cron_id,))
    assert row == [("30 3 * * *", "CALL \"cerebro_db\".\"run_model_selection_job\"('cron_a')", db,
                    "postgres", True, f"cerebro_db:{db}:cron_a")]
    assert cron_db == q(cron_conn, "SELECT current_database()")[0][0]
    assert q(conn, "SELECT schedule, cron_jobid FROM cerebro_db.model_selection_jobs "
                   "WHERE job_name = 'cron_a'")[0] == ("30 3 * * *", cron_id)
    # a bad schedule is pg_cron's error, and no job is left behind
    with pytest.raises(psycopg2.Error) as e:
        schedule(conn, "cron_b", "every now and then")
    assert "schedule" in str(e.value)
    assert q(conn, "SELECT count(*) FROM cerebro_db.jobs WHERE job_name = 'cron_b'")[0][0] == 0
    assert q(conn, "SELECT unschedule_model_selection('cron_a')")[0][0] is True
    assert q(cron_conn, "SELECT count(*) FROM cron.job WHERE jobid = %s", (cron_id,))[0][0] == 0


@pytest.mark.slow
def test_pg_cron_runs_the_job(tiny, cron_conn):
    """pg_cron 1.4 schedules by the minute: wait for the next minute's run (at most ~2 min)."""
    conn = tiny
    schedule(conn, "cron_run", "* * * * *")
    cron_id = q(conn, "SELECT cron_jobid FROM cerebro_db.jobs WHERE job_name = 'cron_run'")[0][0]
    try:
        deadline = time.monotonic() + 180
        done = []
        while time.monotonic() < deadline:
            done = [r for r in runs(conn, "cron_run") if r["status"] != "running"]
            if done:
                break
            time.sleep(2)
    finally:
        q(conn, "SELECT unschedule_model_selection('cron_run')")
    assert done, "pg_cron did not run the job within 3 minutes"
    r = done[0]
    assert r["status"] == "succeeded", r["message"]
    assert r["rows_trained"] == 200
    assert q(conn, "SELECT count(*) FROM cout")[0][0] == 1
    details = q(cron_conn, "SELECT status, command FROM cron.job_run_details WHERE jobid = %s "
                           "ORDER BY runid", (cron_id,))
    assert details and details[0][1].endswith("run_model_selection_job\"('cron_run')")
    assert details[0][0] in ("running", "succeeded")


def plain_role(conn, prefix: str) -> tuple[str, str]:
    """A new login role with a schema of its own that may read the tiny job's tables;
    returns (this database, the role)."""
    import uuid

    role = f"{prefix}_{uuid.uuid4().hex[:8]}"
    q(conn, f'CREATE ROLE "{role}" LOGIN')
    q(conn, f'GRANT USAGE ON SCHEMA cerebro_db TO "{role}"')
    q(conn, f'CREATE SCHEMA "{role}" AUTHORIZATION "{role}"')
    q(conn, f'GRANT SELECT ON jsrc, jarch, jmst, jmst_summary TO "{role}"')
    return q(conn, "SELECT current_database()")[0][0], role


def test_a_plain_roles_job_is_scheduled_and_removed_as_the_messages_say(tiny, cron_conn):
    """pg_cron lives in another database, so a role that is not a superuser cannot schedule;
    the hint gives the statement a superuser runs there, and unscheduling the job says how
    to remove that entry. The entry runs as the role, and pg_cron's unschedule by name
    matches only the caller's own entries: the removal the notice gave before failed for
    the superuser (an outside pass)."""
    import re

    conn = tiny
    db, role = plain_role(conn, "cron_role")
    rc = connect(db, role, autocommit=True)
    jobname = f"cerebro_db:{db}:cron_plain"
    try:
        q(rc, f'SET search_path = "{role}", public, cerebro_db')
        call = ("SELECT schedule_model_selection('cron_plain', {}, 'public.jsrc', 'cpk', 'y', "
                "'x', 'cron_plain_out', 'public.jmst', fit_options => '{{\"num_iterations\": 1}}')")
        with pytest.raises(psycopg2.Error) as e:
            q(rc, call.format("'30 3 * * *'"))
        assert e.value.pgcode == "42501", e.value.pgerror
        hint = e.value.diag.message_hint
        assert hint, e.value.pgerror
        made = re.search(r"run in [^:]*: (SELECT cron\.schedule_in_database\(.*?\));", hint)
        gone = re.search(r"runs there: (SELECT cron\.unschedule\(jobid\) FROM cron\.job WHERE "
                         r"jobname = '[^']*')", hint)
        assert made and gone, hint
        q(rc, call.format("NULL"))
        q(cron_conn, made.group(1))
        assert q(cron_conn, "SELECT username FROM cron.job WHERE jobname = %s",
                 (jobname,)) == [(role,)]
        del rc.notices[:]
        assert q(rc, "SELECT unschedule_model_selection('cron_plain')") == [(True,)]
        said = re.search(r"pg_cron's database: (SELECT cron\.unschedule\(jobid\) .*)$",
                         " ".join(rc.notices).strip())
        assert said, rc.notices
        assert said.group(1).strip() == gone.group(1)
        q(cron_conn, said.group(1).strip())
        assert q(cron_conn, "SELECT count(*) FROM cron.job WHERE jobname = %s",
                 (jobname,)) == [(0,)]
    finally:
        rc.close()
        q(cron_conn, "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname = %s",
          (jobname,))
        for t in ("fits", "jobs", "job_runs"):
            q(conn, f"DELETE FROM cerebro_db.{t} WHERE owner = %s", (role,))
        q(conn, f'DROP OWNED BY "{role}" CASCADE')
        q(conn, f'DROP ROLE "{role}"')


def test_forgetting_a_dropped_role_removes_only_its_own_jobs_pg_cron_entries(tiny, cron_conn):
    """A role may edit its own job rows; with cron_jobid pointed at a DBA's own pg_cron
    entry, cerebro_db_forget_role (a superuser's call, after the role is dropped) removed
    that entry by id (a red-team pass). Only an entry with the job's name, run as the role,
    is removed."""
    conn = tiny
    db, role = plain_role(conn, "cron_gone")
    dba = q(cron_conn, "SELECT cron.schedule('cerebro_test_dba_own', '0 4 * * *', "
                       "'SELECT 1')")[0][0]
    rc = connect(db, role, autocommit=True)
    try:
        q(rc, f'SET search_path = "{role}", public, cerebro_db')
        for name in ("forged", "own"):
            q(rc, f"SELECT schedule_model_selection('{name}', NULL, 'public.jsrc', "
                  f"'{name}_pk', 'y', 'x', '{name}_out', 'public.jmst', "
                  """fit_options => '{"num_iterations": 1}')""")
        # the superuser schedules the role's own job as the hint says
        own = q(cron_conn, "SELECT cron.schedule_in_database(%s, '0 5 * * *', 'SELECT 1', %s, "
                           "%s)", (f"cerebro_db:{db}:own", db, role))[0][0]
        q(rc, "UPDATE cerebro_db.jobs SET cron_jobid = %s WHERE job_name = 'forged'", (dba,))
        q(rc, "UPDATE cerebro_db.jobs SET cron_jobid = %s WHERE job_name = 'own'", (own,))
        rc.close()
        q(conn, f'DROP OWNED BY "{role}" CASCADE')
        q(conn, f'DROP ROLE "{role}"')
        q(conn, "SELECT cerebro_db.cerebro_db_forget_role(%s)", (role,))
        assert q(cron_conn, "SELECT jobid FROM cron.job WHERE jobid IN (%s, %s)",
                 (dba, own)) == [(dba,)]
        assert q(conn, "SELECT count(*) FROM cerebro_db.jobs WHERE owner = %s",
                 (role,)) == [(0,)]
    finally:
        rc.close()
        q(cron_conn, "SELECT cron.unschedule(jobid) FROM cron.job WHERE jobid = %s OR "
                     "jobname LIKE %s", (dba, f"cerebro_db:{db}:own"))
        q(conn, "DELETE FROM cerebro_db.jobs WHERE owner = %s", (role,))
        q(conn, f'DROP OWNED BY "{role}" CASCADE') if q(
            conn, "SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)) else None
        q(conn, f'DROP ROLE IF EXISTS "{role}"')
