"""Statements of the remote executors (:mod:`cerebro_db.remote`): where the remote workers
connect, their database backends, and the settings a remote worker's connection applies."""
from __future__ import annotations

from typing import Any

from . import Catalog


def remote_database(cat: Catalog) -> dict[str, Any]:
    """This database's name, the calling role, the port and ``listen_addresses``."""
    return cat.query("SELECT pg_catalog.current_database()::text AS d, current_user::text AS u, "
                     "pg_catalog.current_setting('port') AS p, "
                     "pg_catalog.current_setting('listen_addresses') AS l")[0]


def _fresh_activity(cat: Catalog) -> None:
    """pg_stat_activity is a snapshot taken once per transaction: take a fresh one."""
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")


def terminate_application(cat: Catalog, application_name: str) -> bool:
    """End the calling role's backends (other than this one) named ``application_name``."""
    _fresh_activity(cat)
    rows = cat.query(
        "SELECT pg_catalog.pg_terminate_backend(pid) AS t FROM "
        "pg_catalog.pg_stat_activity WHERE usename = current_user AND "
        "application_name = $1 AND pid <> pg_catalog.pg_backend_pid()",
        [application_name], ["text"])
    return any(r["t"] for r in rows)


def backends_of_applications(cat: Catalog, names: list[str]) -> dict[str, int]:
    """The calling role's backends named one of ``names``: application_name -> pid."""
    _fresh_activity(cat)
    rows = cat.query("SELECT pid, application_name AS a FROM "
                     "pg_catalog.pg_stat_activity WHERE usename = current_user AND "
                     "application_name = ANY($1)", [names], ["text[]"])
    return {r["a"]: int(r["pid"]) for r in rows}


def set_config_plan(db: Any) -> Any:
    """A prepared ``set_config(name, value, false)`` on a remote worker's connection (a
    ``plpy``-like object, :mod:`cerebro_db.remote.pgdb`)."""
    return db.prepare("SELECT pg_catalog.set_config($1, $2, false)", ["text", "text"])
