"""Roles that are not superusers train, with their own privileges only; one role cannot
read or change another's fits; worker sessions cannot be opened as someone else.

Everything runs against the real server with real login roles made for the test.
"""
from __future__ import annotations

import json
import threading

import pytest

from ..helpers import end_sessions_of, mlp_json, q, worker_sessions, worker_sessions_gone
from .conftest import Roles, catalog_counts, connect_as, load_mnist, relations

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', " \
          "metrics=['accuracy']"


def err(conn, sql: str, args=None) -> psycopg2.Error:
    with pytest.raises(psycopg2.Error) as ei:
        q(conn, sql, args)
    return ei.value


def prepare(conn, offset: int, partitions: int = 2) -> None:
    """As the connected role, in its own schema: raw rows, packed data, one architecture
    and one configuration."""
    load_mnist(conn, "raw", offset, offset + 300)
    q(conn, "SELECT training_preprocessor_dl('raw', 'packed', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, %s, 7)", (partitions,))
    q(conn, "SELECT load_keras_model('arch', %s)", (mlp_json(),))
    q(conn, "SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
            "ARRAY['batch_size=64'])", (COMPILE,))


def fit_multiple(conn, out: str = "out") -> None:
    q(conn, "SELECT madlib_keras_fit_multiple_model('packed', %s, 'mst', 1, FALSE, NULL, NULL, "
            "FALSE, NULL, NULL, FALSE, 'mop', NULL, 3)", (out,))


