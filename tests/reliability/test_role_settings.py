"""Settings a DBA may give a role or a database, which every new session of the role (the
fit's worker and control sessions included) starts with: fits work under them or are
refused before any work with a clear error (an outside pass found fits that trained fully
and then failed, and fits that could not start)."""
from __future__ import annotations

import pytest

from ..helpers import mlp_json, q, worker_sessions_gone
from .conftest import Roles, catalog_counts, load_mnist, relations

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', " \
          "metrics=['accuracy']"
FIT = ("SELECT madlib_keras_fit_multiple_model('p', %s, 'mst', 1, FALSE, NULL, NULL, FALSE, "
       "NULL, NULL, NULL, 'mop', NULL, 3)")


@pytest.fixture(scope="module")
def rs(admin, rel_db):
    """A role with packed data, an architecture and a model selection table in its schema."""
    roles = Roles(admin, rel_db)
    try:
        role = roles.create("rs_role")
        c = roles.connect(role)
        q(c, f'SET search_path = "{role}", cerebro_db')
        load_mnist(c, "raw", 0, 120)
        q(c, "SELECT training_preprocessor_dl('raw', 'p', 'y', 'x', NULL, 255.0, NULL, NULL, "
             "2, 1)")
        q(c, "SELECT load_keras_model('arch', %s)", (mlp_json(),))
        q(c, "SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
             "ARRAY['batch_size=32'])", (COMPILE,))
        c.close()
        yield {"roles": roles, "role": role}
    finally:
        roles.drop()


def session(rs):
    c = rs["roles"].connect(rs["role"])
    q(c, f'SET search_path = "{rs["role"]}", cerebro_db')
    return c


def test_fit_runs_under_a_dbas_role_settings(rs, admin):
    """The worker and control sessions start with the role's settings: non-standard
    quoting, SERIALIZABLE, read-only, an idle timeout shorter than a unit, row security off.
    The caller sets its own session right (as a user would), the sessions pin theirs."""
    role = rs["role"]
    settings = {"standard_conforming_strings": "off",
                "default_transaction_isolation": "serializable",
                "default_transaction_read_only": "on",
                "idle_session_timeout": "100",
                "lock_timeout": "1ms",
                "row_security": "off"}
    for k, v in settings.items():
        q(admin, f'ALTER ROLE "{role}" SET {k} = %s', (v,))
    try:
        c = session(rs)
        assert q(c, "SHOW standard_conforming_strings") == [("off",)]
        q(c, "SET default_transaction_isolation = 'read committed'")
        q(c, "SET default_transaction_read_only = off")
        q(c, "SET idle_session_timeout = 0")
        q(c, FIT, ("rs_out",))
        assert q(c, "SELECT count(*) FROM rs_out_info WHERE training_loss_final > 0") == [(1,)]
        assert q(admin, "SELECT status FROM cerebro_db.fits WHERE owner = %s "
                        "ORDER BY fit_id DESC LIMIT 1", (role,)) == [("done",)]
        assert q(admin, "SELECT count(*) FROM cerebro_db.unit_failures f JOIN cerebro_db.fits "
                        "USING (fit_id) WHERE fits.owner = %s", (role,)) == [(0,)]
        assert worker_sessions_gone(admin)
        c.close()
    finally:
        for k in settings:
            q(admin, f'ALTER ROLE "{role}" RESET {k}')


@pytest.mark.parametrize(("begin", "sqlstate", "fragment"), [
    ("BEGIN ISOLATION LEVEL REPEATABLE READ", "0A000", "READ COMMITTED transaction"),
    ("BEGIN ISOLATION LEVEL SERIALIZABLE", "0A000", "this one is SERIALIZABLE"),
    ("BEGIN READ ONLY", "25006", "this transaction is read-only"),
])
def test_a_transaction_that_cannot_see_or_keep_the_work_is_refused_first(rs, admin, begin,
                                                                          sqlstate, fragment):
    c = session(rs)
    before_rel, before_cat = relations(admin), catalog_counts(admin)
    q(c, begin)
    with pytest.raises(psycopg2.Error) as e:
        q(c, FIT, ("rs_refused",))
    q(c, "ROLLBACK")
    assert e.value.pgcode == sqlstate, e.value.pgerror
    assert fragment in e.value.pgerror and e.value.diag.message_hint
    assert relations(admin) == before_rel
    assert catalog_counts(admin) == before_cat
    assert worker_sessions_gone(admin)
    c.close()


