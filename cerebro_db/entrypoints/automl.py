"""``madlib_keras_automl`` and ``hyperband_schedule``: AutoML on model hopper parallelism.

A run is a fit (catalog kind ``'automl'``) whose trials a tuning procedure
(:mod:`cerebro_db.automl`) launches, extends, stops and frees while the worker sessions
train: the procedure's decisions go through :class:`cerebro_db.automl.trials.TrialBook`
into the same MOP loop as ``madlib_keras_fit_multiple_model`` (no barrier unless the
procedure waits for results, as a Hyperband round does). Decisions, trial statuses and the
procedure's JSON state are written to the catalog as they happen (``automl_decisions``,
``automl_trials``, ``automl_state``).
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import __version__, params
from ..automl.base import TrialSpec, Tuner
from ..automl.engine import AutoMLHooks, run_automl
from ..automl.registry import get_tuner
from ..automl.space import SearchSpace
from ..automl.trials import EvalEpochs, TrialBook, state_for_jsonb, state_from_jsonb
from ..catalog import Catalog
from ..configs import parse_grid
from ..coordinator import ConfigResult, FitOutcome
from ..errors import (
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_OBJECT,
    CerebroError,
    invalid,
)
from ..executors import DblinkExecutor
from ..names import TableName
from ..remote.executor import RemoteExecutor, executor_url
from ..scheduling import Progress
from . import entrypoint, require_output_schema
from .compat import custom_references, grid_names
from .models import require_arch_table
from .preprocessing import resolve_seed, summary_source_sql
from .training import (
    INFO_COLUMNS,
    INFO_TYPES,
    Config,
    FitRequest,
    PackedTable,
    ResumePoint,
    _cache_memory,
    _check_common,
    _conninfo,
    _fault_settings,
    _first,
    _from_log,
    _mark_interrupted,
    _outputs_absent,
    _register,
    _series,
    _UnitExecutor,
    _validation,
    check_item,
    check_spec,
    check_worker_limits,
    final_weights,
    idle_timeout,
    mark_done,
    mark_failed,
    packed_table,
    refuse_uncommitted,
    state_chunk_size,
    stored_configs,
    stored_table,
    take_over,
    worker_checks,
)

SQL_TYPES = {"integer": "int4", "double precision": "float8", "text": "text",
             "jsonb": "jsonb", "integer[]": "int4[]", "double precision[]": "float8[]"}


class _CatalogSink:
    """The AutoML engine's side effects, through the fit's control session."""

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int,
                 archs: Mapping[int, tuple[str, bytes | None]]) -> None:
        self.cat, self.ex, self.fit_id, self.archs = cat, ex, fit_id, archs
        self.configs: dict[int, Config] = {}

    def launch(self, spec: TrialSpec, target: int) -> None:
        lit, ext = self.cat.literal, self.cat.ext
        arch, weights = self.archs[spec.model_id]
        where = f"trial {spec.trial_id}"
        self.configs[spec.trial_id] = Config(
            spec.trial_id, spec.model_id, spec.compile_params, spec.fit_params, arch, weights,
            params.parse_compile_params(spec.compile_params, where),
            params.parse_fit_params(spec.fit_params, where))
        w = "NULL" if weights is None else "'\\x" + bytes(weights).hex() + "'::bytea"
        self.ex.control(
            f"INSERT INTO {ext('fit_configs')} (fit_id, mst_key, model_id, compile_params, "
            f"fit_params, model_arch, init_weights) VALUES ({self.fit_id}, {spec.trial_id}, "
            f"{spec.model_id}, {lit(spec.compile_params)}, {lit(spec.fit_params)}, "
            f"{lit(arch)}::json, {w})")
        if spec.parent is not None:
            self.ex.control(
                f"INSERT INTO {ext('model_states')} (fit_id, mst_key, version, chunk, data) "
                f"SELECT fit_id, {spec.trial_id}, version, chunk, data FROM "
                f"{ext('model_states')} WHERE fit_id = {self.fit_id} AND mst_key = "
                f"{int(spec.parent)} AND version = 'current'")
        self.ex.control(
            f"INSERT INTO {ext('automl_trials')} (fit_id, mst_key, parent, tunables, meta, "
            f"target) VALUES ({self.fit_id}, {spec.trial_id}, "
            f"{'NULL' if spec.parent is None else int(spec.parent)}, "
            f"{lit(json.dumps(dict(spec.tunables)))}::jsonb, "
            f"{lit(json.dumps(dict(spec.meta)))}::jsonb, {int(target)})")

    def record(self, seq: int, kind: str, trial_id: int, target: int | None,
               reason: str | None, meta: Mapping[str, Any], now: float) -> None:
        lit = self.cat.literal
        self.ex.control(
            f"INSERT INTO {self.cat.ext('automl_decisions')} (fit_id, seq, decision, mst_key, "
            f"target, reason, meta, at_seconds) VALUES ({self.fit_id}, {int(seq)}, "
            f"{lit(kind)}, {int(trial_id)}, {'NULL' if target is None else int(target)}, "
            f"{'NULL' if reason is None else lit(reason)}, "
            f"{lit(json.dumps(dict(meta), default=str))}::jsonb, {float(now)})")


class _Hooks(AutoMLHooks):
    """The engine's hooks, keeping the catalog current after every step."""

    def __init__(self, book: TrialBook, sink: _CatalogSink, method: str,
                 eval_kinds: Sequence[str], notice: Any) -> None:
        super().__init__(book, method, eval_kinds, notice)
        self.sink = sink
        self.saved: tuple[Any, ...] | None = None
        self.saved_state: tuple[str, str] | None = None

    def persist(self) -> None:
        """Trial statuses (when changed), the run's total units, the procedure's state and
        the book's, in one transaction: a resumed run starts from exactly this point."""
        book = self.book
        paused, training = book.paused(), book.training()
        rows = []
        for c, t in sorted(book.trials.items()):
            status = "freed" if t.freed else "stopped" if t.stopped else \
                "paused" if c in paused else "training" if c in training else "paused"
            rows.append((c, status, book.progress.targets[c], t.last_epoch, t.score,
                         json.dumps(t.meta or {}, sort_keys=True, default=str)))
        cat, fit_id = self.sink.cat, self.sink.fit_id
        lit = cat.literal
        stmts = []
        key = (book.seq, tuple(rows))
        if key != self.saved and rows:
            values = ", ".join(
                f"({c}, {lit(s)}, {t}, {'NULL' if e is None else e}, "
                f"{'NULL' if sc is None else _float_sql(sc)}, {lit(m)}::jsonb)"
                for c, s, t, e, sc, m in rows)
            stmts.append(
                f"UPDATE {cat.ext('automl_trials')} a SET status = v.s, target = v.t::int, "
                "last_epoch = v.e::int, score = v.sc::float8, meta = v.m, "
                "updated_at = clock_timestamp() "
                f"FROM (VALUES {values}) v(k, s, t, e, sc, m) "
                f"WHERE a.fit_id = {fit_id} AND a.mst_key = v.k")
        state = state_for_jsonb(book.tuner.state_json())
        kept = json.dumps(book.to_json(), sort_keys=True, separators=(",", ":"))
        if not stmts and (state, kept) == self.saved_state:
            return  # nothing happened since the last step
        stmts.append(f"UPDATE {cat.ext('fits')} SET total_units = {book.total_units()} "
                     f"WHERE fit_id = {fit_id}")
        stmts.append(
            f"INSERT INTO {cat.ext('automl_state')} (fit_id, method, state, book) VALUES "
            f"({fit_id}, {lit(self.method)}, {lit(state)}::jsonb, {lit(kept)}::jsonb) "
            "ON CONFLICT (fit_id) DO UPDATE SET state = excluded.state, book = excluded.book, "
            "updated_at = clock_timestamp()")
        # several statements in one command run as one transaction
        self.sink.ex.control("; ".join(stmts))
        self.saved, self.saved_state = key, (state, kept)


