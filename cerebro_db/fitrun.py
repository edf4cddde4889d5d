"""The fit service: one lifecycle for every fit (``madlib_keras_fit_multiple_model``,
``madlib_keras_fit``, ``madlib_keras_automl`` and their resume).

:func:`run` takes a checked :class:`FitRequest` and does, in this order: get the executor
(:func:`cerebro_db.sessions.make_executor`), open the worker sessions and run the worker-side
checks, register the fit (or, with a :class:`ResumePoint`, take an interrupted one over),
start the worker pool, train (:class:`FitHooks`: the coordinator's ``run_fit``), write the
outputs (a callback, in the caller's transaction), mark the fit done (or, on any error,
failed with its message) and close the sessions. What differs between kinds of fit is
plugged in: :class:`FitHooks` trains a fixed set of configurations, its AutoML subclass
(:class:`cerebro_db.automl_run.AutoMLFit`) lets a tuning procedure decide; the outputs
callbacks are in :mod:`cerebro_db.outputs`.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

from . import params
from . import state as state_mod
from .catalog import Catalog
from .catalog import fit_inputs as inputs_sql
from .catalog import fits as sql
from .catalog import sessions as session_sql
from .coordinator import ConfigResult, FitOutcome, run_fit
from .errors import (
    CONNECTION_FAILURE,
    FEATURE_NOT_SUPPORTED,
    INTERNAL_ERROR,
    OBJECT_IN_USE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    QUERY_CANCELED,
    READ_ONLY_SQL_TRANSACTION,
    CerebroError,
    invalid,
)
from .executors import DblinkExecutor, end_sessions, is_cancel
from .names import TableName
from .scheduling import (
    EVAL,
    TRAIN,
    Progress,
    auto_replicas,
    evaluation_epochs,
    get_policy,
    initial_workers,
    policy_class,
)
from .sessions import (
    UnitExecutor,
    WorkerPool,
    check_worker_limits,
    fault_settings,
    make_executor,
)

CHUNK_SETTING = "cerebro_db.state_chunk_size"
TRAINING_METRICS_SETTING = "cerebro_db.training_metrics"
TRAINING_METRICS = ("evaluated", "running")
"""What a fit's training metrics are (:func:`training_metrics`)."""
MIN_CHUNK_SIZE = 1024
MAX_UNITS = 2**31 - 1
"""The most training units of one fit (configs x iterations x partitions; the catalog's
``total_units`` is an integer)."""


@dataclass
class PackedTable:
    """A table made by the preprocessors, with what its summary says."""

    table: TableName
    qualified: str
    summary: dict[str, Any]
    x: str
    y: str
    x_size: int
    y_width: int
    partitions: int
    kind: str
    partition_mod: int | None = None  # MADlib-packed: partition = buffer_id % partition_mod
    multi: dict[str, list[Any]] | None = None  # several inputs/outputs: xs, ys, sizes, kinds
    x_shapes: list[list[int]] | None = None  # each input's per-row shape, as packed

    def columns(self) -> tuple[list[str], list[str], list[int], list[int], list[str]]:
        """Buffer columns, values per row and label kinds of every input and output."""
        if self.multi is None:
            return [self.x], [self.y], [self.x_size], [self.y_width], [self.kind]
        m = self.multi
        return m["xs"], m["ys"], m["x_sizes"], m["y_widths"], m["kinds"]

    @property
    def temporary(self) -> bool:
        """Whether the table is a temporary one (only the calling session sees it; schema
        names starting with ``pg_`` are reserved, so ``pg_temp_N`` is a session's)."""
        return self.qualified.startswith(("pg_temp_", '"pg_temp_'))


@dataclass
class Config:
    """One configuration of a fit (an AutoML trial is one too)."""

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    arch: str
    weights: bytes | None
    cp: params.CompileParams
    fp: params.FitParams


