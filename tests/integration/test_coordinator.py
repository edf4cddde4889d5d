"""The coordinator side of a fit: it never imports TensorFlow (the checks that need Keras run
in a worker session) and keeps its worker sessions open between fits of one calling session
(reused by the same role only, reset, reopened when dead, closed on request, on disconnect
and after an idle timeout)."""
from __future__ import annotations

import time

import pytest

from ..helpers import connect, load_mnist_rows, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

PROBE = """
CREATE OR REPLACE FUNCTION public.cerebro_test_probe()
RETURNS TABLE (ml_modules text[], vm_hwm_kb bigint, vm_rss_kb bigint)
LANGUAGE plpython3u AS $$
import sys
mods = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras'))
kb = {}
with open('/proc/self/status') as f:
    for line in f:
        k, _, v = line.partition(':')
        if k in ('VmHWM', 'VmRSS'):
            kb[k] = int(v.split()[0])
return [(mods, kb['VmHWM'], kb['VmRSS'])]
$$"""


@pytest.fixture(scope="module")
def co(dbname, session_conn):
    """Tiny packed data (400 rows, 2 partitions) and one MLP configuration."""
    c = session_conn
    load_mnist_rows(c, ("co_train", 0, 400))
    q(c, "DROP TABLE IF EXISTS co_p, co_p_summary, co_arch, co_mst, co_mst_summary")
    q(c, "SELECT training_preprocessor_dl('co_train', 'co_p', 'y', 'x', NULL, 255.0, NULL, "
         "NULL, 2, 3)")
    q(c, "SELECT load_keras_model('co_arch', %s)", (mlp_json(hidden=8),))
    q(c, "SELECT load_model_selection_table('co_arch', 'co_mst', ARRAY[1], %s, %s)",
      (["loss='categorical_crossentropy', optimizer='Adam', metrics=['accuracy']"],
       ["batch_size=64"]))
    q(c, PROBE)
    return dbname


def new_conn(dbname):
    c = connect(dbname)
    c.autocommit = True
    return c


CALLED: dict[int, float] = {}


def fit(c, out, mst="co_mst"):
    q(c, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    t = q(c, "SELECT extract(epoch FROM clock_timestamp())::float8")[0][0]
    q(c, "SELECT madlib_keras_fit_multiple_model('co_p', %s, %s, 1)", (out, mst))
    fit_id = q(c, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s "
                  "ORDER BY fit_id DESC LIMIT 1", (out,))[0][0]
    CALLED[fit_id] = t
    return fit_id


def worker_pids(c, fit_id):
    return sorted(r[0] for r in q(c, "SELECT pid FROM cerebro_db.fit_workers WHERE fit_id = %s",
                                  (fit_id,)))


def pooled(c, owner_pid):
    q(c, "SELECT pg_stat_clear_snapshot()")
    return sorted(r[0] for r in q(c, "SELECT pid FROM pg_stat_activity WHERE application_name "
                                     "= %s", (f"cerebro_db_pool {owner_pid}",)))


def gone(c, pids, wait=10.0):
    end = time.monotonic() + wait
    while True:
        q(c, "SELECT pg_stat_clear_snapshot()")
        alive = q(c, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))[0][0]
        if alive == 0 or time.monotonic() > end:
            return alive == 0
        time.sleep(0.1)


def first_unit_delay(c, fit_id):
    """Seconds from the fit's call to the start of its first unit (from the unit log)."""
    return q(c, "SELECT extract(epoch FROM min(started_at))::float8 FROM cerebro_db.units "
                "WHERE fit_id = %s", (fit_id,))[0][0] - CALLED[fit_id]


def test_coordinator_never_imports_tensorflow_and_reuses_its_workers(co):
    c = new_conn(co)
    try:
        me = q(c, "SELECT pg_backend_pid()")[0][0]
        assert q(c, "SELECT ml_modules FROM cerebro_test_probe()")[0][0] == []
        f1 = fit(c, "co_o1")
        mods, hwm, rss = q(c, "SELECT * FROM cerebro_test_probe()")[0]
        assert mods == [], mods
        print(f"\ncoordinator backend after a fit: VmHWM {hwm / 1024:.0f} MB, "
              f"VmRSS {rss / 1024:.0f} MB")
        assert hwm < 400 * 1024  # TensorFlow alone takes more
        p1 = worker_pids(c, f1)
        assert len(p1) == 2 and pooled(c, me) == p1
        f2 = fit(c, "co_o2")
        assert worker_pids(c, f2) == p1  # the same sessions: no TensorFlow import again
        print(f"first unit after the fit started: cold {first_unit_delay(c, f1):.2f} s, "
              f"second fit {first_unit_delay(c, f2):.2f} s")
        assert q(c, "SELECT ml_modules FROM cerebro_test_probe()")[0][0] == []
        # a dead pooled session is replaced by a fresh one
        q(c, "SELECT pg_terminate_backend(%s)", (p1[0],))
        assert gone(c, [p1[0]])
        f3 = fit(c, "co_o3")
        p3 = worker_pids(c, f3)
        assert p1[0] not in p3 and p1[1] in p3
        assert q(c, "SELECT count(*) FROM co_o3_info")[0][0] == 1
        assert q(c, "SELECT cerebro_db_close_workers()")[0][0] == 2
        assert gone(c, p3) and pooled(c, me) == []
        assert q(c, "SELECT cerebro_db_close_workers()")[0][0] == 0
    finally:
        c.close()


