"""The AutoML engine on a simulated clock: runs a :class:`~.base.Tuner` without a database.

:func:`simulate_tuner` runs the engine the server runs (:mod:`.engine`: the fit loop
:func:`cerebro_db.coordinator.run_fit` with the ``'mop'`` policy, a
:class:`~.trials.TrialBook` and :class:`~.engine.AutoMLHooks`) with a fake executor,
:class:`SimulatedExecutor` (on the event-driven executor and clock of
:mod:`cerebro_db.simulation`, which the scheduling simulations share): a unit's result comes from a :class:`LossModel` (by default
:class:`SyntheticLoss`, a learning curve per configuration that depends on the learning
rate) and its duration from a time function; the clock jumps from one unit's end to the next.
The rules a procedure meets (launch, extend, stop and free; paused trials; evaluated
epochs; ``on_idle`` while workers would idle; the errors of :meth:`TrialBook.apply`) are
therefore those of a real run, and so are the reports it gets. What the simulation adds:

- a fork starts from its parent's current loss level (the server copies the parent's
  latest state); a unit trains from the level its trial's last unit left;
- ``roundtrip_state``: after an engine step the procedure is rebuilt from its JSON state
  and the book from its own, as a resumed run does; the outcome must not change;
- everything is logged: units (:class:`~cerebro_db.scheduling.UnitRecord`), the reports and
  decisions as the procedure saw and made them, the decisions as the book's sink got them.

Partition ``p`` is held by worker ``p % num_workers`` (and by worker ``w`` with
``w % num_partitions == p`` when there are more workers than partitions); the server runs
one worker per partition.
"""
from __future__ import annotations

import functools
import json
import math
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..coordinator import FitOutcome
from ..scheduling import TRAIN, Assignment, RunningUnit, UnitRecord
from ..simulation import SimulatedExecutor as BaseSimulatedExecutor
from .base import (
    Decision,
    EngineView,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    UnitReport,
)
from .engine import AutoMLHooks, run_automl
from .registry import tuner_from_state_json
from .trials import AutoMLError, TrialBook

__all__ = [
    "DecisionRecord",
    "EpochScores",
    "LossModel",
    "SimResult",
    "SimulatedExecutor",
    "SyntheticLoss",
    "TrialOutcome",
    "config_tunables",
    "default_unit_time",
    "random_unit_time",
    "simulate_tuner",
]

EVAL_FRACTION = 1.0 / 3.0
"""Evaluation unit time as a fraction of the training unit time."""

_DEFAULT_LR = {"SGD": 0.01}
_KERAS_DEFAULT_LR = 0.001


# --------------------------------------------------------------------------------------------
# The simulated training
# --------------------------------------------------------------------------------------------


def _h(*parts: object) -> float:
    """A stable hash of ``parts`` in [0, 1)."""
    return zlib.crc32(":".join(map(str, parts)).encode()) / 2**32


@functools.lru_cache(maxsize=4096)
def _parsed_tunables(compile_params: str, fit_params: str) -> tuple[float, float | None, int, str]:
    from ..params import parse_compile_params, parse_fit_params

    cp = parse_compile_params(compile_params)
    fp = parse_fit_params(fit_params)
    kw = cp.optimizer.kwargs
    lr = float(kw.get("learning_rate", _DEFAULT_LR.get(cp.optimizer.name, _KERAS_DEFAULT_LR)))
    mom = kw.get("momentum")
    return lr, (None if mom is None else float(mom)), fp.batch_size, cp.optimizer.name


def config_tunables(spec: TrialSpec) -> dict[str, Any]:
    """learning_rate, momentum (None when the optimizer has none), batch_size and optimizer
    a trial trains with, read from its compile/fit strings (imports Keras to parse them).
    Raises :class:`~.trials.AutoMLError` when ``spec.tunables`` disagree with the strings."""
    lr, mom, bs, opt = _parsed_tunables(spec.compile_params, spec.fit_params)
    out: dict[str, Any] = {"learning_rate": lr, "momentum": mom, "batch_size": bs,
                           "optimizer": opt}
    for k, v in spec.tunables.items():
        have = out.get(k)
        if have is None or not math.isclose(float(have), float(v), rel_tol=1e-9):
            raise AutoMLError(
                f"launched trial {spec.trial_id} with tunable {k}={v!r}, which disagrees "
                f"with its compile/fit params ({k}={have!r})")
    return out


