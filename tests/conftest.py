"""Shared fixtures: a real PostgreSQL server (the embedded cluster `make test` starts).

Tests that need the server use the ``dsn`` / ``conn`` fixtures; without a reachable
server they skip with the reason (CI always starts one through `make test`).
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import cerebro_db  # noqa: F401 - before any test module imports TensorFlow: its oneDNN default

from .helpers import connect, create_database, drop_database, server_params

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


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
    c = connect(dbname, autocommit=True)
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
