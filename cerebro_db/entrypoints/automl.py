"""``madlib_keras_automl`` and ``hyperband_schedule``: AutoML on model hopper parallelism.

A run is a fit (catalog kind ``'automl'``) whose trials a tuning procedure
(:mod:`cerebro_db.automl`) launches, extends, stops and frees while the worker sessions
train: the procedure's decisions go through :class:`cerebro_db.automl.trials.TrialBook`
into the same MOP loop as ``madlib_keras_fit_multiple_model`` (no barrier unless the
procedure waits for results, as a Hyperband round does). The entry point checks the
arguments and runs the fit service (:func:`cerebro_db.fitrun.run`) with the AutoML hooks
(:class:`cerebro_db.automl_run.AutoMLFit`), which write decisions, trial statuses and the
procedure's JSON state to the catalog as they happen (``automl_decisions``,
``automl_trials``, ``automl_state``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import fitrun, outputs, params
from ..automl.registry import get_tuner
from ..automl.space import SearchSpace
from ..automl_run import AutoMLFit
from ..catalog import Catalog
from ..catalog import fit_inputs as inputs_sql
from ..configs import discrete_compiles, parse_grid
from ..errors import (
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_OBJECT,
    CerebroError,
    invalid,
)
from ..fitrun import Config, FitRequest, FitRun, PackedTable, ResumePoint
from ..names import TableName
from . import entrypoint, fit_inputs, require_output_schema
from .compat import custom_references, grid_names
from .fit_inputs import check_fit_args, check_item, outputs_absent, packed_table, stored_table
from .models import require_arch_table
from .preprocessing import resolve_seed


def _arch_rows(cat: Catalog, arch: TableName, ids: Sequence[int]
               ) -> dict[int, tuple[str, bytes | None]]:
    rows = inputs_sql.architectures(cat, arch, ids)
    have = {r["model_id"]: (r["a"], None if r["w"] is None else bytes(r["w"])) for r in rows}
    missing = [m for m in ids if m not in have]
    if missing:
        raise CerebroError(f'model_id {missing[0]} in model_id_list does not exist in "{arch}"',
                           UNDEFINED_OBJECT)
    return have


def _selection_absent(cat: Catalog, mst: TableName) -> None:
    """The model selection table (and its _summary) must not exist: the run creates it."""
    for sfx in ("", "_summary"):
        t = mst.with_suffix(sfx, "model_selection_table") if sfx else mst
        if cat.relation_oid(t) is not None:
            raise CerebroError(f'model_selection_table "{t}" already exists', DUPLICATE_TABLE,
                               hint="madlib_keras_automl creates it (holding the best "
                               "configuration); drop it or choose another name.")


def _check_model_ids(model_id_list: Sequence[int] | None) -> list[int]:
    if model_id_list is None:
        raise CerebroError("model_id_list must not be NULL", NULL_VALUE_NOT_ALLOWED)
    ids = list(model_id_list)
    if not ids:
        raise invalid("model_id_list must not be empty")
    if any(m is None for m in ids):
        raise CerebroError("model_id_list must not contain NULL", NULL_VALUE_NOT_ALLOWED)
    if len(set(ids)) != len(ids):
        raise invalid(f"model_id_list has duplicates: {ids}")
    return [int(m) for m in ids]


@entrypoint
def madlib_keras_automl(
        cat: Catalog, *, source_table: str, model_output_table: str, model_arch_table: str,
        model_selection_table: str, model_id_list: Sequence[int] | None,
        compile_params_grid: str | None, fit_params_grid: str | None,
        automl_method: str | None = "hyperband", automl_params: str | None = None,
        random_state: int | None = None, object_table: str | None = None,
        use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, name: str | None = None,
        description: str | None = None, use_caching: bool | None = None) -> None:
    """Run an AutoML procedure over the search space and write the MADlib outputs."""
    check_fit_args(cat, 1, None, use_gpus)
    if metrics_compute_frequency is not None and metrics_compute_frequency < 1:
        raise invalid(f"metrics_compute_frequency must be at least 1, got "
                      f"{metrics_compute_frequency}")
    out = cat.output_table(model_output_table, "model_output_table")
    arch = cat.table(model_arch_table, "model_arch_table")
    mst = cat.output_table(model_selection_table, "model_selection_table")
    ids = _check_model_ids(model_id_list)
    for label, v in (("compile_params_grid", compile_params_grid),
                     ("fit_params_grid", fit_params_grid)):
        if v is None:
            raise CerebroError(f"{label} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    assert compile_params_grid is not None and fit_params_grid is not None  # checked above
    method = (automl_method or "hyperband").strip().lower()
    seed = resolve_seed(random_state)
    src = packed_table(cat, source_table, "source_table")
    val = fit_inputs.validation_table(cat, validation_table, src)
    space = SearchSpace(ids, compile_params_grid, fit_params_grid)
    obj, refs = custom_references(cat, object_table,
                                  grid_names(parse_grid(compile_params_grid, "compile")),
                                  resolve=False)
    for text in discrete_compiles(space.compile_grid):  # every loss, metric, optimizer named
        params.validate_compile_params(params.parse_compile_params(text, "compile_params_grid"),
                                       "compile_params_grid", custom_functions=refs)
    tuner = get_tuner(method, automl_params, model_ids=ids, compile_grid=compile_params_grid,
                      fit_grid=fit_params_grid, num_workers=src.partitions, random_state=seed)
    # a procedure whose trials train a fixed number of epochs (hyperopt, grid, random,
    # mltuner) refuses a frequency above it, as MADlib's hyperopt does ("out of iteration
    # range"); Hyperband's and ASHA's rounds differ in length, and MADlib's Hyperband
    # ignores a frequency a round is shorter than
    epochs = getattr(tuner, "num_iterations", None)
    if metrics_compute_frequency is not None and epochs is not None \
            and metrics_compute_frequency > epochs:
        raise invalid(f"metrics_compute_frequency must be between 1 and num_iterations of "
                      f"automl_params ({epochs}), got {metrics_compute_frequency}")
    outputs_absent(cat, out, ("", "_summary", "_info"), False, can_warm=False)
    _say_if_space_is_short(cat, tuner, space)
    training_metrics = _training_metrics(cat, method, val is not None)
    require_output_schema(cat, mst, "model_selection_table")
    _selection_absent(cat, mst)
    require_arch_table(cat, arch, "model_arch_table")
    archs = _arch_rows(cat, arch, ids)
    rng = np.random.default_rng(seed)
    checks = []
    for m in ids:
        p = space.sample(rng)
        c = Config(0, m, p.compile_params, p.fit_params, archs[m][0], archs[m][1],
                   params.parse_compile_params(p.compile_params),
                   params.parse_fit_params(p.fit_params))
        checks.append(check_item(c))
    req = FitRequest(
        kind="automl", source=src, validation=val, output=out, configs=[], num_iterations=0,
        frequency=metrics_compute_frequency, policy="mop",
        policy_params={"automl_method": method, "automl_params": automl_params,
                       "model_id_list": ids, "use_gpus": bool(use_gpus),
                       "compile_params_grid": compile_params_grid,
                       "fit_params_grid": fit_params_grid},
        random_state=seed, num_workers=src.partitions, use_caching=use_caching,
        mst_table=mst, arch_table=arch, name=name, description=description, checks=checks,
        object_table=str(obj) if obj else None, custom_functions=refs,
        training_metrics=training_metrics)
    run, hooks = _run(cat, req, AutoMLFit(tuner, archs, method, seed), automl_params,
                      bool(use_gpus))
    assert hooks.book is not None and run.outcome is not None
    cat.notice(f"madlib_keras_automl ({method}): fit {run.fit_id} trained "
               f"{len(hooks.book.trials)} configurations ({len(hooks.book.freed())} freed) in "
               f"{run.outcome.seconds:.1f} s; best mst_key {run.written}; results in {out} and "
               f"{out.with_suffix('_info', 'model_output_table')}")


def _training_metrics(cat: Catalog, method: str, validation: bool) -> str:
    """``cerebro_db.training_metrics`` for an AutoML run: ``'running'`` (the training units'
    running means; evaluation units compute the validation metrics only) where the procedure
    decides on validation metrics, i.e. with a validation table and a method other than
    MLtuner (whose convergence test needs the evaluated training loss); otherwise a NOTICE
    says the run evaluates."""
    if fitrun.training_metrics(cat) != "running":
        return "evaluated"
    why = None if validation else "without a validation_table its procedure decides on them"
    if method == "mltuner":
        why = "MLtuner's convergence test compares evaluated training losses"
    if why is None:
        return "running"
    cat.notice(f"madlib_keras_automl: {fitrun.TRAINING_METRICS_SETTING} = 'running' ignored, "
               f"the run evaluates its trials' training metrics after each evaluated epoch: "
               f"{why}")
    return "evaluated"


def _say_if_space_is_short(cat: Catalog, tuner: Any, space: SearchSpace) -> None:
    """A NOTICE when a finite search space has fewer configurations than Hyperband's
    brackets draw: the later brackets get fewer, the last ones none (an outside pass saw a
    2-point grid run bracket 1 with 2 and bracket 0 with none, without a word)."""
    wanted = getattr(tuner, "wanted", None)
    if wanted is None or space.has_distributions:
        return
    have, want = len(space.grid()), wanted()
    if have < want:
        cat.notice(f"madlib_keras_automl: the search space has {have} configurations, fewer "
                   f"than the {want} the Hyperband brackets draw: the brackets drawn last get "
                   "fewer or none")


def _run(cat: Catalog, req: FitRequest, hooks: AutoMLFit, automl_params: str | None,
         use_gpus: bool, resume: ResumePoint | None = None) -> tuple[FitRun, AutoMLFit]:
    """Run (or, with ``resume``, take over and continue) an AutoML fit by the fit service;
    its outputs callback returns the best trial's mst_key (``run.written``)."""
    def write(run: FitRun) -> int:
        assert hooks.book is not None and hooks.sink is not None
        return outputs.write_automl(run, hooks.book, hooks.sink.configs, hooks.method,
                                    automl_params, use_gpus)

    return fitrun.run(cat, request=req, outputs=write, hooks=hooks, resume=resume), hooks