@dataclass(kw_only=True)
class FitRequest:
    """A checked request for one fit (the entry points build it)."""

    kind: str  # 'fit_multiple', 'fit' or 'automl'
    source: PackedTable
    validation: PackedTable | None
    output: TableName
    configs: list[Config]
    num_iterations: int
    frequency: int | None
    policy: str
    policy_params: dict[str, Any]
    random_state: int
    num_workers: int
    use_caching: bool | None  # None: cache what fits the workers' cache_memory budget
    mst_table: TableName | None
    arch_table: TableName
    warm_start: bool = False
    name: str | None = None
    description: str | None = None
    replicas: int = 1
    checks: list[dict[str, Any]] | None = None
    validate_compile: bool = False
    object_table: str | None = None
    custom_functions: dict[str, str] = field(default_factory=dict)
    training_metrics: str = "evaluated"  # or 'running' (:func:`training_metrics`)

    def __post_init__(self) -> None:
        for what, t in (("source_table", self.source), ("validation_table", self.validation)):
            if t is not None and t.temporary:
                raise CerebroError(
                    f'{what} "{t.table}" is a temporary table, which the worker sessions '
                    "cannot read", FEATURE_NOT_SUPPORTED,
                    hint="Pack it into an ordinary table (outputs may be in pg_temp).")

    @property
    def running_metrics(self) -> bool:
        """Whether the training metrics are the training units' running means."""
        return self.training_metrics == "running"

    @property
    def eval_kinds(self) -> list[str]:
        """What an evaluation unit computes: the training partition's metrics (unless they
        are the running ones), then the validation partition's."""
        return (["eval_train"] if not self.running_metrics else []) \
            + (["eval_valid"] if self.validation else [])


@dataclass
class ResumePoint:
    """What a resumed fit takes from the catalog."""

    fit_id: int
    tag: str | None


@dataclass
class FitRun:
    """One fit while :func:`run` runs it: what the hooks and the outputs callback see."""

    cat: Catalog
    request: FitRequest
    ex: DblinkExecutor
    workers: dict[int, Any]
    resume: ResumePoint | None
    max_unit_retries: int
    fit_id: int = 0
    t0: float = field(default_factory=time.time)
    outcome: FitOutcome | None = None
    written: Any = None  # what the outputs callback returned
    digests: tuple[str, str | None] | None = None  # the data's, as the fit started

    def units(self) -> UnitExecutor:
        """The executor as the coordinator takes it."""
        return UnitExecutor(self.cat, self.ex, self.fit_id)


class FitHooks:
    """How a fit of fixed configurations trains (``madlib_keras_fit_multiple_model``,
    ``madlib_keras_fit``): the request's scheduling policy over every configuration for
    ``num_iterations`` epochs, on an elastic pool of workers. AutoML overrides
    :meth:`check`, :meth:`workers`, :meth:`train` and the rest."""

    elastic = True
    """Whether workers may join and leave while the fit runs (:class:`WorkerPool`)."""

    def check(self, req: FitRequest) -> int:
        """Checks before any work; returns the fit's training units (for the catalog)."""
        seeded = {"random_state": req.random_state} \
            if "random_state" in policy_class(req.policy).option_names else {}
        self.policy = get_policy(req.policy, **seeded, **req.policy_params)
        p = req.source.partitions
        total = len(req.configs) * req.num_iterations * p
        if total > MAX_UNITS:
            raise invalid(f"the fit has {total} training units ({len(req.configs)} "
                          f"configurations x {req.num_iterations} iterations x {p} "
                          f"partitions), more than {MAX_UNITS}",
                          hint="Use fewer iterations or configurations.")
        return total

    def workers(self, req: FitRequest) -> dict[int, Any]:
        """The starting workers and the partitions each holds."""
        p = req.source.partitions
        return initial_workers(req.num_workers, p, min(req.replicas, p))

    def train(self, run: FitRun, pool: WorkerPool | None) -> FitOutcome:
        """Train to the end (continuing from the unit log when resumed)."""
        cat, req = run.cat, run.request
        p = req.source.partitions
        # no evaluation unit when the training metrics are the running ones and there is
        # no validation table
        eval_epochs = evaluation_epochs(req.num_iterations, req.frequency) \
            if req.eval_kinds else set()
        targets = {c.mst_key: req.num_iterations for c in req.configs}
        results, done, spent = None, 0, 0.0
        if run.resume is None:
            progress = Progress(targets, p, run.workers, eval_epochs)
        else:
            progress, results, done, spent = progress_from_log(
                cat, run.fit_id, targets, p, run.workers, eval_epochs,
                running=req.running_metrics)
        total = len(req.configs) * req.num_iterations * p
        cat.notice(f"fit {run.fit_id} {'resumes' if run.resume else 'starts'}: "
                   f"{len(req.configs)} configurations x {req.num_iterations} iterations on "
                   f"{p} partitions, {len(run.workers)} {_workers_word(run.ex)}"
                   f"{f' ({req.replicas} replicas)' if req.replicas > 1 else ''}, "
                   f"policy {req.policy}"
                   + (f", {done}/{total} training units already done" if run.resume else "")
                   + (", running training metrics" if req.running_metrics else "")
                   + f"; watch: SELECT * FROM {cat.schema}.fit_progress WHERE fit_id = "
                   f"{run.fit_id}")
        return run_fit(self.policy, progress, run.units(), eval_kinds=req.eval_kinds,
                       num_partitions=p, snapshot_epochs=lambda c, e: e in eval_epochs,
                       notice=cat.notice, max_unit_retries=run.max_unit_retries,
                       results=results, done_units=done, elapsed_before=spent, pool=pool,
                       running_metrics=req.running_metrics)

    def trained(self, run: FitRun) -> None:
        """After training, before the outputs are written."""

    def dropped_states(self) -> Sequence[int]:
        """Configurations whose every state goes once the fit is done (besides every
        version but 'current', which always goes)."""
        return ()


