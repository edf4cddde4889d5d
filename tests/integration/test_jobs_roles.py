"""A job of a role that is not a superuser, run as pg_cron runs it: a login of that role over
the socket calls the procedure, and the fit's worker sessions are opened by
__worker_connect as that role."""
from __future__ import annotations

import uuid

import pytest

from ..helpers import connect, mlp_json, q
from .test_jobs import add_rows, runs

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


@pytest.fixture
def role(session_conn, dbname):
    name = f"jobrole_{uuid.uuid4().hex[:8]}"
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


def test_a_roles_job_runs_with_worker_sessions_of_that_role(role, session_conn):
    name, c = role
    q(c, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(c, 0, 120)
    q(c, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(c, "SELECT load_model_selection_table('jarch', 'jmst', ARRAY[1], ARRAY["
         "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
         "metrics=['accuracy']$$], ARRAY['batch_size=16'])")
    args = ("'jsrc', 'jpacked', 'y', 'x', 'jout', 'jmst', "
            "fit_options => '{\"num_iterations\": 1}', "
            "preprocess_options => '{\"num_partitions\": 2}'")
    # pg_cron lives in another database: a role that is not a superuser cannot schedule
    # there, and is told what a superuser would run; nothing is left behind
    with pytest.raises(psycopg2.Error) as e:
        q(c, f"SELECT schedule_model_selection('rolejob', '0 3 * * *', {args})")
    assert e.value.pgcode == "42501"
    assert "cron.schedule_in_database" in (e.value.diag.message_hint or ""), str(e.value)
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
