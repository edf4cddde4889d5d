"""An event-driven fake executor: runs a policy against simulated unit times.

Used by the property tests (every registered policy, with failures and worker churn) and by
the benchmark's what-if numbers (makespan / lower bound). Nothing here touches a database:
units take ``unit_time(config, partition, worker)`` seconds of simulated time, may fail part
way through (the unit is re-queued and nothing of it counts), and workers may leave (their
unit in flight fails), retire (they leave once their unit in flight ends) or join at given
times; with ``cover_lost`` a departed worker's partitions that no replica holds are given to
the remaining workers (as the coordinator does on one server).

The loop: ask the policy (it sees a :class:`~.base.Snapshot`), start what it assigns (checked
by :class:`~.progress.Progress`), jump to the next event (unit end or worker change), repeat
until the policy says :meth:`~.base.Policy.done` or nothing can ever run again.
"""
from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from .base import EVAL, Policy, RunningUnit, SchedulingError, normalise_targets
from .invariants import UnitRecord, lower_bound
from .progress import Progress
from .replicas import cover

__all__ = [
    "FailureFn",
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
fails (0 <= f < 1), or None for success``; ``attempt`` counts from 0 per unit."""

EVAL_FRACTION = 1.0 / 3.0
"""Default evaluation unit time as a fraction of the training unit time (forward pass only)."""


@dataclass(frozen=True)
class WorkerChange:
    """At ``time``, ``worker`` leaves (``action='remove'``: its unit in flight fails;
    ``'retire'``: once its unit in flight ends) or joins holding ``partitions`` (``'add'``)."""

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
    ``completed``: whether all work finished (False when the run got stuck, e.g. a removed
    worker held the only copy of a partition); ``num_workers``: workers at the start;
    ``decisions``: how many times the policy was asked.
    """

    log: tuple[UnitRecord, ...]
    makespan: float
    completed: bool
    num_workers: int
    decisions: int

    @property
    def lower_bound(self) -> float:
        """:func:`~.invariants.lower_bound` of the log with the starting number of workers."""
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
    cover_lost: bool = False,
    max_steps: int = 1_000_000,
) -> SimulationResult:
    """Run ``policy`` on a fake cluster and log every unit.

    - ``configs``: mst_keys; ``epochs``: target epochs, one for all or config -> epochs;
    - ``unit_time``: seconds per training unit, a constant or ``(config, partition, worker)
      -> seconds``; ``eval_time`` likewise for evaluation units (default: a third of
      ``unit_time``);
    - ``eval_epochs``: epochs after which every partition evaluates the config;
    - ``failures``: a :data:`FailureFn`, or ``{(config, epoch, partition): fraction}`` making
      the first attempt of those training units fail after that fraction of their time;
    - ``worker_changes``: :class:`WorkerChange` s; a removed worker's unit in flight fails;
    - ``workers``: worker -> partitions held (default: worker ``w`` holds partition ``w``);
    - ``cover_lost``: when a worker leaves, partitions nobody holds any more go to the
      remaining workers (:func:`~.replicas.cover`).

    Raises :class:`~.base.SchedulingError` if the policy assigns something the invariants
    forbid; returns with ``completed=False`` if the run can never finish.
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
    fail_at = _as_failure_fn(failures)

    # Events: (time, order, seq, payload); order 0 = unit end, 1 = worker change.
    events: list[tuple[float, int, int, int | WorkerChange]] = []
    seq = 0
    for ch in sorted(worker_changes, key=lambda ch: ch.time):
        heapq.heappush(events, (float(ch.time), 1, seq, ch))
        seq += 1
    in_flight: dict[int, tuple[int, float, float, bool]] = {}  # worker -> (token, start, end, ok)
    attempts: dict[tuple[int, int, int, str], int] = {}
    log: list[UnitRecord] = []
    now = 0.0
    decisions = 0
    completed = False

    retiring: set[int] = set()

    def leave(w: int) -> RunningUnit | None:
        lost = progress.remove_worker(w)
        retiring.discard(w)
        if cover_lost:
            for k, parts in cover(progress.workers, num_partitions).items():
                if parts != progress.workers[k]:
                    progress.grant(k, parts)
        return lost

    def record(end: float, ok: bool, u: RunningUnit) -> None:
        _, start, _, _ = in_flight.pop(u.worker)
        log.append(UnitRecord(u.config, u.epoch, u.partition, u.worker, u.kind, start, end, ok))

    for _ in range(max_steps):
        snap = progress.snapshot(now)
        if policy.done(snap):
            completed = progress.all_done()
            break
        decisions += 1
        for a in policy.assign(snap):
            unit = progress.start(a)
            key = (a.config, a.epoch, a.partition, a.kind)
            attempt = attempts.get(key, 0)
            attempts[key] = attempt + 1
            t = (eval_t if a.kind == EVAL else train_t)(a.config, a.partition, a.worker)
            if t < 0:
                raise ValueError(f"negative unit time {t} for {unit}")
            frac = fail_at(a.config, a.epoch, a.partition, a.worker, a.kind, attempt)
            ok = frac is None
            end = now + (t if frac is None else max(0.0, min(1.0, float(frac))) * t)
            in_flight[a.worker] = (seq, now, end, ok)
            heapq.heappush(events, (end, 0, seq, a.worker))
            seq += 1
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, token, payload = heapq.heappop(events)
            if isinstance(payload, WorkerChange):
                if payload.action == "add":
                    progress.add_worker(payload.worker, payload.partitions)
                    continue
                if payload.worker not in progress.workers:
                    raise SchedulingError(f"cannot remove absent worker {payload.worker}")
                if payload.action == "retire" and payload.worker in progress.running:
                    retiring.add(payload.worker)
                    continue
                lost = leave(payload.worker)
                if lost is not None:
                    record(now, False, lost)
            elif payload in in_flight and in_flight[payload][0] == token:
                ok, began = in_flight[payload][3], in_flight[payload][1]
                done = progress.finish(payload, ok)
                if ok and done.kind != EVAL:
                    progress.observe(done.config, now - began, done.epoch)
                record(now, ok, done)
                if payload in retiring:
                    leave(payload)
            # else: the worker left meanwhile; its unit was already failed
    else:
        raise RuntimeError(f"simulation did not end within {max_steps} steps")

    log.sort(key=lambda r: (r.start, r.worker))
    makespan = max((r.end for r in log), default=0.0)
    return SimulationResult(tuple(log), makespan, completed, num_workers, decisions)

