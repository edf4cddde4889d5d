"""The worker side of a fit: ``__run_unit`` (internal, called through dblink)."""
from __future__ import annotations

import json
from typing import Any

from ..catalog import Catalog
from ..errors import INVALID_PARAMETER_VALUE
from . import internal, json_object

_catalogs: dict[str, Catalog] = {}
"""A worker session's :class:`Catalog` per extension schema, kept between its units so the
statements it prepared (fit and configuration rows, states, the unit log) are planned once
per session, not once per unit."""


def _catalog(plpy: Any, schema: str) -> Catalog:
    cat = _catalogs.get(schema)
    if cat is None:
        cat = _catalogs[schema] = Catalog(plpy, schema)
    return cat


@internal("options")
def run_unit(plpy: Any, schema: str, *, fit_id: int, mst_key: int, epoch: int, partition: int,
             worker: int, kind: str, options: str) -> str:
    """Run one unit; the JSON result says ok or carries the error (never raises). When
    the options name the coordinator's wake-up socket (``"wake"``), the worker pokes it as
    the unit ends (:mod:`cerebro_db.wakeup`).

    A bundle (``"then"`` in the options: a list of further units of the same fit and
    worker, each ``{"mst_key", "epoch", "partition", "kind", "options"}``) runs them one
    after another in this statement, stopping at the first that fails; their results are
    the answer's ``"then"`` list, in order (see ``DblinkExecutor.submit_unit``)."""
    from .. import worker as w
    from ..wakeup import poke

    w.dedicated_session()
    opts = json_object(options, "__run_unit: options")
    then = _bundle_units(plpy, opts.pop("then", None))
    cat = _catalog(plpy, schema)
    res = w.run_unit(cat, fit_id, mst_key, epoch, partition, worker, kind, opts)
    if then:
        done: list[dict[str, Any]] = []
        for u_key, u_epoch, u_part, u_kind, u_opts in then:
            if not (done[-1] if done else res).get("ok"):
                break
            done.append(w.run_unit(cat, fit_id, u_key, u_epoch, u_part, worker, u_kind,
                                   u_opts))
        res["then"] = done
    out = json.dumps(res)
    poke(opts.get("wake"))  # the unit is done: the coordinator may stop sleeping
    return out


def _bundle_units(plpy: Any, then: Any) -> list[tuple[int, int, int, str, dict[str, Any]]]:
    """A bundle's further units (``"then"``), checked before any unit runs."""
    if then is None:
        return []
    try:
        if not isinstance(then, list):
            raise TypeError(type(then).__name__)
        return [(int(u["mst_key"]), int(u["epoch"]), int(u["partition"]), str(u["kind"]),
                 dict(u.get("options") or {})) for u in then]
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        plpy.error(f'__run_unit: "then" must be a list of units, each with mst_key, epoch, '
                   f"partition, kind and options ({type(e).__name__}: {e})",
                   sqlstate=INVALID_PARAMETER_VALUE)
        raise  # plpy.error raises; for a plpy that does not


SLOT_WAIT = 10.0
"""Seconds a worker session's slot waits for the coordinator's posting before it abandons
the slot, ending its chain (the coordinator then sends a new statement when it has a unit):
a worker with nothing to do does not hold its statement open for long."""
SLOT_POLL_FIRST, SLOT_POLL_MAX = 0.0001, 0.002
"""Seconds between two looks for the posting: from the first, doubling up to the last."""

_ended: dict[tuple[str, str, int], int] = {}
"""(schema, executor tag, worker) -> the last seq of a chain that ended early (a slot
stopped or abandoned): that chain's later slots return at once."""


def _slot_wait(cat: Catalog) -> float:
    """:data:`SLOT_WAIT`, or the seconds of a ``{"point": "slot_wait"}`` test hook."""
    from ..worker import test_hooks

    spec = test_hooks(cat)
    for h in spec if isinstance(spec, list) else [spec]:
        if isinstance(h, dict) and h.get("point") == "slot_wait":
            return float(h.get("seconds", SLOT_WAIT))
    return SLOT_WAIT


