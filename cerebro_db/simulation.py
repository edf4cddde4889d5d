"""The production fit loop on a simulated clock: a fake executor, and :func:`simulate` for
scheduling policies.

:class:`SimulatedExecutor` is a :class:`cerebro_db.coordinator.Executor` whose units take
simulated time: :meth:`~SimulatedExecutor.submit` schedules a unit's end (or its failure
part way through), :meth:`~SimulatedExecutor.wait` moves the clock to the next event and
returns what ended; every attempt is logged as a
:class:`~cerebro_db.scheduling.UnitRecord`. Subclasses say how long a unit takes and what it
returns; :mod:`cerebro_db.automl.simulate` adds a loss model and runs the AutoML engine.

:func:`simulate` runs a scheduling policy through :func:`cerebro_db.coordinator.run_fit`
(the loop fits run) on that executor: units take ``unit_time(config, partition, worker)``
seconds, may fail part way through (the worker session is lost and recovered: the
coordinator re-queues the unit, which counts for nothing), and workers leave or join at
given times through the coordinator's :class:`~cerebro_db.coordinator.WorkerPool`
protocol. Used by the property tests (every registered policy, with failures and worker
churn) and by the benchmark's what-if numbers (makespan / lower bound). Nothing here
touches a database.

What the production loop decides, the simulation follows: a worker that leaves takes its
partitions with it and those no other worker holds go to the workers left
(:func:`~cerebro_db.scheduling.cover`); a joining worker gets a fresh id (one above the
highest so far); a retirement takes the highest worker id and waits for its unit in flight.
"""
from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, cast

from .coordinator import NoWorkerLeft, run_fit
from .errors import CerebroError
from .scheduling import (
    EVAL,
    Assignment,
    Policy,
    Progress,
    RunningUnit,
    SchedulingError,
    Snapshot,
    UnitRecord,
    lower_bound,
)
from .scheduling.base import normalise_targets

__all__ = [
    "FailureFn",
    "SimulatedExecutor",
    "SimulationResult",
    "TimeFn",
    "WorkerChange",
    "random_failures",
    "simulate",
]

TimeFn = Callable[[int, int, int], float]
"""``(config, partition, worker) -> seconds``."""
FailureFn = Callable[[int, int, int, int, str, int], Optional[float]]
"""``(config, epoch, partition, worker, kind, attempt) -> fraction of the unit after which it
fails (0 <= f < 1), or None for success``; ``attempt`` counts from 0 per unit (the
coordinator's count of lost attempts)."""

EVAL_FRACTION = 1.0 / 3.0
"""Default evaluation unit time as a fraction of the training unit time (forward pass only)."""

_UNIT_END, _CHANGE = 0, 1  # event order at equal times: units end before workers change


