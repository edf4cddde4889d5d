"""The ``plpy`` subset :class:`cerebro_db.catalog.Catalog` uses, over a psycopg2 connection.

A remote worker (a Dask worker process, a Ray actor) runs the same unit code as a worker
session (:func:`cerebro_db.worker.run_unit`); only the database handle differs. Statements
keep PL/Python's ``$n`` parameters with their types: each ``$n`` becomes a bound psycopg2
parameter cast to its declared type, so values are never spliced into SQL text. Results
come back as PL/Python gives them (rows as dicts, ``bytea`` as ``bytes``, ``json`` and
``jsonb`` as text). Database errors are raised as :class:`SPIError` carrying the
SQLSTATE (a broken connection: 08006).

psycopg2 is imported when a connection is made, never at module import.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

from ..catalog.sessions import REMOTE_SESSION_PINS
from ..errors import (
    CONNECTION_FAILURE,
    INVALID_AUTHORIZATION_SPECIFICATION,
    UNDEFINED_PARAMETER,
)

log = logging.getLogger("cerebro_db.remote")

_PARAM = re.compile(r"\$(\d+)")
_cursors = itertools.count()


class SPIError(Exception):
    """A database error in a remote worker, shaped like PL/Python's ``plpy.SPIError``."""

    def __init__(self, message: str, sqlstate: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate or CONNECTION_FAILURE

    def __str__(self) -> str:
        return self.message


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    import psycopg2

    try:
        yield
    except psycopg2.Error as e:
        msg = (getattr(e, "pgerror", None) or str(e)).strip()
        if msg.startswith("ERROR:"):
            msg = msg[len("ERROR:"):].strip()
        raise SPIError(msg.splitlines()[0] if msg else type(e).__name__,
                       getattr(e, "pgcode", None)) from None


class Plan:
    """A statement with ``$n`` parameters translated for psycopg2 (PL/Python's prepared
    plan)."""

    def __init__(self, sql: str, types: Sequence[str]) -> None:
        self.types = list(types)

        def mark(m: re.Match[str]) -> str:
            i = int(m.group(1))
            if not 1 <= i <= len(self.types):
                raise SPIError(f"there is no parameter ${i}", UNDEFINED_PARAMETER)
            return f"(%(p{i})s::{self.types[i - 1]})"

        self.sql = _PARAM.sub(mark, sql.replace("%", "%%")) if self.types else sql

    def args(self, values: Sequence[Any]) -> dict[str, Any] | None:
        if not self.types:
            return None
        return {f"p{i + 1}": _adapt(v) for i, v in enumerate(values)}


def _adapt(v: Any) -> Any:
    import psycopg2

    if isinstance(v, (bytes, bytearray, memoryview)):
        return psycopg2.Binary(bytes(v))
    return v


def _value(v: Any) -> Any:
    if isinstance(v, memoryview):
        return v.tobytes()
    return v


def _rows(cur: Any) -> list[dict[str, Any]]:
    if cur.description is None:
        return []
    names = [d[0] for d in cur.description]
    return [{n: _value(v) for n, v in zip(names, r)} for r in cur.fetchall()]


class Cursor:
    """A server-side cursor (PL/Python's ``plpy.cursor``) with ``fetch(n)``."""

    def __init__(self, conn: Any, plan: Plan, args: Sequence[Any]) -> None:
        self._cur = conn.cursor(name=f"cerebro_db_cursor_{next(_cursors)}")
        with _errors():
            self._cur.execute(plan.sql, plan.args(args))

    def fetch(self, n: int) -> list[dict[str, Any]]:
        with _errors():
            rows = self._cur.fetchmany(n)
            names = [d[0] for d in self._cur.description or []]
        if not rows:
            self._cur.close()
        return [{k: _value(v) for k, v in zip(names, r)} for r in rows]


class PgDB:
    """``prepare``/``execute``/``cursor``/``subtransaction``/``notice`` over one psycopg2
    connection (not autocommit: the caller commits or rolls back each unit)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._savepoints = itertools.count()

    def prepare(self, sql: str, types: Sequence[str] | None = None) -> Plan:
        return Plan(sql, types or [])

    def execute(self, plan: Plan | str, args: Sequence[Any] | None = None) -> list[dict]:
        if isinstance(plan, str):
            plan = Plan(plan, [])
        with _errors(), self.conn.cursor() as cur:
            cur.execute(plan.sql, plan.args(args or []))
            return _rows(cur)

    def cursor(self, plan: Plan | str, args: Sequence[Any] | None = None) -> Cursor:
        if isinstance(plan, str):
            plan = Plan(plan, [])
        return Cursor(self.conn, plan, args or [])

    @contextlib.contextmanager
    def subtransaction(self) -> Iterator[None]:
        """A savepoint: released when the block ends well, rolled back to when it raises."""
        name = f"cerebro_db_sub_{next(self._savepoints)}"
        self.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            with contextlib.suppress(SPIError):
                self.execute(f"ROLLBACK TO SAVEPOINT {name}")
            raise
        self.execute(f"RELEASE SAVEPOINT {name}")

    def notice(self, message: str) -> None:
        log.info("%s", message)

    def warning(self, message: str) -> None:
        log.warning("%s", message)

    def commit(self) -> None:
        with _errors():
            self.conn.commit()

    def rollback(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def connect(db: dict[str, Any], application_name: str) -> Any:
    """A psycopg2 connection for ``db`` (host, port, dbname, user, options: non-secret
    libpq keywords); the password comes from this process's environment (PGPASSWORD,
    PGPASSFILE, PGSERVICEFILE), never from the coordinator."""
    import psycopg2
    import psycopg2.extensions
    import psycopg2.extras

    kw: dict[str, Any] = {k: db[k] for k in ("host", "port", "dbname", "user") if db.get(k)}
    for k, v in (db.get("options") or {}).items():
        if "password" in str(k).lower():
            raise SPIError("a remote worker's connection options may not hold a password",
                           INVALID_AUTHORIZATION_SPECIFICATION)
        kw[k] = v
    with _errors():
        conn = psycopg2.connect(application_name=application_name, **kw)
    # json and jsonb as text, as PL/Python gives them
    psycopg2.extras.register_default_json(conn, loads=lambda s: s)
    psycopg2.extras.register_default_jsonb(conn, loads=lambda s: s)
    # as the database's own worker sessions (catalog/sessions.py SESSION_PINS): whatever the
    # role's or database's defaults, each unit commits where the coordinator reads it
    conn.set_session(isolation_level="READ COMMITTED", readonly=False, autocommit=False)
    with conn.cursor() as cur:
        cur.execute(REMOTE_SESSION_PINS)
    conn.commit()
    return conn
