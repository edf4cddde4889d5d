"""Row-level security on every catalog table and view, tried as a second role.

``alice`` has a fit (rows written straight into the catalog as alice: no training needed);
``eve`` tries, on every table of the extension's schema, to read, change and add rows of
alice's fit, of the next fit id (read from the sequence) and of a fit id that does not
exist (which would tell her which ids exist); and reads the views through a leaky function
in her WHERE clause.
"""
from __future__ import annotations

import pytest

from ..helpers import end_sessions_of, q
from .conftest import Roles

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

# values for NOT NULL columns without a default, by type; per-column where a CHECK wants one
BY_TYPE = {"integer": "0", "bigint": "0", "text": "'x'", "name": "current_user",
           "jsonb": "'{}'::jsonb", "json": "'{}'::json", "bytea": "'\\x00'::bytea",
           "integer[]": "'{0}'::integer[]", "double precision": "0",
           "timestamp with time zone": "pg_catalog.now()", "boolean": "false"}
BY_COLUMN = {"status": {"fit_workers": "'active'", "automl_trials": "'training'",
                        "fits": "'running'"},
             "kind": {"units": "'train'", "fits": "'fit'", "unit_postings": "'stop'"},
             "decision": {"automl_decisions": "'launch'"},
             # a job run belongs to a job of the writing role (its own policy checks that too)
             "job_id": {"job_runs": "(SELECT max(job_id) FROM cerebro_db.jobs "
                                    "WHERE owner = current_user)"}}


def new_job(conn, name: str) -> None:
    q(conn, "INSERT INTO cerebro_db.jobs (job_name, method, source_table, packed_table, "
            "dependent_varname, independent_varname, model_output_table) VALUES "
            "(%s, 'fit', 's', 'p', 'y', 'x', 'o')", (name,))


def insert_sql(admin, table: str, fit_id: str, extra: dict[str, str] | None = None) -> str:
    """An INSERT of one row into cerebro_db.<table> under ``fit_id`` (SQL text), with a
    value for every NOT NULL column that has no default."""
    cols = q(admin, "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod) "
                    "FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND "
                    "NOT a.attisdropped AND a.attnotnull AND NOT a.atthasdef ORDER BY a.attnum",
             (f"cerebro_db.{table}",))
    values = {"fit_id": fit_id}
    for name, typ in cols:
        if name in values:
            continue
        values[name] = BY_COLUMN.get(name, {}).get(table) or BY_TYPE[typ]
    values.update(extra or {})
    return (f"INSERT INTO cerebro_db.{table} ({', '.join(values)}) "
            f"VALUES ({', '.join(values.values())})")


def fit_tables(admin) -> list[str]:
    return [r[0] for r in q(admin, "SELECT c.relname::text FROM pg_class c JOIN pg_attribute a "
                                   "ON a.attrelid = c.oid AND a.attname = 'fit_id' WHERE "
                                   "c.relnamespace = 'cerebro_db'::regnamespace AND "
                                   "c.relkind = 'r' AND c.relname <> 'fits' ORDER BY 1")]


def new_fit(conn) -> int:
    return q(conn, "INSERT INTO cerebro_db.fits (kind, source_table, model_output_table, policy, "
                   "num_partitions, num_iterations, metrics_compute_frequency, random_state, "
                   "total_units) VALUES ('fit', 's', 'o', 'mop', 1, 1, 1, 1, 1) "
                   "RETURNING fit_id")[0][0]


@pytest.fixture(scope="module")
def two(admin, rel_db):
    roles = Roles(admin, rel_db)
    try:
        alice, eve = roles.create("iso_alice"), roles.create("iso_eve")
        ca, ce = roles.connect(alice), roles.connect(eve)
        fit = new_fit(ca)
        new_job(ca, "iso_alice_job")
        new_job(ce, "iso_eve_job")
        for t in fit_tables(admin):
            q(ca, insert_sql(admin, t, str(fit)))
        yield {"alice": alice, "eve": eve, "ca": ca, "ce": ce, "fit": fit}
    finally:
        for t in fit_tables(admin):
            q(admin, f"DELETE FROM cerebro_db.{t} WHERE owner IN "
                     f"(SELECT rolname FROM pg_roles WHERE rolname LIKE 'iso\\_%%')")
        q(admin, "DELETE FROM cerebro_db.fits WHERE owner LIKE 'iso\\_%%'")
        q(admin, "DELETE FROM cerebro_db.jobs WHERE owner LIKE 'iso\\_%%'")
        roles.drop()


