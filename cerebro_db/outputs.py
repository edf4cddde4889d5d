"""MADlib's output tables of a fit, written in the caller's transaction once the fit's units
are done (the outputs callback of :func:`cerebro_db.fitrun.run`):

* ``madlib_keras_fit_multiple_model``: ``<out>`` (mst_key, weights, arch), ``<out>_info``
  (one row per configuration: losses and metrics per evaluated iteration) and
  ``<out>_summary``;
* ``madlib_keras_fit``: ``<model>`` and ``<model>_summary`` (with the configuration's
  ``_info`` columns);
* ``madlib_keras_automl``: ``<out>``, ``<out>_info`` (plus the procedure's own columns),
  ``<out>_summary``, and the model selection table holding the best configuration.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from . import __version__
from . import state as state_mod
from .catalog import Catalog
from .catalog import fits as fits_sql
from .catalog import outputs as sql
from .coordinator import ConfigResult, FitOutcome, combine
from .errors import (
    INTERNAL_ERROR,
    CerebroError,
)
from .scheduling import evaluation_epochs

if TYPE_CHECKING:
    from .automl.base import Tuner
    from .automl.trials import TrialBook
    from .fitrun import Config, FitRequest, FitRun

INFO_COLUMNS = [
    ("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"), ("compile_params", "text"),
    ("fit_params", "text"), ("model_type", "text"), ("model_size", "double precision"),
    ("metrics_elapsed_time", "double precision[]"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "double precision"),
    ("training_loss_final", "double precision"), ("training_metrics", "double precision[]"),
    ("training_loss", "double precision[]"), ("validation_metrics_final", "double precision"),
    ("validation_loss_final", "double precision"), ("validation_metrics", "double precision[]"),
    ("validation_loss", "double precision[]"), ("metrics_iters", "integer[]"),
    ("training_metrics_all", "double precision[]"), ("validation_metrics_all",
                                                    "double precision[]"),
    ("fit_id", "bigint"),
]
INFO_TYPES = ["int4", "int4", "text", "text", "text", "float8", "float8[]", "text[]", "text",
              "float8", "float8", "float8[]", "float8[]", "float8", "float8", "float8[]",
              "float8[]", "int4[]", "float8[]", "float8[]", "int8"]
SQL_TYPES = {"integer": "int4", "double precision": "float8", "text": "text",
             "jsonb": "jsonb", "integer[]": "int4[]", "double precision[]": "float8[]"}
"""Parameter types of the AutoML procedures' own ``_info`` columns."""
MODEL_COLUMNS = [("mst_key", "integer PRIMARY KEY"), ("model_weights", "bytea"),
                 ("model_arch", "json")]


def final_weights(cat: Catalog, fit_id: int, mst_key: int) -> bytes:
    """A configuration's final weights as MADlib stores them (float32, concatenated)."""
    from .worker import load_state

    data = load_state(cat, fit_id, mst_key, "current")
    if data is None:
        raise CerebroError(f"no final state for mst_key {mst_key}", INTERNAL_ERROR)
    return state_mod.flat_weights(data)


def _model_rows(cat: Catalog, fit_id: int, models: Iterable[tuple[int, str]],
                sizes: dict[int, int]) -> Iterator[list[Any]]:
    """``<out>`` rows (mst_key, weights, arch), one model's weights read at a time, as the
    rows are inserted: a fit's outputs hold one model's state and weights, not every
    model's weights at once (8 configurations of a 74 M-parameter model held 2.4 GB).
    Records each model's weight bytes in ``sizes`` (the ``_info`` table's ``model_size``)."""
    for key, arch in models:
        w = final_weights(cat, fit_id, key)
        sizes[key] = len(w)
        row: list[Any] = [key, w, arch]
        del w
        yield row
        row.clear()  # the inserting loop still holds the list while it asks for the next


def series(r: ConfigResult, epochs: list[int], kind: str
           ) -> tuple[list[float], list[list[float]]]:
    """Loss and metrics per epoch of one kind of evaluation (NaN and [] where missing)."""
    losses: list[float] = []
    metrics: list[list[float]] = []
    for e in epochs:
        parts = r.evals.get((e, kind))
        if not parts:
            losses.append(float("nan"))
            metrics.append([])
            continue
        loss, m = combine(parts)
        losses.append(loss)
        metrics.append(m)
    return losses, metrics


def first(ms: list[list[float]]) -> list[float | None]:
    return [m[0] if m else None for m in ms]