def _float_sql(v: float) -> str:
    if math.isnan(v):
        return "'NaN'::float8"
    if math.isinf(v):
        return "'Infinity'::float8" if v > 0 else "'-Infinity'::float8"
    return repr(float(v))


def _arch_rows(cat: Catalog, arch: TableName, ids: Sequence[int]
               ) -> dict[int, tuple[str, bytes | None]]:
    rows = cat.query(f"SELECT model_id, model_arch::text AS a, model_weights AS w FROM "
                     f"{arch.sql} WHERE model_id = ANY($1)", [list(ids)], ["int4[]"])
    have = {r["model_id"]: (r["a"], None if r["w"] is None else bytes(r["w"])) for r in rows}
    missing = [m for m in ids if m not in have]
    if missing:
        raise CerebroError(f'model_id {missing[0]} in model_id_list does not exist in "{arch}"',
                           UNDEFINED_OBJECT)
    return have


def _epochs_of(r: ConfigResult, num_partitions: int) -> list[int]:
    return sorted(e for (e, k), parts in r.evals.items()
                  if k == "eval_train" and len(parts) == num_partitions)


def _info_rows(book: TrialBook, tuner: Tuner, configs: Mapping[int, Config],
               outcome: FitOutcome, sizes: Mapping[int, int], fit_id: int, validation: bool,
               num_partitions: int) -> list[list[Any]]:
    rows = []
    for k in book.outputs():
        c = configs[k]
        r = outcome.results.get(k, ConfigResult())
        epochs = _epochs_of(r, num_partitions)
        tl, tm = _series(r, epochs, "eval_train")
        vl, vm = _series(r, epochs, "eval_valid") if validation else ([], [])
        loss = c.cp.loss if isinstance(c.cp.loss, str) else json.dumps(c.cp.loss)
        info = tuner.info(k)
        rows.append([
            c.mst_key, c.model_id, c.compile_params, c.fit_params, "madlib_keras",
            sizes[k] / 1024.0, [r.eval_done_at.get(e) for e in epochs], c.cp.metric_names(),
            loss, tm[-1][0] if tm and tm[-1] else None, tl[-1] if tl else None, _first(tm), tl,
            (vm[-1][0] if vm and vm[-1] else None) if validation else None,
            vl[-1] if vl else None, _first(vm) if validation else None,
            vl if validation else None, epochs,
            tm if tm and all(tm) else None,
            vm if validation and vm and all(vm) else None, fit_id,
        ] + [info.get(name) for name, _ in tuner.info_columns()])
    return rows