class LossModel(Protocol):
    """How simulated training goes. A trial's state is one float (its loss level)."""

    def initial(self, spec: TrialSpec) -> float:
        """The loss level of a fresh trial."""

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        """Train one unit from ``level``: (the unit's reported loss, the new level)."""

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        """(training loss, validation loss or None) of the end-of-epoch state."""


@dataclass(frozen=True)
class SyntheticLoss:
    """A learning curve per configuration, deterministic given ``seed``.

    Effective learning rate ``lr / (1 - momentum)`` (Keras default when the optimizer string
    gives none) relative to ``best_lr`` (per model id in ``best_lr_by_model``): ``r``. The
    level decays towards a floor ``floor(model) * (1 + floor_slope * r)`` (a higher learning
    rate stalls higher: re-tuning pays) at ``speed * r * exp(1 - r) * sqrt(32 / batch_size)``
    per epoch (fastest at ``r = 1``). Above ``diverge_ratio`` the loss grows each unit and
    becomes NaN past ``1e6`` (or at once above twice the ratio). Unit losses carry
    multiplicative noise ``noise * N(0, 1)`` drawn from (seed, trial, epoch, partition) and a
    fixed per-partition offset; validation adds a per-model generalisation gap.
    """

    best_lr: float = 0.01
    best_lr_by_model: Mapping[int, float] = field(default_factory=dict)
    speed: float = 0.6
    floor_slope: float = 0.5
    diverge_ratio: float = 8.0
    noise: float = 0.02
    partition_spread: float = 0.03
    seed: int = 0

    def _r(self, spec: TrialSpec) -> tuple[float, float]:
        t = config_tunables(spec)
        mom = t["momentum"] or 0.0
        eff = t["learning_rate"] / max(1e-6, 1.0 - mom)
        best = self.best_lr_by_model.get(spec.model_id, self.best_lr)
        return eff / best, math.sqrt(32.0 / t["batch_size"])

    def initial(self, spec: TrialSpec) -> float:
        return 2.0 + 0.3 * _h("init", spec.model_id)

    def floor(self, spec: TrialSpec) -> float:
        """The lowest level the model reaches (learning rate going to 0)."""
        return 0.1 + 0.2 * _h("floor", spec.model_id, self.seed)

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        r, g = self._r(spec)
        old = level
        if not math.isfinite(level) or r > 2 * self.diverge_ratio:
            new = math.nan
        elif r > self.diverge_ratio:
            new = level * (1.0 + 2.0 * (r / self.diverge_ratio - 0.5))
            new = math.nan if new > 1e6 else new
        else:
            floor = self.floor(spec) * (1.0 + self.floor_slope * r)
            rate = self.speed * r * math.exp(1.0 - r) * g
            new = floor + (level - floor) * math.exp(-rate / num_partitions)
        rng = np.random.default_rng([self.seed, spec.trial_id, epoch, partition])
        offset = 1.0 + self.partition_spread * (2.0 * _h("part", partition, self.seed) - 1.0)
        loss = 0.5 * (old + new) * offset * (1.0 + self.noise * float(rng.standard_normal()))
        return (loss if math.isfinite(loss) else math.nan), new

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        if not math.isfinite(level):
            return math.nan, (math.nan if validation else None)
        rng = np.random.default_rng([self.seed, spec.trial_id, epoch, 10**6])
        train = level * (1.0 + self.noise / 3 * float(rng.standard_normal()))
        if not validation:
            return train, None
        gap = 0.05 + 0.1 * _h("gap", spec.model_id, self.seed)
        return train, level * (1.0 + gap) * (1.0 + self.noise / 3 * float(rng.standard_normal()))


def default_unit_time(spec: TrialSpec, partition: int) -> float:
    """Seconds of one training unit: per model 1 to 1.5 s, faster with bigger batches
    (``0.5 + 0.5 * sqrt(32 / batch_size)``), +-10% per partition."""
    bs = config_tunables(spec)["batch_size"]
    base = 1.0 + 0.5 * _h("time", spec.model_id)
    return base * (0.5 + 0.5 * math.sqrt(32.0 / bs)) * (0.9 + 0.2 * _h("ptime", partition))


@dataclass(frozen=True)
class EpochScores:
    """A :class:`LossModel` for properties of a procedure's decisions: every unit of epoch
    ``e`` of a trial reports ``score(spec, e)`` and the evaluation of that epoch scores
    ``score(spec, e)`` (training and validation alike)."""

    score: Callable[[TrialSpec, int], float]

    def initial(self, spec: TrialSpec) -> float:
        return 0.0

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        return float(self.score(spec, epoch)), level

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        s = float(self.score(spec, epoch))
        return s, (s if validation else None)