class SimulatedExecutor:
    """An event-driven :class:`cerebro_db.coordinator.Executor` on a simulated clock.

    Subclasses give :meth:`unit_time` and :meth:`result` (and :meth:`failure` to make units
    lose their worker session). With ``batch``, :meth:`wait` returns every unit that ends at
    the next event time (as a real executor returns all finished units); otherwise one unit
    per call. :meth:`change` schedules an event that :meth:`on_change` handles when the
    clock reaches it. :attr:`log` holds every attempt, :attr:`steps` the calls to
    :meth:`wait` (``RuntimeError`` past ``max_steps``). With ``bundle`` > 1 a submit may
    carry that many units (:meth:`bundle`), run one after another and returned together as
    the last ends, like worker sessions' evaluation bundles; a lost session loses them all.
    """

    def __init__(self, *, max_steps: int, batch: bool = False, pipeline: bool = False,
                 bundle: int = 1) -> None:
        self.max_steps, self.batch, self.pipeline = max_steps, batch, pipeline
        self.bundle_size = bundle
        # worker -> a bundle's units after the first (assignment, options, seconds)
        self._then: dict[int, list[tuple[Assignment, dict[str, Any], float]]] = {}
        self._queued: dict[int, tuple[Assignment, dict[str, Any]]] = {}
        self.now = 0.0
        self.steps = 0
        self.log: list[UnitRecord] = []
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        # worker -> (assignment, options, start, token, fails)
        self._running: dict[int, tuple[Assignment, dict[str, Any], float, int, bool]] = {}

    # -- what a subclass says ----------------------------------------------------------

    def unit_time(self, a: Assignment, options: dict[str, Any]) -> float:
        """Seconds the unit takes."""
        raise NotImplementedError

    def failure(self, a: Assignment, options: dict[str, Any]) -> float | None:
        """Fraction of the unit after which its worker session is lost, or None."""
        return None

    def result(self, a: Assignment, options: dict[str, Any], start: float, end: float
               ) -> dict[str, Any]:
        """What a successful unit returns to the coordinator."""
        raise NotImplementedError

    def on_change(self, payload: Any) -> list[tuple[int, bool, dict[str, Any]]]:
        """Handle an event scheduled with :meth:`change`; returns units it ended."""
        raise NotImplementedError

    # -- the Executor protocol ---------------------------------------------------------

    def clock(self) -> float:
        return self.now

    def bundle(self) -> int:
        """Units one :meth:`submit` may carry."""
        return self.bundle_size

    def submit(self, a: Assignment, options: dict[str, Any],
               then: list[tuple[Assignment, dict[str, Any]]] | None = None) -> None:
        secs = float(self.unit_time(a, options))
        more = [(b, o, float(self.unit_time(b, o))) for b, o in then or []]
        if more and len(more) >= self.bundle_size:
            raise RuntimeError(f"a bundle of {len(more) + 1} units for worker {a.worker}")
        if min([secs] + [t for *_, t in more]) < 0:
            raise ValueError(f"negative unit time for {a} or its bundle")
        total = secs + sum(t for *_, t in more)
        frac = self.failure(a, options)
        end = self.now + (total if frac is None else max(0.0, min(1.0, float(frac))) * total)
        self._running[a.worker] = (a, options, self.now, self._seq, frac is not None)
        if more:
            self._then[a.worker] = [(a, options, secs), *more]
        self._push(end, _UNIT_END, a.worker)

    def can_queue(self, worker: int) -> bool:
        """With ``pipeline``: a busy worker takes one next unit, which starts as its unit in
        flight ends well (dropped if that unit's session is lost), like worker sessions'
        chains (:class:`cerebro_db.executors.DblinkExecutor`)."""
        return self.pipeline and worker in self._running and worker not in self._queued

    def queue(self, a: Assignment, options: dict[str, Any]) -> bool:
        if not self.can_queue(a.worker):
            raise RuntimeError(f"worker {a.worker} cannot queue {a}")
        self._queued[a.worker] = (a, options)
        return True

    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        self.steps += 1
        if self.steps > self.max_steps:
            raise RuntimeError(f"the simulated run did not end within {self.max_steps} steps")
        if not self._events:
            raise RuntimeError("the simulated executor has nothing in flight to wait for")
        self.now = self._events[0][0]
        out: list[tuple[int, bool, dict[str, Any]]] = []
        while self._events and self._events[0][0] == self.now and (self.batch or not out):
            _, order, token, payload = heapq.heappop(self._events)
            if order == _CHANGE:
                out.extend(self.on_change(payload))
                continue
            entry = self._running.get(payload)
            if entry is not None and entry[3] == token:  # else: ended earlier (lost)
                out.extend(self._end(payload, lost=entry[4]))
        return out

    def recover(self, worker: int) -> bool:
        return True

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        pass

    # -- helpers -----------------------------------------------------------------------

    def change(self, time: float, payload: Any) -> None:
        self._push(float(time), _CHANGE, payload)

    def running(self, worker: int) -> bool:
        return worker in self._running

    def lose(self, worker: int, message: str) -> tuple[int, bool, dict[str, Any]]:
        """End ``worker``'s unit in flight now: its session is lost."""
        return self._end(worker, lost=True, message=message)[0]

    def _push(self, time: float, order: int, payload: Any) -> None:
        heapq.heappush(self._events, (time, order, self._seq, payload))
        self._seq += 1

    def _end(self, worker: int, *, lost: bool, message: str = "simulated session loss"
             ) -> list[tuple[int, bool, dict[str, Any]]]:
        a, opts, start, _, _ = self._running.pop(worker)
        units = self._then.pop(worker, None)
        nxt = self._queued.pop(worker, None)
        if lost or units is None:
            self.log.append(UnitRecord(a.config, a.epoch, a.partition, worker, a.kind, start,
                                       self.now, not lost))
        if lost:
            return [(worker, False, {"lost": True, "message": message})]
        if units is None:
            out = [(worker, True, self.result(a, opts, start, self.now))]
        else:  # a bundle: its units one after another, the last ending now
            out, t = [], start
            for i, (u, o, secs) in enumerate(units):
                end = self.now if i == len(units) - 1 else t + secs
                self.log.append(UnitRecord(u.config, u.epoch, u.partition, worker, u.kind, t,
                                           end, True))
                out.append((worker, True, self.result(u, o, t, end)))
                t = end
        if nxt is not None:
            self.submit(*nxt)
        return out


