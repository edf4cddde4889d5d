"""The AutoML kind of fit for :func:`cerebro_db.fitrun.run` (``madlib_keras_automl`` and its
resume): :class:`AutoMLFit` trains by the AutoML engine (:func:`automl.engine.run_automl`)
instead of a fixed set of configurations, and :class:`CatalogHooks` save every step of the
engine to the catalog (``automl_trials``, ``automl_decisions``, ``automl_state``) through
the fit's control session, so that a resume starts from exactly the last saved step.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import params
from .automl.base import TrialSpec, Tuner
from .automl.engine import AutoMLHooks, run_automl
from .automl.registry import tuner_from_state_json
from .automl.trials import EvalEpochs, TrialBook, state_for_jsonb, state_from_jsonb
from .catalog import Catalog
from .catalog import fits as sql
from .coordinator import ConfigResult, FitOutcome
from .errors import (
    INTERNAL_ERROR,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    CerebroError,
)
from .executors import DblinkExecutor
from .fitrun import Config, FitHooks, FitRequest, FitRun, progress_from_log, stored_configs
from .scheduling import Progress
from .sessions import WorkerPool


class CatalogSink:
    """The AutoML engine's side effects (:class:`automl.trials.Sink`), through the fit's
    control session."""

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int,
                 archs: Mapping[int, tuple[str, bytes | None]]) -> None:
        self.cat, self.ex, self.fit_id, self.archs = cat, ex, fit_id, archs
        self.configs: dict[int, Config] = {}

    def launch(self, spec: TrialSpec, target: int) -> None:
        arch, weights = self.archs[spec.model_id]
        where = f"trial {spec.trial_id}"
        self.configs[spec.trial_id] = Config(
            spec.trial_id, spec.model_id, spec.compile_params, spec.fit_params, arch, weights,
            params.parse_compile_params(spec.compile_params, where),
            params.parse_fit_params(spec.fit_params, where))
        self.ex.control(sql.add_config(self.cat, self.fit_id, spec.trial_id, spec.model_id,
                                       spec.compile_params, spec.fit_params, arch, weights))
        if spec.parent is not None:
            self.ex.control(sql.copy_parent_state(self.cat, self.fit_id, spec.trial_id,
                                                  int(spec.parent)))
        self.ex.control(sql.add_trial(
            self.cat, self.fit_id, spec.trial_id,
            None if spec.parent is None else int(spec.parent), dict(spec.tunables),
            dict(spec.meta), int(target)))

    def record(self, seq: int, kind: str, trial_id: int, target: int | None,
               reason: str | None, meta: Mapping[str, Any], now: float) -> None:
        self.ex.control(sql.record_decision(self.cat, self.fit_id, int(seq), kind,
                                            int(trial_id), target, reason, dict(meta),
                                            float(now)))


class CatalogHooks(AutoMLHooks):
    """The engine's hooks, keeping the catalog current after every step."""

    def __init__(self, book: TrialBook, sink: CatalogSink, method: str,
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
        stmts = []
        key = (book.seq, tuple(rows))
        if key != self.saved and rows:
            stmts.append(sql.update_trials(cat, fit_id, rows))
        state = state_for_jsonb(book.tuner.state_json())
        kept = json.dumps(book.to_json(), sort_keys=True, separators=(",", ":"))
        if not stmts and (state, kept) == self.saved_state:
            return  # nothing happened since the last step
        stmts.append(sql.set_total_units(cat, fit_id, book.total_units()))
        stmts.append(sql.save_automl_state(cat, fit_id, self.method, state, kept))
        # several statements in one command run as one transaction
        self.sink.ex.control("; ".join(stmts))
        self.saved, self.saved_state = key, (state, kept)


class AutoMLFit(FitHooks):
    """An AutoML run for :func:`fitrun.run`: the procedure ``tuner`` launches the trials
    (configurations of ``archs``: model_id -> (architecture, weights)); one worker per
    partition, no pool. ``method`` and ``seed``: the procedure's name and the run's seed."""

    elastic = False

    def __init__(self, tuner: Tuner, archs: Mapping[int, tuple[str, bytes | None]],
                 method: str, seed: int) -> None:
        self.tuner, self.archs, self.method, self.seed = tuner, archs, method, seed
        self.book: TrialBook | None = None
        self.hooks: CatalogHooks | None = None
        self.sink: CatalogSink | None = None

    def check(self, req: FitRequest) -> int:
        return 0  # the procedure sets the units as it goes

    def workers(self, req: FitRequest) -> dict[int, Any]:
        return {w: {w} for w in range(req.source.partitions)}

    def train(self, run: FitRun, pool: WorkerPool | None) -> FitOutcome:
        cat, req = run.cat, run.request
        p = req.source.partitions
        eval_kinds = req.eval_kinds
        self.sink = sink = CatalogSink(cat, run.ex, run.fit_id, self.archs)
        self.book = book = TrialBook(self.tuner, sink, p, run.workers, req.frequency)
        self.hooks = hooks = CatalogHooks(book, sink, self.method, eval_kinds, cat.notice)
        results, done, spent = None, 0, 0.0
        saved = saved_state(cat, run.fit_id) if run.resume is not None else None
        if saved is None:
            if run.resume is not None:  # stopped before its first step was saved: start over
                forget_trials(cat, run.ex, run.fit_id, set(), 0)
            book.start(0.0)
            cat.notice(f"fit {run.fit_id}: madlib_keras_automl ({self.method}) "
                       f"{'starts over' if run.resume else 'starts'} on {p} partitions, {p} "
                       f"worker sessions; watch: SELECT * FROM {cat.schema}.automl_trials "
                       f"WHERE fit_id = {run.fit_id}")
        else:
            results, done, spent, replayed = restore(cat, run.ex, book, hooks, sink,
                                                     run.fit_id, saved, run.workers,
                                                     eval_kinds, req.running_metrics)
            cat.notice(f"fit {run.fit_id}: madlib_keras_automl ({self.method}) resumes with "
                       f"{len(book.trials)} trials launched and {done} training units done "
                       f"({replayed} of them reported to the procedure only now); watch: "
                       f"SELECT * FROM {cat.schema}.automl_trials WHERE fit_id = {run.fit_id}")
        return run_automl(hooks, run.units(), random_state=self.seed, notice=cat.notice,
                          max_unit_retries=run.max_unit_retries, results=results,
                          done_units=done, elapsed_before=spent,
                          running_metrics=req.running_metrics)

    def trained(self, run: FitRun) -> None:
        assert self.hooks is not None
        self.hooks.persist()

    def dropped_states(self) -> Sequence[int]:
        return self.book.freed() if self.book is not None else ()


def saved_state(cat: Catalog, fit_id: int) -> tuple[str, dict[str, Any]] | None:
    """The procedure's state and the book's, as the last step saved them."""
    row = sql.automl_state(cat, fit_id)
    if row is None or row["book"] is None:
        return None
    return state_from_jsonb(row["state"]), json.loads(row["book"])


def forget_trials(cat: Catalog, ex: DblinkExecutor, fit_id: int, known: set[int],
                  seq: int) -> None:
    """Remove what decisions made after the last saved step left in the catalog (trials
    registered, forked states copied, decisions logged): the resumed run makes them again.
    No unit of such a trial can exist (units are assigned only after a saved step)."""
    for statement in sql.forget_trials(cat, fit_id, known, seq):
        ex.control(statement)


def restore(cat: Catalog, ex: DblinkExecutor, book: TrialBook, hooks: CatalogHooks,
            sink: CatalogSink, fit_id: int, saved: tuple[str, dict[str, Any]],
            workers: dict[int, Any], eval_kinds: Sequence[str], running: bool = False
            ) -> tuple[dict[int, ConfigResult], int, float, int]:
    """Bring ``book`` (and its tuner) back to the last saved step, rebuild the scheduling
    progress and results from the unit log, then report to the procedure, in commit order,
    the units committed after that step (the procedure decides on them as it would have).
    ``running``: the training metrics are the training units' (:func:`progress_from_log`).
    Returns results, training units done, seconds spent, units reported now."""
    state, kept = saved
    try:
        book.tuner = tuner_from_state_json(state)
        targets = book.restore(kept)
    except (CerebroError, KeyError, TypeError, ValueError, AttributeError, IndexError) as bad:
        # the role that owns the fit may edit its saved state (a red-team pass got XX000)
        raise CerebroError(f"fit {fit_id} cannot be resumed: its saved AutoML state is "
                           f"damaged ({type(bad).__name__}: {str(bad)[:200]})",
                           OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Start a new fit instead.") from None
    forget_trials(cat, ex, fit_id, set(targets), book.seq)
    sink.configs.update((c.mst_key, c) for c in stored_configs(cat, fit_id))
    missing = sorted(set(targets) - set(sink.configs))
    if missing:
        raise CerebroError(f"fit {fit_id} cannot be resumed: trial {missing[0]} has no "
                           "configuration row", INTERNAL_ERROR)
    p = book.progress.num_partitions
    rows = sql.unit_log(cat, fit_id)
    # evaluation epochs: those the current targets call for, and those already in the log
    book.progress = Progress(targets, p, workers)
    wanted = EvalEpochs(book)
    logged: dict[int, set[int]] = {c: set() for c in targets}
    for r in rows:
        if r["kind"] != "train":
            logged[r["mst_key"]].add(r["epoch"])
    eval_map = {c: set(wanted[c]) | logged[c] for c in targets}
    progress, results, done, spent = progress_from_log(cat, fit_id, targets, p, workers,
                                                       eval_map, rows, running)
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