def run(cat: Catalog, *, request: FitRequest, outputs: Callable[[FitRun], Any],
        hooks: FitHooks | None = None, resume: ResumePoint | None = None) -> FitRun:
    """Run one fit to its end (see the module); returns it, with the outcome and what
    ``outputs(run)`` returned. ``resume``: take an interrupted (failed, cancelled) fit over
    and continue from its unit log. The fit is marked done only after ``outputs`` wrote
    the outputs in the caller's transaction, failed (with the message) on any error."""
    hooks = hooks or FitHooks()
    cat.warn_unknown_settings()
    check_caller_transaction(cat)
    total = hooks.check(request)
    workers = hooks.workers(request)
    retries, _, forward = fault_settings(cat)
    state_chunk_size(cat)
    check_worker_limits(cat, len(workers), resume.fit_id if resume else None)
    ex = make_executor(cat, len(workers))
    fit = FitRun(cat, request, ex, workers, resume, retries)
    ended = False
    try:
        ex.open(forward)
        if resume is not None:  # at once: the fit shows running (cancellable) from here
            fit.fit_id, fit.t0 = take_over(cat, ex, resume)
        refuse_uncommitted(cat, ex, [request.source, request.validation])
        worker_checks(ex, check_spec(request.source, request.checks or [], len(workers),
                                     request.validate_compile, request.custom_functions))
        ex.control(sql.mark_interrupted(cat))
        ex.control(sql.purge_done_states(cat))
        ex.control(sql.purge_postings(cat))
        fit.digests = (data_digest(cat, request.source),
                       data_digest(cat, request.validation) if request.validation else None)
        if resume is None:  # after the checks: a refused fit leaves no row
            fit.fit_id = register(cat, ex, request, total, fit.digests)
        pool = WorkerPool(cat, ex, fit.fit_id, request.source.partitions, request.replicas) \
            if hooks.elastic else None
        if pool is not None:
            pool.start(workers)
        fit.outcome = hooks.train(fit, pool)
        if pool is not None:
            pool.close()
        hooks.trained(fit)
        check_data_unchanged(cat, fit)
        fit.written = outputs(fit)
        mark_done(cat, ex, fit.fit_id)
        ex.control(sql.drop_states(cat, fit.fit_id, hooks.dropped_states()))
        ended = True
        return fit
    except BaseException as e:
        if fit.fit_id:
            mark_failed(cat, ex, fit.fit_id, e)
            if is_cancel(e) and not getattr(e, "hint", None):
                # pg_cancel_backend, statement_timeout: the caller learns how to go on
                raise CerebroError(
                    (getattr(e, "message", None) or str(e)).strip(), QUERY_CANCELED,
                    hint=f"The units committed so far are kept: resume the fit with "
                    f"madlib_keras_fit_resume({fit.fit_id}).") from e
        raise
    finally:
        ex.close(keep=ended)