# --------------------------------------------------------------------------------------------
# Scheduling policies on the simulated cluster
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerChange:
    """At ``time``, ``worker`` leaves (``action='remove'``: its session is lost, its unit in
    flight fails; ``'retire'``: the coordinator retires it once its unit in flight ends) or a
    worker joins holding ``partitions`` (``'add'``; later changes name it ``worker``, while
    the coordinator gives it a fresh id)."""

    time: float
    action: str
    worker: int
    partitions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.action not in ("add", "remove", "retire"):
            raise ValueError(f"action must be 'add', 'remove' or 'retire', got {self.action!r}")
        object.__setattr__(self, "partitions", tuple(self.partitions))


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` returns.

    ``log``: every unit attempt, in start order; ``makespan``: end of the last unit;
    ``completed``: whether all work finished (False when the coordinator stopped with
    nothing left to run, e.g. every worker left); ``num_workers``: workers at the start;
    ``decisions``: how many times the policy was asked.
    """

    log: tuple[UnitRecord, ...]
    makespan: float
    completed: bool
    num_workers: int
    decisions: int

    @property
    def lower_bound(self) -> float:
        """:func:`~cerebro_db.scheduling.lower_bound` of the log with the starting number of
        workers."""
        return lower_bound(self.log, self.num_workers)

    @property
    def ratio(self) -> float:
        """``makespan / lower_bound`` (1.0 for an empty run)."""
        lb = self.lower_bound
        return self.makespan / lb if lb > 0 else 1.0

    def busy_time(self) -> float:
        """Sum of the durations of all unit attempts (training, evaluation, failed)."""
        return sum(r.duration for r in self.log)


def _as_time_fn(t: TimeFn | float) -> TimeFn:
    if callable(t):
        return t
    value = float(t)
    return lambda c, q, w: value


def random_failures(rate: float, seed: int = 0, max_attempts: int = 3) -> FailureFn:
    """Each attempt fails with probability ``rate`` (at a uniform point), deterministically
    from ``seed`` and the unit; attempt ``max_attempts - 1`` and later always succeed."""

    def fail(c: int, e: int, q: int, w: int, kind: str, attempt: int) -> float | None:
        if attempt >= max_attempts - 1:
            return None
        rng = random.Random(f"{seed}:{c}:{e}:{q}:{kind}:{attempt}")
        return rng.random() if rng.random() < rate else None

    return fail


def _as_failure_fn(
    failures: FailureFn | Mapping[tuple[int, int, int], float] | None,
) -> FailureFn:
    if failures is None:
        return lambda *a: None
    if callable(failures):
        return failures
    table = dict(failures)

    def first_attempt(c: int, e: int, q: int, w: int, kind: str, attempt: int) -> float | None:
        return table.get((c, e, q)) if attempt == 0 and kind != EVAL else None

    return first_attempt


class _Cluster(SimulatedExecutor):
    """The executor and the :class:`~cerebro_db.coordinator.WorkerPool` of :func:`simulate`.

    A removed worker's unit in flight ends lost and the worker cannot reconnect, so the
    coordinator drops it; an idle removed worker is found lost on its next unit (which then
    never started: it is not logged). Adds and retirements reach the coordinator as a new
    number of workers at its next poll.
    """

    poll_interval = 0.0

    def __init__(self, progress: Progress, train_t: TimeFn, eval_t: TimeFn, fail_at: FailureFn,
                 changes: Iterable[WorkerChange], max_steps: int, pipeline: bool = False,
                 read_time: float | None = None, bundle: int = 1) -> None:
        super().__init__(max_steps=max_steps, batch=True, pipeline=pipeline, bundle=bundle)
        self.progress = progress
        self.read_time = read_time
        self._read: set[tuple[int, int]] = set()  # (worker, partition) read so far
        self._reading: dict[int, float] = {}  # worker -> its unit in flight's read
        self.train_t, self.eval_t, self.fail_at = train_t, eval_t, fail_at
        self.ids = {w: w for w in progress.workers}  # a change's worker name -> worker id
        self.dead: set[int] = set()
        self.retired: set[int] = set()
        self._adds: list[tuple[int, tuple[int, ...]]] = []
        self._retires: list[int] = []
        self._joining: list[tuple[int, tuple[int, ...]]] = []
        for ch in sorted(changes, key=lambda ch: ch.time):
            self.change(ch.time, ch)

    def unit_time(self, a: Assignment, options: dict[str, Any]) -> float:
        t = (self.eval_t if a.kind == EVAL else self.train_t)(a.config, a.partition, a.worker)
        if self.read_time is None:
            return t
        cold = (a.worker, a.partition) not in self._read
        self._read.add((a.worker, a.partition))
        self._reading[a.worker] = self.read_time if cold else 0.0
        return t + self._reading[a.worker]

    def failure(self, a: Assignment, options: dict[str, Any]) -> float | None:
        return self.fail_at(a.config, a.epoch, a.partition, a.worker, a.kind,
                            int(options.get("attempt", 0)))

    def submit(self, a: Assignment, options: dict[str, Any],
               then: list[tuple[Assignment, dict[str, Any]]] | None = None) -> None:
        if a.worker in self.dead:  # its session is gone: the unit fails at once, unrun
            self._push(self.now, _CHANGE, ("lost", a.worker))
            return
        super().submit(a, options, then)

    def result(self, a: Assignment, options: dict[str, Any], start: float, end: float
               ) -> dict[str, Any]:
        # No training happens: there is no loss to report.
        out: dict[str, Any] = {"seconds": end - start}
        if self.read_time is not None:
            out["read_seconds"] = self._reading.get(a.worker, 0.0)
        if a.kind == EVAL:
            return {**out, "evals": {k: {"loss": math.nan, "rows": 0, "metrics": {}}
                                     for k in options.get("eval_kinds", ())}}
        return {**out, "loss": math.nan, "rows": 0}

    def recover(self, worker: int) -> bool:
        """A lost session of a worker still present reopens, with nothing read yet."""
        if worker in self.dead:
            return False
        self._read = {(w, q) for w, q in self._read if w != worker}
        return True

    def on_change(self, payload: Any) -> list[tuple[int, bool, dict[str, Any]]]:
        if isinstance(payload, tuple):  # a unit submitted to a dead worker
            return [(payload[1], False, {"lost": True, "message": "worker removed"})]
        ch: WorkerChange = payload
        if ch.action == "add":
            self._adds.append((ch.worker, ch.partitions))
            return []
        w = self.ids.get(ch.worker)
        gone = self.dead | (self.retired if ch.action == "retire" else set())
        if w is None or w not in self.progress.workers or w in gone:
            raise SchedulingError(f"cannot {ch.action} absent worker {ch.worker}")
        if ch.action == "retire":
            self._retires.append(w)
            return []
        self.dead.add(w)
        del self.ids[ch.worker]
        return [self.lose(w, "worker removed")] if self.running(w) else []

    # -- the WorkerPool protocol -------------------------------------------------------

    def requested(self) -> int | None:
        if not (self._adds or self._retires):
            return None
        self.retired &= set(self.progress.workers)
        active = sorted(set(self.progress.workers) - self.retired)  # as the coordinator counts
        for w in self._retires:
            if not active or w != active[-1]:
                raise SchedulingError(
                    f"cannot retire worker {w}: the coordinator retires the highest worker "
                    f"id first ({active[-1] if active else 'none left'})")
            active.pop()
            self.retired.add(w)
        # a retiring worker asked to stay takes the place of a joining one
        leaving = self.retired - set(self._retires)
        stay = min(len(self._adds), len(leaving))
        for _ in range(stay):
            w = min(leaving)
            leaving.discard(w)
            self.retired.discard(w)
        self._joining.extend(self._adds[stay:])
        want = len(active) + len(self._adds)
        self._adds, self._retires = [], []
        return want

    def holds(self, worker: int) -> frozenset[int]:
        _, parts = self._joining[0]
        return frozenset(parts)

    def join(self, worker: int, partitions: frozenset[int]) -> bool:
        name, _ = self._joining.pop(0)
        self.ids[name] = worker
        return True

    def leave(self, worker: int, status: str) -> None:
        self.retired.discard(worker)

    def granted(self, worker: int, partitions: frozenset[int]) -> None:
        pass


class _Counted:
    """The policy under simulation; counts the times it is asked."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.decisions = policy, 0
        self.lookahead = policy.lookahead

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        self.decisions += 1
        return self.policy.assign(snapshot)


def simulate(
    policy: Policy,
    configs: Sequence[int],
    num_partitions: int,
    epochs: int | Mapping[int, int],
    unit_time: TimeFn | float,
    *,
    eval_epochs: Collection[int] | Mapping[int, Collection[int]] = (),
    eval_time: TimeFn | float | None = None,
    failures: FailureFn | Mapping[tuple[int, int, int], float] | None = None,
    worker_changes: Iterable[WorkerChange] = (),
    workers: Mapping[int, Iterable[int]] | None = None,
    max_steps: int = 1_000_000,
    max_unit_retries: int = 1000,
    pipeline: bool = False,
    read_time: float | None = None,
    bundle: int = 1,
) -> SimulationResult:
    """Run ``policy`` through the coordinator's fit loop on a fake cluster; log every unit.

    - ``configs``: mst_keys; ``epochs``: target epochs, one for all or config -> epochs;
    - ``unit_time``: seconds per training unit, a constant or ``(config, partition, worker)
      -> seconds``; ``eval_time`` likewise for evaluation units (default: a third of
      ``unit_time``);
    - ``eval_epochs``: epochs after which every partition evaluates the config;
    - ``failures``: a :data:`FailureFn`, or ``{(config, epoch, partition): fraction}`` making
      the first attempt of those training units fail after that fraction of their time;
    - ``worker_changes``: :class:`WorkerChange` s;
    - ``workers``: worker -> partitions held (default: worker ``w`` holds partition ``w``);
    - ``max_unit_retries``: the coordinator's limit of lost attempts per unit;
    - ``pipeline``: busy workers take their next unit ahead (pipelined dispatch), as worker
      sessions do;
    - ``read_time``: seconds a worker's first unit on a partition spends reading it (on
      top of its unit time), reported as the unit's ``read_seconds`` like worker sessions
      do; None (default): reads cost nothing and are not reported;
    - ``bundle``: evaluation units one statement may carry (``cerebro_db.eval_bundle``).

    Raises :class:`~cerebro_db.scheduling.SchedulingError` if the policy assigns something
    the invariants forbid, :class:`~cerebro_db.coordinator.WorkerFailed` past
    ``max_unit_retries``; returns with ``completed=False`` if the coordinator found nothing
    left to run (every worker gone, or none that holds what is left).
    """
    targets = normalise_targets(configs, epochs)
    if workers is None:
        workers = {w: (w,) for w in range(num_partitions)}
    progress = Progress(targets, num_partitions, workers, eval_epochs)
    num_workers = len(progress.workers)
    train_t = _as_time_fn(unit_time)
    if eval_time is None:
        eval_t: TimeFn = lambda c, q, w: EVAL_FRACTION * train_t(c, q, w)
    else:
        eval_t = _as_time_fn(eval_time)
    cluster = _Cluster(progress, train_t, eval_t, _as_failure_fn(failures), worker_changes,
                       max_steps, pipeline, read_time, bundle)
    counted = _Counted(policy)
    try:
        run_fit(cast(Policy, counted), progress, cluster, eval_kinds=["eval_train"],
                num_partitions=num_partitions, snapshot_epochs=lambda c, e: False,
                clock=cluster.clock, max_unit_retries=max_unit_retries, pool=cluster)
        completed = True
    except CerebroError as e:
        if "nothing to run" not in str(e) and not isinstance(e, NoWorkerLeft):
            raise
        completed = False
    log = sorted(cluster.log, key=lambda r: (r.start, r.worker))
    makespan = max((r.end for r in log), default=0.0)
    return SimulationResult(tuple(log), makespan, completed, num_workers, counted.decisions)
