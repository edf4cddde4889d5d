"""Bookkeeping of a fit's progress, shared by the coordinator and the simulator.

:class:`Progress` tracks epochs, visits, units in flight, pending evaluation units and live
workers; it builds the :class:`~.base.Snapshot` a policy sees and refuses any assignment that
would break an invariant (completeness, model isolation, worker exclusivity), so a buggy
policy fails loudly instead of training a config twice on a partition.

Queued units (pipelined dispatch). A busy worker may hold one *queued* unit, decided on
:meth:`Progress.ahead` (this progress as if the worker's unit in flight had ended well) and
started by :meth:`Progress.finish` when that unit does end well; if it fails, the queued
unit is dropped (it never ran). Until then a queued unit counts as in flight for everybody
else: its config is training and its evaluation unit is not pending, so no other worker
takes either.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from .base import (
    EVAL,
    TRAIN,
    Assignment,
    EvalUnit,
    RunningUnit,
    SchedulingError,
    Snapshot,
    eval_epochs_for,
    normalise_targets,
)

__all__ = ["Progress"]


class Progress:
    """Mutable progress of one fit.

    ``targets``: config -> epochs to train (or give ``configs`` order via a dict).
    ``workers``: worker -> partitions it holds. ``eval_epochs``: the epochs after which every
    partition evaluates the config (one set for all configs, or config -> set).
    """

    def __init__(
        self,
        targets: Mapping[int, int],
        num_partitions: int,
        workers: Mapping[int, Iterable[int]],
        eval_epochs: Collection[int] | Mapping[int, Collection[int]] = (),
    ) -> None:
        if num_partitions < 1:
            raise SchedulingError(f"num_partitions must be at least 1, got {num_partitions}")
        self.num_partitions = num_partitions
        self.targets: dict[int, int] = normalise_targets(targets, targets)
        self.completed: dict[int, int] = {c: 0 for c in self.targets}
        self.visited: dict[int, set[int]] = {c: set() for c in self.targets}
        self.workers: dict[int, frozenset[int]] = {}
        for w, parts in workers.items():
            self.add_worker(w, parts)
        self.running: dict[int, RunningUnit] = {}
        self.queued: dict[int, RunningUnit] = {}
        self._queued_taken: set[int] = set()  # queued evaluation units already not pending
        self.pending_evals: list[EvalUnit] = []
        self._eval_epochs = eval_epochs
        self._samples: dict[int, list[tuple[int, float]]] = {}
        self._clock = 0.0  # ``now`` of the latest snapshot: when units started since began
        self.started: dict[int, float] = {}
        self.read: dict[int, set[int]] = {}  # worker -> partitions it has started a unit on
        self._cold: list[float] = []  # measured first reads of a partition by a worker
        self._cold_seen: set[tuple[int, int]] = set()
        self._eval_samples: dict[int, list[float]] = {}

    # -- what the policy sees -------------------------------------------------------------

    def snapshot(self, now: float = 0.0) -> Snapshot:
        """A frozen view for the policy."""
        self._clock = now
        return Snapshot(
            num_partitions=self.num_partitions,
            target_epochs=self.targets,
            completed_epochs=self.completed,
            visited={c: frozenset(v) for c, v in self.visited.items()},
            running=tuple(self.running[w] for w in sorted(self.running))
            + tuple(self.queued[w] for w in sorted(self.queued)),
            workers=self.workers,
            idle_workers=tuple(w for w in sorted(self.workers) if w not in self.running),
            pending_evals=tuple(self.pending_evals),
            now=now,
            unit_seconds={c: _estimate(v) for c, v in self._samples.items()},
            warm={w: frozenset(v) for w, v in self.read.items()},
            started={w: self.started[w] for w in self.running if w in self.started},
            cold_read_seconds=sum(self._cold) / len(self._cold) if self._cold else None,
            eval_seconds={c: sum(v) / len(v) for c, v in self._eval_samples.items()},
        )

    def observe(self, config: int, seconds: float | None, epoch: int | None = None) -> None:
        """A successful training unit of ``config`` (in ``epoch``; default: the epoch it is
        in, or has just completed) took ``seconds``: its measured cost, which cost-aware
        policies see as :attr:`Snapshot.unit_seconds` (see :func:`_estimate`)."""
        if seconds is None or not seconds >= 0 or config not in self.targets:
            return
        if epoch is None:
            epoch = self.completed[config] + (0 if not self.visited[config] else 1)
        self._samples.setdefault(config, []).append((int(epoch), float(seconds)))

    def observe_read(self, worker: int, partition: int, seconds: float | None) -> None:
        """A successful unit of ``worker`` on ``partition`` spent ``seconds`` reading its
        rows: the first one a worker reports for a partition is a cold read, whose mean
        policies see as :attr:`Snapshot.cold_read_seconds`."""
        if seconds is None or not seconds >= 0 or (worker, partition) in self._cold_seen:
            return
        self._cold_seen.add((worker, partition))
        self._cold.append(float(seconds))

    def observe_eval(self, config: int, seconds: float | None) -> None:
        """A successful evaluation unit of ``config`` took ``seconds``
        (:attr:`Snapshot.eval_seconds`)."""
        if seconds is None or not seconds >= 0 or config not in self.targets:
            return
        self._eval_samples.setdefault(config, []).append(float(seconds))

    def all_done(self) -> bool:
        """Every config at its target, every evaluation done, nothing in flight."""
        return (
            not self.running
            and not self.pending_evals
            and all(self.completed[c] >= t for c, t in self.targets.items())
        )

    # -- workers ----------------------------------------------------------------------------

    def add_worker(self, worker: int, partitions: Iterable[int]) -> None:
        """A worker joins (or re-joins) holding ``partitions``."""
        if worker in self.workers:
            raise SchedulingError(f"worker {worker} is already present")
        parts = frozenset(int(q) for q in partitions)
        bad = sorted(q for q in parts if not 0 <= q < self.num_partitions)
        if bad:
            raise SchedulingError(f"worker {worker} holds unknown partitions {bad}")
        self.workers[worker] = parts

    def grant(self, worker: int, partitions: Iterable[int]) -> None:
        """``worker`` now also holds ``partitions`` (a lost or removed worker's partitions
        that no replica serves); its unit in flight, if any, is unaffected."""
        if worker not in self.workers:
            raise SchedulingError(f"worker {worker} is not present")
        parts = frozenset(int(q) for q in partitions)
        bad = sorted(q for q in parts if not 0 <= q < self.num_partitions)
        if bad:
            raise SchedulingError(f"worker {worker} cannot hold unknown partitions {bad}")
        self.workers[worker] = self.workers[worker] | parts

    def remove_worker(self, worker: int) -> RunningUnit | None:
        """A worker leaves; its unit in flight (returned) fails and is re-queued."""
        if worker not in self.workers:
            raise SchedulingError(f"worker {worker} is not present")
        unit = self.finish(worker, ok=False) if worker in self.running else None
        del self.workers[worker]
        self.read.pop(worker, None)
        return unit

    # -- units ------------------------------------------------------------------------------

    def set_target(self, config: int, epochs: int) -> None:
        """Change a config's target (an AutoML policy stopping or extending it)."""
        if config not in self.targets:
            raise SchedulingError(f"unknown config {config}")
        self.targets[config] = max(int(epochs), self.completed[config])

    def check(self, a: Assignment) -> None:
        """Raise :class:`SchedulingError` if starting ``a`` now would break an invariant."""
        where = f"assignment {a}"
        if a.worker not in self.workers:
            raise SchedulingError(f"{where}: worker {a.worker} is not present")
        if a.worker in self.running or a.worker in self.queued:
            raise SchedulingError(f"{where}: worker {a.worker} is busy")
        if a.partition not in self.workers[a.worker]:
            raise SchedulingError(f"{where}: worker {a.worker} does not hold the partition")
        if a.config not in self.targets:
            raise SchedulingError(f"{where}: unknown config")
        if a.kind == TRAIN:
            if self.completed[a.config] >= self.targets[a.config]:
                raise SchedulingError(f"{where}: config is finished")
            if a.epoch != self.completed[a.config] + 1:
                raise SchedulingError(
                    f"{where}: config is in epoch {self.completed[a.config] + 1}"
                )
            if any(u.config == a.config and u.kind == TRAIN
                   for u in (*self.running.values(), *self.queued.values())):
                raise SchedulingError(f"{where}: config is already training")
            if a.partition in self.visited[a.config]:
                raise SchedulingError(f"{where}: partition already visited this epoch")
        elif a.kind == EVAL:
            if EvalUnit(a.config, a.epoch, a.partition) not in self.pending_evals:
                raise SchedulingError(f"{where}: no such pending evaluation unit")
        else:
            raise SchedulingError(f"{where}: unknown kind {a.kind!r}")

    def start(self, a: Assignment) -> RunningUnit:
        """Start ``a`` (checked first)."""
        self.check(a)
        if a.kind == EVAL:
            self.pending_evals.remove(EvalUnit(a.config, a.epoch, a.partition))
        unit = RunningUnit(a.worker, a.config, a.epoch, a.partition, a.kind)
        self.running[a.worker] = unit
        self.started[a.worker] = self._clock
        self.read.setdefault(a.worker, set()).add(a.partition)
        return unit

    def finish(self, worker: int, ok: bool) -> RunningUnit:
        """The unit on ``worker`` ended; if not ``ok`` nothing of it counts and it is re-queued.
        The worker's queued unit, if any, starts when it ended ``ok``, else is dropped."""
        unit = self.running.pop(worker, None)
        if unit is None:
            raise SchedulingError(f"worker {worker} is not running a unit")
        nxt = self.queued.pop(worker, None)
        taken = worker in self._queued_taken
        self._queued_taken.discard(worker)
        if unit.kind == EVAL:
            if not ok:
                self.pending_evals.append(EvalUnit(unit.config, unit.epoch, unit.partition))
        elif ok:
            self._visit(unit.config, unit.partition)
        if nxt is not None:
            a = Assignment(worker, nxt.config, nxt.epoch, nxt.partition, nxt.kind)
            if ok:
                if taken:  # not pending since it was queued: check it as if it were
                    self.pending_evals.append(EvalUnit(a.config, a.epoch, a.partition))
                self.start(a)
            elif taken:
                self.pending_evals.append(EvalUnit(a.config, a.epoch, a.partition))
        return unit

    def ahead(self, worker: int) -> Progress:
        """A copy of this progress as if ``worker``'s unit in flight had ended well (the
        progress a queued unit for it is decided and checked on)."""
        if worker not in self.running:
            raise SchedulingError(f"worker {worker} is not running a unit")
        p = Progress.__new__(Progress)
        p.num_partitions, p.targets = self.num_partitions, dict(self.targets)
        p.completed = dict(self.completed)
        p.visited = {c: set(v) for c, v in self.visited.items()}
        p.workers = dict(self.workers)
        p.running, p.queued = dict(self.running), dict(self.queued)
        p._queued_taken = set(self._queued_taken)
        p.pending_evals = list(self.pending_evals)
        p._eval_epochs, p._samples = self._eval_epochs, self._samples
        p._clock, p.started = self._clock, dict(self.started)
        p.read = {w: set(v) for w, v in self.read.items()}
        p._cold, p._cold_seen, p._eval_samples = self._cold, self._cold_seen, self._eval_samples
        p.finish(worker, True)
        return p

    def queue(self, a: Assignment, ahead: Progress) -> RunningUnit:
        """Queue ``a`` on its busy worker (checked on ``ahead``, :meth:`ahead` of it)."""
        if a.worker not in self.running or a.worker in self.queued:
            raise SchedulingError(f"queued assignment {a}: worker {a.worker} is not running "
                                  "a unit, or has one queued already")
        ahead.check(a)
        u = EvalUnit(a.config, a.epoch, a.partition)
        if a.kind == EVAL and u in self.pending_evals:
            self.pending_evals.remove(u)
            self._queued_taken.add(a.worker)
        unit = RunningUnit(a.worker, a.config, a.epoch, a.partition, a.kind)
        self.queued[a.worker] = unit
        self.read.setdefault(a.worker, set()).add(a.partition)
        return unit

    def forget_reads(self, worker: int) -> None:
        """``worker`` has a fresh session (its old one was lost): it holds no partition's
        rows until it reads them again, so every partition is cold for it
        (:attr:`Snapshot.warm`)."""
        self.read.pop(worker, None)

    def take(self, a: Assignment) -> None:
        """Take the pending evaluation unit ``a`` out of the pending ones: its worker runs it
        after the unit it is sent with (an evaluation bundle, started by :meth:`start_taken`
        or handed back by :meth:`give_back`)."""
        u = EvalUnit(a.config, a.epoch, a.partition)
        if a.kind != EVAL or u not in self.pending_evals:
            raise SchedulingError(f"assignment {a}: no such pending evaluation unit")
        self.pending_evals.remove(u)

    def give_back(self, a: Assignment) -> None:
        """An evaluation unit taken by :meth:`take` is pending again (it did not run)."""
        self.pending_evals.append(EvalUnit(a.config, a.epoch, a.partition))

    def start_taken(self, a: Assignment) -> RunningUnit:
        """Start an evaluation unit taken by :meth:`take` (checked as if it were pending)."""
        self.give_back(a)
        return self.start(a)

    def _visit(self, config: int, partition: int) -> None:
        seen = self.visited[config]
        seen.add(partition)
        if len(seen) == self.num_partitions:
            seen.clear()
            self.completed[config] += 1
            epoch = self.completed[config]
            if epoch in eval_epochs_for(self._eval_epochs, config):
                self.pending_evals.extend(
                    EvalUnit(config, epoch, q) for q in range(self.num_partitions)
                )

    # -- resume -----------------------------------------------------------------------------

    @classmethod
    def from_log(
        cls,
        records: Iterable[Any],
        targets: Mapping[int, int],
        num_partitions: int,
        workers: Mapping[int, Iterable[int]],
        eval_epochs: Collection[int] | Mapping[int, Collection[int]] = (),
    ) -> Progress:
        """Rebuild progress from a unit log (successful units, replayed by end time).

        Records are mappings or objects with config, epoch, partition, kind, end, ok; units
        that were in flight when the log was cut are simply not there, hence re-queued.
        """
        from .invariants import as_record

        p = cls(targets, num_partitions, workers, eval_epochs)
        recs = sorted((as_record(r) for r in records if _get(r, "ok")), key=lambda r: r.end)
        for r in recs:
            if r.kind == TRAIN:
                if r.epoch != p.completed[r.config] + 1 or r.partition in p.visited[r.config]:
                    raise SchedulingError(f"unit log is inconsistent at {r}")
                p._visit(r.config, r.partition)
            else:
                u = EvalUnit(r.config, r.epoch, r.partition)
                if u not in p.pending_evals:
                    raise SchedulingError(f"unit log is inconsistent at {r}")
                p.pending_evals.remove(u)
        return p


def _estimate(samples: list[tuple[int, float]]) -> float:
    """A config's expected training unit time from its measured units ``(epoch, seconds)``:
    the mean over the latest epoch measured, leaving out the config's very first unit when
    another unit of that epoch is measured (the first one also builds the model and traces
    its training step, a one-off cost that would make the config look dearer than it is)."""
    last = samples[-1][0]
    recent = [t for e, t in samples[1:] if e == last]
    if not recent:  # the first unit is the only one measured
        recent = [samples[0][1]]
    return sum(recent) / len(recent)


def _get(r: Any, key: str) -> Any:
    return r[key] if isinstance(r, Mapping) else getattr(r, key)
