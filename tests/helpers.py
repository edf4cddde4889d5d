"""Helpers shared by every test tier: the test server's connection parameters, databases
made for a test, statements through psycopg2 and small Keras models as JSON.

Nothing here imports psycopg2 or Keras at module level, so the unit tests import this module
on a machine without them; a test that needs one skips when it is absent.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

requires_keras = pytest.mark.skipif(importlib.util.find_spec("keras") is None,
                                    reason="keras is not installed")


def server_params() -> dict[str, str]:
    """host, port and user of the test server (`scripts/cerebro.sh env`, or CEREBRO_TEST_PG*)."""
    out = subprocess.run([str(ROOT / "scripts" / "cerebro.sh"), "env"], capture_output=True,
                         text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.split())
    return {"host": os.environ.get("CEREBRO_TEST_PGHOST", env["PGHOST"]),
            "port": os.environ.get("CEREBRO_TEST_PGPORT", env["PGPORT"]),
            "user": os.environ.get("CEREBRO_TEST_PGUSER", env["PGUSER"])}


def connect(dbname: str, user: str | None = None, *, autocommit: bool = False):
    """A psycopg2 connection to ``dbname`` on the test server (as ``user`` when given)."""
    psycopg2 = pytest.importorskip("psycopg2")
    p = server_params()
    if user is not None:
        p["user"] = user
    c = psycopg2.connect(dbname=dbname, **p)
    c.autocommit = autocommit
    return c


def server_or_skip():
    """An autocommit connection to database postgres; skips the test without psycopg2 or a
    reachable server."""
    pytest.importorskip("psycopg2", reason="psycopg2 is not installed (run `make test`)")
    try:
        return connect("postgres", autocommit=True)
    except Exception as e:  # noqa: BLE001
        pytest.skip(reason=f"no cerebro_db test server reachable ({e.__class__.__name__}); "
                           "run `make test`")


def create_database(schema: str = "cerebro_db", version: str | None = None) -> str:
    """A new database with the extension installed in ``schema``; returns its name."""
    admin = server_or_skip()
    name = f"cerebro_test_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    c = connect(name, autocommit=True)
    with c.cursor() as cur:
        cur.execute("SET client_min_messages = warning")
        if schema != "public":
            cur.execute(f'CREATE SCHEMA "{schema}"')
        ver = f" VERSION '{version}'" if version else ""
        cur.execute(f'CREATE EXTENSION cerebro_db SCHEMA "{schema}"{ver} CASCADE')
        cur.execute(f'ALTER DATABASE "{name}" SET search_path = "$user", public, "{schema}"')
        # the tests connect as the cluster's superuser, which keeps its idle worker sessions
        # only when it opts in (test_security checks the default)
        cur.execute(f'ALTER DATABASE "{name}" SET cerebro_db.keep_workers_as_maintainer = on')
    c.close()
    return name


def drop_database(name: str, wait: float = 60.0) -> None:
    """``DROP DATABASE ... WITH (FORCE)``, tried again for ``wait`` seconds while it says the
    database is in use: FORCE terminates the other sessions but waits only 5 s for them to
    end, and a backend inside a PL/Python call (a unit whose worker is gone, TensorFlow's
    import) ends only when the call returns to PostgreSQL. The sessions still there are in
    the error if it never succeeds."""
    import psycopg2.errors

    admin = connect("postgres", autocommit=True)
    end = time.monotonic() + wait
    try:
        with admin.cursor() as cur:
            while True:
                try:
                    cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    return
                except psycopg2.errors.ObjectInUse:
                    if time.monotonic() >= end:
                        cur.execute("SELECT pid, application_name, state, left(query, 200), "
                                    "now() - query_start FROM pg_stat_activity WHERE "
                                    "datname = %s", (name,))
                        raise AssertionError(f"database {name} still in use after {wait:g} s: "
                                             f"{cur.fetchall()}") from None
                    time.sleep(1.0)
    finally:
        admin.close()


def cerebro_error(fn, *args: Any, **kwargs: Any):
    """The CerebroError ``fn(*args, **kwargs)`` raises (fails the test when it raises none),
    checked for PostgreSQL's message style: lower case, no trailing period, a SQLSTATE."""
    from cerebro_db.errors import CerebroError

    with pytest.raises(CerebroError) as info:
        fn(*args, **kwargs)
    e = info.value
    assert e.message == e.message.rstrip("."), e.message
    assert e.message[:1] == e.message[:1].lower(), e.message
    assert len(e.sqlstate) == 5, e.sqlstate
    return e


def q(conn, sql: str, args: Any = None) -> list[tuple] | None:
    """Execute one statement; its rows, or None for a statement that returns none."""
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def error_of(conn, sql: str, args: Any = None):
    """The psycopg2 error a statement raises (fails the test when it succeeds)."""
    import psycopg2

    with pytest.raises(psycopg2.Error) as info:
        q(conn, sql, args)
    return info.value


def worker_sessions(conn) -> int:
    """Worker and control sessions of any fit connected to this database now."""
    return q(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                   "'cerebro_db %%' AND datname = current_database()")[0][0]


def end_sessions_of(admin, conn) -> int:
    """Terminate the other sessions of ``conn``'s role (worker sessions a test opened with
    ``__worker_connect``: the role may not run ``dblink_disconnect``, migration 098); the
    dead connection's name stays taken in ``conn``'s backend. Returns how many."""
    return q(admin, "SELECT count(pg_catalog.pg_terminate_backend(pid, 5000)) FROM "
                    "pg_stat_activity WHERE usename = (SELECT usename FROM pg_stat_activity "
                    "WHERE pid = %s) AND pid <> %s AND backend_type = 'client backend'",
             (conn.get_backend_pid(), conn.get_backend_pid()))[0][0]


def worker_sessions_gone(conn, wait: float = 10.0) -> bool:
    """True once no fit's worker session is connected (a closed session's backend may take a
    moment to leave pg_stat_activity)."""
    end = time.monotonic() + wait
    while True:
        q(conn, "SELECT pg_catalog.pg_stat_clear_snapshot()")
        if worker_sessions(conn) == 0:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.1)


def load_mnist_rows(conn, *tables: tuple[str, int, int], replace: bool = True) -> None:
    """Create each ``(name, lo, hi)`` as ``(id integer, y integer, x real[])`` holding the
    Fashion-MNIST training rows ``lo .. hi-1`` (Debian's dataset-fashion-mnist), by binary
    COPY; with ``replace`` a table of that name is dropped first."""
    import io

    import numpy as np

    from tooling.datasets import copy_payload, find_dataset_dir, load_split

    x, y = load_split(find_dataset_dir("fashion-mnist"), "train")
    with conn.cursor() as cur:
        for name, lo, hi in tables:
            if replace:
                cur.execute(f"DROP TABLE IF EXISTS {name}")
            cur.execute(f"CREATE TABLE {name} (id integer, y integer, x real[])")
            cur.copy_expert(f"COPY {name} FROM STDIN (FORMAT binary)",
                            io.BytesIO(copy_payload(np.arange(lo, hi),
                                                    y[lo:hi].astype(np.int32), x[lo:hi])))


def mlp_json(hidden: int = 8, inputs: int = 784, outputs: int = 10) -> str:
    """A Keras MLP (inputs -> hidden relu -> outputs softmax) as JSON; skips without Keras."""
    keras = pytest.importorskip("keras")
    return keras.Sequential([keras.Input((inputs,)),
                             keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(outputs, activation="softmax")]).to_json()
