"""Statements of the worker and control sessions (:mod:`cerebro_db.executors`).

A statement sent to a session through dblink travels as text: it is composed here with
:meth:`Catalog.format_sql`, so PostgreSQL's ``format()`` quotes its values. The statements
the coordinator runs itself use bound parameters.
"""
from __future__ import annotations

import json
from typing import Any

from . import Catalog


def ext(cat: Catalog, name: str) -> str:
    """An extension object's qualified name, escaped for a ``format()`` template."""
    return cat.ext(name).replace("%", "%%")


# -- sent to a session (dblink) -----------------------------------------------------------
SESSION_PINS = (
    # the caller's statement_timeout bounds the whole fit (the coordinator's statement); a
    # unit is never cancelled by a timeout of its own session (see executors.is_cancel)
    "SET statement_timeout = 0; "
    # every statement sent to the session names its tables and the extension's functions
    # qualified; pinning search_path keeps out any function or operator a role could create
    # in a schema of the database's default search_path
    "SET search_path = pg_catalog, pg_temp; "
    # a unit reported committed must survive a crash of the server (a resume trusts the
    # catalog), whatever the server's default
    "SET synchronous_commit = on; "
    # what a DBA may set for the role or database must not break the sessions (an outside
    # pass): statements travel as text with standard quoting; each unit commits and the
    # coordinator (READ COMMITTED, checked by fitrun) reads it; the caller's transaction is
    # writable (checked too); a session waits idle between units for as long as the fit
    # needs; row-level security filters the catalog rather than failing every query; the
    # catalog's triggers fire (they draw the generated ids)
    "SET standard_conforming_strings = on; "
    "SET default_transaction_isolation = 'read committed'; "
    "SET default_transaction_read_only = off; "
    "SET idle_session_timeout = 0; "
    "SET idle_in_transaction_session_timeout = 0; "
    # a lock wait of a session is the coordinator's to judge (its lock-wait check finds a
    # wait on the fit's own transaction; a role's lock_timeout failed units, red-team pass)
    "SET lock_timeout = 0; "
    "SET row_security = on; "
    "DO $pins$ BEGIN IF pg_catalog.current_setting('session_replication_role') "
    "OPERATOR(pg_catalog.<>) 'origin' THEN "
    "PERFORM pg_catalog.set_config('session_replication_role', 'origin', false); "
    "END IF; EXCEPTION WHEN insufficient_privilege THEN RAISE EXCEPTION USING "
    "ERRCODE = '42501', MESSAGE = pg_catalog.format('session_replication_role is %L for "
    "this role, where the catalog''s triggers do not fire, and the role may not set it back', "
    "pg_catalog.current_setting('session_replication_role')), "
    "HINT = 'A superuser: ALTER ROLE ... RESET session_replication_role.'; END $pins$"
)
"""Settings every worker and control session runs with, in one round trip."""
REMOTE_SESSION_PINS = ("SET standard_conforming_strings = on; SET row_security = on; "
                       "SET idle_session_timeout = 0; "
                       "SET idle_in_transaction_session_timeout = 0; SET lock_timeout = 0")
"""What a remote worker's own connection pins (``remote/pgdb.py``; its isolation level and
read-write mode are set through the driver)."""
RESET_ALL = "RESET ALL"
BACKEND_PID = "SELECT pg_catalog.pg_backend_pid()::text"
ROLES = "SELECT concat_ws(',', current_user, session_user)"
COMMIT_STATUS = "COMMIT"
"""What a chain's ``COMMIT`` answers once the statement before it has committed."""
ROLES_AND_PID = "SELECT concat_ws(',', current_user, session_user, pg_catalog.pg_backend_pid())"


def set_application_name(cat: Catalog, name: str) -> str:
    return cat.format_sql("SET application_name = %L", [name], ["text"])


def set_idle_session_timeout(cat: Catalog, milliseconds: int) -> str:
    return cat.format_sql("SET idle_session_timeout = %s", [int(milliseconds)], ["int4"])


def set_config(cat: Catalog, setting: str, value: str) -> str:
    """A session-wide setting (a ``cerebro_db.*`` setting forwarded to the workers)."""
    return cat.format_sql("SELECT pg_catalog.set_config(%L, %L, false)", [setting, value],
                          ["text", "text"])


