"""Shared fixtures: a real PostgreSQL server (the embedded cluster `make test` starts).

Tests that need the server use the ``dsn`` / ``conn`` fixtures; without a reachable
server they skip with the reason (CI always starts one through `make test`).
"""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def server_params() -> dict[str, str]:
    out = subprocess.run([str(ROOT / "scripts" / "cerebro.sh"), "env"], capture_output=True,
                         text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.split())
    return {"host": os.environ.get("CEREBRO_TEST_PGHOST", env["PGHOST"]),
            "port": os.environ.get("CEREBRO_TEST_PGPORT", env["PGPORT"]),
            "user": os.environ.get("CEREBRO_TEST_PGUSER", env["PGUSER"])}


def _connect(dbname: str):
    import psycopg2

    p = server_params()
    return psycopg2.connect(dbname=dbname, **p)


def _server_or_skip():
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip(reason="psycopg2 is not installed (run `make test`)")
    try:
        c = _connect("postgres")
    except Exception as e:  # noqa: BLE001
        pytest.skip(reason=f"no cerebro_db test server reachable ({e.__class__.__name__}); run `make test`")
    c.autocommit = True
    return c


def create_database(schema: str = "cerebro_db", version: str | None = None) -> str:
    """A new database with the extension installed in ``schema``; returns its name."""
    admin = _server_or_skip()
    name = f"cerebro_test_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    c = _connect(name)
    c.autocommit = True
    with c.cursor() as cur:
        cur.execute("SET client_min_messages = warning")
        if schema != "public":
            cur.execute(f'CREATE SCHEMA "{schema}"')
        ver = f" VERSION '{version}'" if version else ""
        cur.execute(f'CREATE EXTENSION cerebro_db SCHEMA "{schema}"{ver} CASCADE')
        cur.execute(f'ALTER DATABASE "{name}" SET search_path = "$user", public, "{schema}"')
    c.close()
    return name


def drop_database(name: str) -> None:
    admin = _connect("postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(scope="session")
def dbname() -> Iterator[str]:
    name = create_database()
    yield name
    drop_database(name)


@pytest.fixture(scope="session")
def dsn(dbname: str) -> str:
    p = server_params()
    return f"dbname={dbname} host={p['host']} port={p['port']} user={p['user']}"


@pytest.fixture(scope="session")
def session_conn(dbname: str):
    """One long-lived connection (its backend keeps TensorFlow imported)."""
    c = _connect(dbname)
    c.autocommit = True
    yield c
    c.close()


@pytest.fixture
def conn(session_conn):
    """The session connection; each test cleans up the tables it made via ``tables``."""
    yield session_conn


@pytest.fixture
def tables(session_conn):
    """Names registered here are dropped (with _summary) after the test."""
    names: list[str] = []
    yield names
    with session_conn.cursor() as cur:
        for n in names:
            cur.execute(f"DROP TABLE IF EXISTS {n} CASCADE")
            if not n.endswith('"'):
                cur.execute(f"DROP TABLE IF EXISTS {n}_summary CASCADE")