def test_an_unqualified_output_goes_where_create_table_would(rs, admin):
    """A role whose path is "$user", public writes an unqualified output into its own schema
    even when public holds another role's table of that name (it got "already exists")."""
    roles, role = rs["roles"], rs["role"]
    other = roles.create("rs_other")
    q(admin, f'GRANT CREATE ON SCHEMA public TO "{other}"')
    try:
        co = roles.connect(other)
        q(co, "CREATE TABLE public.rs_shared (note text)")
        c = roles.connect(role)
        q(c, "SET search_path = \"$user\", public, cerebro_db")
        q(c, "SELECT training_preprocessor_dl('raw', 'rs_shared', 'y', 'x', NULL, 255.0, NULL, "
             "NULL, 2, 1)")
        assert q(admin, "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
                 (f'"{role}".rs_shared', f'"{role}".rs_shared_summary')) == [(True, True)]
        assert q(admin, "SELECT count(*) FROM public.rs_shared") == [(0,)]
        c.close()
        co.close()
    finally:
        q(admin, "DROP TABLE IF EXISTS public.rs_shared")
        q(admin, f'REVOKE CREATE ON SCHEMA public FROM "{other}"')


def test_a_default_tablespace_without_create_is_refused_before_any_work(rs, admin):
    """default_tablespace naming a tablespace the role may not create in: the fit trained
    to its end and failed at CREATE TABLE before; now it is refused up front."""
    import os

    data_dir = q(admin, "SHOW data_directory")[0][0]
    try:
        owner = os.stat(data_dir)
    except OSError:
        pytest.skip("the server's data directory is not visible from here")
    import shutil
    import tempfile

    loc = tempfile.mkdtemp(prefix="cerebro_ts_", dir="/tmp")  # the server's user must reach it
    os.chmod(loc, 0o700)
    os.chown(loc, owner.st_uid, owner.st_gid)
    ts, role = f"rs_ts_{os.getpid()}", rs["role"]
    try:
        q(admin, f"CREATE TABLESPACE {ts} LOCATION %s", (loc,))
        q(admin, f'ALTER ROLE "{role}" SET default_tablespace = {ts}')
        c = session(rs)
        before_rel, before_cat = relations(admin), catalog_counts(admin)
        with pytest.raises(psycopg2.Error) as e:
            q(c, FIT, ("rs_ts_out",))
        assert e.value.pgcode == "42501", e.value.pgerror
        assert f"permission denied for tablespace {ts}" in e.value.pgerror
        assert "default_tablespace" in e.value.diag.message_hint
        assert relations(admin) == before_rel and catalog_counts(admin) == before_cat
        c.close()
    finally:
        q(admin, f'ALTER ROLE "{role}" RESET default_tablespace')
        q(admin, f"DROP TABLESPACE IF EXISTS {ts}")
        shutil.rmtree(loc, ignore_errors=True)


def test_a_qualified_call_finds_the_architecture_beside_the_selection_table(rs, admin):
    """The selection table's summary names its architecture table as given ('arch',
    unqualified, as MADlib stores it): a fully qualified call from a session whose path
    lacks that schema finds it beside the selection table."""
    role = rs["role"]
    c = rs["roles"].connect(role)
    q(c, "SET search_path = cerebro_db")
    assert q(c, f'SELECT model_arch_table FROM "{role}".mst_summary') == [("arch",)]
    q(c, f"SELECT cerebro_db.madlib_keras_fit_multiple_model('\"{role}\".p', "
         f"'\"{role}\".rs_q', '\"{role}\".mst', 1, FALSE, NULL, NULL, FALSE, NULL, NULL, "
         "NULL, 'mop', NULL, 3)")
    assert q(admin, f'SELECT count(*) FROM "{role}".rs_q_info') == [(1,)]
    c.close()


def test_a_replication_role_the_role_cannot_set_back_is_a_clear_error(rs, admin):
    """session_replication_role = replica stored for a role (only a superuser can): the
    catalog's id triggers would not fire in its sessions, and it may not set the value back;
    the fit says so before any work."""
    role = rs["role"]
    q(admin, f'ALTER ROLE "{role}" SET session_replication_role = replica')
    try:
        c = session(rs)
        before_rel, before_cat = relations(admin), catalog_counts(admin)
        with pytest.raises(psycopg2.Error) as e:
            q(c, FIT, ("rs_repl",))
        assert e.value.pgcode == "42501", e.value.pgerror
        assert "session_replication_role is 'replica' for this role" in e.value.pgerror
        assert "RESET session_replication_role" in e.value.diag.message_hint
        assert relations(admin) == before_rel and catalog_counts(admin) == before_cat
        assert worker_sessions_gone(admin)
        c.close()
    finally:
        q(admin, f'ALTER ROLE "{role}" RESET session_replication_role')
