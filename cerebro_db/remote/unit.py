"""The remote side of a unit: :func:`run_call`, what a Dask task or a Ray actor method runs.

A ``call`` is JSON-able::

    {"db": {"host", "port", "dbname", "user", "options": {libpq keyword: value}},
     "schema": the extension's schema, "application_name": str,
     "settings": {setting: value}, "fit_id", "mst_key", "epoch", "partition", "worker",
     "kind", "options": {...}}

or, for the fit's checks before it starts, ``{"db", "schema", "application_name",
"settings", "check": true, "spec": {...}}``.

The process keeps one database connection (as the calling role; the password comes from
this process's environment) and the worker module's caches (decoded partitions, compiled
models) across calls, like a worker session keeps them across units. Each call runs
:func:`cerebro_db.worker.run_unit` in one transaction of that connection, committed when
the unit succeeded and rolled back otherwise, with ``search_path = pg_catalog, pg_temp``
and the settings the sessions executor forwards to worker sessions. Connecting to another
database or as another role first drops every cached fit row and partition.
"""
from __future__ import annotations

import json
import threading
import traceback
from typing import Any

from ..catalog.remote import set_config_plan
from ..errors import (
    CONNECTION_FAILURE,
    INTERNAL_ERROR,
)

LOCK = threading.Lock()
_state: dict[str, Any] = {"key": None, "db": None, "applied": None}

FIXED_SETTINGS = (("statement_timeout", "0"), ("search_path", "pg_catalog, pg_temp"),
                  ("synchronous_commit", "on"))
"""What a worker session sets on opening (``DblinkExecutor._connect``); a remote worker's
connection gets the same."""


def _forget_caches() -> None:
    """Drop what the worker module keeps of another database or role."""
    from .. import worker

    worker._fits.clear()
    worker._configs.clear()
    while worker._partitions:
        worker._evict_oldest()


IDLE_APPLICATION = "cerebro_db remote worker (idle)"
"""The connection's ``application_name`` between units (during a unit: the worker's, as a
worker session's, so a resume of an interrupted fit finds and ends it)."""


def _apply(db: Any, call: dict[str, Any]) -> None:
    """The call's ``application_name`` and, when they changed, its session settings."""
    settings = json.dumps(call.get("settings") or {}, sort_keys=True)
    plan = set_config_plan(db)
    pairs = [("application_name", str(call.get("application_name") or IDLE_APPLICATION))]
    if settings != _state["applied"]:
        pairs += [*FIXED_SETTINGS, *(call.get("settings") or {}).items()]
    db.rollback()
    for k, v in pairs:
        db.execute(plan, [k, str(v)])
    db.commit()
    _state["applied"] = settings


def _database(call: dict[str, Any]) -> Any:
    """This process's connection for ``call`` (opened, or reopened when it broke or the
    call names another database or role), with the call's session settings applied."""
    from .pgdb import PgDB, SPIError, connect

    key = json.dumps(call["db"], sort_keys=True)
    for attempt in (0, 1):
        db = _state["db"]
        if db is not None and (key != _state["key"] or db.closed or attempt):
            db.close()
            db = None
        fresh = db is None
        if fresh:
            _state.update(db=None, applied=None)
            if _state["key"] is not None and key != _state["key"]:
                _forget_caches()
            db = PgDB(connect(call["db"], IDLE_APPLICATION))
            _state.update(key=key, db=db)
        try:
            _apply(db, call)
            return db
        except SPIError:
            if fresh:  # a new connection that fails is not stale: report it
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _no_connection(e: BaseException) -> dict[str, Any]:
    """The failed answer of a call whose connection to the database could not be made."""
    return {"ok": False, "message": "the remote worker could not connect to the database: "
            f"{getattr(e, 'message', None) or e}",
            "sqlstate": getattr(e, "sqlstate", None) or CONNECTION_FAILURE,
            "detail": traceback.format_exc()}


def _idle(db: Any) -> None:
    """Between units the connection shows it serves no fit."""
    try:
        db.rollback()
        db.execute(set_config_plan(db), ["application_name", IDLE_APPLICATION])
        db.commit()
    except Exception:  # noqa: BLE001 - a broken connection is reopened by the next call
        db.rollback()


def run_call(call: dict[str, Any]) -> dict[str, Any]:
    """Run one unit described by ``call``; returns :func:`cerebro_db.worker.run_unit`'s
    result (never raises: a connection that cannot be made or a failed commit come back
    as a failed result with the SQLSTATE, 08006 for a lost connection). A call with
    ``"check": true`` runs the fit's checks instead (:func:`check_call`)."""
    from .. import worker
    from ..catalog import Catalog

    if call.get("check"):
        return check_call(call)
    with LOCK:
        w = int(call.get("worker", -1))
        try:
            db = _database(call)
        except Exception as e:  # noqa: BLE001 - reported to the coordinator
            _state.update(db=None, applied=None)
            return {**_no_connection(e), "worker": w}
        cat = Catalog(db, str(call["schema"]))
        try:
            res = worker.run_unit(cat, int(call["fit_id"]), int(call["mst_key"]),
                                  int(call["epoch"]), int(call["partition"]), w,
                                  str(call["kind"]), dict(call.get("options") or {}))
        except BaseException:
            db.rollback()
            raise
        if res.get("ok"):
            try:
                db.commit()
            except Exception as e:  # noqa: BLE001 - the unit's writes are gone
                db.rollback()
                _idle(db)
                return {"ok": False, "message": f"committing the unit failed: "
                        f"{getattr(e, 'message', None) or e}",
                        "sqlstate": getattr(e, "sqlstate", None) or CONNECTION_FAILURE,
                        "detail": traceback.format_exc(), "worker": w}
        else:
            db.rollback()
        _idle(db)
        return res


def check_call(call: dict[str, Any]) -> dict[str, Any]:
    """A fit's Keras checks (``fit_checks.check_configs`` of ``call["spec"]``)
    run by the remote worker before the fit writes anything, as worker sessions run them
    (``__check_fit``); the answer says ok or carries the error."""
    from ..catalog import Catalog
    from ..errors import CerebroError
    from ..fit_checks import check_configs

    with LOCK:
        try:
            db = _database(call)
        except Exception as e:  # noqa: BLE001 - reported to the coordinator
            _state.update(db=None, applied=None)
            return _no_connection(e)
        try:
            check_configs(call.get("spec") or {}, Catalog(db, str(call["schema"])))
        except CerebroError as e:
            return {"ok": False, "message": e.message, "sqlstate": e.sqlstate, "hint": e.hint,
                    "detail": e.detail}
        except Exception as e:  # noqa: BLE001 - reported as an internal error
            return {"ok": False, "message": f"checking the fit failed: {type(e).__name__}: "
                    f"{e}", "sqlstate": getattr(e, "sqlstate", None) or INTERNAL_ERROR,
                    "detail": traceback.format_exc()}
        finally:
            _idle(db)
        return {"ok": True}

