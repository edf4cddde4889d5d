"""Statements about the calling session itself: a cheap round trip, the caller's
search_path, privileges to create outputs.

These take a ``plpy``-like ``db`` (or a :class:`~cerebro_db.catalog.Catalog`) because the
entry point wrapper runs some of them before a catalog object exists.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode


def ping(db: Any) -> None:
    """One round trip to the server (lets it deliver a pending cancel)."""
    db.execute("SELECT 1")


def custom_setting(db: Any, name: str) -> str | None:
    """A (possibly custom) setting of this session through ``db`` (no catalog object yet),
    None when unset or empty. ``name`` is the project's own setting name."""
    plan = db.prepare("SELECT pg_catalog.current_setting($1, true) AS p", ["text"])
    rows = db.execute(plan, [name])
    v = rows[0]["p"] if rows else None
    return v if v else None


def search_path(cat: Any) -> str:
    """This session's search_path now."""
    return str(cat.query("SELECT pg_catalog.current_setting('search_path') AS p")[0]["p"])


def may_create_temporary(cat: Any) -> bool:
    return bool(cat.query("SELECT pg_catalog.has_database_privilege("
                          "pg_catalog.current_database(), 'TEMPORARY') AS ok")[0]["ok"])


def schema_create_privilege(cat: Any, schema: str) -> dict[str, Any] | None:
    """``{"s": name, "ok": may CREATE}`` of an existing schema, None when there is none."""
    rows = cat.query("SELECT n.nspname::text AS s, "
                     "pg_catalog.has_schema_privilege(n.oid, 'CREATE') AS ok "
                     "FROM pg_catalog.pg_namespace n WHERE n.nspname = $1", [schema], ["text"])
    return rows[0] if rows else None


def default_tablespace_denied(cat: Any) -> str | None:
    """The tablespace ``default_tablespace`` names when the caller may not create tables in
    it (its database's own default needs no privilege), else None."""
    rows = cat.query(
        "SELECT t.spcname::text AS t FROM pg_catalog.pg_tablespace t "
        "WHERE t.spcname = pg_catalog.current_setting('default_tablespace') "
        "AND t.oid <> (SELECT d.dattablespace FROM pg_catalog.pg_database d "
        "WHERE d.datname = pg_catalog.current_database()) "
        "AND NOT pg_catalog.has_tablespace_privilege(t.oid, 'CREATE')")
    return rows[0]["t"] if rows else None


def server_version(cat: Any) -> str:
    """PostgreSQL's ``version()`` text."""
    return str(cat.query("SELECT pg_catalog.version() AS v")[0]["v"])


def current_database(cat: Any) -> str:
    return str(cat.query("SELECT pg_catalog.current_database()::text AS d")[0]["d"])


def current_user(cat: Any) -> str:
    return str(cat.query("SELECT current_user::text AS u")[0]["u"])


def is_superuser(cat: Any) -> bool:
    return bool(cat.query("SELECT rolsuper AS s FROM pg_catalog.pg_roles "
                          "WHERE rolname = current_user")[0]["s"])


def socket_login(cat: Any) -> dict[str, Any]:
    """``{"u": current user, "p": port, "s": first socket directory}`` of this server."""
    return cat.query("SELECT current_user::text AS u, "
                     "pg_catalog.current_setting('port') AS p, "
                     "pg_catalog.split_part(pg_catalog.current_setting("
                     "'unix_socket_directories'), ',', 1) AS s")[0]


def conninfo(**params: str) -> str:
    """A libpq connection URI with these parameters (``dbname``, ``user``, ``port``,
    ``host``: a socket directory or a host name), every value percent-encoded, so no value
    can add a parameter."""
    return "postgresql://?" + urlencode(params, quote_via=quote, safe="")
