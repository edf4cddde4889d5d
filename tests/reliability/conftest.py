"""Fixtures for the security and hostile-input tiers: a database of their own, real login
roles made for the test (dropped afterwards), and snapshots that show what a call left
behind."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ..helpers import connect, create_database, drop_database, load_mnist_rows, q

CATALOG_TABLES = ("fits", "fit_configs", "units", "model_states")


def connect_as(dbname: str, role: str):
    """A new autocommit connection logged in as ``role`` (local socket)."""
    return connect(dbname, role, autocommit=True)


def relations(conn) -> set[tuple[str, str]]:
    """Every relation (schema, name) outside the system schemas."""
    return set(q(conn, "SELECT n.nspname::text, c.relname::text FROM pg_class c "
                       "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN "
                       "('pg_catalog', 'information_schema', 'pg_toast') "
                       "AND n.nspname NOT LIKE 'pg_temp%%' AND n.nspname NOT LIKE 'pg_toast%%'"))


def catalog_counts(conn) -> dict[str, int]:
    """Row counts of the extension's catalog tables (as a superuser: every role's rows)."""
    return {t: q(conn, f"SELECT count(*) FROM cerebro_db.{t}")[0][0] for t in CATALOG_TABLES}


def load_mnist(conn, table: str, lo: int, hi: int) -> None:
    """Rows lo..hi of the Fashion-MNIST training split as a new table (id, y, x real[])."""
    load_mnist_rows(conn, (table, lo, hi), replace=False)


@pytest.fixture(scope="package")
def rel_db() -> Iterator[str]:
    """A database of this tier's own (the extension in schema cerebro_db)."""
    name = create_database()
    yield name
    drop_database(name)


@pytest.fixture(scope="package")
def admin(rel_db):
    """A superuser connection to that database."""
    c = connect(rel_db)
    c.autocommit = True
    yield c
    c.close()


class Roles:
    """Login roles made for the test, each with a schema of its own name; dropped (with
    everything they own) at the end."""

    def __init__(self, admin, dbname: str) -> None:
        self.admin, self.dbname = admin, dbname
        self.names: list[str] = []
        self.conns: list[Any] = []

    def create(self, prefix: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        q(self.admin, f'CREATE ROLE "{name}" LOGIN')
        self.names.append(name)
        q(self.admin, f'GRANT USAGE ON SCHEMA cerebro_db TO "{name}"')
        q(self.admin, f'CREATE SCHEMA "{name}" AUTHORIZATION "{name}"')
        return name

    def connect(self, role: str):
        c = connect_as(self.dbname, role)
        self.conns.append(c)
        return c

    def drop(self) -> None:
        for c in self.conns:
            c.close()
        for n in self.names:
            q(self.admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE usename = %s", (n,))
            for t in CATALOG_TABLES[::-1]:
                q(self.admin, f"DELETE FROM cerebro_db.{t} WHERE owner = %s", (n,))
            q(self.admin, f'DROP OWNED BY "{n}" CASCADE')
            q(self.admin, f'DROP ROLE "{n}"')