@pytest.fixture(scope="module")
def world(admin, rel_db):
    """Two roles, alice and bob, each with prepared data; both fit at the same time (two
    threads); a third role, eve, has nothing of her own."""
    roles = Roles(admin, rel_db)
    try:
        alice, bob, eve = roles.create("sec_alice"), roles.create("sec_bob"), \
            roles.create("sec_eve")
        ca, cb, ce = roles.connect(alice), roles.connect(bob), roles.connect(eve)
        prepare(ca, 0)
        prepare(cb, 300)
        prepare(ce, 600, 1)
        errors: dict[str, BaseException] = {}

        def run(role: str, c) -> None:
            try:
                fit_multiple(c)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors[role] = e

        threads = [threading.Thread(target=run, args=(r, c)) for r, c in ((alice, ca), (bob, cb))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        fits = {r: q(admin, "SELECT fit_id, owner::text, status, started_at, ended_at FROM "
                            "cerebro_db.fits WHERE owner = %s", (r,)) for r in (alice, bob)}
        yield {"roles": roles, "alice": alice, "bob": bob, "eve": eve, "ca": ca, "cb": cb,
               "ce": ce, "errors": errors, "fits": fits}
    finally:
        worker_sessions_gone(admin)
        roles.drop()


def test_two_roles_fit_at_the_same_time(world, admin):
    assert world["errors"] == {}
    a, b = world["fits"][world["alice"]], world["fits"][world["bob"]]
    assert len(a) == 1 and len(b) == 1 and a[0][2] == "done" and b[0][2] == "done"
    # the two fits really overlapped in time
    assert a[0][3] < b[0][4] and b[0][3] < a[0][4]
    for role, conn, (fit_id, *_rest) in ((world["alice"], world["ca"], a[0]),
                                         (world["bob"], world["cb"], b[0])):
        # every unit and state of the fit was written by a worker session of that role
        owners = q(admin, "SELECT DISTINCT owner::text FROM cerebro_db.units WHERE fit_id = %s "
                          "UNION SELECT DISTINCT owner::text FROM cerebro_db.model_states "
                          "WHERE fit_id = %s", (fit_id, fit_id))
        assert owners == [(role,)]
        assert q(admin, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND "
                        "kind = 'train'", (fit_id,))[0][0] == 2
        # outputs in the role's own schema, owned by it
        rows = q(admin, "SELECT c.relname::text, pg_get_userbyid(c.relowner)::text FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                        "AND c.relname LIKE 'out%%' AND c.relkind = 'r' ORDER BY 1", (role,))
        assert rows == [("out", role), ("out_info", role), ("out_summary", role)]
        assert q(conn, "SELECT count(*), min(length(model_weights)) FROM out")[0] == \
            (1, 4 * (784 * 8 + 8 + 8 * 10 + 10))
        # the role sees its own fit only
        assert q(conn, "SELECT fit_id FROM cerebro_db.fit_progress") == [(fit_id,)]
        assert q(conn, "SELECT DISTINCT fit_id FROM cerebro_db.units") == [(fit_id,)]
    worker_sessions_gone(admin)
    assert worker_sessions(admin) == 0


def test_worker_sessions_run_as_the_calling_role(world, admin):
    """A worker session opened for bob is logged in as bob, who is not a superuser; and
    bob's own SQL cannot use it: dblink's functions on open connections are the extension's
    alone (migration 098), reached through __dblink with a key that only the extension's
    Python code holds."""
    bob, cb = world["bob"], world["cb"]
    assert q(cb, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [(False,)]
    end_sessions_of(admin, cb)  # what earlier tests kept
    token = q(cb, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token")[0][0]
    q(cb, "SELECT cerebro_db.__worker_connect('t_own', %s)", (token,))
    try:
        who = q(admin, "SELECT a.usename::text, r.rolsuper FROM pg_stat_activity a JOIN "
                       "pg_roles r ON r.rolname = a.usename WHERE a.usename = %s AND "
                       "a.pid <> %s AND a.backend_type = 'client backend'",
                (bob, cb.get_backend_pid()))
        assert who == [(bob, False)]
        assert "t_own" in q(cb, "SELECT cerebro_db.dblink_get_connections()")[0][0]
        for sql in ("SELECT * FROM cerebro_db.dblink('t_own', 'SELECT 1') AS t(i int)",
                    "SELECT cerebro_db.dblink_exec('t_own', 'RESET ROLE')",
                    "SELECT cerebro_db.dblink_send_query('t_own', 'SELECT 1')",
                    "SELECT cerebro_db.dblink_disconnect('t_own')",
                    "SELECT cerebro_db.__dblink('0123', 'exec', 't_own', 'SELECT 1')",
                    "SELECT cerebro_db.__dblink(NULL, 'exec', 't_own', 'SELECT 1')"):
            e = err(cb, sql)
            assert e.pgcode == "42501", (sql, e.pgerror)
    finally:
        end_sessions_of(admin, cb)


def test_dblink_gate_takes_only_the_backends_key_and_open_connections(world, admin):
    """Only the extension's functions that use a connection are closed to PUBLIC; __dblink
    runs them for the holder of this backend's key (here a superuser's PL/Python, which can
    read it like the extension's code), on open connections only: an unknown name (which
    dblink would read as a connection string, as __dblink's owner) is refused."""
    cb = world["cb"]
    rows = q(cb, "SELECT p.proname::text, bool_or(has_function_privilege(p.oid, 'EXECUTE')) "
                 "FROM pg_proc p WHERE p.pronamespace = 'cerebro_db'::regnamespace AND "
                 "p.proname LIKE 'dblink%%' GROUP BY 1")
    allowed = {name for name, ok in rows if ok}
    assert allowed == {"dblink_connect", "dblink_get_connections", "dblink_is_busy",
                       "dblink_get_pkey",
                       "dblink_build_sql_insert", "dblink_build_sql_delete",
                       "dblink_build_sql_update", "dblink_current_query",
                       "dblink_fdw_validator"}, allowed
    q(admin, "DO $$\nfrom cerebro_db.catalog.dblink_gate import TOKEN\n"
             "try:\n"
             "    plpy.execute(plpy.prepare(\"SELECT cerebro_db.__dblink($1, 'exec', "
             "'dbname=postgres', 'SELECT 1')\", ['text']), [TOKEN])\n"
             "except plpy.SPIError as e:\n"
             "    assert e.sqlstate == '08003', e\n"
             "else:\n"
             "    raise AssertionError('a connection string was taken')\n"
             "$$ LANGUAGE plpython3u")


@pytest.mark.parametrize("target", ["alice", "postgres", "pg_read_server_files"])
def test_cannot_open_a_worker_session_as_another_role(world, admin, target):
    """The role a worker session is opened for is the owner of the caller's ticket: a
    ticket in another role's name cannot be made, a made-up one does not exist, and another
    role's ticket (its token somehow known) opens nothing for it in bob's session."""
    cb = world["cb"]
    role = world.get(target, target)
    e = err(cb, "INSERT INTO cerebro_db.worker_tickets (owner) VALUES (%s)", (role,))
    assert e.pgcode == "42501" and "row-level security" in e.pgerror
    e = err(cb, "SELECT cerebro_db.__worker_connect('t_other', 'made-up')")
    assert e.pgcode == "42501" and "no worker ticket" in e.pgerror
    token = q(admin, "INSERT INTO cerebro_db.worker_tickets (owner) VALUES (%s) "
                     "RETURNING token", (role,))[0][0]
    e = err(cb, "SELECT cerebro_db.__worker_connect('t_other', %s)", (token,))
    assert e.pgcode == "42501"
    assert f'role "{role}" may not open worker sessions in a session of role' in e.pgerror
    # no connection was left (the session may keep its fits' idle worker sessions)
    assert q(cb, "SELECT 't_other' <> ALL(coalesce(cerebro_db.dblink_get_connections(), "
                 "'{}'))") == [(True,)]


def test_a_roles_code_run_by_the_server_gets_no_session_of_the_session_user(world, admin):
    """A red-team pass made a role superuser this way: an index function of bob's asks for
    a worker session when the server runs it as bob for a superuser session (autovacuum,
    here the superuser's ANALYZE: session_user postgres, current_user bob) and, with a
    session logged in as postgres, makes bob superuser. The ticket says bob, who is neither
    the session user nor the role it SET ROLE to: refused, and bob stays as he was (the
    session would log in as postgres, where bob's code could RESET ROLE). A second pass did
    it after the superuser's SET ROLE bob (the ticket then named the role the session set):
    where PostgreSQL forbids changing the role (a maintenance command, a SECURITY DEFINER
    function), a ticket for a role other than the session user is refused (migration
    098)."""
    bob, cb = world["bob"], world["cb"]
    s = f'"{bob}"'
    q(cb, f"CREATE TABLE {s}.esc_log (cu text, su text, msg text)")
    q(cb, f"""CREATE FUNCTION {s}.esc_try() RETURNS void LANGUAGE plpgsql AS $f$
        DECLARE t text;
        BEGIN
            INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token INTO t;
            PERFORM cerebro_db.__worker_connect('esc', t);
            PERFORM cerebro_db.dblink_exec('esc', 'RESET ROLE');
            PERFORM cerebro_db.dblink_exec('esc', 'ALTER ROLE {s} SUPERUSER');
            INSERT INTO {s}.esc_log VALUES (current_user, session_user, 'connected');
        EXCEPTION WHEN OTHERS THEN
            INSERT INTO {s}.esc_log VALUES (current_user, session_user, SQLERRM);
        END $f$""")
    q(cb, f"""CREATE FUNCTION {s}.esc(i int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$
        BEGIN
            IF session_user <> current_user THEN
                PERFORM {s}.esc_try();
            END IF;
            RETURN i;
        END $f$""")
    q(cb, f"""CREATE FUNCTION {s}.esc_sd() RETURNS void LANGUAGE plpgsql SECURITY DEFINER
        AS $f$ BEGIN PERFORM {s}.esc_try(); END $f$""")
    q(cb, f"CREATE TABLE {s}.esc_t (i int)")
    q(cb, f"CREATE INDEX ON {s}.esc_t ({s}.esc(i))")
    q(cb, f"INSERT INTO {s}.esc_t SELECT generate_series(1, 50)")
    try:
        su = q(admin, "SELECT session_user::text")[0][0]
        # the superuser's ANALYZE, then (a second red-team pass) the same after SET ROLE bob,
        # where the ticket named the role the session SET ROLE to and was taken; and bob's
        # SECURITY DEFINER function called there
        for how in ("analyze", "set role, analyze", "set role, definer function"):
            q(admin, f"DELETE FROM {s}.esc_log")
            if how.startswith("set role"):
                q(admin, f"SET ROLE {s}")
            try:
                q(admin, f"ANALYZE {s}.esc_t" if how.endswith("analyze") else
                  f"SELECT {s}.esc_sd()")
            finally:
                q(admin, "RESET ROLE")
            log = q(admin, f"SELECT cu, su, msg FROM {s}.esc_log")
            assert log and all(row[:2] == (bob, su) for row in log), log
            assert all("may not open worker sessions" in row[2] for row in log), log
            assert q(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (bob,)) == \
                [(False,)]
    finally:
        q(admin, f"ALTER ROLE {s} NOSUPERUSER")
        q(admin, f"DROP TABLE {s}.esc_t, {s}.esc_log")
        q(admin, f"DROP FUNCTION {s}.esc(int), {s}.esc_sd(), {s}.esc_try()")


def test_a_maintainer_keeps_no_worker_sessions_unless_it_opts_in(world, admin, rel_db):
    """A superuser's (or the database owner's) VACUUM and ANALYZE run other roles' index
    functions in its session, where a kept worker connection (logged in as the superuser,
    dblink_exec is PUBLIC's) would be theirs to use: such a session keeps none after a fit,
    unless it sets cerebro_db.keep_workers_as_maintainer; an ordinary role keeps them."""
    bob = world["bob"]

    def kept(conn) -> list[str]:
        return q(conn, "SELECT coalesce(cerebro_db.dblink_get_connections(), '{}')")[0][0]

    su = connect_as(rel_db, q(admin, "SELECT current_user")[0][0])
    try:
        q(su, f'SET search_path = "{bob}", cerebro_db')
        told = "worker sessions closed, not kept for this session's next fit"
        # the notice: once a session, with the way to keep them (an outside pass, logged in
        # as the superuser, saw its second fit start cold with no word of why)
        for setting, keeps, notices in (("off", False, 1), ("off", False, 0), ("on", True, 0)):
            q(su, "SET cerebro_db.keep_workers_as_maintainer = %s", (setting,))
            del su.notices[:]
            fit_multiple(su, f"su_out_{setting}")
            assert bool(kept(su)) is keeps, (setting, kept(su))
            said = [n for n in su.notices if told in n]
            assert len(said) == notices, su.notices
            assert all("keep_workers_as_maintainer = on" in n for n in said)
            q(su, "SELECT cerebro_db_close_workers()")
            q(su, f'DROP TABLE "{bob}".su_out_{setting}, "{bob}".su_out_{setting}_summary, '
                  f'"{bob}".su_out_{setting}_info')
    finally:
        su.close()
    cb = world["cb"]
    q(cb, "SET cerebro_db.keep_workers_as_maintainer = off")  # not a maintainer: no matter
    fit_multiple(cb, "bob_keeps")
    try:
        assert kept(cb)
    finally:
        q(cb, "SELECT cerebro_db_close_workers()")
        q(cb, "RESET cerebro_db.keep_workers_as_maintainer")
        q(cb, "DROP TABLE bob_keeps, bob_keeps_summary, bob_keeps_info")


def test_plain_dblink_stays_closed_to_roles(world):
    cb = world["cb"]
    assert err(cb, "SELECT cerebro_db.dblink_connect_u('x', 'dbname=postgres')").pgcode == "42501"
    e = err(cb, "SELECT cerebro_db.dblink_connect('x', 'dbname=postgres user=postgres')")
    assert "password is required" in e.pgerror


def test_worker_conninfo_cannot_redirect_workers(world, admin):
    """cerebro_db.worker_conninfo never says where or as whom workers connect: a setting
    naming a user, database, port, TCP host or URI is refused before any work (22023; a
    red-team pass had another role's SECURITY DEFINER function plant dbname= in a
    superuser's session, and the superuser's workers ran the attacker's functions); a
    wrong password fails the login (trust does not use it) with nothing left behind; the
    role's own password works."""
    alice, eve, ce = world["alice"], world["eve"], world["ce"]
    try:
        before_rel, before_cat = relations(admin), catalog_counts(admin)
        for bad in (f"user={alice}", "dbname=postgres", "password=x port=1",
                    "host=127.0.0.1 password=x", "postgresql://x@localhost/postgres",
                    "options='-c role=postgres'", "password=x service=s", "password"):
            q(ce, "SET cerebro_db.worker_conninfo = %s", (bad,))
            e = err(ce, "SELECT madlib_keras_fit_multiple_model('packed', 'o2', 'mst', 1)")
            assert e.pgcode == "22023" and "cerebro_db.worker_conninfo" in e.pgerror, \
                (bad, e.pgerror)
        q(ce, "SET cerebro_db.worker_conninfo = 'password=x'")
        e = err(ce, "SELECT madlib_keras_fit_multiple_model('packed', 'o2', 'mst', 1)")
        assert e.pgcode == "08001" and f'password authentication failed for user "{eve}"' \
            in e.pgerror, e.pgerror
        assert "cerebro_db.worker_conninfo" in (e.diag.message_hint or ""), e.pgerror
        worker_sessions_gone(admin)
        assert relations(admin) == before_rel and catalog_counts(admin) == before_cat
        assert worker_sessions(admin) == 0
        # the documented alternative: the role's own password, over TCP
        q(admin, f'ALTER ROLE "{eve}" PASSWORD %s', ("eve-secret-1",))
        q(ce, "SET cerebro_db.worker_conninfo = 'password=eve-secret-1 connect_timeout=10'")
        fit_multiple(ce, "with_password")
        fit_id = q(admin, "SELECT fit_id FROM cerebro_db.fits WHERE owner = %s AND "
                          "model_output_table = 'with_password'", (eve,))[0][0]
        assert q(admin, "SELECT DISTINCT owner::text FROM cerebro_db.units WHERE fit_id = %s",
                 (fit_id,)) == [(eve,)]
    finally:
        q(ce, "RESET cerebro_db.worker_conninfo")


def test_no_select_on_source_cannot_train(world, admin, rel_db):
    """A packed table of the superuser whose summary eve may read, but not its rows: both
    fit functions fail with 42501 before any work and leave nothing behind."""
    eve, ce = world["eve"], world["ce"]
    q(admin, "DROP TABLE IF EXISTS public.secret_raw, public.secret_p, public.secret_p_summary")
    load_mnist(admin, "public.secret_raw", 0, 100)
    q(admin, "SET client_min_messages = warning")
    q(admin, "SELECT training_preprocessor_dl('public.secret_raw', 'public.secret_p', 'y', 'x', "
             "NULL, 255.0, NULL, NULL, 1, 1)")
    q(admin, f'GRANT SELECT ON public.secret_p_summary TO "{eve}"')
    before_rel, before_cat = relations(admin), catalog_counts(admin)
    try:
        for sql in (
            "SELECT madlib_keras_fit_multiple_model('public.secret_p', 'o', 'mst', 1)",
            "SELECT madlib_keras_fit('public.secret_p', 'o', 'arch', 1, %s, 'batch_size=8', 1)",
            "SELECT training_preprocessor_dl('public.secret_raw', 'p2', 'y', 'x')",
        ):
            e = err(ce, sql, (COMPILE,) if "%s" in sql else None)
            assert e.pgcode == "42501", e.pgerror
            assert "permission denied for table secret_" in e.pgerror
        worker_sessions_gone(admin)
        assert worker_sessions(admin) == 0
        assert relations(admin) == before_rel
        assert catalog_counts(admin) == before_cat
    finally:
        q(admin, "DROP TABLE public.secret_raw, public.secret_p, public.secret_p_summary")


def test_another_roles_fit_state_is_invisible_and_read_only(world, admin):
    alice_fit = world["fits"][world["alice"]][0][0]
    ce = world["ce"]

    def state():
        return [q(admin, f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM "
                         f"cerebro_db.{t} t WHERE fit_id = %s", (alice_fit,))[0][0]
                for t in ("fits", "fit_configs", "units", "model_states")]

    before = state()
    assert q(admin, "SELECT count(*) FROM cerebro_db.model_states WHERE fit_id = %s",
             (alice_fit,))[0][0] >= 1
    for t in ("fits", "fit_configs", "units", "model_states", "fit_progress",
              "fit_config_progress"):
        assert q(ce, f"SELECT count(*) FROM cerebro_db.{t} WHERE fit_id = %s",
                 (alice_fit,)) == [(0,)], t
    # updates see no rows; deletes are not allowed at all (a role marks its own rows doomed
    # and __purge deletes marked rows)
    for sql in ("UPDATE cerebro_db.fits SET status = 'failed' WHERE fit_id = %s",
                "UPDATE cerebro_db.model_states SET data = '\\x00' WHERE fit_id = %s"):
        with ce.cursor() as cur:
            cur.execute(sql, (alice_fit,))
            assert cur.rowcount == 0, sql
    for sql in ("DELETE FROM cerebro_db.units WHERE fit_id = %s",
                "DELETE FROM cerebro_db.model_states WHERE fit_id = %s",
                "DELETE FROM cerebro_db.fit_configs WHERE fit_id = %s"):
        with pytest.raises(psycopg2.Error) as e:
            q(ce, sql, (alice_fit,))
        assert e.value.pgcode == "42501", sql
    # nor marked for deletion, so a purge leaves them
    for t in ("model_states", "fit_configs"):
        with ce.cursor() as cur:
            cur.execute(f"UPDATE cerebro_db.{t} SET doomed = true WHERE fit_id = %s",
                        (alice_fit,))
            assert cur.rowcount == 0, t
        q(ce, "CALL cerebro_db.__purge(%s)", (t,))
    # inserts under alice's fit fail, as eve or in alice's name
    for sql in (
        ("INSERT INTO cerebro_db.model_states (fit_id, mst_key, version, chunk, data) "
         "VALUES (%s, 1, 'current', 7, '\\x00')"),
        ("INSERT INTO cerebro_db.model_states (fit_id, mst_key, version, chunk, data, owner) "
         "VALUES (%s, 1, 'current', 7, '\\x00', '" + world["alice"] + "')"),
        ("INSERT INTO cerebro_db.units (fit_id, mst_key, epoch, partition, worker, kind, "
         "started_at, ended_at, rows) VALUES (%s, 1, 2, 0, 0, 'train', now(), now(), 1)"),
        ("INSERT INTO cerebro_db.fit_configs (fit_id, mst_key, compile_params, fit_params, "
         "model_arch) VALUES (%s, 99, '', '', '{}')"),
    ):
        e = err(ce, sql, (alice_fit,))
        assert e.pgcode == "42501" and "row-level security" in e.pgerror, sql
    # through the extension: a unit of alice's fit run by eve finds no fit
    res = json.loads(q(ce, "SELECT cerebro_db.__run_unit(%s, 1, 1, 0, 0, 'train', '{}')",
                       (alice_fit,))[0][0])
    assert res["ok"] is False and f"fit {alice_fit} does not exist" in res["message"]
    # nor can eve read or use alice's outputs and data
    for sql, frag in (
        (f'SELECT * FROM "{world["alice"]}".out', "permission denied for schema"),
        (f"SELECT madlib_keras_predict('\"{world['alice']}\".out', 'eve_t', 'id', 'x', 'p')",
         "permission denied for schema"),
        ((f"SELECT madlib_keras_fit_multiple_model('\"{world['alice']}\".packed', 'o', "
          f"'\"{world['alice']}\".mst', 1, FALSE, NULL, NULL, TRUE)"),
         "permission denied for schema"),
    ):
        e = err(ce, sql)
        assert e.pgcode == "42501" and frag in e.pgerror, (sql, e.pgerror)
    assert state() == before
    assert q(admin, "SELECT count(*) FROM cerebro_db.units u JOIN cerebro_db.fits f "
                    "USING (fit_id) WHERE u.owner <> f.owner") == [(0,)]


def test_a_superuser_does_not_resume_another_roles_fit(world, admin):
    """A red-team pass: a superuser sees every role's fits, and a resume runs the fit as
    its caller on the tables the fit's row names (a row its owner wrote, or one restored
    from a dump); so only the owner resumes a fit (42501, with the SET ROLE to use)."""
    alice = world["alice"]
    alice_fit = world["fits"][alice][0][0]
    e = err(admin, "SELECT cerebro_db.madlib_keras_fit_resume(%s)", (alice_fit,))
    assert e.pgcode == "42501", e.pgerror
    assert f'belongs to role "{alice}"' in e.pgerror
    assert e.diag.message_hint == f'A fit is resumed by its owner: SET ROLE "{alice}" first.'


def test_another_roles_code_cannot_use_a_callers_kept_sessions(world, admin):
    """A red-team pass: after alice's fit her backend keeps idle worker sessions (logged in
    as alice) for the next fit; eve's SECURITY DEFINER function, called by alice in the same
    session, listed them and ran SQL as alice through dblink_exec (it copied her table).
    Now dblink's functions on open connections are the extension's only: eve's function
    gets 42501 on each, cannot close them either, alice's data stays hers, and alice's next
    fit still reuses them."""
    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    a, e = f'"{alice}"', f'"{eve}"'
    q(ca, f"CREATE TABLE {a}.secret AS SELECT 'alice-only'::text AS v")
    q(ce, f"CREATE TABLE {e}.tried (conn text, how text, state text)")
    q(ce, f"GRANT USAGE ON SCHEMA {e} TO {a}")
    q(ce, f"""CREATE FUNCTION {e}.api(x int) RETURNS int LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, cerebro_db AS $f$
        DECLARE c text; how text;
        BEGIN
            FOREACH c IN ARRAY coalesce(dblink_get_connections(), '{{}}') LOOP
                FOREACH how IN ARRAY ARRAY['exec', 'query', 'disconnect', 'gate'] LOOP
                    BEGIN
                        CASE how
                        WHEN 'exec' THEN PERFORM dblink_exec(c,
                            'CREATE TABLE public.stolen AS SELECT * FROM {a}.secret');
                        WHEN 'query' THEN PERFORM * FROM dblink(c, 'SELECT v FROM {a}.secret')
                            AS t(v text);
                        WHEN 'disconnect' THEN PERFORM dblink_disconnect(c);
                        ELSE PERFORM cerebro_db.__dblink(md5(c), 'exec', c, 'SELECT 1');
                        END CASE;
                        INSERT INTO {e}.tried VALUES (c, how, 'ran');
                    EXCEPTION WHEN OTHERS THEN
                        INSERT INTO {e}.tried VALUES (c, how, SQLSTATE);
                    END;
                END LOOP;
            END LOOP;
            INSERT INTO {e}.tried VALUES ('-', 'close', cerebro_db.cerebro_db_close_workers());
            RETURN x + 1;
        END $f$""")
    q(ce, f"GRANT EXECUTE ON FUNCTION {e}.api(int) TO {a}")
    try:
        fit_multiple(ca, "kept_a")
        kept = q(ca, "SELECT coalesce(cerebro_db.dblink_get_connections(), '{}')")[0][0]
        assert kept, "alice's session keeps its worker sessions"
        assert q(ca, f"SELECT {e}.api(41)") == [(42,)]
        tried = q(ce, f"SELECT conn, how, state FROM {e}.tried WHERE how <> 'close' "
                      "ORDER BY 1, 2")
        assert tried and {c for c, _, _ in tried} == set(kept)
        assert all(state == "42501" for _, _, state in tried), tried
        # nor may it close them (cerebro_db_close_workers closes the calling role's only)
        assert q(ce, f"SELECT state FROM {e}.tried WHERE how = 'close'") == [("0",)]
        assert q(admin, "SELECT to_regclass('public.stolen')") == [(None,)]
        before = set(q(admin, "SELECT pid FROM pg_stat_activity WHERE usename = %s AND "
                              "application_name LIKE 'cerebro_db_pool %%'", (alice,)))
        assert before
        fit_multiple(ca, "kept_b")  # reuses them
        assert q(ca, "SELECT count(DISTINCT worker_pid) FROM cerebro_db.units u JOIN "
                     "cerebro_db.fits f USING (fit_id) WHERE f.model_output_table LIKE "
                     "'%%kept_b' AND u.worker_pid = ANY(%s)", ([p for (p,) in before],)) \
            == [(len(before),)]
    finally:
        q(ca, "SELECT cerebro_db_close_workers()")
        q(ca, f"DROP TABLE IF EXISTS {a}.secret, kept_a, kept_a_summary, kept_a_info, kept_b, "
              "kept_b_summary, kept_b_info")
        q(ce, f"DROP FUNCTION {e}.api(int)")
        q(ce, f"DROP TABLE {e}.tried")


def test_a_call_writes_only_into_tables_its_caller_owns(world, admin):
    """Another role's table the caller names to append to, delete from or drop is refused
    before anything is written: its owner's triggers (and defaults) would run as the caller
    (a red-team pass became superuser through a trigger on a model_arch table in public)."""
    eve, ce = world["eve"], world["ce"]
    q(ce, "CREATE TABLE trap_log (who text)")
    q(ce, "GRANT INSERT, SELECT ON trap_log TO PUBLIC")
    q(ce, f"""CREATE FUNCTION trap() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN INSERT INTO "{eve}".trap_log VALUES (current_user); RETURN NEW; END $$""")
    q(ce, f"""SELECT load_top_k_accuracy_function('"{eve}".objs', 3)""")
    for t in ("arch", "mst", "objs"):
        q(ce, f"CREATE TRIGGER trap BEFORE INSERT OR DELETE ON {t} FOR EACH ROW "
              "EXECUTE FUNCTION trap()")
        q(ce, f"GRANT ALL ON {t} TO PUBLIC")
    q(ce, f'GRANT USAGE ON SCHEMA "{eve}" TO PUBLIC')
    q(ce, f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{eve}" TO PUBLIC')
    q(ce, "GRANT SELECT ON mst_summary TO PUBLIC")
    before = {t: q(admin, f'SELECT count(*) FROM "{eve}".{t}')[0][0] for t in ("arch", "mst",
                                                                                "objs")}
    grid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
            "[{'optimizer': ['SGD'], 'lr': [0.1]}], 'metrics': ['accuracy']}")
    calls = [
        ("SELECT load_keras_model(%s, %s)", (f'"{eve}".arch', mlp_json())),
        ("SELECT delete_keras_model(%s, 1)", (f'"{eve}".arch',)),
        ("SELECT generate_model_configs('arch', %s, ARRAY[1], %s, $${'batch_size': [8]}$$)",
         (f'"{eve}".mst', grid)),
        ("SELECT load_top_k_accuracy_function(%s, 5)", (f'"{eve}".objs',)),
        ("SELECT delete_custom_function(%s, name => 'top_3_accuracy')", (f'"{eve}".objs',)),
    ]
    su = connect_as(world["roles"].dbname, q(admin, "SELECT current_user")[0][0])
    try:
        q(su, f'SET search_path = "{world["alice"]}", cerebro_db')
        for conn in (world["ca"], su):
            for sql, args in calls:
                e = err(conn, sql, args)
                assert e.pgcode == "42501", (sql, e.pgerror)
                assert f'belongs to role "{eve}"' in e.pgerror, e.pgerror
    finally:
        su.close()
    assert q(admin, f'SELECT who FROM "{eve}".trap_log') == []
    assert {t: q(admin, f'SELECT count(*) FROM "{eve}".{t}')[0][0]
            for t in ("arch", "mst", "objs")} == before
    # her own calls on her own tables still work (and her trigger runs as herself)
    q(ce, "SELECT load_keras_model('arch', %s)", (mlp_json(),))
    assert q(ce, "SELECT who FROM trap_log") == [(eve,)]


def _trap(admin, ce, eve: str, schema: str) -> str:
    """A schema of eve's that PUBLIC may use, with a log table any role may write and a
    function logging who runs it; returns the log's name."""
    q(admin, f'CREATE SCHEMA IF NOT EXISTS "{schema}" AUTHORIZATION "{eve}"')
    q(ce, f'CREATE TABLE IF NOT EXISTS "{schema}".log (who text)')
    q(ce, f'GRANT INSERT, SELECT ON "{schema}".log TO PUBLIC')
    q(ce, f'GRANT USAGE ON SCHEMA "{schema}" TO PUBLIC')
    q(ce, f"""CREATE OR REPLACE FUNCTION "{schema}".probe() RETURNS boolean LANGUAGE plpgsql
              AS $$ BEGIN INSERT INTO "{schema}".log VALUES (current_user); RETURN true;
              END $$""")
    return f'"{schema}".log'


def test_a_selection_tables_architecture_table_is_not_found_along_the_callers_path(
        world, admin):
    """A selection table's _summary names its architecture table unqualified (as MADlib
    stores it). Looked up along the caller's search_path first, eve's view of that name in
    a schema on the path ran her function as a superuser fitting alice's table (a red-team
    pass). Now the table beside the selection table comes first, and a table found along
    the path must be the caller's, the selection table owner's or a superuser's."""
    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    log = _trap(admin, ce, eve, f"{eve}_s")
    q(ce, f'CREATE VIEW "{eve}_s".arch AS SELECT * FROM "{eve}".arch WHERE "{eve}_s".probe()')
    q(ce, f'CREATE VIEW "{eve}_s".arch2 AS SELECT * FROM "{eve}".arch WHERE "{eve}_s".probe()')
    q(ce, f'GRANT SELECT ON "{eve}_s".arch, "{eve}_s".arch2, "{eve}".arch TO PUBLIC')
    q(ce, f'GRANT USAGE ON SCHEMA "{eve}" TO PUBLIC')
    q(ca, f'SET search_path = "{eve}_s", "{alice}", cerebro_db')
    try:
        q(ca, f"""SELECT madlib_keras_fit_multiple_model('"{alice}".packed', '"{alice}".out_p',
                  '"{alice}".mst', 1)""")
        assert q(admin, f"SELECT who FROM {log}") == []
        # a name only the path finds, in a schema of another role: refused, nothing read
        q(ca, f'UPDATE "{alice}".mst_summary SET model_arch_table = \'arch2\'')
        e = err(ca, f"""SELECT madlib_keras_fit_multiple_model('"{alice}".packed',
                        '"{alice}".out_q', '"{alice}".mst', 1)""")
        assert e.pgcode == "42501", e.pgerror
        assert f'belongs to role "{eve}"' in e.pgerror
        assert q(admin, f"SELECT who FROM {log}") == []
    finally:
        q(ca, f'UPDATE "{alice}".mst_summary SET model_arch_table = \'arch\'')
        q(ca, f'SET search_path = "{alice}", cerebro_db')


def test_a_table_replaced_by_its_schemas_owner_after_the_check_is_not_written(world, admin):
    """require_own_table checked the owner, then the write named the table again: the owner
    of the schema (who may drop any table in it) replaced alice's table by one with a
    trigger while alice's call waited on its lock, and the trigger ran as alice (a red-team
    pass, as a superuser). The table is now locked after the check and checked again."""
    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    schema = f"{eve}_r"
    log = _trap(admin, ce, eve, schema)
    q(ce, f'GRANT CREATE ON SCHEMA "{schema}" TO "{alice}"')
    q(ca, "SELECT load_keras_model(%s, %s)", (f'"{schema}".aarch', mlp_json()))
    q(ce, f"""CREATE OR REPLACE FUNCTION "{schema}".trig() RETURNS trigger LANGUAGE plpgsql
              AS $$ BEGIN PERFORM "{schema}".probe(); RETURN NEW; END $$""")
    swap = connect_as(world["roles"].dbname, eve)
    swap.autocommit = False
    result: dict[str, BaseException | None] = {}
    try:
        with swap.cursor() as cur:
            cur.execute(f'DROP TABLE "{schema}".aarch')
            cur.execute(f'CREATE TABLE "{schema}".aarch (model_id serial PRIMARY KEY, '
                        "model_arch json, model_weights bytea, name text, description text, "
                        "__internal_madlib_id__ text)")
            cur.execute(f'GRANT ALL ON "{schema}".aarch TO PUBLIC')
            cur.execute(f'GRANT ALL ON SEQUENCE "{schema}".aarch_model_id_seq TO PUBLIC')
            cur.execute(f'CREATE TRIGGER t BEFORE INSERT ON "{schema}".aarch FOR EACH ROW '
                        f'EXECUTE FUNCTION "{schema}".trig()')

        def call() -> None:
            try:
                q(ca, "SELECT load_keras_model(%s, %s)", (f'"{schema}".aarch', mlp_json()))
                result["e"] = None
            except psycopg2.Error as e:
                result["e"] = e

        t = threading.Thread(target=call)
        t.start()
        for _ in range(200):  # alice's call waits on eve's lock
            if q(admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                        "wait_event_type = 'Lock'", (alice,))[0][0]:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("alice's call never waited on the swap's lock")
        swap.commit()
        t.join(60)
    finally:
        swap.close()
    e = result["e"]
    assert e is not None and e.pgcode == "42501", e and e.pgerror
    assert f'belongs to role "{eve}"' in e.pgerror
    assert q(admin, f"SELECT who FROM {log}") == []
    assert q(admin, f'SELECT count(*) FROM "{schema}".aarch')[0][0] == 0


def test_another_roles_temporary_relation_in_the_callers_session_is_not_read(world, admin):
    """eve's SECURITY DEFINER function, called by a superuser, made a temporary view named
    like the superuser's selection table in the superuser's session; the session's
    temporary schema comes first on every path, so the fit read it and ran eve's function
    as the superuser (a red-team pass). Such a relation is now refused (42501)."""
    alice, eve, ce = world["alice"], world["eve"], world["ce"]
    log = _trap(admin, ce, eve, f"{eve}_t")
    q(ce, f'GRANT SELECT ON "{eve}".mst TO PUBLIC')
    q(ce, f"""CREATE FUNCTION "{eve}_t".hello() RETURNS text LANGUAGE plpgsql SECURITY DEFINER
              AS $$ BEGIN EXECUTE 'CREATE TEMP VIEW mst AS SELECT * FROM "{eve}".mst
              WHERE "{eve}_t".probe()'; RETURN 'hello'; END $$""")
    q(ce, f'GRANT EXECUTE ON FUNCTION "{eve}_t".hello() TO PUBLIC')
    su = connect_as(world["roles"].dbname, q(admin, "SELECT current_user")[0][0])
    try:
        q(su, f'SET search_path = "{alice}", cerebro_db')
        q(su, f'SELECT "{eve}_t".hello()')
        e = err(su, f"""SELECT madlib_keras_fit_multiple_model('"{alice}".packed',
                        '"{alice}".out_t', 'mst', 1)""")
        assert e.pgcode == "42501", e.pgerror
        assert f'temporary relation of role "{eve}"' in e.pgerror
        assert q(admin, f"SELECT who FROM {log}") == []
        q(su, "DISCARD TEMP")
    finally:
        su.close()


def test_another_roles_view_on_an_object_table_does_not_block_deleting_from_it(world, admin):
    """delete_custom_function drops the object table once it is empty; eve's view on it
    (its SELECT is PUBLIC's) made the call fail and roll back. The table is now kept."""
    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    q(ca, f"""SELECT load_top_k_accuracy_function('"{alice}".objs_v', 3)""")
    q(ca, f'GRANT USAGE ON SCHEMA "{alice}" TO "{eve}"')
    try:
        q(ce, f'CREATE VIEW "{eve}".on_objs AS SELECT * FROM "{alice}".objs_v')
        del ca.notices[:]
        q(ca, f"""SELECT delete_custom_function('"{alice}".objs_v', name => 'top_3_accuracy')""")
        assert q(ca, f'SELECT count(*) FROM "{alice}".objs_v')[0][0] == 0
        assert any("is kept: other objects depend on it" in n for n in ca.notices)
    finally:
        q(ce, f'DROP VIEW IF EXISTS "{eve}".on_objs')
        q(ca, f'DROP TABLE IF EXISTS "{alice}".objs_v')
        q(ca, f'REVOKE USAGE ON SCHEMA "{alice}" FROM "{eve}"')


def test_predict_on_a_model_without_weights_is_a_clear_error(world):
    ca, alice = world["ca"], world["alice"]
    q(ca, 'CREATE TABLE nw AS SELECT * FROM "out" LIMIT 1')
    q(ca, 'CREATE TABLE nw_summary AS SELECT * FROM "out_summary"')
    q(ca, "UPDATE nw SET model_weights = NULL")
    try:
        e = err(ca, "SELECT madlib_keras_predict('nw', 'raw', 'id', 'x', 'nw_pred', "
                    "mst_key => (SELECT mst_key FROM nw))")
        assert e.pgcode == "22004", e.pgerror
        assert "model_weights of mst_key" in e.pgerror and "is NULL" in e.pgerror
        assert q(ca, "SELECT to_regclass('nw_pred')") == [(None,)]
    finally:
        q(ca, f'DROP TABLE IF EXISTS "{alice}".nw, "{alice}".nw_summary, "{alice}".nw_pred')


def test_another_roles_model_is_read_only_when_reading_it_runs_none_of_its_code(world, admin):
    """A model table (or its _summary) of another role that is a view, or has row-level
    security, runs that role's functions as the reader: a red-team pass made itself
    superuser with a view as its model's _summary, read by a superuser's
    madlib_keras_predict. Such relations of another (non-superuser) role are refused
    (42501) before anything is written; its plain tables are still read, and a superuser,
    whom no policy applies to, reads a table with row-level security."""
    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    log = _trap(admin, ce, eve, f"{eve}_m")
    q(ce, "SELECT madlib_keras_fit('packed', 'emodel', 'arch', 1, %s, 'batch_size=64', 1)",
      (COMPILE,))
    q(ce, f'GRANT USAGE ON SCHEMA "{eve}" TO PUBLIC')
    q(ce, "ALTER TABLE emodel_summary RENAME TO emodel_summary_t")
    q(ce, f'CREATE VIEW emodel_summary AS SELECT * FROM emodel_summary_t WHERE "{eve}_m".probe()')
    q(ce, f'CREATE VIEW emodel2 AS SELECT * FROM emodel WHERE "{eve}_m".probe()')
    q(ce, "CREATE TABLE emodel2_summary AS SELECT * FROM emodel_summary_t")
    q(ce, "GRANT SELECT ON emodel, emodel2, emodel_summary, emodel_summary_t, emodel2_summary "
          "TO PUBLIC")
    su = connect_as(world["roles"].dbname, q(admin, "SELECT current_user")[0][0])
    predict = "SELECT madlib_keras_predict(%s, %s, 'id', 'x', %s)"
    try:
        q(su, f'SET search_path = "{alice}", cerebro_db')
        for conn in (ca, su):
            for model, why in (("emodel", 'emodel_summary" is a view'),
                               ("emodel2", 'emodel2" is a view')):
                e = err(conn, predict, (f'"{eve}".{model}', f'"{alice}".raw',
                                        f'"{alice}".pred_v'))
                assert e.pgcode == "42501", e.pgerror
                assert why in e.pgerror and f'of role "{eve}"' in e.pgerror, e.pgerror
                assert q(admin, f"SELECT who FROM {log}") == []
                assert q(admin, f"SELECT to_regclass('\"{alice}\".pred_v')") == [(None,)]
        # a plain summary with a row security policy calling her function
        q(ce, "DROP VIEW emodel_summary")
        q(ce, "ALTER TABLE emodel_summary_t RENAME TO emodel_summary")
        q(ce, "ALTER TABLE emodel_summary ENABLE ROW LEVEL SECURITY")
        q(ce, f'CREATE POLICY p ON emodel_summary USING ("{eve}_m".probe())')
        e = err(ca, predict, (f'"{eve}".emodel', f'"{alice}".raw', f'"{alice}".pred_r'))
        assert e.pgcode == "42501" and "row-level security" in e.pgerror, e.pgerror
        q(su, predict, (f'"{eve}".emodel', f'"{alice}".raw', f'"{alice}".pred_r'))
        assert q(su, f'SELECT count(DISTINCT id) FROM "{alice}".pred_r')[0][0] == 300
        # without the policy, alice reads eve's plain tables
        q(ce, "ALTER TABLE emodel_summary DISABLE ROW LEVEL SECURITY")
        q(ca, predict, (f'"{eve}".emodel', f'"{alice}".raw', f'"{alice}".pred_p'))
        assert q(ca, "SELECT count(DISTINCT id) FROM pred_p")[0][0] == 300
        assert q(admin, f"SELECT who FROM {log}") == []
    finally:
        su.close()
        q(admin, f'DROP TABLE IF EXISTS "{alice}".pred_r, "{alice}".pred_p')


def test_another_roles_types_materialized_views_and_tables_made_views_are_not_read(
        world, admin):
    """A later red-team pass ran its function as the caller (a superuser included) through
    a column of its domain, whose CHECK runs when predict casts the id column to its type,
    and through a table it made a view in place (CREATE RULE "_RETURN", same oid) while
    the caller waited on its lock; another role's materialized view failed on LOCK with a
    bare 42809. Each is refused (42501) before anything is written, and nothing of hers
    runs."""
    import time

    alice, eve, ca, ce = world["alice"], world["eve"], world["ca"], world["ce"]
    s = f"{eve}_t"
    log = _trap(admin, ce, eve, s)
    q(ca, "SELECT madlib_keras_fit('packed', 'amodel_t', 'arch', 1, %s, 'batch_size=64', 1)",
      (COMPILE,))
    q(ce, f'GRANT USAGE ON SCHEMA "{eve}" TO PUBLIC')
    q(ce, f'CREATE DOMAIN "{s}".did AS integer CHECK ("{s}".probe())')
    q(ce, f"CREATE TYPE \"{s}\".tag AS ENUM ('a')")
    q(ce, f'CREATE TABLE dtab AS SELECT id::"{s}".did AS id, x FROM raw')
    q(ce, f'CREATE TABLE etab AS SELECT id, x, ARRAY[]::"{s}".tag[] AS tags FROM raw')
    q(ce, "CREATE MATERIALIZED VIEW emv AS SELECT id, x FROM raw")
    q(ce, "CREATE TABLE conv AS SELECT id, x FROM raw WITH NO DATA")
    q(ce, "GRANT SELECT ON dtab, etab, emv, conv, raw TO PUBLIC")
    q(admin, f"DELETE FROM {log}")
    su = connect_as(world["roles"].dbname, q(admin, "SELECT current_user")[0][0])
    predict = "SELECT madlib_keras_predict(%s, %s, 'id', 'x', %s)"
    model = f'"{alice}".amodel_t'
    try:
        for conn, table, says in (
                (ca, "dtab", f'column "id" is of type {s}.did of role "{eve}"'),
                (su, "dtab", f'column "id" is of type {s}.did of role "{eve}"'),
                (ca, "etab", f'column "tags" is of type {s}.tag'),
                (ca, "emv", f'is a materialized view of role "{eve}"')):
            e = err(conn, predict, (model, f'"{eve}".{table}', f'"{alice}".pred_t'))
            assert e.pgcode == "42501" and says in e.pgerror, (table, e.pgerror)
            assert q(admin, f"SELECT to_regclass('\"{alice}\".pred_t')") == [(None,)]
        # eve makes her empty table a view while alice's predict waits on its lock
        ce2 = connect_as(world["roles"].dbname, eve)
        ce2.autocommit = False
        q(ce2, "LOCK TABLE conv IN ACCESS EXCLUSIVE MODE")
        q(ce2, f'CREATE RULE "_RETURN" AS ON SELECT TO conv DO INSTEAD '
               f'SELECT id, x FROM raw WHERE "{s}".probe()')
        pid = ca.get_backend_pid()
        got: list[BaseException] = []

        def call() -> None:
            try:
                q(ca, predict, (model, f'"{eve}".conv', f'"{alice}".pred_t'))
            except BaseException as x:  # noqa: BLE001 - the test reads it
                got.append(x)

        t = threading.Thread(target=call)
        t.start()
        end = time.monotonic() + 120
        while q(admin, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                (pid,)) != [("Lock",)]:
            assert time.monotonic() < end and t.is_alive(), got
            time.sleep(0.05)
        ce2.commit()
        ce2.close()
        t.join(120)
        assert got and getattr(got[0], "pgcode", None) == "42501", got
        assert 'conv" is a view' in got[0].pgerror, got[0].pgerror
        assert q(admin, f"SELECT to_regclass('\"{alice}\".pred_t')") == [(None,)]
        assert q(admin, f"SELECT who FROM {log}") == []
    finally:
        su.close()


def test_a_dropped_roles_catalog_rows_are_forgotten_before_its_name_is_reused(admin, rel_db):
    """Catalog rows name their owner; DROP OWNED BY leaves them, and a role created later
    under the same name saw and could write them as its own (a red-team pass).
    cerebro_db_forget_role (superusers, a dropped role only) deletes them."""
    import uuid

    name = f"sec_gone_{uuid.uuid4().hex[:8]}"

    def make():
        q(admin, f'CREATE ROLE "{name}" LOGIN')
        q(admin, f'GRANT USAGE ON SCHEMA cerebro_db TO "{name}"')
        return connect_as(rel_db, name)

    c = make()
    try:
        q(c, "INSERT INTO cerebro_db.fits (kind, source_table, model_output_table, policy, "
             "num_partitions, num_iterations, metrics_compute_frequency, random_state, "
             "total_units, message) VALUES ('fit', 'x', 'y', 'mop', 1, 1, 1, 1, 1, 'secret')")
        e = err(c, "SELECT cerebro_db.cerebro_db_forget_role(current_user)")
        assert e.pgcode == "42501", e.pgerror
        e = err(admin, "SELECT cerebro_db.cerebro_db_forget_role(%s)", (name,))
        assert e.pgcode == "55000" and "still exists" in e.pgerror, e.pgerror
        e = err(admin, "SELECT cerebro_db.cerebro_db_forget_role(NULL)")
        assert e.pgcode == "22004", e.pgerror
    finally:
        c.close()
    q(admin, f'DROP OWNED BY "{name}"')
    q(admin, f'DROP ROLE "{name}"')
    assert q(admin, "SELECT count(*) FROM cerebro_db.fits WHERE owner = %s", (name,)) == [(1,)]
    assert q(admin, "SELECT cerebro_db.cerebro_db_forget_role(%s)", (name,)) == [(1,)]
    assert q(admin, "SELECT count(*) FROM cerebro_db.fits WHERE owner = %s", (name,)) == [(0,)]
    c = make()
    try:
        assert q(c, "SELECT count(*) FROM cerebro_db.fits") == [(0,)]
    finally:
        c.close()
        q(admin, f'DROP OWNED BY "{name}"')
        q(admin, f'DROP ROLE "{name}"')


def test_internal_functions_and_a_resume_of_an_edited_fit_row_give_clear_errors(world):
    """PUBLIC may call the internal functions the worker sessions and jobs call, and a role
    may edit its own fit rows; a red-team pass got Python tracebacks (38000, XX000) from
    NULLs, malformed JSON and a resume of an edited row."""
    ce = world["ce"]
    for sql, code in (
            ("SELECT cerebro_db.__run_unit(1, 1, 1, 0, 0, 'train', 'not json')", "22P02"),
            ("SELECT cerebro_db.__run_unit(1, 1, 1, 0, 0, 'train', '[1]')", "22023"),
            ("SELECT cerebro_db.__run_slot(NULL, NULL, NULL, NULL, NULL, NULL)", "22004"),
            ("SELECT cerebro_db.__job_step('no_such_job', 1, 'pack')", "42704")):
        e = err(ce, sql)
        assert e.pgcode == code, (sql, e.pgerror)
        # PL/Python says plpy.Error for a function without a PL/pgSQL wrapper; no other
        # exception type reaches the message
        first = e.pgerror.split("\n")[0].replace("plpy.Error: ", "")
        assert "Error" not in first and "Exception" not in first, e.pgerror
    for spec in ('[]', '{"configs": 5, "columns": []}', ('{"columns": [], "configs": '
                 '[{"mst_key": "1", "model_id": 1, "compile_params": "", "what": "", '
                 '"arch": {}}]}'), '{"columns": [], "configs": [7]}'):
        (answer,) = q(ce, "SELECT cerebro_db.__check_fit(%s)", (spec,))[0]
        assert json.loads(answer)["sqlstate"] == "22023", (spec, answer)
        assert "Traceback" not in answer, answer
    fit_id = q(ce, "INSERT INTO cerebro_db.fits (kind, source_table, model_output_table, "
                   "policy, num_partitions, num_iterations, metrics_compute_frequency, "
                   "random_state, total_units, status, options) VALUES ('fit_multiple', "
                   "'packed', 'edited_out', 'mop', 1, 1, 1, 1, 1, 'failed', "
                   """'{"executor_tag": "x"}') RETURNING fit_id""")[0][0]
    try:
        for opts, says in (
                ({}, "options.arch_table is missing"),
                ({"arch_table": "arch", "num_workers": "abc"}, "options.num_workers is"),
                ({"arch_table": "arch", "num_workers": 0}, "options.num_workers is 0"),
                ({"arch_table": "arch", "num_workers": 1, "tables": {"output": [1]}},
                 "options.tables.output"),
                ({"arch_table": "arch", "num_workers": 1}, "it has no configurations")):
            q(ce, "UPDATE cerebro_db.fits SET options = %s WHERE fit_id = %s",
              (json.dumps({"executor_tag": "x", **opts}), fit_id))
            e = err(ce, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
            assert e.pgcode == "55000", (opts, e.pgerror)
            assert "catalog row is damaged" in e.pgerror and says in e.pgerror, e.pgerror
    finally:  # a role cannot delete its fit rows; the module's roles.drop() does
        q(ce, "UPDATE cerebro_db.fits SET status = 'done' WHERE fit_id = %s", (fit_id,))
