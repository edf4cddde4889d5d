"""A deterministic fake engine: runs an AutoML :class:`~.base.Tuner` against simulated training.

The real engine (model hopper parallelism over worker sessions in PostgreSQL) and this one
follow the same contract (``automl_engine.md``); the bookkeeping and the error rules live in
:class:`TrialBook`, which the real engine can use as is. Nothing here touches a database or
TensorFlow: a unit's loss comes from a :class:`LossModel` (by default :class:`SyntheticLoss`,
a learning curve per configuration that depends on the learning rate) and its duration from
a time function.

Semantics, in the order the loop applies them:

1. ``tuner.start()``; decisions are applied in order (:meth:`TrialBook.apply`).
2. *Training* trials are launched, not stopped, and below their target. Scheduling is MOP:
   each idle worker (ascending ids) takes a training trial that is not in flight and has an
   unvisited partition the worker holds, lagging trials first (most training units left;
   ties drawn with the engine's seeded rng), on one such partition; a worker with no such
   trial takes the oldest queued evaluation unit on a partition it holds. Partition ``p`` is
   held by worker ``p % num_workers`` (and by worker ``w`` with ``w % num_partitions == p``
   when there are more workers than partitions).
3. After each training unit: ``on_unit``; its decisions are applied at once. When the unit
   completes epoch ``e``, the epoch is *evaluated* if ``e`` is the trial's target at that
   moment or ``e % metrics_compute_frequency == 0``: one evaluation unit per partition
   (reading the frozen end-of-epoch state; they never block training). When the last one
   ends: ``on_epoch(EpochReport(at_target = e == target now))``.
4. After every step: while ``view.free_slots > 0``, ``on_idle(view)`` and apply, until it
   returns ``[]`` (more than 1000 calls in one step is an error).
5. Stop: no new training units for the trial; a unit in flight finishes and is reported
   normally (a completed epoch is evaluated by the usual rule). Stop(free=True): the trial
   leaves the outputs; its unit in flight is discarded, its queued evaluations are dropped
   and nothing more is reported about it. Extend never lowers a target: a target at or below
   the current one is a no-op (meta is still merged), below the completed epochs an error.
6. The run ends when ``done()`` is true, no trial is training and nothing is in flight or
   queued; if ``done()`` is false at that point, "the AutoML procedure stalled".

Errors (:class:`AutoMLEngineError`, SQLSTATE XX000) are the rules of :meth:`TrialBook.apply`.
"""
from __future__ import annotations

import functools
import heapq
import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from ..errors import INTERNAL_ERROR, CerebroError
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
    score_key,
)

__all__ = [
    "MAX_IDLE_CALLS",
    "AutoMLEngineError",
    "DecisionRecord",
    "LossModel",
    "SimResult",
    "SimUnit",
    "SyntheticLoss",
    "TrialBook",
    "TrialState",
    "config_tunables",
    "default_unit_time",
    "simulate_tuner",
]

MAX_IDLE_CALLS = 1000
"""Most ``on_idle`` calls the engine makes in one step."""

EVAL_FRACTION = 1.0 / 3.0
"""Evaluation unit time as a fraction of the training unit time."""

_DEFAULT_LR = {"SGD": 0.01}
_KERAS_DEFAULT_LR = 0.001