def test_every_catalog_table_has_row_level_security(admin):
    rows = q(admin, "SELECT c.relname::text, c.relrowsecurity, "
                    "has_table_privilege('public', c.oid, 'INSERT') FROM pg_class c "
                    "WHERE c.relnamespace = 'cerebro_db'::regnamespace AND c.relkind = 'r' "
                    "ORDER BY 1")
    assert len(rows) >= 10
    for name, rls, public_insert in rows:
        assert rls or not public_insert, name
    assert {r[0] for r in rows} >= {"fits", "fit_configs", "units", "model_states",
                                    "unit_failures", "fit_workers", "automl_trials",
                                    "automl_state", "automl_decisions"}


def test_no_rows_under_another_roles_fit_nor_probing(two, admin):
    ce, fit = two["ce"], two["fit"]
    tables = fit_tables(admin)
    assert {"unit_failures", "fit_workers", "automl_trials", "automl_state",
            "automl_decisions", "units", "model_states", "fit_configs"} <= set(tables)
    nxt = q(ce, "SELECT pg_catalog.nextval('cerebro_db.fits_fit_id_seq')")[0][0]
    own = new_fit(ce)
    assert own > nxt
    for t in tables:
        # alice's fit, the next fit ids, an id that does not exist: the same refusal
        for target in (fit, own + 1, own + 2, 10**12):
            with pytest.raises(psycopg2.Error) as e:
                q(ce, insert_sql(admin, t, str(target)))
            assert e.value.pgcode == "42501", (t, target, e.value.pgerror)
            assert "row-level security" in e.value.pgerror
        # in alice's name, too
        with pytest.raises(psycopg2.Error) as e:
            q(ce, insert_sql(admin, t, str(fit), {"owner": f"'{two['alice']}'"}))
        assert e.value.pgcode == "42501", t
        # under her own fit eve may write (the policy is about the fit, not the table)
        q(ce, insert_sql(admin, t, str(own)))
        # and cannot move her row to alice's fit
        with pytest.raises(psycopg2.Error) as e:
            q(ce, f"UPDATE cerebro_db.{t} SET fit_id = %s WHERE fit_id = %s", (fit, own))
        assert e.value.pgcode == "42501", t
        assert q(ce, f"SELECT count(*) FROM cerebro_db.{t} WHERE fit_id = %s", (fit,)) == [(0,)]
        with pytest.raises(psycopg2.Error) as e:  # no role deletes: it marks rows, __purge
            q(ce, f"DELETE FROM cerebro_db.{t} WHERE fit_id = %s", (fit,))
        assert e.value.pgcode == "42501", t
        assert q(admin, f"SELECT count(*) FROM cerebro_db.{t} WHERE fit_id = %s", (fit,)) == \
            [(1,)], t


def test_no_role_can_lock_a_catalog_table_against_the_others(two, admin):
    """With UPDATE or DELETE on a table PostgreSQL lets a role LOCK it IN ACCESS EXCLUSIVE
    MODE, past row-level security, which would stall every role's fits: a role holds
    neither on the catalog tables (UPDATE per column only), so every lock mode that could
    block a fit is refused; a role marks its rows doomed (only its own: row-level security)
    and __purge deletes marked rows."""
    ce, ca = two["ce"], two["ca"]
    tables = [r[0] for r in q(admin, "SELECT relname::text FROM pg_class WHERE relnamespace = "
                                     "'cerebro_db'::regnamespace AND relkind = 'r'")]
    assert {"fits", "units", "model_states", "jobs", "unit_postings"} <= set(tables)
    for t in tables:
        for mode in ("ACCESS EXCLUSIVE", "EXCLUSIVE", "SHARE ROW EXCLUSIVE", "SHARE"):
            q(ce, "BEGIN")
            try:
                with pytest.raises(psycopg2.Error) as e:
                    q(ce, f"LOCK TABLE cerebro_db.{t} IN {mode} MODE NOWAIT")
                assert e.value.pgcode == "42501", (t, mode, e.value.pgerror)
            finally:
                q(ce, "ROLLBACK")
        for statement in (f"DELETE FROM cerebro_db.{t}", f"TRUNCATE cerebro_db.{t}"):
            with pytest.raises(psycopg2.Error) as e:
                q(ce, statement)
            assert e.value.pgcode == "42501", (statement, e.value.pgerror)
    # eve cannot mark alice's rows for deletion; a purge deletes only marked rows
    with ce.cursor() as cur:
        cur.execute("UPDATE cerebro_db.jobs SET doomed = true WHERE job_name = 'iso_alice_job'")
        assert cur.rowcount == 0
    q(ce, "CALL cerebro_db.__purge('jobs')")
    with pytest.raises(psycopg2.Error) as e:
        q(ce, "CALL cerebro_db.__purge('fits')")
    assert e.value.pgcode == "22023"
    new_job(ca, "iso_alice_gone")
    q(ca, "UPDATE cerebro_db.jobs SET doomed = true WHERE job_name = 'iso_alice_gone'")
    q(ca, "CALL cerebro_db.__purge('jobs')")
    assert q(admin, "SELECT job_name FROM cerebro_db.jobs WHERE job_name IN "
                    "('iso_alice_job', 'iso_alice_gone')") == [("iso_alice_job",)]
    # what a role still may do to its rows: UPDATE (per column) and lock them for update
    q(ca, "UPDATE cerebro_db.jobs SET retries = 1 WHERE job_name = 'iso_alice_job'")
    q(ca, "BEGIN")
    try:
        assert q(ca, "SELECT job_name FROM cerebro_db.jobs WHERE job_name = 'iso_alice_job' "
                     "FOR UPDATE") == [("iso_alice_job",)]
    finally:
        q(ca, "ROLLBACK")