def run_unit(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: dict[str, Any]) -> str:
    """One unit of a fit for a worker session (``__run_unit``: its JSON answer). The integers
    are written as numbers (``pg_stat_activity`` shows which unit a session runs)."""
    return cat.format_sql(
        f"SELECT {ext(cat, '__run_unit')}(%s::bigint, %s, %s, %s, %s, %L, %L)",
        [int(fit_id), int(mst_key), int(epoch), int(partition), int(worker), kind,
         json.dumps(options)],
        ["int8", "int4", "int4", "int4", "int4", "text", "text"])


CHAIN_PAD = 9000
"""Bytes of the statement after each ``COMMIT`` of a chain: a server sends the results of a
statement string's statements as its output buffer (8 kB) fills, or all at the end; a row
larger than the buffer makes it send at once what came before, so a unit's answer and its
``COMMIT`` reach the coordinator as soon as the unit has committed."""


def run_chain(cat: Catalog, first: str, tag: str, fit_id: int, worker: int, seqs: range,
              wake: str | None) -> str:
    """A worker session's chain: ``first`` (a :func:`run_unit` statement) and then one
    ``__run_slot`` per seq of ``seqs``, each in a transaction of its own (``BEGIN``, the
    statement, ``COMMIT``: a statement's answer is written before its commit, the
    ``COMMIT``'s status after it) followed by a :data:`CHAIN_PAD` row that pushes them out.
    Without ``seqs``: ``first`` alone."""
    if not len(seqs):
        return first
    head = cat.format_sql(f"BEGIN; SELECT {ext(cat, '__run_slot')}(%L, %s::bigint, %s, ",
                          [tag, int(fit_id), int(worker)], ["text", "int8", "int4"])
    tail = cat.format_sql(", %s, %L); COMMIT; SELECT pg_catalog.repeat(' ', %s)",
                          [int(seqs[-1]), wake, CHAIN_PAD], ["int4", "text", "int4"])
    pad = tail[tail.index("; SELECT pg_catalog.repeat"):]
    return "; ".join([f"BEGIN; {first}; COMMIT{pad}",
                      *(f"{head}{int(s)}{tail}" for s in seqs)])


def post_unit(cat: Catalog, tag: str, fit_id: int, worker: int, seq: int, kind: str,
              unit: dict[str, Any] | None) -> str:
    """For the control session: post ``kind`` ('unit' with ``unit``, or 'stop') in a
    worker's slot unless the worker abandoned it first; returns a row when posted."""
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'unit_postings')} (tag, worker, seq, fit_id, kind, unit) "
        "VALUES (%L, %s, %s, %s::bigint, %L, %L::jsonb) ON CONFLICT DO NOTHING "
        "RETURNING 'posted'",
        [tag, int(worker), int(seq), int(fit_id), kind,
         None if unit is None else json.dumps(unit)],
        ["text", "int4", "int4", "int8", "text", "text"])


def slot_kind(cat: Catalog, tag: str, fit_id: int, worker: int, seq: int) -> str:
    """For the control session: what a worker's slot holds (no row: nothing)."""
    return cat.format_sql(f"SELECT kind FROM {ext(cat, 'unit_postings')} WHERE fit_id = "
                          "%s::bigint AND tag = %L AND worker = %s AND seq = %s",
                          [int(fit_id), tag, int(worker), int(seq)],
                          ["int8", "text", "int4", "int4"])


def purge(cat: Catalog, table: str) -> str:
    """Delete the rows of catalog ``table`` marked ``doomed`` (``__purge``; a role has no
    DELETE on the catalog: it marks its rows with an UPDATE, which row-level security keeps
    to its own, and this deletes the marked ones)."""
    assert table.isidentifier(), table  # one of the package's table names
    return f"CALL {ext(cat, '__purge')}('{table}')"


def clear_postings(cat: Catalog, tag: str) -> str:
    """For the control session: forget an executor's postings."""
    return cat.format_sql(f"UPDATE {ext(cat, 'unit_postings')} SET doomed = true WHERE tag = %L; "
                          f"{purge(cat, 'unit_postings')}", [tag], ["text"])


def check_fit(cat: Catalog, spec: dict[str, Any]) -> str:
    """The worker-side checks of a fit (``__check_fit``: its JSON answer)."""
    return cat.format_sql(f"SELECT {ext(cat, '__check_fit')}(%L::text)", [json.dumps(spec)],
                          ["text"])