# -- the steps ------------------------------------------------------------------------------
def check_caller_transaction(cat: Catalog) -> None:
    """The caller's transaction can run a fit: READ COMMITTED (the coordinator reads what its
    worker sessions commit as they go; a REPEATABLE READ or SERIALIZABLE snapshot never sees
    it, and such a fit failed only after all its training) and not read-only (the fit writes
    its outputs there at the end)."""
    iso = cat.setting("transaction_isolation") or "read committed"
    if iso != "read committed":
        raise CerebroError(
            f"a fit must run in a READ COMMITTED transaction; this one is {iso.upper()}",
            FEATURE_NOT_SUPPORTED,
            detail="The fit's worker sessions commit each unit as it ends and the calling "
                   "transaction must see those commits; a snapshot taken for the whole "
                   "transaction never does.",
            hint="SET default_transaction_isolation = 'read committed' before the "
                 "transaction, or BEGIN ISOLATION LEVEL READ COMMITTED.")
    if cat.setting("transaction_read_only") == "on":
        raise CerebroError(
            "a fit writes its outputs and catalog rows, and this transaction is read-only",
            READ_ONLY_SQL_TRANSACTION,
            hint="SET default_transaction_read_only = off before the transaction, or BEGIN "
                 "READ WRITE.")


def state_chunk_size(cat: Catalog) -> int | None:
    """``cerebro_db.state_chunk_size`` (bytes of model state per catalog row), checked."""
    raw = cat.setting(CHUNK_SETTING)
    if raw is None:
        return None
    limit = state_mod.MAX_CHUNK_SIZE - 64
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if not MIN_CHUNK_SIZE <= n <= limit:
        raise invalid(f"{CHUNK_SETTING} must be a number of bytes between {MIN_CHUNK_SIZE} and "
                      f"{limit}, got {raw!r}", hint=f"RESET {CHUNK_SETTING} for the default.")
    return n


def training_metrics(cat: Catalog) -> str:
    """``cerebro_db.training_metrics``, checked: ``'evaluated'`` (the default, MADlib's: after
    each evaluated epoch, the epoch's final model does a forward pass over every training
    row, in the evaluation units) or ``'running'`` (what Keras' ``fit`` reports: the means
    the training units measured as they trained, weighted by rows; no pass over the
    training rows, so a fit with metrics every epoch saves 15-21% of its time,
    ``bench/metrics_bench.py``; the values mix the model's states through the epoch)."""
    raw = cat.setting(TRAINING_METRICS_SETTING)
    value = (raw or "").strip().lower() or "evaluated"
    if value not in TRAINING_METRICS:
        raise invalid(f"{TRAINING_METRICS_SETTING} must be 'evaluated' or 'running', got "
                      f"{raw!r}", hint=f"RESET {TRAINING_METRICS_SETTING} for the default "
                      "('evaluated').")
    return value


def cache_memory(cat: Catalog, num_workers: int) -> int:
    """Each worker's budget of cached partitions for ``use_caching`` NULL (bytes): the
    setting ``cerebro_db.cache_memory``, else the default of :func:`worker.cache_memory`."""
    from . import worker

    return worker.cache_memory(cat.setting(worker.CACHE_SETTING), num_workers)


def data_bytes(tables: Sequence[PackedTable | None]) -> int | None:
    """The decoded size of ``tables`` (features as float32, labels), from their summaries'
    row counts; None when a summary has none (a table packed by MADlib)."""
    total = 0
    for t in tables:
        if t is None:
            continue
        rows = t.summary.get("num_rows")
        if rows is None:
            return None
        _, _, x_sizes, y_widths, _ = t.columns()
        total += int(rows) * (sum(x_sizes) + sum(y_widths)) * 4
    return total


def fit_replicas(cat: Catalog, setting: int | None, policy: str, source: PackedTable,
                 validation: PackedTable | None, num_workers: int) -> int:
    """The fit's replication factor: ``cerebro_db.replicas`` when set; by default
    (:func:`~cerebro_db.scheduling.auto_replicas`) every worker holds every partition when
    the policy steals work (takes another partition's units only when it would idle) and
    the data of all partitions fits one worker's cache budget (:func:`cache_memory`), else
    1."""
    if setting is not None:
        return setting
    if not policy_class(policy).steals:
        return 1
    return auto_replicas(source.partitions, data_bytes([source, validation]),
                         cache_memory(cat, num_workers))


def refuse_uncommitted(cat: Catalog, ex: DblinkExecutor,
                       tables: Sequence[PackedTable | None]) -> None:
    """The packed tables exist for the worker sessions (opened already): a table created in
    the caller's transaction, not yet committed, does not."""
    for t in tables:
        if t is None:
            continue
        seen = ex.control_query(session_sql.relation_visible(cat, t.qualified))
        if not seen or seen[0][0] != "true":
            raise CerebroError(f'table "{t.table}" was created in this transaction, which the '
                               "worker sessions cannot see until it commits",
                               OBJECT_NOT_IN_PREREQUISITE_STATE,
                               hint="COMMIT the transaction that made it, then call the "
                               "function again.")