def test_no_role_makes_another_wait_on_its_marked_rows_or_tickets(two, admin):
    """__purge and __worker_connect delete across roles (marked rows, expired tickets) as
    the extension's owner; rows another transaction holds are skipped, never waited on: a
    role that locks its own marked row, or holds an expired ticket's deletion open, stalls
    nobody else. A ticket's token and time are the defaults (no role can choose a ticket
    that never expires)."""
    ca, ce = two["ca"], two["ce"]
    own = new_fit(ce)
    q(ce, "INSERT INTO cerebro_db.model_states (fit_id, mst_key, version, chunk, data, "
          "doomed) VALUES (%s, 1, 'current', 0, '\\x00', true)", (own,))
    for column, value in (("made_at", "2000-01-01"), ("token", "x" * 5000)):
        with pytest.raises(psycopg2.Error) as e:
            q(ce, f"INSERT INTO cerebro_db.worker_tickets ({column}) VALUES (%s)", (value,))
        assert e.value.pgcode == "42501", column
    q(admin, "INSERT INTO cerebro_db.worker_tickets (owner, made_at) VALUES (%s, "
             "'2000-01-01')", (two["eve"],))
    q(ce, "BEGIN")
    try:
        assert len(q(ce, "SELECT fit_id FROM cerebro_db.model_states WHERE doomed "
                         "FOR UPDATE")) == 1
        token = q(ce, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token")
        q(ce, "SELECT cerebro_db.__worker_connect('iso_hold', %s)", token[0])
        q(ca, "SET statement_timeout = '5s'")
        try:
            q(ca, "CALL cerebro_db.__purge('model_states')")  # no wait on eve's locked row
            mine = q(ca, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES "
                         "RETURNING token")[0][0]
            q(ca, "SELECT cerebro_db.__worker_connect('iso_a1', %s)", (mine,))
            assert end_sessions_of(admin, ca) >= 1
        finally:
            q(ca, "RESET statement_timeout")
    finally:
        q(ce, "ROLLBACK")
        end_sessions_of(admin, ce)
    q(ca, "CALL cerebro_db.__purge('model_states')")  # unlocked now: gone
    assert q(admin, "SELECT count(*) FROM cerebro_db.model_states WHERE fit_id = %s",
             (own,)) == [(0,)]


def test_no_role_fills_the_tickets_that_every_connect_cleans(two, admin):
    """A role holds at most 100 live worker tickets: an INSERT past that fails as a whole
    (54000), the role's own expired tickets do not count, and a connect deletes at most 100
    expired tickets, so a pile of them (made here by the superuser, as 10 minutes of a role's
    inserts would) costs another role's connect a bounded amount."""
    ca, ce = two["ca"], two["ce"]
    q(admin, "DELETE FROM cerebro_db.worker_tickets")  # what earlier tests left
    with pytest.raises(psycopg2.Error) as e:
        q(ce, "INSERT INTO cerebro_db.worker_tickets SELECT FROM generate_series(1, 101)")
    assert e.value.pgcode == "54000", e.value.pgerror
    assert "more than 100 live worker tickets" in e.value.pgerror
    assert q(ce, "SELECT count(*) FROM cerebro_db.worker_tickets") == [(0,)]
    q(ce, "INSERT INTO cerebro_db.worker_tickets SELECT FROM generate_series(1, 100)")
    with pytest.raises(psycopg2.Error) as e:
        q(ce, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES")
    assert e.value.pgcode == "54000"
    q(admin, "UPDATE cerebro_db.worker_tickets SET made_at = '2000-01-01' WHERE owner = %s",
      (two["eve"],))
    q(admin, "INSERT INTO cerebro_db.worker_tickets (owner, made_at) SELECT %s, '2000-01-01' "
             "FROM generate_series(1, 150)", (two["eve"],))
    token = q(ce, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token")[0][0]
    q(ce, "SELECT cerebro_db.__worker_connect('iso_e', %s)", (token,))
    assert end_sessions_of(admin, ce) >= 1
    assert q(admin, "SELECT count(*) FROM cerebro_db.worker_tickets WHERE owner = %s",
             (two["eve"],)) == [(150,)]
    mine = q(ca, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token")[0][0]
    q(ca, "SELECT cerebro_db.__worker_connect('iso_a2', %s)", (mine,))
    assert end_sessions_of(admin, ca) >= 1
    assert q(admin, "SELECT count(*) FROM cerebro_db.worker_tickets") == [(50,)]
    q(admin, "DELETE FROM cerebro_db.worker_tickets")


def test_ids_come_from_the_sequences(two, admin):
    """eve cannot take the next fit id (or unit id) in advance: an explicit id is replaced
    by a fresh one and an id never changes."""
    ce = two["ce"]
    nxt = q(ce, "SELECT pg_catalog.nextval('cerebro_db.fits_fit_id_seq')")[0][0]
    got = q(ce, "INSERT INTO cerebro_db.fits (fit_id, kind, source_table, model_output_table, "
                "policy, num_partitions, num_iterations, metrics_compute_frequency, "
                "random_state, total_units) VALUES (%s, 'fit', 's', 'o', 'mop', 1, 1, 1, 1, 1) "
                "RETURNING fit_id", (nxt + 50,))[0][0]
    assert nxt < got < nxt + 50
    q(ce, "UPDATE cerebro_db.fits SET fit_id = %s WHERE fit_id = %s", (nxt + 51, got))
    assert q(ce, "SELECT count(*) FROM cerebro_db.fits WHERE fit_id = %s", (got,)) == [(1,)]
    u = q(ce, insert_sql(admin, "units", str(got), {"unit_id": "424242424"}) +
          " RETURNING unit_id")[0][0]
    assert u != 424242424
    # alice's next fit gets a fresh id and writes its rows
    assert new_fit(two["ca"]) not in (nxt + 50, nxt + 51)


def test_views_are_security_barriers(two, admin):
    """A cheap function in eve's WHERE clause sees only eve's rows of every view."""
    ce, alice = two["ce"], two["alice"]
    q(ce, "CREATE FUNCTION leak(VARIADIC a text[]) RETURNS boolean LANGUAGE plpgsql COST 0.0001 "
          "AS $l$ BEGIN RAISE NOTICE 'leak: %', a; RETURN true; END $l$")
    views = [r[0] for r in q(admin, "SELECT c.relname::text FROM pg_class c WHERE "
                                    "c.relnamespace = 'cerebro_db'::regnamespace AND "
                                    "c.relkind = 'v' ORDER BY 1")]
    assert {"fit_progress", "fit_config_progress"} <= set(views)
    for v in views:
        opts = q(admin, "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                 (f"cerebro_db.{v}",))[0][0] or []
        assert "security_barrier=true" in opts, v
        assert "security_invoker=true" in opts, v
        cols = [r[0] for r in q(admin, "SELECT attname::text FROM pg_attribute WHERE attrelid = "
                                       "%s::regclass AND attnum > 0 ORDER BY attnum", (f"cerebro_db.{v}",))]
        args = ", ".join(f"{c}::text" for c in cols)
        del ce.notices[:]
        q(ce, f"SELECT count(*) FROM cerebro_db.{v} WHERE leak({args})")
        # alice's name, or her fit's id where a row starts with a fit id (a row of eve's
        # that starts with another id of the same number is not a leak)
        leaked = [n for n in ce.notices if alice in n
                  or (cols[0] == "fit_id" and f"{{{two['fit']}," in n)]
        assert leaked == [], (v, leaked[:2])
    # the superuser still sees every role's fits
    assert q(admin, "SELECT count(*) FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (two["fit"],)) == [(1,)]