def cancel_requested(cat: Catalog, fit_id: int) -> str:
    """For the control session: 't' when ``cerebro_db_cancel_fit`` flagged the fit."""
    return cat.format_sql(f"SELECT (cancel_requested IS NOT NULL)::text FROM {ext(cat, 'fits')} "
                          "WHERE fit_id = %L::bigint", [int(fit_id)], ["int8"])


def relation_visible(cat: Catalog, qualified: str) -> str:
    """For the control session: 'true' when the table ``qualified`` names exists there."""
    return cat.format_sql("SELECT (pg_catalog.to_regclass(%L) IS NOT NULL)::text", [qualified],
                          ["text"])


# -- run by the coordinator ---------------------------------------------------------------
def worker_connect(cat: Catalog, name: str) -> None:
    """Open ``name`` through the extension's SECURITY DEFINER ``__worker_connect``, with a
    ticket that says who asks (``worker_tickets``: its owner is this current_user). In one
    subtransaction: a connect that fails leaves no ticket behind (a role holds at most 100
    live ones)."""
    with cat.db.subtransaction():
        token = cat.query(f"INSERT INTO {cat.ext('worker_tickets')} DEFAULT VALUES "
                          "RETURNING token")[0]["token"]
        cat.query(f"SELECT {cat.ext('__worker_connect')}($1, $2)", [name, token],
                  ["text", "text"])


def backend_pid(cat: Catalog) -> int:
    return int(cat.query("SELECT pg_catalog.pg_backend_pid() AS p")[0]["p"])


def roles(cat: Catalog) -> dict[str, Any]:
    """current_user (c), session_user (s) and the database (d) of the calling session, and
    whether the session user may VACUUM and ANALYZE other roles' tables here (m: a
    superuser or a member of the database's owner), which run those roles' index
    functions in this session."""
    return cat.query(
        "SELECT current_user::text AS c, session_user::text AS s, current_database()::text "
        "AS d, (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = session_user) "
        "OR pg_catalog.pg_has_role(session_user, (SELECT db.datdba FROM pg_catalog.pg_database "
        "db WHERE db.datname = current_database()), 'MEMBER') AS m")[0]


def terminate_backend(cat: Catalog, pid: int) -> bool:
    rows = cat.query("SELECT pg_catalog.pg_terminate_backend($1) AS t", [pid], ["int4"])
    return bool(rows[0]["t"])


def clear_stat_snapshot(cat: Catalog) -> None:
    """Forget the transaction's cached view of pg_stat_activity (to see sessions end)."""
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")


def blocked_by_coordinator(cat: Catalog, pids: list[int]) -> dict[str, int] | None:
    """A session among ``pids`` waiting for a lock this backend holds, or behind a session
    that waits for this backend: (worker_pid, blocker), or None."""
    rows = cat.query(
        "SELECT w.pid AS worker_pid, b.pid AS blocker FROM pg_catalog.pg_locks w "
        "CROSS JOIN LATERAL pg_catalog.unnest(pg_catalog.pg_blocking_pids(w.pid)) AS b(pid) "
        "WHERE NOT w.granted AND w.pid = ANY($1) AND b.pid <> ALL($1) AND "
        "(b.pid = pg_catalog.pg_backend_pid() OR "
        "pg_catalog.pg_backend_pid() = ANY(pg_catalog.pg_blocking_pids(b.pid))) LIMIT 1",
        [pids], ["int4[]"])
    return rows[0] if rows else None


def activity(cat: Catalog, pid: int) -> dict[str, Any] | None:
    """The user (u) and statement (query) of the session ``pid``, or None when it is gone."""
    rows = cat.query("SELECT usename::text AS u, query FROM pg_catalog.pg_stat_activity "
                     "WHERE pid = $1", [pid], ["int4"])
    return rows[0] if rows else None


def sessions_named(cat: Catalog, application_prefix: str) -> list[int]:
    """Pids of this role's other sessions whose application_name starts with the prefix."""
    rows = cat.query("SELECT pid FROM pg_catalog.pg_stat_activity WHERE usename = current_user "
                     "AND left(application_name, length($1)) = $1 AND "
                     "pid <> pg_catalog.pg_backend_pid()", [application_prefix], ["text"])
    return [r["pid"] for r in rows]