class AutoMLEngineError(CerebroError):
    """An AutoML procedure broke the engine contract (a bug in the procedure)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, INTERNAL_ERROR)


# --------------------------------------------------------------------------------------------
# Bookkeeping and the error rules (shared with the real engine)
# --------------------------------------------------------------------------------------------


@dataclass
class TrialState:
    """What the engine knows of one trial."""

    spec: TrialSpec
    target: int
    completed: int = 0
    visited: set[int] = field(default_factory=set)
    in_flight: bool = False
    stopped: bool = False
    freed: bool = False
    reason: str | None = None
    last_eval: tuple[int, float] | None = None
    """(epoch, score) of the last evaluated epoch."""

    @property
    def training(self) -> bool:
        return not self.stopped and self.completed < self.target

    @property
    def paused(self) -> bool:
        return not self.stopped and self.completed >= self.target


class TrialBook:
    """Trials, their targets and progress, and the decision rules of the engine contract.

    :meth:`apply` raises :class:`AutoMLEngineError` for: a Launch with a used trial id or a
    target below 1; a Launch whose ``parent`` is unknown, freed or training; an Extend or Stop
    of an unknown or freed trial; an Extend of a stopped trial or below the completed epochs.
    (Tunables without a parent are refused by :class:`~.base.TrialSpec` itself.)
    """

    def __init__(self) -> None:
        self.trials: dict[int, TrialState] = {}

    def __contains__(self, trial_id: object) -> bool:
        return trial_id in self.trials

    def __getitem__(self, trial_id: int) -> TrialState:
        return self.trials[trial_id]

    def _known(self, trial_id: int, what: str) -> TrialState:
        t = self.trials.get(trial_id)
        if t is None:
            raise AutoMLEngineError(f"{what} of unknown trial {trial_id}")
        if t.freed:
            raise AutoMLEngineError(f"{what} of freed trial {trial_id}")
        return t

    def apply(self, d: Decision) -> TrialState:
        """Apply one decision (see the class docstring for the errors); returns the trial."""
        if isinstance(d, Launch):
            spec = d.spec
            if spec.trial_id in self.trials:
                raise AutoMLEngineError(f"launch of trial {spec.trial_id}: trial id already used")
            if isinstance(d.target, bool) or not isinstance(d.target, int) or d.target < 1:
                raise AutoMLEngineError(
                    f"launch of trial {spec.trial_id}: target must be a positive integer, "
                    f"got {d.target!r}")
            if spec.parent is not None:
                p = self.trials.get(spec.parent)
                if p is None or p.freed:
                    state = "unknown" if p is None else "freed"
                    raise AutoMLEngineError(
                        f"launch of trial {spec.trial_id}: parent {spec.parent} is {state}")
                if p.training:
                    raise AutoMLEngineError(
                        f"launch of trial {spec.trial_id}: parent {spec.parent} is training "
                        "(fork only from paused or stopped trials)")
            t = TrialState(spec, d.target)
            self.trials[spec.trial_id] = t
            return t
        if isinstance(d, Extend):
            t = self._known(d.trial_id, "extend")
            if t.stopped:
                raise AutoMLEngineError(f"extend of stopped trial {d.trial_id}")
            if isinstance(d.target, bool) or not isinstance(d.target, int):
                raise AutoMLEngineError(
                    f"extend of trial {d.trial_id}: target must be an integer, got {d.target!r}")
            if d.target < t.completed:
                raise AutoMLEngineError(
                    f"extend of trial {d.trial_id} to {d.target} epochs: it has completed "
                    f"{t.completed}")
            if d.meta:
                t.spec = replace(t.spec, meta={**t.spec.meta, **d.meta})
            t.target = max(t.target, d.target)
            return t
        if isinstance(d, Stop):
            t = self._known(d.trial_id, "stop")
            if not t.stopped or d.free:
                t.reason = d.reason
            t.stopped = True
            t.freed = bool(d.free)
            return t
        raise AutoMLEngineError(f"unknown decision {d!r}")

    def training(self) -> frozenset[int]:
        return frozenset(k for k, t in self.trials.items() if t.training)

    def paused(self) -> frozenset[int]:
        return frozenset(k for k, t in self.trials.items() if t.paused)

    def evaluated(self, trial_id: int, epoch: int, frequency: int | None) -> bool:
        """Whether ``epoch`` (just completed) of the trial is evaluated."""
        t = self.trials[trial_id]
        return epoch == t.target or (frequency is not None and epoch % frequency == 0)

    def ranking(self) -> list[tuple[int, float]]:
        """(trial_id, score of its last evaluated epoch) for every trial not freed, best
        first (NaN last, ties by trial id)."""
        rows = [(k, t.last_eval[1] if t.last_eval else math.nan)
                for k, t in self.trials.items() if not t.freed]
        return sorted(rows, key=lambda r: (score_key(r[1]), r[0]))


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
    Raises :class:`AutoMLEngineError` when ``spec.tunables`` disagree with the strings."""
    lr, mom, bs, opt = _parsed_tunables(spec.compile_params, spec.fit_params)
    out: dict[str, Any] = {"learning_rate": lr, "momentum": mom, "batch_size": bs,
                           "optimizer": opt}
    for k, v in spec.tunables.items():
        have = out.get(k)
        if have is None or not math.isclose(float(have), float(v), rel_tol=1e-9):
            raise AutoMLEngineError(
                f"trial {spec.trial_id}: tunable {k}={v!r} disagrees with its "
                f"compile/fit params ({k}={have!r})")
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


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimUnit:
    """One unit run: ``kind`` 'train' or 'eval'; ``discarded`` when its trial was freed."""

    trial_id: int
    epoch: int
    partition: int
    worker: int
    start: float
    end: float
    kind: str
    loss: float | None = None
    discarded: bool = False