def _write_outputs(cat: Catalog, req: FitRequest, book: TrialBook, sink: _CatalogSink,
                   fit_id: int, outcome: FitOutcome, t0: float, mst: TableName, method: str,
                   automl_params: str | None, random_state: int, use_gpus: bool,
                   name: str | None, description: str | None) -> int:
    tuner = book.tuner
    weights = {k: final_weights(cat, fit_id, k) for k in book.outputs()}
    sizes = {k: len(w) for k, w in weights.items()}
    out = req.output
    info = out.with_suffix("_info", "model_output_table")
    summ = out.with_suffix("_summary", "model_output_table")
    cat.create_table(out, [("mst_key", "integer PRIMARY KEY"), ("model_weights", "bytea"),
                           ("model_arch", "json")], external_storage=["model_weights"])
    cat.insert(out, ["mst_key", "model_weights", "model_arch"], ["int4", "bytea", "json"],
               ([k, weights[k], sink.configs[k].arch] for k in book.outputs()))
    extra = tuner.info_columns()
    cat.create_table(info, INFO_COLUMNS + extra)
    cat.insert(info, [n for n, _ in INFO_COLUMNS + extra],
               INFO_TYPES + [SQL_TYPES.get(t, "text") for _, t in extra],
               _info_rows(book, tuner, sink.configs, outcome, sizes, fit_id,
                          req.validation is not None, req.source.partitions))
    ranking = book.ranking()
    best = sink.configs[ranking[0]]
    src_summary = summary_source_sql(cat, req.source.table, req.source.summary)
    cv = ", s.".join('"' + (d + "_class_values").replace('"', '""') + '"'
                     for d in req.source.summary["dependent_varname"])
    # MADlib's AutoML summary columns exactly; our own facts (fit_id, best_mst_key,
    # num_trials) are in the catalog (cerebro_db.fits.options) and fit_id in <out>_info
    cat.query(
        f"CREATE TABLE {summ.sql} AS SELECT $1::text AS source_table, "
        "$2::text AS validation_table, $3::text AS model, $4::text AS model_info, "
        "s.dependent_varname, s.independent_varname, $5::text AS model_arch_table, "
        "$6::text AS model_selection_table, $7::text AS automl_method, "
        "$8::text AS automl_params, $9::text AS random_state, $16::text AS object_table, "
        "$10::boolean AS use_gpus, $11::int AS metrics_compute_frequency, $12::text AS name, "
        "$13::text AS description, to_timestamp($14)::timestamp AS start_training_time, "
        "clock_timestamp()::timestamp AS end_training_time, $15::text AS madlib_version, "
        f"s.num_classes, s.{cv}, s.dependent_vartype, s.normalizing_const "
        f"FROM {src_summary} s",
        [str(req.source.table), str(req.validation.table) if req.validation else None,
         str(out), str(info), str(req.arch_table), str(mst), method,
         automl_params, str(random_state), use_gpus, req.frequency, name, description, t0,
         __version__, req.object_table],
        ["text", "text", "text", "text", "text", "text", "text", "text", "text", "bool",
         "int4", "text", "text", "float8", "text", "text"])
    sink.ex.control(f"UPDATE {cat.ext('fits')} SET options = options || "
                    f"jsonb_build_object('best_mst_key', {int(best.mst_key)}, 'num_trials', "
                    f"{len(book.trials)}) WHERE fit_id = {int(fit_id)}")
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