def check_spec(src: PackedTable, items: list[dict[str, Any]], num_workers: int,
               validate_compile: bool = False,
               custom_functions: dict[str, str] | None = None) -> dict[str, Any]:
    """What the worker sessions check before a fit writes anything
    (``fit_checks.check_configs``); also their warm-up: the check imports
    TensorFlow with the fit's thread count. ``custom_functions``: the fit's
    ``{name: reference}`` (imported by the workers only)."""
    return {"configs": items, "x_size": src.x_size, "y_width": src.y_width, "kind": src.kind,
            "columns": list(src.columns()), "num_rows": src.summary.get("num_rows"),
            "x_shapes": src.x_shapes,
            "validate_compile": validate_compile, "custom_functions": custom_functions or {},
            "worker_threads": max(1, (os.cpu_count() or 1) // max(1, num_workers))}


def worker_checks(ex: DblinkExecutor, spec: dict[str, Any]) -> None:
    """Run the checks of ``spec`` in every worker session at once (each imports TensorFlow
    in parallel: a cold fit's start-up), and raise the first error one of them reports."""
    for w in ex.idle():
        ex.submit_check(w, spec)
    answers: dict[int, dict[str, Any]] = {}
    while ex.busy:
        for r in ex.wait():
            answers[r.worker] = r.data
    for w in sorted(answers):
        d = answers[w]
        if d.get("lost"):
            raise CerebroError(f"worker session {w} failed while checking the fit: "
                               f"{d.get('message')}", CONNECTION_FAILURE)
        if not d.get("ok"):
            raise CerebroError(d.get("message") or "the worker's checks failed",
                               d.get("sqlstate") or INTERNAL_ERROR, detail=d.get("detail"),
                               hint=d.get("hint"))


def _validation_columns(v: PackedTable | None) -> dict[str, Any]:
    """The validation table's own buffer columns (its summary's names, which need not be the
    training table's) and, for a MADlib-packed one, how its buffers map to partitions."""
    if v is None:
        return {}
    out: dict[str, Any] = {"valid_x": v.x, "valid_y": v.y,
                           "valid_partition_mod": v.partition_mod}
    if v.multi is not None:
        out.update(valid_xs=v.multi["xs"], valid_ys=v.multi["ys"])
    return out


def check_data_unchanged(cat: Catalog, fit: FitRun) -> None:
    """Fail (55000) when the packed data changed while the fit trained on it: worker sessions
    read it in their own transactions, and a DELETE, INSERT or UPDATE takes no lock a fit
    holds, so an outside pass had a fit end 'done' after training a partition on 750 rows,
    then on none. The digests (:func:`data_digest`) taken at the start and now must match;
    nothing is written otherwise."""
    if fit.digests is None:
        return
    req = fit.request
    for t, before in ((req.source, fit.digests[0]), (req.validation, fit.digests[1])):
        if t is None or before is None or data_digest(cat, t) == before:
            continue
        what = "source_table" if t is req.source else "validation_table"
        raise CerebroError(
            f'{what} "{t.table}" changed while fit {fit.fit_id} trained on it',
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            detail="Its rows, labels or packing differ from when the fit started, so its "
                   "units trained or were evaluated on different data; no output was written.",
            hint="Keep a packed table unchanged while a fit reads it (pack new data into a "
                 "new table), then start the fit again.")


def _table_records(cat: Catalog, req: FitRequest,
                   digests: tuple[str, str | None]) -> dict[str, Any]:
    """The fit's tables as this call resolved them (schema, name, the text the caller gave)
    and the oids of its data, so that a resume uses the same ones whatever its search_path."""
    def rec(t: TableName | None) -> list[str | None] | None:
        return None if t is None else [t.schema, t.name, t.given]

    return {"output": rec(req.output), "mst": rec(req.mst_table), "arch": rec(req.arch_table),
            "source_oid": cat.relation_oid(req.source.table),
            "validation_oid": cat.relation_oid(req.validation.table) if req.validation else None,
            "source_digest": digests[0], "validation_digest": digests[1]}


def data_digest(cat: Catalog, t: PackedTable) -> str:
    """A packed table's summary and buffer statistics (``buffer_stats``: its labels whole,
    samples of its features), hashed: a resume takes a table of another oid (a dump restored
    into another database) when this matches, and refuses one packed again with other rows,
    labels or settings (a change of some feature values alone can go unnoticed)."""
    xs, ys, *_ = t.columns()
    stats = inputs_sql.buffer_stats(cat, t.table, xs, ys)
    text = json.dumps([t.summary, stats], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _executor_name(ex: Any) -> str:
    """What ran the fit's units, as ``cerebro_db.executor`` names it: ``'sessions'`` or the
    remote cluster's URL (never a credential: such URLs refuse them)."""
    url = getattr(ex, "url", None)
    return "sessions" if url is None else str(url)


def _workers_word(ex: Any) -> str:
    return "worker sessions" if getattr(ex, "url", None) is None else \
        f"remote workers on {ex.url}"


def register(cat: Catalog, ex: DblinkExecutor, req: FitRequest, total: int,
             digests: tuple[str, str | None]) -> int:
    """The fit's catalog rows (the fit and its configurations); returns its fit_id."""
    opts = {"x": req.source.x, "y": req.source.y, **_validation_columns(req.validation),
            "partition_mod": req.source.partition_mod,
            **({"xs": req.source.multi["xs"], "ys": req.source.multi["ys"]}
               if req.source.multi is not None else {}),
            "use_caching": req.use_caching,
            "cache_memory": cache_memory(cat, req.num_workers),
            "worker_threads": max(1, (os.cpu_count() or 1) // req.num_workers),
            "state_chunk_size": state_chunk_size(cat),
            "training_metrics": req.training_metrics,
            "policy_params": req.policy_params, "num_workers": req.num_workers,
            "replicas": req.replicas,
            "frequency": req.frequency, "arch_table": str(req.arch_table),
            "warm_start": req.warm_start, "name": req.name, "description": req.description,
            "executor_tag": ex.tag, "executor": _executor_name(ex),
            "source_name": str(req.source.table),
            "validation_name": str(req.validation.table) if req.validation else None,
            "tables": _table_records(cat, req, digests),
            "object_table": req.object_table, "custom_functions": req.custom_functions}
    fit_row = sql.register_fit(
        cat, kind=req.kind, source_table=req.source.qualified,
        validation_table=req.validation.qualified if req.validation else None,
        model_output_table=str(req.output),
        model_selection_table=str(req.mst_table) if req.mst_table else None,
        policy=req.policy, num_partitions=req.source.partitions,
        num_iterations=req.num_iterations,
        metrics_compute_frequency=req.frequency or req.num_iterations,
        random_state=req.random_state, options=opts, total_units=total,
        coordinator_pid=session_sql.backend_pid(cat))
    if req.configs:  # the fit and its configurations: one string, one transaction
        fit_row += "; " + sql.add_configs_of_new_fit(
            cat, [(c.mst_key, c.model_id, c.compile_params, c.fit_params, c.arch, c.weights)
                  for c in req.configs])
    fit_id = int(ex.control_query(fit_row)[0][0])
    ex.fit_id = fit_id
    return fit_id


def take_over(cat: Catalog, ex: DblinkExecutor, resume: ResumePoint) -> tuple[int, float]:
    """Make this session the coordinator of an interrupted fit, if the fit is not done and
    no live coordinator has it (atomic: two resumes cannot both win), and end its orphaned
    worker sessions; returns the fit_id and its original start (epoch seconds)."""
    rows = ex.control_query(sql.claim(cat, resume.fit_id, session_sql.backend_pid(cat),
                                      ex.tag))
    if not rows:
        raise CerebroError(f"fit {resume.fit_id} is done or has a live coordinator session",
                           OBJECT_IN_USE, hint="Only an interrupted, cancelled or failed fit can be "
                           "resumed.")
    ex.fit_id = resume.fit_id
    if resume.tag:
        end_sessions(cat, f"cerebro_db {resume.tag} worker ")
    return resume.fit_id, sql.started_at(cat, resume.fit_id)


def mark_failed(cat: Catalog, ex: DblinkExecutor, fit_id: int, e: BaseException) -> None:
    """Record a fit's failure (its message), if this session still coordinates it: status
    'cancelled' for a cancel (``pg_cancel_backend``, ``statement_timeout``,
    ``cerebro_db_cancel_fit``: SQLSTATE 57014), else 'failed'; both are resumable."""
    try:
        msg = getattr(e, "message", None) or str(e)
        status = "cancelled" if is_cancel(e) else "failed"
        if status == "cancelled":
            msg = (f"{msg.strip()}; the units committed so far are kept: resume it with "
                   f"madlib_keras_fit_resume({fit_id})")
        ex.control(sql.mark_failed(cat, fit_id, session_sql.backend_pid(cat), status,
                                   msg[:2000]))
        # its sessions close with it (the outside pass saw fit_workers rows stay 'active',
        # with pids long gone, after a failed or cancelled fit)
        ex.control(sql.close_workers(cat, fit_id))
    except Exception:  # noqa: BLE001, S110 - the original error matters more
        pass


def mark_done(cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
    """Mark the fit done in the caller's transaction, after its outputs were written there:
    the catalog then agrees with the caller's COMMIT or ROLLBACK.

    The control session first records that no coordinator runs the fit any more (committed
    at once); the caller's transaction then sets 'done'. If that transaction rolls back, the
    fit is 'running' with no coordinator, i.e. interrupted (``fit_progress`` shows it so),
    and a resume (which only writes the outputs again: every unit is in the log) waits for
    the caller's transaction to end, then finds it done or resumable. A resume that took the
    fit over in between makes this call fail (the caller's outputs roll back)."""
    ex.control(sql.release(cat, fit_id, session_sql.backend_pid(cat)))
    if not sql.mark_done(cat, fit_id):
        raise CerebroError(f"fit {fit_id} was taken over by another session before its "
                           "outputs were written", OBJECT_IN_USE)


def progress_from_log(cat: Catalog, fit_id: int, targets: dict[int, int], p: int,
                      workers: dict[int, Any], eval_epochs: Any,
                      rows: list[dict[str, Any]] | None = None, running: bool = False
                      ) -> tuple[Progress, dict[int, ConfigResult], int, float]:
    """Progress, per-config results, training units done and seconds spent, from the units
    committed so far (in commit order; units in flight when the fit stopped are absent).
    ``rows``: the unit log when the caller has read it already. ``running``: the training
    metrics are the training units' (an evaluation unit logs 'eval_valid' rows only)."""
    rows = sql.unit_log(cat, fit_id) if rows is None else rows
    records, results = [], {c: ConfigResult() for c in targets}
    done, spent = 0, 0.0
    for i, r in enumerate(rows):
        spent = max(spent, float(r["at"]))
        res = results.get(r["mst_key"])
        if res is None:  # the role may write its own fit's unit log
            raise CerebroError(f"fit {fit_id} cannot be resumed: its unit log names mst_key "
                               f"{r['mst_key']}, which is none of its configurations",
                               OBJECT_NOT_IN_PREREQUISITE_STATE)
        metrics = {str(k): v for k, v in enumerate(r["metrics"] or [])}
        part = {"loss": r["loss"], "rows": r["rows"], "metrics": metrics}
        if r["kind"] == TRAIN:
            done += 1
            res.train_loss.setdefault(r["epoch"], []).append((r["loss"], r["rows"]))
            if len(res.train_loss[r["epoch"]]) == p:
                res.trained_at[r["epoch"]] = float(r["at"])
            if running:
                res.evals.setdefault((r["epoch"], "eval_train"), []).append(part)
        else:
            res.evals.setdefault((r["epoch"], r["kind"]), []).append(part)
        if r["kind"] in (TRAIN, "eval_valid" if running else "eval_train"):
            records.append({"config": r["mst_key"], "epoch": r["epoch"],
                            "partition": r["partition"], "worker": r["worker"],
                            "kind": TRAIN if r["kind"] == TRAIN else EVAL,
                            "start": float(i), "end": float(i), "ok": True})
    progress = Progress.from_log(records, targets, p, workers, eval_epochs)
    return progress, results, done, spent


def stored_configs(cat: Catalog, fit_id: int) -> list[Config]:
    """A fit's configurations as its catalog rows hold them, by mst_key."""
    configs = []
    for r in sql.stored_configs(cat, fit_id):
        w = bytes(r["init_weights"]) if r["init_weights"] is not None else None
        configs.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                              r["arch"], w, params.parse_compile_params(r["compile_params"]),
                              params.parse_fit_params(r["fit_params"])))
    return configs