@dataclass(frozen=True)
class DecisionRecord:
    """A decision as applied: ``step`` (0 for start), ``source`` ('start', 'unit', 'epoch',
    'idle'), ``time`` (the engine clock)."""

    step: int
    source: str
    time: float
    decision: Decision


@dataclass
class SimResult:
    """Everything a run did.

    ``log`` interleaves ``('unit', UnitReport)``, ``('epoch', EpochReport)`` and
    ``('decision', DecisionRecord)`` in the order they happened; ``ranking``: (trial_id,
    score) best first over the trials not freed; ``info``: ``tuner.info`` per output trial.
    """

    units: list[SimUnit]
    decisions: list[DecisionRecord]
    unit_reports: list[UnitReport]
    epoch_reports: list[EpochReport]
    log: list[tuple[str, Any]]
    trials: dict[int, TrialState]
    ranking: list[tuple[int, float]]
    info_columns: list[tuple[str, str]]
    info: dict[int, dict[str, Any]]
    makespan: float
    steps: int
    final_state: str

    @property
    def outputs(self) -> list[int]:
        """Trial ids in the outputs (not freed), best first."""
        return [k for k, _ in self.ranking]

    def specs(self) -> dict[int, TrialSpec]:
        return {k: t.spec for k, t in self.trials.items()}


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


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
    roundtrip_state: bool = False,
    rows_per_partition: int = 1000,
) -> SimResult:
    """Run ``tuner`` to the end on the fake engine (semantics in the module docstring).

    ``unit_time(spec, partition)``: seconds of a training unit (``eval_time`` defaults to a
    third of it); ``seed``: the engine's tie-breaks; ``roundtrip_state``: after every step,
    replace the tuner by ``Tuner.from_state_json(tuner.state_json())`` (what a resumed run
    does; the outcome must not change). Raises :class:`AutoMLEngineError` when the tuner
    breaks the contract or stalls, or after ``max_steps`` steps.
    """
    if num_partitions < 1 or num_workers < 1:
        raise ValueError("num_partitions and num_workers must be at least 1")
    if metrics_compute_frequency is not None and metrics_compute_frequency < 1:
        raise ValueError("metrics_compute_frequency must be at least 1")
    model = loss_model if loss_model is not None else SyntheticLoss()
    etime = eval_time or (lambda s, p: EVAL_FRACTION * unit_time(s, p))
    rng = np.random.default_rng(seed)
    held = _holders(num_partitions, num_workers)
    book = TrialBook()
    level: dict[int, float] = {}
    epoch_level: dict[tuple[int, int], float] = {}
    eval_queue: list[tuple[int, int, int]] = []
    eval_left: dict[tuple[int, int], int] = {}
    running: dict[int, tuple[int, int, int, str, float]] = {}
    events: list[tuple[float, int, int]] = []
    units: list[SimUnit] = []
    decisions: list[DecisionRecord] = []
    unit_reports: list[UnitReport] = []
    epoch_reports: list[EpochReport] = []
    log: list[tuple[str, Any]] = []
    now = 0.0
    seq = 0
    step = 0

    def apply(ds: Iterable[Decision], source: str) -> None:
        if not isinstance(ds, list):
            raise AutoMLEngineError(f"{type(tuner).__name__}.{source} must return a list")
        for d in ds:
            book.apply(d)
            rec = DecisionRecord(step, source, now, d)
            decisions.append(rec)
            log.append(("decision", rec))
            if isinstance(d, Launch):
                config_tunables(d.spec)
                if d.spec.parent is None:
                    level[d.spec.trial_id] = model.initial(d.spec)
                else:
                    level[d.spec.trial_id] = level[d.spec.parent]
            elif isinstance(d, Stop) and d.free:
                eval_queue[:] = [e for e in eval_queue if e[0] != d.trial_id]
                for key in [k for k in eval_left if k[0] == d.trial_id]:
                    del eval_left[key]

    def view() -> EngineView:
        return EngineView(num_workers, book.training(), book.paused(), now)

    def idle_loop() -> None:
        calls = 0
        while view().free_slots > 0:
            ds = tuner.on_idle(view())
            if not ds:
                return
            apply(ds, "idle")
            calls += 1
            if calls >= MAX_IDLE_CALLS:
                raise AutoMLEngineError(
                    f"on_idle was called {MAX_IDLE_CALLS} times in one step without "
                    "filling the workers")

    def assign() -> None:
        nonlocal seq
        for w in range(num_workers):
            if w in running:
                continue
            cands: list[tuple[int, list[int]]] = []
            for k, t in book.trials.items():
                if not t.training or t.in_flight:
                    continue
                parts = sorted(held[w] - t.visited)
                if parts:
                    cands.append((k, parts))
            if cands:
                def left(c: tuple[int, list[int]]) -> int:
                    t = book[c[0]]
                    return (t.target - t.completed) * num_partitions - len(t.visited)
                most = max(left(c) for c in cands)
                cands = [c for c in cands if left(c) == most]
                k, parts = cands[int(rng.integers(len(cands)))] if len(cands) > 1 else cands[0]
                p = parts[int(rng.integers(len(parts)))] if len(parts) > 1 else parts[0]
                t = book[k]
                t.in_flight = True
                epoch = t.completed + 1
                secs = float(unit_time(t.spec, p))
                running[w] = (k, epoch, p, "train", now)
                heapq.heappush(events, (now + secs, seq, w))
                seq += 1
                continue
            for i, (k, e, p) in enumerate(eval_queue):
                if p in held[w]:
                    del eval_queue[i]
                    running[w] = (k, e, p, "eval", now)
                    heapq.heappush(events, (now + float(etime(book[k].spec, p)), seq, w))
                    seq += 1
                    break

    def finish_train(w: int, k: int, epoch: int, p: int, start: float) -> None:
        t = book[k]
        t.in_flight = False
        if t.freed:
            units.append(SimUnit(k, epoch, p, w, start, now, "train", None, True))
            return
        loss, new = model.step(t.spec, level[k], epoch, p, num_partitions)
        level[k] = new
        t.visited.add(p)
        units.append(SimUnit(k, epoch, p, w, start, now, "train", loss))
        if len(t.visited) == num_partitions:
            t.completed = epoch
            t.visited = set()
            epoch_level[(k, epoch)] = new
            if book.evaluated(k, epoch, metrics_compute_frequency):
                eval_left[(k, epoch)] = num_partitions
                eval_queue.extend((k, epoch, q) for q in range(num_partitions))
        r = UnitReport(k, epoch, p, loss, rows_per_partition, now - start, now)
        unit_reports.append(r)
        log.append(("unit", r))
        apply(tuner.on_unit(r), "unit")

    def finish_eval(w: int, k: int, epoch: int, p: int, start: float) -> None:
        t = book[k]
        units.append(SimUnit(k, epoch, p, w, start, now, "eval", None, t.freed))
        if (k, epoch) not in eval_left:
            return
        eval_left[(k, epoch)] -= 1
        if eval_left[(k, epoch)]:
            return
        del eval_left[(k, epoch)]
        tl, vl = model.evaluate(t.spec, epoch_level[(k, epoch)], epoch, validation)
        r = EpochReport(k, epoch, tl, {}, vl, {} if validation else None,
                        epoch == t.target, now)
        t.last_eval = (epoch, r.score)
        epoch_reports.append(r)
        log.append(("epoch", r))
        apply(tuner.on_epoch(r), "epoch")

    apply(tuner.start(), "start")
    idle_loop()
    if roundtrip_state:
        tuner = Tuner.from_state_json(tuner.state_json())
    while True:
        assign()
        if not running:
            if book.training():
                raise AutoMLEngineError("training trials cannot be scheduled")
            if tuner.done():
                break
            raise AutoMLEngineError("the AutoML procedure stalled")
        step += 1
        if step > max_steps:
            raise AutoMLEngineError(f"the run did not end within {max_steps} steps")
        end, _, w = heapq.heappop(events)
        now = end
        k, epoch, p, kind, start = running.pop(w)
        if kind == "train":
            finish_train(w, k, epoch, p, start)
        else:
            finish_eval(w, k, epoch, p, start)
        idle_loop()
        if roundtrip_state:
            tuner = Tuner.from_state_json(tuner.state_json())
    info = {k: dict(tuner.info(k)) for k, t in book.trials.items() if not t.freed}
    return SimResult(units, decisions, unit_reports, epoch_reports, log, dict(book.trials),
                     book.ranking(), list(tuner.info_columns()), info,
                     max((u.end for u in units), default=0.0), step, tuner.state_json())