def random_unit_time(seed: int, low: float = 0.2, high: float = 3.0
                     ) -> Callable[[TrialSpec, int], float]:
    """Unit times drawn uniformly from [low, high) per (seed, trial, partition): trials end
    their units in an order that changes with ``seed``."""
    def unit_time(spec: TrialSpec, partition: int) -> float:
        return low + (high - low) * _h("utime", seed, spec.trial_id, partition)
    return unit_time


# --------------------------------------------------------------------------------------------
# The fake executor and the engine's side effects
# --------------------------------------------------------------------------------------------


class _Trials:
    """The trials as the simulated cluster holds them: specs and current loss levels (the
    :class:`~.trials.Sink` of the book: a launch registers the trial; a fork copies its
    parent's level, as the server copies the parent's latest state)."""

    def __init__(self, model: LossModel) -> None:
        self.model = model
        self.specs: dict[int, TrialSpec] = {}
        self.level: dict[int, float] = {}
        self.records: list[tuple[int, str, int, int | None, str | None, dict[str, Any],
                                 float]] = []

    def launch(self, spec: TrialSpec, target: int) -> None:
        if spec.tunables:
            config_tunables(spec)  # the strings say what the trial trains with
        self.specs[spec.trial_id] = spec
        self.level[spec.trial_id] = (self.model.initial(spec) if spec.parent is None
                                     else self.level[spec.parent])

    def record(self, seq: int, kind: str, trial_id: int, target: int | None,
               reason: str | None, meta: Mapping[str, Any], now: float) -> None:
        self.records.append((seq, kind, trial_id, target, reason, dict(meta), now))


class SimulatedExecutor(BaseSimulatedExecutor):
    """The :class:`cerebro_db.simulation.SimulatedExecutor` of an AutoML run (clock:
    :meth:`clock`).

    A unit ends ``unit_time(spec, partition)`` seconds after :meth:`submit` (evaluation:
    ``eval_time``); :meth:`wait` moves the clock to the next end and returns that one unit's
    result: a training unit trains its trial's level by one :meth:`LossModel.step` (and
    keeps the end-of-epoch level when the loop asks for a snapshot), an evaluation unit
    evaluates that snapshot. No unit loses its worker.
    """

    def __init__(self, trials: _Trials, num_partitions: int,
                 unit_time: Callable[[TrialSpec, int], float],
                 eval_time: Callable[[TrialSpec, int], float], rows_per_partition: int,
                 max_steps: int) -> None:
        super().__init__(max_steps=max_steps)
        self.trials, self.num_partitions = trials, num_partitions
        self.train_time, self.eval_time = unit_time, eval_time
        self.rows = rows_per_partition
        self._snapshots: dict[tuple[int, int], float] = {}

    def unit_time(self, a: Assignment, options: dict[str, Any]) -> float:
        spec = self.trials.specs[a.config]
        return (self.train_time if a.kind == TRAIN else self.eval_time)(spec, a.partition)

    def result(self, a: Assignment, options: dict[str, Any], start: float, end: float
               ) -> dict[str, Any]:
        spec = self.trials.specs[a.config]
        model = self.trials.model
        if a.kind == TRAIN:
            if options.get("keep_previous"):  # as the worker keeps 'current' as 'epoch:N'
                self._snapshots[(a.config, a.epoch - 1)] = self.trials.level[a.config]
            loss, level = model.step(spec, self.trials.level[a.config], a.epoch, a.partition,
                                     self.num_partitions)
            self.trials.level[a.config] = level
            return {"loss": loss, "rows": self.rows, "seconds": end - start,
                    "train_seconds": end - start}
        kinds = list(options["eval_kinds"])
        level = self._snapshots.get((a.config, a.epoch), self.trials.level[a.config])
        train, valid = model.evaluate(spec, level, a.epoch, "eval_valid" in kinds)
        losses = {"eval_train": train, "eval_valid": valid}
        return {"evals": {k: {"loss": losses[k], "rows": self.rows, "metrics": {}}
                          for k in kinds}}

    def recover(self, worker: int) -> bool:
        raise RuntimeError("a simulated unit never loses its worker session")

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        raise RuntimeError("a simulated unit never loses its worker session")


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecisionRecord:
    """A decision as the procedure made it: ``step`` (engine steps so far; 0 at start),
    ``source`` ('start', 'unit', 'epoch', 'idle'), ``time`` (the engine clock)."""

    step: int
    source: str
    time: float
    decision: Decision


