"""Roles that are not superusers train, with their own privileges only; one role cannot
read or change another's fits; worker sessions cannot be opened as someone else.

Everything runs against the real server with real login roles made for the test.
"""
from __future__ import annotations

import json
import threading

import pytest

from ..helpers import mlp_json, q, worker_sessions, worker_sessions_gone
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
    """The unit rows record the worker backend's pid; while a fit runs, those backends are
    logged in as the role; afterwards the role cannot reach another identity."""
    bob, cb = world["bob"], world["cb"]
    assert q(cb, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [(False,)]
    token = q(cb, "INSERT INTO cerebro_db.worker_tickets DEFAULT VALUES RETURNING token")[0][0]
    q(cb, "SELECT cerebro_db.__worker_connect('t_own', %s)", (token,))
    try:
        who = q(cb, "SELECT * FROM cerebro_db.dblink('t_own', 'SELECT current_user::text, "
                    "session_user::text, (SELECT rolsuper FROM pg_roles WHERE rolname = "
                    "current_user)') AS t(u text, s text, su boolean)")
        assert who == [(bob, bob, False)]
    finally:
        q(cb, "SELECT cerebro_db.dblink_disconnect('t_own')")


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
    session would log in as postgres, where bob's code could RESET ROLE)."""
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
    q(cb, f"CREATE TABLE {s}.esc_t (i int)")
    q(cb, f"CREATE INDEX ON {s}.esc_t ({s}.esc(i))")
    q(cb, f"INSERT INTO {s}.esc_t SELECT generate_series(1, 50)")
    try:
        q(admin, f"ANALYZE {s}.esc_t")
        log = q(admin, f"SELECT cu, su, msg FROM {s}.esc_log")
        su = q(admin, "SELECT session_user::text")[0][0]
        assert log and all(row[:2] == (bob, su) for row in log), log
        assert all("may not open worker sessions in a session of role" in row[2]
                   for row in log), log
        assert q(admin, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", (bob,)) == \
            [(False,)]
    finally:
        q(admin, f"ALTER ROLE {s} NOSUPERUSER")
        q(admin, f"DROP TABLE {s}.esc_t, {s}.esc_log")
        q(admin, f"DROP FUNCTION {s}.esc(int), {s}.esc_try()")


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
        for setting, keeps in (("off", False), ("on", True)):
            q(su, "SET cerebro_db.keep_workers_as_maintainer = %s", (setting,))
            fit_multiple(su, f"su_out_{setting}")
            assert bool(kept(su)) is keeps, (setting, kept(su))
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
    """cerebro_db.worker_conninfo naming another user is ignored without a password (the
    extension builds the whole connection), and with one dblink refuses it (the server's
    trust authentication does not use the password)."""
    alice, eve, ce = world["alice"], world["eve"], world["ce"]
    try:
        q(ce, "SET cerebro_db.worker_conninfo = %s", (f"user={alice} dbname=postgres",))
        fit_multiple(ce, "redirected")
        fit_id = q(admin, "SELECT fit_id FROM cerebro_db.fits WHERE owner = %s AND "
                          "model_output_table = 'redirected'", (eve,))[0][0]
        assert q(admin, "SELECT DISTINCT owner::text FROM cerebro_db.units WHERE fit_id = %s",
                 (fit_id,)) == [(eve,)]
        worker_sessions_gone(admin)
        before_rel, before_cat = relations(admin), catalog_counts(admin)
        q(ce, "SET cerebro_db.worker_conninfo = %s", (f"user={alice} password=x",))
        e = err(ce, "SELECT madlib_keras_fit_multiple_model('packed', 'o2', 'mst', 1)")
        assert e.pgcode == "08001" and f'password authentication failed for user "{alice}"' \
            in e.pgerror, e.pgerror
        assert "cerebro_db.worker_conninfo" in (e.diag.message_hint or ""), e.pgerror
        worker_sessions_gone(admin)
        assert relations(admin) == before_rel and catalog_counts(admin) == before_cat
        assert worker_sessions(admin) == 0
        # the documented alternative: the role's own password, over TCP
        q(admin, f'ALTER ROLE "{eve}" PASSWORD %s', ("eve-secret-1",))
        q(ce, "SET cerebro_db.worker_conninfo = 'password=eve-secret-1'")
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
