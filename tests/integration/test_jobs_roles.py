"""A job of a role that is not a superuser, run as pg_cron runs it: a login of that role over
the socket calls the procedure, and the fit's worker sessions are opened by
__worker_connect as that role."""
from __future__ import annotations

import uuid

import pytest

from ..helpers import connect, error_of, mlp_json, q
from .test_jobs import add_rows, runs

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def _login_role(session_conn, dbname, prefix: str):
    """A role that may log in, use the extension and create in public; its connection."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    q(session_conn, f'CREATE ROLE "{name}" LOGIN')
    q(session_conn, f'GRANT USAGE ON SCHEMA cerebro_db TO "{name}"')
    q(session_conn, f'GRANT CREATE ON SCHEMA public TO "{name}"')
    c = connect(dbname, name, autocommit=True)
    yield name, c
    c.close()
    q(session_conn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = %s", (name,))
    q(session_conn, f'DROP OWNED BY "{name}" CASCADE')
    q(session_conn, f'DROP ROLE "{name}"')


@pytest.fixture
def role(session_conn, dbname):
    yield from _login_role(session_conn, dbname, "jobrole")


def _job_inputs(c, rows: int) -> None:
    """A job's source (``rows`` rows), architecture and model selection table."""
    q(c, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(c, 0, rows)
    q(c, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(c, "SELECT load_model_selection_table('jarch', 'jmst', ARRAY[1], ARRAY["
         "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
         "metrics=['accuracy']$$], ARRAY['batch_size=16'])")


def test_a_roles_job_runs_with_worker_sessions_of_that_role(role, session_conn):
    name, c = role
    _job_inputs(c, 120)
    args = ("'jsrc', 'jpacked', 'y', 'x', 'jout', 'jmst', "
            "fit_options => '{\"num_iterations\": 1}', "
            "preprocess_options => '{\"num_partitions\": 2}'")
    # pg_cron lives in another database: a role that is not a superuser cannot schedule
    # there, and is told what a superuser would run; nothing is left behind
    with pytest.raises(psycopg2.Error) as e:
        q(c, f"SELECT schedule_model_selection('rolejob', '0 3 * * *', {args})")
    assert e.value.pgcode == "42501"
    hint = e.value.diag.message_hint or ""
    # the whole statement, with the job's owner (pg_cron would otherwise run it as the
    # superuser, who has no job of that name)
    assert "SELECT cron.schedule_in_database('cerebro_db:" in hint, hint
    assert "'0 3 * * *', 'CALL \"cerebro_db\".\"run_model_selection_job\"(''rolejob'')'" in hint, hint
    assert f"'{name}'); (to remove that entry later" in hint, hint
    assert q(c, "SELECT count(*) FROM cerebro_db.jobs")[0][0] == 0
    q(c, f"SELECT schedule_model_selection('rolejob', NULL, {args})")
    q(c, "CALL run_model_selection_job('rolejob')")
    (r,) = runs(c, "rolejob")
    assert r["status"] == "succeeded", r["message"]
    assert r["owner"] == name and r["rows_trained"] == 120
    owners = q(session_conn, "SELECT DISTINCT owner FROM cerebro_db.units WHERE fit_id = %s",
               (r["fit_id"],))
    assert owners == [(name,)]
    assert q(c, "SELECT count(*) FROM jout")[0][0] == 1
    q(c, "SELECT unschedule_model_selection('rolejob')")


def test_job_names_are_unique_per_role(role, session_conn):
    """Two roles may each have a job of the same name (so no role can take a name from
    another, nor learn from a unique violation that another has it); one role cannot have
    two."""
    name, c = role
    ins = ("INSERT INTO cerebro_db.jobs (job_name, method, source_table, packed_table, "
           "dependent_varname, independent_varname, model_output_table) "
           "VALUES ('twin', 'fit', 's', 'p', 'y', 'x', 'o')")
    q(c, ins)
    try:
        q(session_conn, ins)
        with pytest.raises(psycopg2.Error) as e:
            q(c, ins)
        assert e.value.pgcode == "23505"
        assert q(c, "SELECT owner FROM cerebro_db.jobs WHERE job_name = 'twin'") == [(name,)]
        assert q(session_conn, "SELECT count(*) FROM cerebro_db.jobs "
                               "WHERE job_name = 'twin'") == [(2,)]
    finally:
        q(session_conn, "DELETE FROM cerebro_db.jobs WHERE job_name = 'twin'")


@pytest.fixture
def mallory(session_conn, dbname):
    """A second role that, like the first, may create tables in schema jshared."""
    yield from _login_role(session_conn, dbname, "jobmal")


def _job_in_shared_schema(session_conn, c, alice: str, mallory: str) -> None:
    q(session_conn, "DROP SCHEMA IF EXISTS jshared CASCADE")
    q(session_conn, "CREATE SCHEMA jshared")
    q(session_conn, f'GRANT USAGE, CREATE ON SCHEMA jshared TO "{alice}", "{mallory}"')
    _job_inputs(c, 60)
    q(c, "SELECT schedule_model_selection('team', NULL, 'jsrc', 'jshared.jpacked', 'y', 'x', "
         "'jshared.jout', 'jmst', warm_start => TRUE, "
         "fit_options => '{\"num_iterations\": 1}', "
         "preprocess_options => '{\"num_partitions\": 2}')")


def test_a_job_reads_no_relation_another_role_put_at_its_names(role, mallory, session_conn):
    """Another role that may create tables in the schema of a job's outputs puts a view at
    the output's name (before the first run, or after dropping the published table as the
    schema's owner could): the run would read it (warm_start) and so run the view's
    function as the job's owner. The run refuses it (42501) without reading it; the
    function never runs as the job's owner. A staging name taken in advance (job ids come
    from a sequence) blocks nothing: staging names carry a random token per step."""
    alice, c = role
    mal, m = mallory
    _job_in_shared_schema(session_conn, c, alice, mal)
    jid = q(c, "SELECT job_id FROM cerebro_db.jobs WHERE job_name = 'team'")[0][0]
    q(m, "CREATE TABLE jshared.loot (who text)")
    q(m, "GRANT INSERT ON jshared.loot TO PUBLIC")
    q(m, "CREATE FUNCTION jshared.evil() RETURNS int LANGUAGE sql AS "
         "$$ INSERT INTO jshared.loot SELECT current_user; SELECT 1 $$")
    q(m, "CREATE VIEW jshared.jout AS SELECT jshared.evil() AS model_weights")
    q(m, "GRANT SELECT ON jshared.jout TO PUBLIC")
    for what in ("packed", "out", "new", "mst"):
        q(m, f"CREATE TABLE jshared.__cerebro_job_{jid}_{what} (x int)")
    assert error_of(c, "CALL run_model_selection_job('team')").pgcode == "P0001"
    (r,) = runs(c, "team")
    assert r["status"] == "failed"
    assert f'"jshared.jout" is a relation that is not a plain table of role "{mal}"' \
        in r["message"], r["message"]
    assert "SQLSTATE 42501" in r["message"]
    assert q(m, "SELECT count(*) FROM jshared.loot")[0][0] == 0
    # gone: the next run packs and trains despite the taken staging names, then the
    # schema's owner-like role replaces the published table with a table of its own
    q(m, "DROP VIEW jshared.jout")
    q(c, "CALL run_model_selection_job('team')")
    assert runs(c, "team")[-1]["status"] == "succeeded", runs(c, "team")[-1]["message"]
    q(session_conn, "DROP TABLE jshared.jout")
    q(m, "CREATE TABLE jshared.jout AS SELECT 1 AS mst_key, NULL::bytea AS model_weights")
    assert error_of(c, "CALL run_model_selection_job('team')").pgcode == "P0001"
    last = runs(c, "team")[-1]
    assert last["status"] == "failed"
    assert f'"jshared.jout" is a table of role "{mal}", not a table this job made' \
        in last["message"], last["message"]
    assert q(m, "SELECT count(*) FROM jshared.loot")[0][0] == 0
    q(c, "SELECT unschedule_model_selection('team')")
    q(session_conn, "DROP SCHEMA jshared CASCADE")


def test_a_run_waits_its_own_jobs_retry_delay(role, session_conn):
    """A superuser sees every role's jobs: its run of a job named like another role's must
    still wait its own retry_delay (1 second), not the other role's (1 hour)."""
    _, c = role
    sched = ("SELECT schedule_model_selection('twin_delay', NULL, 'empty_src', %s, 'y', "
             "'x', %s, 'empty_mst', retries => 1, retry_delay => %s, "
             "fit_options => '{\"num_iterations\": 1}')")
    q(c, "CREATE TABLE empty_src (id integer, x real[], y integer)")
    q(c, "CREATE TABLE empty_mst (mst_key integer)")
    try:
        q(c, sched, ("tdp_role", "tdo_role", "1 hour"))
        q(session_conn, sched, ("tdp_super", "tdo_super", "1 second"))
        q(session_conn, "SET statement_timeout = '60s'")
        assert error_of(session_conn,
                        "CALL run_model_selection_job('twin_delay')").pgcode == "P0001"
        (r,) = [r for r in runs(session_conn, "twin_delay") if r["owner"] == "postgres"]
        assert r["status"] == "failed" and r["attempts"] == 2, r
    finally:
        q(session_conn, "RESET statement_timeout")
        q(session_conn, "SELECT unschedule_model_selection('twin_delay')")
        q(c, "SELECT unschedule_model_selection('twin_delay')")


def test_another_roles_view_on_a_published_table_does_not_stop_the_job(role, mallory,
                                                                       session_conn):
    """A view (or a temporary view of an open session) of another role on the job's
    published tables made every later run fail (DROP TABLE: other objects depend on it,
    2BP01). A run now renames the old table away, publishes, and keeps the old one while
    something depends on it; a later run drops it. In the train step the packed table must
    exist: an absent name cannot be held against a view put there between the check and
    the fit."""
    alice, c = role
    mal, m = mallory
    _job_in_shared_schema(session_conn, c, alice, mal)
    q(c, "CALL run_model_selection_job('team')")
    assert runs(c, "team")[-1]["status"] == "succeeded"
    q(m, "CREATE VIEW jshared.pin AS SELECT 1 AS one FROM jshared.jout_summary")
    q(m, "CREATE TEMP VIEW pin_info AS SELECT 1 AS one FROM jshared.jout_info")
    q(m, "CREATE VIEW jshared.pin_packed AS SELECT 1 AS one FROM jshared.jpacked_summary")
    c.notices.clear()
    q(c, "CALL run_model_selection_job('team')")
    last = runs(c, "team")[-1]
    assert last["status"] == "succeeded", last["message"]
    assert any("kept the replaced table" in n for n in c.notices), c.notices
    kept = q(session_conn, "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE "
                           "'\\_\\_cerebro\\_job\\_%%\\_old%%'")
    assert len(kept) == 3, kept
    # mallory's views now stand on the old tables (which she still may not read)
    assert q(m, "SELECT count(*) FROM pg_views WHERE viewname = 'pin'") == [(1,)]
    q(m, "DROP VIEW jshared.pin, jshared.pin_packed")
    q(m, "DROP VIEW pin_info")
    q(c, "CALL run_model_selection_job('team')")
    assert runs(c, "team")[-1]["status"] == "succeeded"
    assert q(session_conn, "SELECT count(*) FROM pg_class WHERE relname LIKE "
                           "'\\_\\_cerebro\\_job\\_%%\\_old%%'")[0][0] == 0
    # the train step finds its packed table gone (a schema's owner dropped it after pack)
    run = q(c, "SELECT cerebro_db.__job_step('team', NULL, 'begin')")[0][0]
    q(c, "DROP TABLE jshared.jpacked, jshared.jpacked_summary")
    step = q(c, "SELECT cerebro_db.__job_step('team', %s, 'train')", (int(run),))
    assert step in ([("retry",)], [("failed",)]), step
    q(c, "SELECT cerebro_db.__job_step('team', %s, 'end')", (int(run),))
    assert "is gone since the pack step" in runs(c, "team")[-1]["message"]
    q(c, "SELECT unschedule_model_selection('team')")
    q(session_conn, "DROP SCHEMA jshared CASCADE")