@dataclass(frozen=True)
class TrialOutcome:
    """A trial at the end of the run, as the book and the scheduling progress hold it
    (``target`` of a stopped trial: the epochs it had completed when stopped)."""

    spec: TrialSpec
    target: int
    completed: int
    stopped: bool
    freed: bool
    reason: str | None
    last_epoch: int | None
    score: float | None
    meta: dict[str, Any]


@dataclass
class SimResult:
    """Everything a run did.

    ``units``: every unit, in the order they ended; ``log`` interleaves ``('unit',
    UnitReport)``, ``('epoch', EpochReport)`` and ``('decision', DecisionRecord)`` in the
    order the procedure saw and made them; ``records``: the decisions as the book's sink got
    them (what the server writes to ``automl_decisions``: seq, kind, trial, target, reason,
    meta, time); ``ranking``: (trial_id, score) best first over the trials not freed;
    ``info``: ``tuner.info`` per output trial; ``tuner``: the procedure at the end (rebuilt
    from its state with ``roundtrip_state``).
    """

    units: list[UnitRecord]
    decisions: list[DecisionRecord]
    unit_reports: list[UnitReport]
    epoch_reports: list[EpochReport]
    log: list[tuple[str, Any]]
    records: list[tuple[int, str, int, int | None, str | None, dict[str, Any], float]]
    trials: dict[int, TrialOutcome]
    ranking: list[tuple[int, float]]
    info_columns: list[tuple[str, str]]
    info: dict[int, dict[str, Any]]
    makespan: float
    steps: int
    final_state: str
    tuner: Tuner
    outcome: FitOutcome

    @property
    def outputs(self) -> list[int]:
        """Trial ids in the outputs (not freed), best first."""
        return [k for k, _ in self.ranking]

    def specs(self) -> dict[int, TrialSpec]:
        return {k: t.spec for k, t in self.trials.items()}

    def max_in_flight(self) -> int:
        """Most trials in flight at once, as the procedure saw them: a trial is in flight
        from its launch (or an extension) until it is reported at its target or stopped,
        its evaluation included. A procedure that launches only into free slots keeps this
        at most the number of workers."""
        flying: set[int] = set()
        most = 0
        for kind, x in self.log:
            if kind == "decision":
                d = x.decision
                if isinstance(d, Launch):
                    flying.add(d.spec.trial_id)
                elif isinstance(d, Extend):
                    flying.add(d.trial_id)
                elif isinstance(d, Stop):
                    flying.discard(d.trial_id)
                most = max(most, len(flying))
            elif kind == "epoch" and x.at_target:
                flying.discard(x.trial_id)
        return most


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


class _Observed(Tuner):
    """The procedure under simulation; logs what it is told and what it decides."""

    name = "observed"

    def __init__(self, inner: Tuner, clock: Callable[[], tuple[int, float]]) -> None:
        self.inner = inner
        self.__dict__["name"] = inner.name  # the engine's messages name the procedure
        self.clock = clock
        self.decisions: list[DecisionRecord] = []
        self.units: list[UnitReport] = []
        self.epochs: list[EpochReport] = []
        self.log: list[tuple[str, Any]] = []

    def _decided(self, source: str, decisions: list[Decision]) -> list[Decision]:
        step, now = self.clock()
        for d in decisions:
            rec = DecisionRecord(step, source, now, d)
            self.decisions.append(rec)
            self.log.append(("decision", rec))
        return decisions

    def start(self) -> list[Decision]:
        return self._decided("start", self.inner.start())

    def on_unit(self, report: UnitReport) -> list[Decision]:
        self.units.append(report)
        self.log.append(("unit", report))
        return self._decided("unit", self.inner.on_unit(report))

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        self.epochs.append(report)
        self.log.append(("epoch", report))
        return self._decided("epoch", self.inner.on_epoch(report))

    def on_idle(self, view: EngineView) -> list[Decision]:
        return self._decided("idle", self.inner.on_idle(view))

    def done(self) -> bool:
        return self.inner.done()

    def options(self) -> dict[str, Any]:
        return self.inner.options()

    def info(self, trial_id: int) -> dict[str, Any]:
        return self.inner.info(trial_id)

    def info_columns(self) -> list[tuple[str, str]]:
        return self.inner.info_columns()

    def state_json(self) -> str:
        return self.inner.state_json()