def info_row(c: Config, r: ConfigResult, epochs: list[int], size: int, fit_id: int,
             validation: bool, metrics_when_none: bool) -> list[Any]:
    """One ``_info`` row (:data:`INFO_COLUMNS`). ``metrics_when_none``: without metrics in
    compile_params the metric columns are NULL (MADlib), not '{}'."""
    tl, tm = series(r, epochs, "eval_train")
    vl, vm = series(r, epochs, "eval_valid") if validation else ([], [])
    loss = c.cp.loss if isinstance(c.cp.loss, str) else json.dumps(c.cp.loss)
    has = bool(c.cp.metrics) or metrics_when_none
    return [
        c.mst_key, c.model_id, c.compile_params, c.fit_params, "madlib_keras",
        size / 1024.0, [r.trained_at.get(e) for e in epochs],
        c.cp.metric_names() if has else None, loss,
        tm[-1][0] if tm and tm[-1] else None, tl[-1] if tl else None,
        first(tm) if has else None, tl,
        (vm[-1][0] if vm and vm[-1] else None) if validation else None,
        vl[-1] if vl else None, first(vm) if validation and has else None,
        vl if validation else None, epochs,
        tm if tm and all(tm) and tm[0] else None,
        vm if validation and vm and all(vm) and vm[0] else None, fit_id,
    ]


def info_rows(req: FitRequest, fit_id: int, outcome: FitOutcome,
              sizes: Mapping[int, int]) -> list[list[Any]]:
    epochs = sorted(evaluation_epochs(req.num_iterations, req.frequency))
    return [info_row(c, outcome.results[c.mst_key], epochs, sizes[c.mst_key], fit_id,
                     req.validation is not None, False) for c in req.configs]


def _summary_values(run: FitRun, info: str | None) -> dict[str, Any]:
    req = run.request
    return {"source_table": str(req.source.table),
            "validation_table": str(req.validation.table) if req.validation else None,
            "model": str(req.output), "model_info": info,
            "model_arch_table": str(req.arch_table),
            "model_selection_table": str(req.mst_table) if req.mst_table else None,
            "object_table": req.object_table, "num_iterations": req.num_iterations,
            # MADlib's summary holds the frequency used: num_iterations when not given
            "metrics_compute_frequency": req.frequency or req.num_iterations,
            "warm_start": req.warm_start,
            "name": req.name, "description": req.description, "start_training_time": run.t0,
            "madlib_version": __version__,
            "metrics_iters": sorted(evaluation_epochs(req.num_iterations, req.frequency)),
            "fit_id": run.fit_id, "scheduling_policy": req.policy}


def _source_summary(cat: Catalog, req: FitRequest) -> str:
    from .entrypoints.preprocessing import summary_source_sql

    return summary_source_sql(cat, req.source.table, req.source.summary)


def write_fit_multiple(run: FitRun) -> None:
    """``madlib_keras_fit_multiple_model``'s outputs."""
    cat, req = run.cat, run.request
    out = req.output
    info = out.with_suffix("_info", "model_output_table")
    summ = out.with_suffix("_summary", "model_output_table")
    cat.create_table(out, MODEL_COLUMNS, external_storage=["model_weights"])
    sizes: dict[int, int] = {}
    cat.insert(out, [n for n, _ in MODEL_COLUMNS], ["int4", "bytea", "json"],
               _model_rows(cat, run.fit_id, ((c.mst_key, c.arch) for c in req.configs), sizes))
    cat.create_table(info, INFO_COLUMNS)
    assert run.outcome is not None
    cat.insert(info, [n for n, _ in INFO_COLUMNS], INFO_TYPES,
               info_rows(req, run.fit_id, run.outcome, sizes))
    sql.create_fit_summary(cat, summ, _source_summary(cat, req),
                           req.source.summary["dependent_varname"],
                           _summary_values(run, str(info)))


def write_fit(run: FitRun) -> None:
    """``madlib_keras_fit``'s outputs: ``<model>`` (weights, arch) and ``<model>_summary``
    with the summary columns plus the configuration and its metrics."""
    cat, req = run.cat, run.request
    c = req.configs[0]
    w = final_weights(cat, run.fit_id, c.mst_key)
    out = req.output
    summ = out.with_suffix("_summary", "model")
    cat.create_table(out, MODEL_COLUMNS[1:], external_storage=["model_weights"])
    cat.insert(out, ["model_weights", "model_arch"], ["bytea", "json"], [[w, c.arch]])
    sql.create_fit_summary(cat, summ, _source_summary(cat, req),
                           req.source.summary["dependent_varname"], _summary_values(run, None))
    assert run.outcome is not None
    info = info_rows(req, run.fit_id, run.outcome, {c.mst_key: len(w)})[0]
    extra = INFO_COLUMNS[1:17]  # model_id .. validation_loss
    sql.add_summary_columns(cat, summ, extra, INFO_TYPES[1:17], info[1:17])