@internal("wake")
def run_slot(plpy: Any, schema: str, *, tag: str, fit_id: int, worker: int, seq: int,
             last: int, wake: str | None) -> str:
    """One slot of a worker session's chain (pipelined dispatch, see
    ``DblinkExecutor.submit_unit``): wait for what the coordinator posts for it in
    ``unit_postings``, then run that unit as :func:`run_unit` does, or end the chain (a
    'stop' posting, or nothing posted within :data:`SLOT_WAIT`: the slot is abandoned).
    It pokes the coordinator (``wake``) as it starts, for the slot before it, whose answer
    has then reached the coordinator's connection, and, the chain's last slot, as it ends.
    Answers the unit's JSON, or ``{"idle": true}`` when the chain ended here, or
    ``{"skip": true}`` for a slot after the end."""
    import time

    from .. import worker as w
    from ..catalog import units as sql
    from ..errors import CerebroError
    from ..wakeup import poke

    key = (schema, tag, worker)
    if _ended.get(key, -1) >= seq:
        return '{"skip": true}'
    # the slot before has committed and its answer is out: the coordinator may read it now
    # (a poke as a unit ends would wake the coordinator while the worker still commits)
    poke(wake)
    w.dedicated_session()
    cat = _catalog(plpy, schema)
    try:
        w.fit_row(cat, fit_id)  # a fit this role cannot see is refused at once (42704)
    except CerebroError as e:
        plpy.error(e.message, sqlstate=e.sqlstate)
    end, nap = None, SLOT_POLL_FIRST
    while (found := sql.posting(cat, tag, fit_id, worker, seq)) is None:
        if end is None:
            end = time.monotonic() + _slot_wait(cat)
        if time.monotonic() >= end and sql.abandon_slot(cat, tag, fit_id, worker, seq):
            found = ("abandoned", None)
            break
        time.sleep(nap)
        nap = min(SLOT_POLL_MAX, nap * 2)
    kind, text = found
    unit = json.loads(text) if kind == "unit" and text else None
    if not isinstance(unit, dict):
        for k in [k for k in _ended if k[1] != tag]:
            del _ended[k]  # a pooled session's earlier fits
        _ended[key] = last
        poke(wake)
        return json.dumps({"idle": True, "seq": seq, "posting": kind})
    opts = unit.get("options") or {}
    res = w.run_unit(cat, int(fit_id), int(unit["mst_key"]), int(unit["epoch"]),
                     int(unit["partition"]), int(worker), str(unit["kind"]),
                     opts if isinstance(opts, dict) else {})
    res["seq"] = seq
    out = json.dumps(res)
    if seq == last:  # no slot after it to say so
        poke(wake)
    return out


_SPEC_ITEM = {"mst_key": int, "model_id": int, "compile_params": str, "what": str}


def _check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``__check_fit``'s spec has the shape :func:`fitrun.check_spec` gives it, or 22023:
    PUBLIC may call the function (the worker sessions do), and a malformed spec answered
    a Python TypeError with its traceback (a red-team pass)."""
    from ..errors import CerebroError

    def bad(what: str) -> CerebroError:
        return CerebroError(f"__check_fit: spec.{what}", INVALID_PARAMETER_VALUE,
                            hint="It is called by cerebro_db's worker sessions, not by hand.")

    if not isinstance(spec.get("columns"), list):
        raise bad("columns is not a list")
    if not isinstance(spec.get("configs") or [], list):
        raise bad("configs is not a list")
    if not isinstance(spec.get("custom_functions") or {}, dict):
        raise bad("custom_functions is not an object")
    for i, item in enumerate(spec.get("configs") or []):
        if not isinstance(item, dict) or "arch" not in item:
            raise bad(f"configs[{i}] is not an object with an arch")
        for key, typ in _SPEC_ITEM.items():
            if not isinstance(item.get(key), typ) or isinstance(item.get(key), bool):
                raise bad(f"configs[{i}].{key} is not of type {typ.__name__}")
    return spec


@internal("spec")
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
        check_configs(_check_spec(json_object(spec, "__check_fit: spec")),
                      Catalog(plpy, schema))
    except CerebroError as e:
        return json.dumps({"ok": False, "message": e.message, "sqlstate": e.sqlstate,
                           "hint": e.hint, "detail": e.detail})
    except Exception as e:  # noqa: BLE001 - reported to the coordinator as an internal error
        return json.dumps({"ok": False, "message": f"checking the fit failed: "
                           f"{type(e).__name__}: {e}", "sqlstate": INTERNAL_ERROR,
                           "detail": traceback.format_exc()})
    return json.dumps({"ok": True})
