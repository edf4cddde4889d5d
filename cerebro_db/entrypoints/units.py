"""The worker side of a fit: ``__run_unit`` (internal, called through dblink)."""
from __future__ import annotations

import json
from typing import Any

from ..catalog import Catalog

_catalogs: dict[str, Catalog] = {}
"""A worker session's :class:`Catalog` per extension schema, kept between its units so the
statements it prepared (fit and configuration rows, states, the unit log) are planned once
per session, not once per unit."""


def _catalog(plpy: Any, schema: str) -> Catalog:
    cat = _catalogs.get(schema)
    if cat is None:
        cat = _catalogs[schema] = Catalog(plpy, schema)
    return cat


def run_unit(plpy: Any, schema: str, *, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: str) -> str:
    """Run one unit; the JSON result says ok or carries the error (never raises). When
    the options name the coordinator's wake-up socket (``"wake"``), the worker pokes it as
    the unit ends (:mod:`cerebro_db.wakeup`)."""
    from .. import worker as w
    from ..wakeup import poke

    w.dedicated_session()
    opts = json.loads(options or "{}")
    res = w.run_unit(_catalog(plpy, schema), fit_id, mst_key, epoch, partition, worker, kind,
                     opts)
    out = json.dumps(res)
    poke(opts.get("wake"))  # the unit is done: the coordinator may stop sleeping
    return out


def check_fit(plpy: Any, schema: str, *, spec: str) -> str:
    """The checks of a fit that need Keras (``fit_checks.check_configs``), run in a
    worker session before the fit writes anything; the JSON answer says ok or carries the
    error (message, SQLSTATE, hint, detail) for the coordinator to raise."""
    import traceback

    from .. import worker
    from ..errors import INTERNAL_ERROR, CerebroError
    from ..fit_checks import check_configs

    worker.dedicated_session()
    try:
        check_configs(json.loads(spec or "{}"), Catalog(plpy, schema))
    except CerebroError as e:
        return json.dumps({"ok": False, "message": e.message, "sqlstate": e.sqlstate,
                           "hint": e.hint, "detail": e.detail})
    except Exception as e:  # noqa: BLE001 - reported to the coordinator as an internal error
        return json.dumps({"ok": False, "message": f"checking the fit failed: "
                           f"{type(e).__name__}: {e}", "sqlstate": INTERNAL_ERROR,
                           "detail": traceback.format_exc()})
    return json.dumps({"ok": True})
