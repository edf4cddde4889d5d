"""One Python function per SQL function.

Each entry point validates its arguments before doing any work, builds the pieces, and
turns failures into PostgreSQL errors: a :class:`~cerebro_db.errors.CerebroError` becomes
``plpy.error`` with its SQLSTATE, hint and detail; an SQL error raised by the server keeps
its own SQLSTATE; anything unexpected becomes an internal error with the traceback in
DETAIL. The PL/Python bodies in ``plpython/`` are one call into this package.
"""
from __future__ import annotations

import functools
import traceback
from typing import Any, Callable

from .. import interrupts
from ..catalog import Catalog, session
from ..errors import (
    INSUFFICIENT_PRIVILEGE,
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    INVALID_SCHEMA_NAME,
    INVALID_TEXT_REPRESENTATION,
    NULL_VALUE_NOT_ALLOWED,
    OUT_OF_MEMORY,
    CerebroError,
    out_of_memory,
)
from ..names import TableName


def entrypoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn(catalog, **args)`` as ``wrapper(plpy, schema, **args)`` for a PL/Python body."""

    @functools.wraps(fn)
    def wrapper(plpy: Any, schema: str, **kwargs: Any) -> Any:
        spi_errors: tuple[type[BaseException], ...] = tuple(
            e for e in (getattr(plpy, "SPIError", None), getattr(plpy, "Error", None)) if e
        )
        try:
            with interrupts.installed(lambda: session.ping(plpy)):
                return fn(Catalog(plpy, schema, caller_search_path(plpy)), **kwargs)
        except CerebroError as e:
            extra = {k: v for k, v in (("detail", e.detail), ("hint", e.hint)) if v}
            plpy.error(e.message, sqlstate=e.sqlstate, **extra)
        except spi_errors:
            raise
        except Exception as e:  # noqa: BLE001 - unexpected: say where, keep the traceback
            if out_of_memory(e):
                plpy.error(f"{fn.__name__}: out of memory", detail=traceback.format_exc(),
                           sqlstate=OUT_OF_MEMORY)
            plpy.error(
                f"{fn.__name__} failed: {type(e).__name__}: {e}",
                detail=traceback.format_exc(),
                sqlstate=INTERNAL_ERROR,
            )

    return wrapper


def internal(*nullable: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap an internal function's implementation (``__run_unit``, ``__run_slot``,
    ``__job_step``, ``__check_fit``: PUBLIC may call them, as the worker sessions and jobs do)
    so that a NULL argument (other than ``nullable``) is 22004 and a
    :class:`~cerebro_db.errors.CerebroError` keeps its SQLSTATE, as at the entry points; a
    red-team pass got Python tracebacks (38000) from NULLs and malformed JSON."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(plpy: Any, schema: str, **kwargs: Any) -> Any:
            try:
                for k, v in kwargs.items():
                    if v is None and k not in nullable:
                        raise CerebroError(f"{k} must not be NULL", NULL_VALUE_NOT_ALLOWED)
                return fn(plpy, schema, **kwargs)
            except CerebroError as e:
                extra = {k: v for k, v in (("detail", e.detail), ("hint", e.hint)) if v}
                plpy.error(e.message, sqlstate=e.sqlstate, **extra)

        return wrapper

    return wrap


def json_object(text: str | None, what: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object (empty or NULL: ``{}``), else 22P02 / 22023."""
    import json

    try:
        value = json.loads(text or "{}")
    except ValueError as e:
        raise CerebroError(f"{what} is not valid JSON: {e}", INVALID_TEXT_REPRESENTATION) \
            from None
    if not isinstance(value, dict):
        raise CerebroError(f"{what} must be a JSON object, got {type(value).__name__}",
                           INVALID_PARAMETER_VALUE)
    return value


CALLER_PATH_SETTING = "cerebro_db.caller_search_path"


def caller_search_path(plpy: Any) -> str | None:
    """The search_path of the statement that called the entry point: its SQL wrapper (see
    scripts/build_sql.py) records it here before calling the implementation, which runs
    with search_path pinned to pg_catalog, pg_temp."""
    return session.custom_setting(plpy, CALLER_PATH_SETTING)


def require_output_schema(cat: Catalog, table: TableName, what: str) -> None:
    """The schema ``table`` will be created in exists and the caller may create in it.

    Checked before any work: an output is written at the end, so without this a fit would
    train to completion and then fail on CREATE TABLE. ``pg_temp.<name>`` is this session's
    temporary schema (created on first use), which needs the TEMPORARY privilege; outputs
    are written by the calling session, so temporary outputs work (worker sessions only
    read the packed tables)."""
    if table.schema == "pg_temp":
        if not session.may_create_temporary(cat):
            raise CerebroError(f'{what} "{table}": permission denied to create temporary '
                               "tables in this database", INSUFFICIENT_PRIVILEGE)
        return
    row = (session.schema_create_privilege(cat, table.schema)
           if table.schema is not None else None)
    if row is None:
        if table.schema is None:
            raise CerebroError(f'{what} "{table}": no schema has been selected to create in',
                               INVALID_SCHEMA_NAME, hint="Qualify the name or set search_path.")
        raise CerebroError(f'{what} "{table}": schema "{table.schema}" does not exist',
                           INVALID_SCHEMA_NAME)
    if not row["ok"]:
        raise CerebroError(f'{what} "{table}": permission denied for schema {row["s"]}',
                           INSUFFICIENT_PRIVILEGE)
    ts = session.default_tablespace_denied(cat)
    if ts is not None:  # found only at CREATE TABLE, after a fit's training (an outside pass)
        raise CerebroError(f'{what} "{table}": permission denied for tablespace {ts}',
                           INSUFFICIENT_PRIVILEGE,
                           hint=f"default_tablespace names {ts}, where the outputs would be "
                           "created: ask for CREATE on it, or SET default_tablespace = '' "
                           "(the database's default).")


def usage(function: str, message: str | None = None) -> str:
    """The short usage text of an SQL function (``fn('help')``, ``fn()``)."""
    from ..usage import USAGE

    text = USAGE.get(function)
    if text is None:
        raise CerebroError(f"no usage text for {function!r}")
    return text
