"""A fit asked to run on a bad executor fails before any work: a malformed or unknown
cerebro_db.executor (22023), an engine whose package the server lacks (58000, with the
pip hint), an unreachable cluster (08001); no output table, no fit row, no worker left."""
from __future__ import annotations

import time

import pytest

from .conftest import _free_port, allow_executor, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def state(admin, role):
    return (q(admin, "SELECT count(*) FROM cerebro_db.fits WHERE owner = %s", (role.name,)),
            q(admin, "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON "
                     "n.oid = c.relnamespace WHERE n.nspname = %s", (role.name,)),
            q(admin, "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                     "application_name LIKE 'cerebro_db %%'", (role.name,)))


def fails(conn, executor):
    q(conn, "SET cerebro_db.executor = %s", (executor,))
    try:
        with pytest.raises(psycopg2.Error) as e:
            q(conn, "SELECT madlib_keras_fit_multiple_model('rm_p', 'bad_exec', 'rm_mst', 1)")
    finally:
        q(conn, "RESET cerebro_db.executor")
    return e.value


@pytest.mark.parametrize("executor,why", [
    ("spark://h:7077", 'unknown executor "spark"'),
    ("dask://nohost", "expected scheme://host:port"),
    ("dask://user:pw@h:8786", "may not hold credentials"),
])
def test_bad_executor_url(role, radmin, executor, why):
    c = role.connect()
    before = state(radmin, role)
    e = fails(c, executor)
    assert e.pgcode == "22023" and why in e.pgerror, e.pgerror
    assert "HINT:  Use 'sessions' (the default), 'dask://host:port'" in e.pgerror
    assert ":pw@" not in e.pgerror
    assert state(radmin, role) == before
    c.close()


def test_engine_package_missing_on_server(role, radmin):
    """Whichever engine package this server's Python lacks (ray or distributed) gives the
    error; skipped where the server has both."""
    q(radmin, "CREATE OR REPLACE FUNCTION pg_temp.has_module(m text) RETURNS boolean "
              "LANGUAGE plpython3u AS 'import importlib.util\nreturn "
              "importlib.util.find_spec(m) is not None'")
    missing = [(s, extra) for s, m, extra in (("ray", "ray", "ray"),
                                             ("dask", "distributed", "dask"))
               if not q(radmin, "SELECT pg_temp.has_module(%s)", (m,))[0][0]]
    if not missing:
        pytest.skip("the server has both ray and distributed")
    scheme, extra = missing[0]
    c = role.connect()
    before = state(radmin, role)
    allow_executor(radmin, f"{scheme}://127.0.0.1:1")
    try:
        e = fails(c, f"{scheme}://127.0.0.1:1")
    finally:
        allow_executor(radmin, f"{scheme}://127.0.0.1:1", allow=False)
    assert e.pgcode == "58000" and "is not installed on the database server" in e.pgerror
    assert f"pip install 'cerebro_db[{extra}]'" in e.pgerror
    assert state(radmin, role) == before
    c.close()


def test_unreachable_cluster(role, radmin):
    pytest.importorskip("distributed")
    c = role.connect()
    before = state(radmin, role)
    url = f"dask://127.0.0.1:{_free_port()}"
    allow_executor(radmin, url)
    try:
        e = fails(c, url)
    finally:
        allow_executor(radmin, url, allow=False)
    assert e.pgcode == "08001" and "could not connect to the executor" in e.pgerror, e.pgerror
    assert state(radmin, role) == before
    c.close()


def test_remote_connection_settings_are_the_dbas(role, radmin, dask_cluster):
    """cerebro_db.remote_conninfo / remote_dbhost count only as the DBA set them
    (ALTER SYSTEM): a role's SET is ignored (it cannot point the nodes' credentials at
    another server), and a password in the DBA's value is refused before any work."""
    c = role.connect()
    executor = "dask://" + dask_cluster.address.split("://")[1]
    q(c, "SET cerebro_db.remote_dbhost = 'attacker.example.org'")
    q(c, "SET cerebro_db.remote_conninfo = 'host=attacker.example.org'")
    q(c, "SET cerebro_db.executor = %s", (executor,))
    try:
        q(c, "DROP TABLE IF EXISTS dba_only, dba_only_info, dba_only_summary")
        q(c, "SELECT madlib_keras_fit_multiple_model('rm_p', 'dba_only', 'rm_mst', 1)")
    finally:
        q(c, "RESET ALL")
    assert q(c, "SELECT count(*) FROM dba_only") == [(1,)]
    before = state(radmin, role)
    # PostgreSQL 15's ALTER SYSTEM wants the custom setting known in its session
    q(radmin, "SELECT set_config('cerebro_db.remote_conninfo', '', false)")
    q(radmin, "ALTER SYSTEM SET cerebro_db.remote_conninfo = 'sslmode=prefer password=s3cret'")
    q(radmin, "SELECT pg_reload_conf()")
    try:
        time.sleep(0.5)
        e = fails(c, executor)
    finally:
        q(radmin, "ALTER SYSTEM RESET cerebro_db.remote_conninfo")
        q(radmin, "SELECT pg_reload_conf()")
    assert e.pgcode == "22023" and "cerebro_db.remote_conninfo may not hold a password" \
        in e.pgerror, e.pgerror
    assert "s3cret" not in e.pgerror
    assert state(radmin, role) == before
    c.close()


def test_only_clusters_the_dba_allowed(role, radmin, dask_cluster):
    """A remote engine's client unpickles what the cluster sends inside the database
    server: a role may not point a fit at a cluster of its choice. Only the DBA's
    cerebro_db.allowed_executors counts (a role's own SET of it is ignored): 42501 before
    any work, nothing created."""
    listed = "dask://" + dask_cluster.address.split("://")[1]
    elsewhere = f"dask://127.0.0.1:{_free_port()}"
    c = role.connect()
    before = state(radmin, role)
    q(c, "SET cerebro_db.allowed_executors = %s", (elsewhere,))
    try:
        e = fails(c, elsewhere)
    finally:
        q(c, "RESET cerebro_db.allowed_executors")
    assert e.pgcode == "42501" and "is not a cluster this server may use" in e.pgerror, \
        e.pgerror
    assert "cerebro_db.allowed_executors" in e.pgerror
    assert state(radmin, role) == before
    # the same address as the listed cluster but another scheme or port is not listed either
    e = fails(c, listed.replace("dask://", "ray://"))
    assert e.pgcode == "42501", e.pgerror
    c.close()
