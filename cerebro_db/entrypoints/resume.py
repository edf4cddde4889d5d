"""``madlib_keras_fit_resume``: continue an interrupted, cancelled or failed fit of any kind.

The one resume entry point: it checks the fit and its data, then dispatches on the fit's
kind to the entry point that made it (:func:`.training.resume_fit` for
``madlib_keras_fit_multiple_model`` and ``madlib_keras_fit``, :func:`.automl.resume_automl`
for ``madlib_keras_automl``); both run the fit service with a
:class:`~cerebro_db.fitrun.ResumePoint`.
"""
from __future__ import annotations

import json
from typing import Any

from ..catalog import Catalog
from ..catalog import fits as sql
from ..errors import (
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_IN_USE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    CerebroError,
)
from ..names import display_name, quote_ident
from . import entrypoint, fit_inputs
from .automl import resume_automl
from .training import resume_fit


@entrypoint
def madlib_keras_fit_resume(cat: Catalog, *, fit_id: int) -> None:
    """Continue an interrupted (or failed) fit from the catalog: the units it committed are
    kept, each configuration continues from its last committed state, and the outputs are
    written as the original call would have. With a fixed random_state the result equals an
    uninterrupted run (the visit orders and unit seeds depend on the seed only)."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    f = sql.fit_row(cat, fit_id)
    if f is None:
        raise CerebroError(f"fit {fit_id} does not exist", UNDEFINED_OBJECT,
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    if not f["mine"]:
        # a superuser sees every role's fits; a resume runs the fit as the caller, on the
        # tables its row names, and a role writes its own rows (a red-team pass: a row a role
        # made, or one restored from a dump, would run with a superuser's rights)
        raise CerebroError(f'fit {fit_id} belongs to role "{f["owner"]}"',
                           INSUFFICIENT_PRIVILEGE,
                           hint=f"A fit is resumed by its owner: SET ROLE "
                                f"{quote_ident(f['owner'])} first.")
    job = sql.job_run_of_fit(cat, fit_id)
    if job is not None or "__cerebro_job_" in (f["model_output_table"] or ""):
        # its outputs go to the job's staging names, which only the job's run publishes (an
        # outside pass resumed one as its message said: the tables stayed unpublished)
        which = f'run {job["run"]} of model selection job "{job["job_name"]}"' if job else \
            "a model selection job's run"
        raise CerebroError(
            f"fit {fit_id} is {which}: a job's fit is not resumed by hand",
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            hint="Run the job again (CALL run_model_selection_job('<job name>')); a failed "
            "run is retried by the job as its retries setting says.")
    if f["status"] == "done":
        raise CerebroError(f"fit {fit_id} is already done", OBJECT_NOT_IN_PREREQUISITE_STATE)
    if f["status"] == "running" and f["live"]:
        raise CerebroError(f"fit {fit_id} is still running (coordinator pid "
                           f"{f['coordinator_pid']})", OBJECT_IN_USE,
                           hint="Only an interrupted, cancelled or failed fit can be resumed.")
    opts = f["options"] if isinstance(f["options"], dict) else json.loads(f["options"])
    if "executor_tag" not in opts:
        raise CerebroError(f"fit {fit_id} was made by an older version and cannot be resumed",
                           FEATURE_NOT_SUPPORTED)
    check_recorded_options(fit_id, f["kind"], opts)
    src = fit_inputs.packed_table(cat, display_name(f["source_table"], "source_table"),
                                  "source_table")
    vname = f["validation_table"] and display_name(f["validation_table"], "validation_table")
    val = fit_inputs.validation_table(cat, vname, src) if vname else None
    fit_inputs.same_data(cat, opts, fit_id, src, val)
    if src.partitions != f["num_partitions"]:
        raise CerebroError(f'source_table "{src.table}" now has {src.partitions} partitions, '
                           f"fit {fit_id} was started on {f['num_partitions']}",
                           OBJECT_NOT_IN_PREREQUISITE_STATE)
    out = fit_inputs.stored_table(cat, opts, "output", f["model_output_table"],
                                  "model_output_table")
    assert out is not None
    resume = resume_automl if f["kind"] == "automl" else resume_fit
    resume(cat, f, opts, src, val, out)


_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "executor_tag": (str,), "tables": (dict,), "arch_table": (str,), "num_workers": (int,),
    "frequency": (int,), "policy_params": (dict,), "use_caching": (bool,), "name": (str,),
    "description": (str,), "replicas": (int,), "object_table": (str,),
    "custom_functions": (dict,), "training_metrics": (str,), "warm_start": (bool,),
    "source_name": (str,), "validation_name": (str,),
}
"""The recorded options a resume reads, and their JSON types (NULL allowed but where
:data:`_REQUIRED_OPTIONS` says)."""
_REQUIRED_OPTIONS = ("arch_table", "num_workers")
_TABLE_KEYS = ("output", "arch", "mst")
_AUTOML_OPTIONS: dict[str, tuple[type, ...]] = {
    "model_id_list": (list,), "automl_method": (str,), "compile_params_grid": (str,),
    "fit_params_grid": (str,), "automl_params": (str, type(None)),
}


def check_recorded_options(fit_id: int, kind: str, opts: dict[str, Any]) -> None:
    """The options a fit recorded, as a resume reads them, or 55000 naming what is wrong: a
    role may edit its own fit rows, and a resume of an edited row answered Python's
    KeyError, ValueError or IndexError (a red-team pass)."""
    def damaged(what: str) -> CerebroError:
        return CerebroError(f"fit {fit_id} cannot be resumed: its catalog row is damaged "
                            f"({what})", OBJECT_NOT_IN_PREREQUISITE_STATE,
                            hint="Start a new fit instead.")

    def typed(v: Any, types: tuple[type, ...]) -> bool:
        # JSON has no integer subtype of bool: true is not a number of workers
        return isinstance(v, types) and not (isinstance(v, bool) and bool not in types)

    for key, types in _OPTION_TYPES.items():
        v = opts.get(key)
        if v is None:
            if key in _REQUIRED_OPTIONS:
                raise damaged(f"options.{key} is missing")
        elif not typed(v, types):
            raise damaged(f"options.{key} is {json.dumps(v)[:80]}, not of type "
                          f"{types[0].__name__}")
    for key in ("num_workers", "replicas", "frequency"):
        if opts.get(key) is not None and opts[key] < 1:
            raise damaged(f"options.{key} is {opts[key]}")
    tables = opts.get("tables") or {}
    for key in _TABLE_KEYS:
        rec = tables.get(key)
        if rec is not None and not (isinstance(rec, list) and len(rec) == 3
                                    and all(x is None or isinstance(x, str) for x in rec)
                                    and isinstance(rec[1], str) and isinstance(rec[2], str)):
            raise damaged(f"options.tables.{key} is {json.dumps(rec)[:80]}")
    for key in ("source_oid", "validation_oid"):
        if tables.get(key) is not None and not typed(tables[key], (int,)):
            raise damaged(f"options.tables.{key} is {json.dumps(tables[key])[:80]}")
    funcs = opts.get("custom_functions") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in funcs.items()):
        raise damaged("options.custom_functions maps names to text")
    if kind == "automl":
        pp = opts.get("policy_params") or {}
        for key, types in _AUTOML_OPTIONS.items():
            if key in pp and not typed(pp[key], types):
                raise damaged(f"options.policy_params.{key} is {json.dumps(pp[key])[:80]}")
        if not all(typed(m, (int,)) for m in pp.get("model_id_list") or []):
            raise damaged("options.policy_params.model_id_list holds integers")