def _selection_absent(cat: Catalog, mst: TableName) -> None:
    """The model selection table (and its _summary) must not exist: the run creates it."""
    for sfx in ("", "_summary"):
        t = mst.with_suffix(sfx, "model_selection_table") if sfx else mst
        if cat.relation_oid(t) is not None:
            raise CerebroError(f'model_selection_table "{t}" already exists', "42P07",
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
    _check_common(1, None, use_gpus)
    _cache_memory(cat, 1)
    if metrics_compute_frequency is not None and metrics_compute_frequency < 1:
        raise invalid(f"metrics_compute_frequency must be at least 1, got "
                      f"{metrics_compute_frequency}")
    out = cat.table(model_output_table, "model_output_table")
    arch = cat.table(model_arch_table, "model_arch_table")
    mst = cat.table(model_selection_table, "model_selection_table")
    ids = _check_model_ids(model_id_list)
    for label, v in (("compile_params_grid", compile_params_grid),
                     ("fit_params_grid", fit_params_grid)):
        if v is None:
            raise CerebroError(f"{label} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    method = (automl_method or "hyperband").strip().lower()
    seed = resolve_seed(random_state)
    src = packed_table(cat, source_table, "source_table")
    val = _validation(cat, validation_table, src)
    space = SearchSpace(ids, compile_params_grid, fit_params_grid)
    obj, refs = custom_references(cat, object_table,
                                  grid_names(parse_grid(compile_params_grid, "compile")),
                                  resolve=False)
    tuner = get_tuner(method, automl_params, model_ids=ids, compile_grid=compile_params_grid,
                      fit_grid=fit_params_grid, num_workers=src.partitions, random_state=seed)
    _outputs_absent(cat, out, ("", "_summary", "_info"), False)
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
    req = FitRequest("automl", src, val, out, [], 0, metrics_compute_frequency, "mop",
                     {"automl_method": method, "automl_params": automl_params,
                      "model_id_list": ids, "use_gpus": bool(use_gpus),
                      "compile_params_grid": compile_params_grid,
                      "fit_params_grid": fit_params_grid}, seed,
                     src.partitions, use_caching, mst, arch, False, name, description,
                     checks=checks, object_table=str(obj) if obj else None,
                     custom_functions=refs)
    fit_id, best, outcome, book = _execute(cat, req, tuner, archs, method, automl_params, seed,
                                           bool(use_gpus), name, description, mst)
    cat.notice(f"madlib_keras_automl ({method}): fit {fit_id} trained {len(book.trials)} "
               f"configurations ({len(book.freed())} freed) in {outcome.seconds:.1f} s; best "
               f"mst_key {best}; results in {out} and "
               f"{out.with_suffix('_info', 'model_output_table')}")


def _execute(cat: Catalog, req: FitRequest, tuner: Tuner,
             archs: Mapping[int, tuple[str, bytes | None]], method: str,
             automl_params: str | None, seed: int, use_gpus: bool, name: str | None,
             description: str | None, mst: TableName, resume: ResumePoint | None = None
             ) -> tuple[int, int, FitOutcome, TrialBook]:
    """Run (or, with ``resume``, take over and continue) an AutoML fit and write its
    outputs; the fit is marked done after that, failed with the message on any error."""
    p = req.source.partitions
    workers = {w: {w} for w in range(p)}
    retries, timeout, forward = _fault_settings(cat)
    check_worker_limits(cat, p, resume.fit_id if resume else None)
    state_chunk_size(cat)
    tag = f"{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    remote = executor_url(cat)
    ex = RemoteExecutor(cat, tag, p, _conninfo(cat), remote, unit_timeout=timeout) if remote \
        else DblinkExecutor(cat, tag, p, _conninfo(cat), unit_timeout=timeout)
    ex.keep_idle = idle_timeout(cat)
    t0 = time.time()
    fit_id = None
    ended = False
    try:
        ex.open(forward)
        refuse_uncommitted(cat, ex, [req.source, req.validation])
        worker_checks(ex, check_spec(req.source, req.checks or [], p,
                                     custom_functions=req.custom_functions))
        _mark_interrupted(cat, ex)
        eval_kinds = ["eval_train"] + (["eval_valid"] if req.validation else [])
        results, done, spent = None, 0, 0.0
        if resume is None:
            fit_id = _register(cat, ex, req, 0)
        else:
            fit_id, t0 = take_over(cat, ex, resume)
        sink = _CatalogSink(cat, ex, fit_id, archs)
        book = TrialBook(tuner, sink, p, workers, req.frequency)
        hooks = _Hooks(book, sink, method, eval_kinds, cat.notice)
        saved = _saved_state(cat, fit_id) if resume is not None else None
        if saved is None:
            if resume is not None:  # stopped before its first step was saved: start over
                _forget_trials(cat, ex, fit_id, set(), 0)
            book.start(0.0)
            cat.notice(f"fit {fit_id}: madlib_keras_automl ({method}) "
                       f"{'starts over' if resume else 'starts'} on {p} partitions, {p} worker "
                       f"sessions; watch: SELECT * FROM {cat.schema}.automl_trials "
                       f"WHERE fit_id = {fit_id}")
        else:
            results, done, spent, replayed = _restore(cat, ex, book, hooks, sink, fit_id,
                                                      saved, workers, eval_kinds)
            cat.notice(f"fit {fit_id}: madlib_keras_automl ({method}) resumes with "
                       f"{len(book.trials)} trials launched and {done} training units done "
                       f"({replayed} of them reported to the procedure only now); watch: "
                       f"SELECT * FROM {cat.schema}.automl_trials WHERE fit_id = {fit_id}")
        outcome = run_automl(hooks, _UnitExecutor(cat, ex, fit_id), random_state=seed,
                             notice=cat.notice, max_unit_retries=retries, results=results,
                             done_units=done, elapsed_before=spent)
        hooks.persist()
        best = _write_outputs(cat, req, book, sink, fit_id, outcome, t0, mst, method,
                              automl_params, seed, use_gpus, name, description)
        mark_done(cat, ex, fit_id)
        freed = ", ".join(str(k) for k in book.freed())
        ex.control(f"DELETE FROM {cat.ext('model_states')} WHERE fit_id = {fit_id} AND "
                   f"(version <> 'current'{f' OR mst_key IN ({freed})' if freed else ''})")
        ended = True
        return fit_id, best, outcome, book
    except BaseException as e:
        if fit_id is not None:
            mark_failed(cat, ex, fit_id, e)
        raise
    finally:
        ex.close(keep=ended)


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
    mst = stored_table(cat, opts, "mst", f["model_selection_table"], "model_selection_table")
    _outputs_absent(cat, out, ("", "_summary", "_info"), False)
    _selection_absent(cat, mst)
    arch = stored_table(cat, opts, "arch", opts["arch_table"], "model_arch_table")
    require_arch_table(cat, arch, "model_arch_table")
    ids = [int(m) for m in pp["model_id_list"]]
    archs = _arch_rows(cat, arch, ids)
    seed = int(f["random_state"])
    tuner = get_tuner(method, automl_params, model_ids=ids,
                      compile_grid=pp["compile_params_grid"], fit_grid=pp["fit_params_grid"],
                      num_workers=src.partitions, random_state=seed)
    req = FitRequest("automl", src, val, out, [], 0, opts.get("frequency"), "mop", pp, seed,
                     src.partitions, opts.get("use_caching"), mst, arch, False,
                     opts.get("name"), opts.get("description"),
                     object_table=opts.get("object_table"),
                     custom_functions=dict(opts.get("custom_functions") or {}))
    _, best, outcome, book = _execute(cat, req, tuner, archs, method, automl_params, seed,
                                      bool(pp.get("use_gpus")), req.name, req.description, mst,
                                      ResumePoint(fit_id, opts.get("executor_tag")))
    cat.notice(f"madlib_keras_fit_resume: automl fit {fit_id} ({method}) done in "
               f"{outcome.seconds:.1f} s ({outcome.retried} unit attempts retried), "
               f"{len(book.trials)} configurations; best mst_key {best}; results in {out}")


def _saved_state(cat: Catalog, fit_id: int) -> tuple[str, dict[str, Any]] | None:
    """The procedure's state and the book's, as the last step saved them."""
    rows = cat.query(f"SELECT state::text AS state, book::text AS book FROM "
                     f"{cat.ext('automl_state')} WHERE fit_id = $1", [fit_id], ["int8"])
    if not rows or rows[0]["book"] is None:
        return None
    return state_from_jsonb(rows[0]["state"]), json.loads(rows[0]["book"])


def _forget_trials(cat: Catalog, ex: DblinkExecutor, fit_id: int, known: set[int],
                   seq: int) -> None:
    """Remove what decisions made after the last saved step left in the catalog (trials
    registered, forked states copied, decisions logged): the resumed run makes them again.
    No unit of such a trial can exist (units are assigned only after a saved step)."""
    keep = f"mst_key NOT IN ({', '.join(str(k) for k in sorted(known))})" if known else "TRUE"
    for table in ("model_states", "automl_trials", "fit_configs"):
        ex.control(f"DELETE FROM {cat.ext(table)} WHERE fit_id = {fit_id} AND {keep}")
    ex.control(f"DELETE FROM {cat.ext('automl_decisions')} WHERE fit_id = {fit_id} AND "
               f"seq > {int(seq)}")


def _restore(cat: Catalog, ex: DblinkExecutor, book: TrialBook, hooks: _Hooks,
             sink: _CatalogSink, fit_id: int, saved: tuple[str, dict[str, Any]],
             workers: dict[int, set[int]], eval_kinds: Sequence[str]
             ) -> tuple[dict[int, ConfigResult], int, float, int]:
    """Bring ``book`` (and its tuner) back to the last saved step, rebuild the scheduling
    progress and results from the unit log, then report to the procedure, in commit order,
    the units committed after that step (the procedure decides on them as it would have).
    Returns results, training units done, seconds spent, units reported now."""
    state, kept = saved
    book.tuner = Tuner.from_state_json(state)
    targets = book.restore(kept)
    _forget_trials(cat, ex, fit_id, set(targets), book.seq)
    sink.configs.update((c.mst_key, c) for c in stored_configs(cat, fit_id))
    missing = sorted(set(targets) - set(sink.configs))
    if missing:
        raise CerebroError(f"fit {fit_id} cannot be resumed: trial {missing[0]} has no "
                           "configuration row", "XX000")
    p = book.progress.num_partitions
    rows = cat.query(
        f"SELECT u.mst_key, u.epoch, u.partition, u.kind, u.loss, u.rows, u.seconds_run, "
        f"extract(epoch FROM u.ended_at - f.started_at)::float8 AS at "
        f"FROM {cat.ext('units')} u JOIN {cat.ext('fits')} f USING (fit_id) "
        "WHERE u.fit_id = $1 ORDER BY u.unit_id", [fit_id], ["int8"])
    # evaluation epochs: those the current targets call for, and those already in the log
    book.progress = Progress(targets, p, workers)
    wanted = EvalEpochs(book)
    logged: dict[int, set[int]] = {c: set() for c in targets}
    for r in rows:
        if r["kind"] != "train":
            logged[r["mst_key"]].add(r["epoch"])
    eval_map = {c: set(wanted[c]) | logged[c] for c in targets}
    progress, results, done, spent = _from_log(cat, fit_id, targets, p, workers, eval_map)
    progress._eval_epochs = EvalEpochs(book)
    book.progress = progress
    freed = {c for c, t in book.trials.items() if t.freed}
    progress.pending_evals[:] = [u for u in progress.pending_evals if u.config not in freed]
    seen_units = dict.fromkeys(targets, 0)
    evaluated: dict[tuple[int, int], int] = {}
    replayed = 0
    for r in rows:
        c, e = r["mst_key"], r["epoch"]
        if r["kind"] == "train":
            seen_units[c] += 1
            if seen_units[c] > book.reported_units.get(c, 0):
                replayed += 1
                hooks.on_train(c, e, r["partition"], {"loss": r["loss"], "rows": r["rows"],
                                                     "train_seconds": r["seconds_run"]},
                               float(r["at"]))
        elif r["kind"] == eval_kinds[0]:
            evaluated[(c, e)] = evaluated.get((c, e), 0) + 1
            if evaluated[(c, e)] == p and e not in book.reported_epochs.get(c, ()):
                hooks.on_evaluated(c, e, results[c], float(r["at"]))
    hooks.persist()
    return results, done, spent, replayed


@entrypoint
def hyperband_schedule(cat: Catalog, *, schedule_table: str, r: int | None, eta: int | None = 3,
                       skip_last: int | None = 0) -> None:
    """The Hyperband brackets for (R, eta, skip_last) as a table (s, i, n_i, r_i)."""
    from ..automl.hyperband import hyperband_schedule as schedule

    table = cat.table(schedule_table, "schedule_table")
    for label, v in (("r", r), ("eta", eta), ("skip_last", skip_last)):
        if v is None:
            raise CerebroError(f"{label} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    rows = schedule(int(r), int(eta), int(skip_last))
    require_output_schema(cat, table, "schedule_table")
    if cat.relation_oid(table) is not None:
        raise CerebroError(f'schedule_table "{table}" already exists', "42P07",
                           hint="Drop it or choose another name.")
    cols = [("s", "integer"), ("i", "integer"), ("n_i", "integer"), ("r_i", "integer")]
    cat.create_table(table, cols)
    cat.insert(table, [c for c, _ in cols], ["int4"] * 4, [list(x) for x in rows])