def test_pooled_workers_end_with_the_session_and_the_idle_timeout(co, session_conn):
    c = new_conn(co)
    me = q(c, "SELECT pg_backend_pid()")[0][0]
    fit(c, "co_o4")
    p = pooled(c, me)
    assert len(p) == 2
    c.close()
    assert gone(session_conn, p)
    c = new_conn(co)
    try:
        me = q(c, "SELECT pg_backend_pid()")[0][0]
        q(c, "SET cerebro_db.worker_idle_timeout = 1")
        fit(c, "co_o5")
        p = pooled(c, me)
        assert len(p) == 2
        assert gone(c, p, wait=15.0)  # idle_session_timeout ended them
        f = fit(c, "co_o6")  # the next fit opens fresh sessions
        assert set(worker_pids(c, f)).isdisjoint(p)
        q(c, "SET cerebro_db.worker_idle_timeout = 0")
        fit(c, "co_o7")
        assert pooled(c, me) == []
        with pytest.raises(psycopg2.Error) as e:
            q(c, "SET cerebro_db.worker_idle_timeout = 'soon'")
            fit(c, "co_o8")
        assert e.value.pgcode == "22023" and "worker_idle_timeout" in e.value.pgerror
    finally:
        c.close()


def test_pooled_workers_are_not_reused_by_another_role(co, session_conn):
    c = new_conn(co)
    try:
        q(c, "DROP ROLE IF EXISTS co_other")
        q(c, "CREATE ROLE co_other")
        q(c, "GRANT USAGE ON SCHEMA cerebro_db TO co_other")
        q(c, "GRANT SELECT ON co_p, co_p_summary, co_mst, co_mst_summary, co_arch TO co_other")
        q(c, "GRANT CREATE ON SCHEMA public TO co_other")
        me = q(c, "SELECT pg_backend_pid()")[0][0]
        f1 = fit(c, "co_o9")
        p1 = worker_pids(c, f1)
        q(c, "SET ROLE co_other")
        f2 = fit(c, "co_o10")
        p2 = worker_pids(c, f2)
        assert set(p1).isdisjoint(p2)
        # a role the session did not log in as keeps no session: a kept dblink connection
        # could be used by whatever runs next in this session
        assert gone(c, p2) and pooled(c, me) == p1
        assert q(c, "SELECT count(*) FROM unnest(cerebro_db.dblink_get_connections()) n "
                    "WHERE n LIKE 'cerebro%%'")[0][0] == 2
        q(c, "DROP TABLE co_o10, co_o10_info, co_o10_summary")
        q(c, "RESET ROLE")
        f3 = fit(c, "co_o11")  # the superuser's own pooled sessions are still there
        assert worker_pids(c, f3) == p1
        assert pooled(c, me) == p1
    finally:
        c.close()
        q(session_conn, "SELECT pg_sleep(0.5)")
        q(session_conn, "REVOKE ALL ON SCHEMA public FROM co_other")
        q(session_conn, "REVOKE ALL ON SCHEMA cerebro_db FROM co_other")
        q(session_conn, "REVOKE ALL ON co_p, co_p_summary, co_mst, co_mst_summary, co_arch "
                        "FROM co_other")


CONNINFO_PROBE = """
CREATE OR REPLACE FUNCTION public.cerebro_test_conninfo(v text) RETURNS text
LANGUAGE plpython3u AS $$
from cerebro_db.catalog import Catalog
from cerebro_db.catalog.fits import conninfo
cat = Catalog(plpy, plpy.execute("SELECT extnamespace::regnamespace::text AS s FROM "
                                 "pg_extension WHERE extname = 'cerebro_db'")[0]["s"])
f = plpy.execute("SELECT current_database()::text AS d, current_setting('port') AS p, "
                 "split_part(current_setting('unix_socket_directories'), ',', 1) AS s")[0]
info = conninfo(cat, [("dbname", f["d"]), ("port", f["p"]), ("host", f["s"]),
                      ("application_name", v)])
cat.dblink_connect("cerebro_test_conninfo", info)
try:
    return cat.dblink_query("cerebro_test_conninfo",
                            "SELECT current_setting('application_name')")[0][0]
finally:
    cat.dblink_disconnect("cerebro_test_conninfo")
$$"""


def test_worker_conninfo_values_reach_libpq_unchanged(session_conn):
    """The worker sessions' connection string (catalog.fits.conninfo): PostgreSQL quotes
    each value as libpq reads it, so quotes, backslashes and spaces arrive unchanged."""
    c = session_conn
    q(c, CONNINFO_PROBE)
    try:
        for v in ("plain", "a'b", "back\\slash", "two words", "'\\' mixed '' \\\\"):
            assert q(c, "SELECT public.cerebro_test_conninfo(%s)", (v,))[0][0] == v
    finally:
        q(c, "DROP FUNCTION public.cerebro_test_conninfo(text)")