class _Hooks(AutoMLHooks):
    """The engine's hooks; with ``roundtrip`` steps, a step's end rebuilds the procedure and
    the book from their JSON state (what a resumed run starts from)."""

    def __init__(self, book: TrialBook, observed: _Observed, executor: SimulatedExecutor,
                 eval_kinds: list[str], roundtrip: bool | Collection[int]) -> None:
        super().__init__(book, observed.name, eval_kinds)
        self.observed, self.executor, self.roundtrip = observed, executor, roundtrip

    def persist(self) -> None:
        rt = self.roundtrip
        if rt is True or (not isinstance(rt, bool) and self.executor.steps in rt):
            o = self.observed
            o.inner = tuner_from_state_json(o.inner.state_json())
            kept = json.loads(json.dumps(self.book.to_json()))
            targets = self.book.restore(kept)
            if targets != self.book.progress.targets:
                raise AutoMLError(f"book state gave back targets {targets}, not "
                                  f"{self.book.progress.targets}")


def _holders(num_partitions: int, num_workers: int) -> dict[int, frozenset[int]]:
    held: dict[int, set[int]] = {w: set() for w in range(num_workers)}
    for p in range(num_partitions):
        held[p % num_workers].add(p)
    for w in range(num_partitions, num_workers):
        held[w].add(w % num_partitions)
    return {w: frozenset(s) for w, s in held.items()}


def simulate_tuner(
    tuner: Tuner,
    *,
    num_partitions: int,
    num_workers: int,
    metrics_compute_frequency: int | None = None,
    loss_model: LossModel | None = None,
    unit_time: Callable[[TrialSpec, int], float] = default_unit_time,
    eval_time: Callable[[TrialSpec, int], float] | None = None,
    validation: bool = True,
    max_steps: int = 100_000,
    seed: int = 0,
    roundtrip_state: bool | Collection[int] = False,
    rows_per_partition: int = 1000,
) -> SimResult:
    """Run ``tuner`` to the end on the engine with a :class:`SimulatedExecutor` (see the
    module).

    ``unit_time(spec, partition)``: seconds of a training unit (``eval_time`` defaults to a
    third of it); ``seed``: the scheduling policy's ``random_state``; ``roundtrip_state``:
    after every engine step (``True``) or after the given steps (counted in units ended),
    rebuild the procedure and the book from their JSON state. Raises what the engine raises
    (:class:`~.trials.AutoMLError` when the procedure breaks the contract or stalls), and
    ``RuntimeError`` after ``max_steps`` units.
    """
    if num_partitions < 1 or num_workers < 1:
        raise ValueError("num_partitions and num_workers must be at least 1")
    if metrics_compute_frequency is not None and metrics_compute_frequency < 1:
        raise ValueError("metrics_compute_frequency must be at least 1")
    trials = _Trials(loss_model if loss_model is not None else SyntheticLoss())
    etime = eval_time or (lambda s, p: EVAL_FRACTION * unit_time(s, p))
    ex = SimulatedExecutor(trials, num_partitions, unit_time, etime, rows_per_partition,
                           max_steps)
    observed = _Observed(tuner, lambda: (ex.steps, ex.now))
    book = TrialBook(observed, trials, num_partitions, _holders(num_partitions, num_workers),
                     metrics_compute_frequency)
    eval_kinds = ["eval_train"] + (["eval_valid"] if validation else [])
    hooks = _Hooks(book, observed, ex, eval_kinds, roundtrip_state)
    book.start(0.0)
    outcome = run_automl(hooks, ex, random_state=seed, clock=ex.clock)
    p = book.progress
    outcomes = {c: TrialOutcome(t.spec, p.targets[c], p.completed[c], t.stopped, t.freed,
                                t.reason, t.last_epoch, t.score, dict(t.meta or {}))
                for c, t in sorted(book.trials.items())}
    ranking = [(c, math.nan if (score := book.trials[c].score) is None else float(score))
               for c in book.ranking()]
    final = observed.inner
    info = {c: dict(final.info(c)) for c in book.outputs()}
    return SimResult(sorted(ex.log, key=lambda r: (r.end, r.start)), observed.decisions,
                     observed.units, observed.epochs, observed.log, trials.records, outcomes,
                     ranking, list(final.info_columns()), info,
                     max((u.end for u in ex.log), default=0.0), ex.steps, final.state_json(),
                     final, outcome)