def resume_automl(cat: Catalog, f: Mapping[str, Any], opts: Mapping[str, Any],
                  src: PackedTable, val: PackedTable | None, out: TableName) -> None:
    """``madlib_keras_fit_resume`` of an AutoML fit: the procedure and its trials come back
    from the last saved step, the units committed since are reported to it, and the run
    goes on to the same outputs as the original call would have written."""
    fit_id = int(f["fit_id"])
    pp = dict(opts.get("policy_params") or {})
    if "model_id_list" not in pp:
        raise CerebroError(f"fit {fit_id} was made by an older version and cannot be resumed",
                           FEATURE_NOT_SUPPORTED)
    method, automl_params = str(pp["automl_method"]), pp.get("automl_params")
    mst = stored_table(cat, dict(opts), "mst", f["model_selection_table"],
                       "model_selection_table")
    assert mst is not None
    outputs_absent(cat, out, ("", "_summary", "_info"), False, resume=True)
    _selection_absent(cat, mst)
    arch = stored_table(cat, dict(opts), "arch", opts["arch_table"], "model_arch_table")
    assert arch is not None
    require_arch_table(cat, arch, "model_arch_table")
    ids = [int(m) for m in pp["model_id_list"]]
    archs = _arch_rows(cat, arch, ids)
    seed = int(f["random_state"])
    tuner = get_tuner(method, automl_params, model_ids=ids,
                      compile_grid=pp["compile_params_grid"], fit_grid=pp["fit_params_grid"],
                      num_workers=src.partitions, random_state=seed)
    req = FitRequest(
        kind="automl", source=src, validation=val, output=out, configs=[], num_iterations=0,
        frequency=opts.get("frequency"), policy="mop", policy_params=pp, random_state=seed,
        num_workers=src.partitions, use_caching=opts.get("use_caching"), mst_table=mst,
        arch_table=arch, name=opts.get("name"), description=opts.get("description"),
        object_table=opts.get("object_table"),
        custom_functions=dict(opts.get("custom_functions") or {}),
        training_metrics=opts.get("training_metrics") or "evaluated")
    run, hooks = _run(cat, req, AutoMLFit(tuner, archs, method, seed), automl_params,
                      bool(pp.get("use_gpus")), ResumePoint(fit_id, opts.get("executor_tag")))
    assert hooks.book is not None and run.outcome is not None
    cat.notice(f"madlib_keras_fit_resume: automl fit {fit_id} ({method}) done in "
               f"{run.outcome.seconds:.1f} s ({run.outcome.retried} unit attempts retried), "
               f"{len(hooks.book.trials)} configurations; best mst_key {run.written}; "
               f"results in {out}")


@entrypoint
def hyperband_schedule(cat: Catalog, *, schedule_table: str, r: int | None, eta: int | None = 3,
                       skip_last: int | None = 0) -> None:
    """The Hyperband brackets for (R, eta, skip_last) as a table (s, i, n_i, r_i)."""
    from ..automl.hyperband import hyperband_schedule as schedule

    table = cat.output_table(schedule_table, "schedule_table")
    for label, v in (("r", r), ("eta", eta), ("skip_last", skip_last)):
        if v is None:
            raise CerebroError(f"{label} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    assert r is not None and eta is not None and skip_last is not None  # checked above
    rows = schedule(int(r), int(eta), int(skip_last))
    require_output_schema(cat, table, "schedule_table")
    if cat.relation_oid(table) is not None:
        raise CerebroError(f'schedule_table "{table}" already exists', DUPLICATE_TABLE,
                           hint="Drop it or choose another name.")
    cols = [("s", "integer"), ("i", "integer"), ("n_i", "integer"), ("r_i", "integer")]
    cat.create_table(table, cols)
    cat.insert(table, [c for c, _ in cols], ["int4"] * 4, [list(x) for x in rows])