def _automl_info_rows(book: TrialBook, tuner: Tuner, configs: Mapping[int, Config],
                      outcome: FitOutcome, sizes: Mapping[int, int], fit_id: int,
                      validation: bool, num_partitions: int, evaluated: str
                      ) -> list[list[Any]]:
    """``evaluated``: the kind whose complete epochs are the evaluated ones ('eval_train';
    'eval_valid' when the training metrics are the running ones, logged every epoch)."""
    rows = []
    for k in book.outputs():
        r = outcome.results.get(k, ConfigResult())
        epochs = sorted(e for (e, kind), parts in r.evals.items()
                        if kind == evaluated and len(parts) == num_partitions)
        info = tuner.info(k)
        rows.append(info_row(configs[k], r, epochs, sizes[k], fit_id, validation, True)
                    + [info.get(name) for name, _ in tuner.info_columns()])
    return rows


def _most_epochs(run: FitRun) -> int | None:
    """The most epochs a trial of an AutoML run trained: its ``_summary``'s
    ``metrics_compute_frequency`` when the call left it out (MADlib's value there: R for
    Hyperband, num_iterations for Hyperopt)."""
    assert run.outcome is not None
    return max((e for r in run.outcome.results.values() for (e, kind) in r.evals
                if kind == _evaluated_kind(run.request)), default=None)


def _evaluated_kind(req: FitRequest) -> str:
    """The evaluation kind an AutoML run computes at every evaluated epoch (the training
    metrics' when evaluated, else the validation's)."""
    return "eval_valid" if req.running_metrics else "eval_train"


def _defaults_of(tuner: Tuner) -> str:
    """The procedure's parameters as MADlib's ``_summary`` records them for a call that gave
    none (``'R=6, eta=3, skip_last=0'``), not NULL (an outside pass)."""
    return ", ".join(f"{k}={v}" for k, v in type(tuner).defaults.items())


def write_automl(run: FitRun, book: TrialBook, configs: Mapping[int, Config], method: str,
                 automl_params: str | None, use_gpus: bool) -> int:
    """``madlib_keras_automl``'s outputs; returns the best trial's mst_key."""
    cat, req = run.cat, run.request
    tuner = book.tuner
    out = req.output
    info = out.with_suffix("_info", "model_output_table")
    summ = out.with_suffix("_summary", "model_output_table")
    cat.create_table(out, MODEL_COLUMNS, external_storage=["model_weights"])
    sizes: dict[int, int] = {}
    cat.insert(out, [n for n, _ in MODEL_COLUMNS], ["int4", "bytea", "json"],
               _model_rows(cat, run.fit_id, ((k, configs[k].arch) for k in book.outputs()),
                           sizes))
    extra = tuner.info_columns()
    cat.create_table(info, INFO_COLUMNS + extra)
    assert run.outcome is not None
    cat.insert(info, [n for n, _ in INFO_COLUMNS + extra],
               INFO_TYPES + [SQL_TYPES.get(t, "text") for _, t in extra],
               _automl_info_rows(book, tuner, configs, run.outcome,
                                 sizes, run.fit_id,
                                 req.validation is not None, req.source.partitions,
                                 _evaluated_kind(req)))
    best = configs[book.ranking()[0]]
    mst = req.mst_table
    assert mst is not None
    # MADlib's AutoML summary columns exactly; our own facts (fit_id, best_mst_key,
    # num_trials) are in the catalog (cerebro_db.fits.options) and fit_id in <out>_info
    sql.create_automl_summary(cat, summ, _source_summary(cat, req),
                              req.source.summary["dependent_varname"], {
                                  "source_table": str(req.source.table),
                                  "validation_table":
                                      str(req.validation.table) if req.validation else None,
                                  "model": str(out), "model_info": str(info),
                                  "model_arch_table": str(req.arch_table),
                                  "model_selection_table": str(mst), "automl_method": method,
                                  "automl_params": automl_params
                                  if (automl_params or "").strip() else _defaults_of(tuner),
                                  "random_state": str(req.random_state),
                                  "object_table": req.object_table, "use_gpus": use_gpus,
                                  "metrics_compute_frequency":
                                      req.frequency or _most_epochs(run),
                                  "name": req.name, "description": req.description,
                                  "start_training_time": run.t0,
                                  "madlib_version": __version__})
    run.ex.control(fits_sql.add_options(cat, run.fit_id, {"best_mst_key": int(best.mst_key),
                                                          "num_trials": len(book.trials)}))
    # MADlib leaves the model selection table holding the best configuration
    cat.create_table(mst, [("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"),
                           ("compile_params", "varchar"), ("fit_params", "varchar")])
    cat.insert(mst, ["mst_key", "model_id", "compile_params", "fit_params"],
               ["int4", "int4", "text", "text"],
               [[best.mst_key, best.model_id, best.compile_params, best.fit_params]])
    mst_summary = mst.with_suffix("_summary", "model_selection_table")
    cat.create_table(mst_summary, [("model_arch_table", "varchar"), ("object_table", "varchar")])
    cat.insert(mst_summary, ["model_arch_table", "object_table"], ["text", "text"],
               [[str(req.arch_table), req.object_table]])
    return best.mst_key
