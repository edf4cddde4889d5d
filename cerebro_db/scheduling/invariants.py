"""Checks of a unit log against the MOP invariants, and the makespan lower bound.

A log is a plain list of records, each a mapping or an object with ``config, epoch,
partition, worker, kind, start, end, ok`` (``kind`` is ``'train'`` or ``'eval'``; epochs count
from 1), so the same checks run on the simulator's log and on the unit table of a real fit.

Invariants checked (docs/architecture.md):

- worker exclusivity: the units (training and evaluation) of a worker never overlap;
- model isolation: the training units of a config never overlap;
- completeness: in each epoch a config trains successfully on every partition exactly once;
- non-preemption: a failed unit counts for nothing: it is retried later, a success is never
  followed by another attempt, and the config's next epoch starts only after the successful
  units of this one have ended;
- evaluation: each evaluated (config, epoch) is evaluated successfully on every partition
  exactly once, after the config's epoch has ended.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .base import EVAL, KINDS, TRAIN, eval_epochs_for

__all__ = [
    "InvariantError",
    "UnitRecord",
    "as_record",
    "check_invariants",
    "find_violations",
    "lower_bound",
    "partition_bound",
]


@dataclass(frozen=True)
class UnitRecord:
    """One attempt of a unit, as logged."""

    config: int
    epoch: int
    partition: int
    worker: int
    kind: str
    start: float
    end: float
    ok: bool

    @property
    def duration(self) -> float:
        """``end - start``."""
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        """A plain dict with the eight keys."""
        return asdict(self)


class InvariantError(AssertionError):
    """A unit log breaks an invariant; ``violations`` lists every problem found."""

    def __init__(self, violations: list[str]) -> None:
        shown = violations[:10]
        more = f"\n... and {len(violations) - 10} more" if len(violations) > 10 else ""
        super().__init__(
            f"{len(violations)} invariant violation(s):\n" + "\n".join(shown) + more
        )
        self.violations = violations


_FIELDS = ("config", "epoch", "partition", "worker", "kind", "start", "end", "ok")


def as_record(r: Any) -> UnitRecord:
    """A :class:`UnitRecord` from a mapping or an object with the eight fields."""
    if isinstance(r, UnitRecord):
        return r
    if isinstance(r, Mapping):
        f: dict[str, Any] = {k: r.get(k) for k in _FIELDS}
    else:
        f = {k: getattr(r, k, None) for k in _FIELDS}
    missing = [k for k in _FIELDS if k != "kind" and f[k] is None]
    if missing:
        raise ValueError(f"unit record {r!r} lacks {missing}")
    return UnitRecord(
        config=int(f["config"]),
        epoch=int(f["epoch"]),
        partition=int(f["partition"]),
        worker=int(f["worker"]),
        kind=str(f["kind"] or TRAIN),
        start=float(f["start"]),
        end=float(f["end"]),
        ok=bool(f["ok"]),
    )


def _overlaps(recs: list[UnitRecord], tol: float) -> list[tuple[UnitRecord, UnitRecord]]:
    out = []
    last: UnitRecord | None = None
    for r in sorted(recs, key=lambda r: (r.start, r.end)):
        if last is not None and r.start < last.end - tol:
            out.append((last, r))
        if last is None or r.end > last.end:
            last = r
    return out


def find_violations(
    log: Iterable[Any],
    *,
    num_partitions: int | None = None,
    epochs: int | Mapping[int, int] | None = None,
    eval_epochs: Collection[int] | Mapping[int, Collection[int]] | None = None,
    complete: bool = True,
    tol: float = 1e-9,
) -> list[str]:
    """Every invariant violation in ``log``, as messages (empty when all hold).

    ``num_partitions``: partitions are ``0 .. num_partitions - 1`` (default: those in the log).
    ``epochs``: target epochs (one for all configs or per config); with it, each config must
    have trained exactly that many. ``eval_epochs``: the epochs that must be evaluated (capped
    at each config's trained epochs); without it, every evaluated epoch must be complete.
    ``complete=False`` accepts a cut log (a fit in progress or aborted): the last epoch may be
    partial and failed units need no retry. ``tol`` absorbs timestamp rounding.
    """
    recs = [as_record(r) for r in log]
    v: list[str] = []
    for r in recs:
        if r.kind not in KINDS:
            v.append(f"unknown kind {r.kind!r} in {r}")
        if r.end < r.start - tol:
            v.append(f"ends before it starts: {r}")
        if r.epoch < 1:
            v.append(f"epochs count from 1: {r}")
    parts = (
        set(range(num_partitions)) if num_partitions is not None
        else {r.partition for r in recs}
    )
    for r in recs:
        if r.partition not in parts:
            v.append(f"unknown partition: {r}")

    by_worker: dict[int, list[UnitRecord]] = defaultdict(list)
    train_by_config: dict[int, list[UnitRecord]] = defaultdict(list)
    attempts: dict[tuple[int, int, int, str], list[UnitRecord]] = defaultdict(list)
    for r in recs:
        by_worker[r.worker].append(r)
        if r.kind == TRAIN:
            train_by_config[r.config].append(r)
        attempts[(r.config, r.epoch, r.partition, r.kind)].append(r)

    for w, rs in sorted(by_worker.items()):
        for a, b in _overlaps(rs, tol):
            v.append(f"worker exclusivity: worker {w} runs {a} and {b} at once")
    for c, rs in sorted(train_by_config.items()):
        for a, b in _overlaps(rs, tol):
            v.append(f"model isolation: config {c} trains {a} and {b} at once")

    # Non-preemption: per unit, attempts are failures then (at most) one success.
    for key, rs in sorted(attempts.items()):
        rs.sort(key=lambda r: (r.start, r.end))
        oks = [r for r in rs if r.ok]
        if len(oks) > 1:
            v.append(f"unit {key} succeeded {len(oks)} times")
        if oks and rs[-1] is not oks[-1]:
            v.append(f"unit {key} attempted again after it succeeded: {rs[-1]}")
        if complete and not oks:
            v.append(f"unit {key} failed and was never retried successfully")
        for a, b in zip(rs, rs[1:]):
            if b.start < a.end - tol:
                v.append(f"unit {key} has overlapping attempts {a} and {b}")

    # Completeness and epoch order, from successful units only.
    targets: dict[int, int] | None = None
    if epochs is not None:
        targets = (
            {int(c): int(e) for c, e in epochs.items()} if isinstance(epochs, Mapping)
            else {c: int(epochs) for c in train_by_config}
        )
        for c in sorted(set(train_by_config) - set(targets)):
            v.append(f"config {c} is in the log but has no target epochs")
    trained: dict[int, int] = {}
    epoch_end: dict[tuple[int, int], float] = {}
    configs = sorted(set(train_by_config) | set(targets or ()))
    for c in configs:
        rs = train_by_config.get(c, [])
        ok_by_epoch: dict[int, set[int]] = defaultdict(set)
        for r in rs:
            if r.ok:
                ok_by_epoch[r.epoch].add(r.partition)
                epoch_end[(c, r.epoch)] = max(epoch_end.get((c, r.epoch), r.end), r.end)
        top = max(ok_by_epoch, default=0)
        full = [e for e in range(1, top + 1) if ok_by_epoch.get(e) == parts]
        n_full = len(full)
        if full != list(range(1, n_full + 1)):
            v.append(f"completeness: config {c} has gaps in its epochs {sorted(ok_by_epoch)}")
        for e in range(1, top + 1):
            missing = sorted(parts - ok_by_epoch.get(e, set()))
            if missing and (complete or e < top):
                v.append(f"completeness: config {c} epoch {e} missed partitions {missing}")
        trained[c] = n_full
        if targets is not None and c in targets:
            want = targets[c]
            if (complete and n_full != want) or top > want:
                v.append(f"config {c} trained {n_full} full epochs (top {top}), target {want}")
        for r in rs:
            prev = epoch_end.get((c, r.epoch - 1))
            if r.epoch > 1 and (prev is None or r.start < prev - tol):
                v.append(f"epoch order: {r} starts before config {c} finished epoch {r.epoch - 1}")

    # Evaluation units.
    evals: dict[tuple[int, int], list[UnitRecord]] = defaultdict(list)
    for r in recs:
        if r.kind == EVAL:
            evals[(r.config, r.epoch)].append(r)
    wanted: set[tuple[int, int]] = set(evals)
    if eval_epochs is not None:
        for c in configs:
            for e in eval_epochs_for(eval_epochs, c):
                if 1 <= e <= trained.get(c, 0):
                    wanted.add((c, e))
    for c, e in sorted(wanted):
        rs = evals.get((c, e), [])
        done = [r.partition for r in rs if r.ok]
        missing = sorted(parts - set(done))
        if missing and complete:
            v.append(f"evaluation: config {c} epoch {e} not evaluated on partitions {missing}")
        if (c, e) not in epoch_end or trained.get(c, 0) < e:
            v.append(f"evaluation: config {c} epoch {e} evaluated but never trained")
            continue
        for r in rs:
            if r.start < epoch_end[(c, e)] - tol:
                v.append(f"evaluation: {r} starts before config {c} finished epoch {e}")
    return v


def check_invariants(
    log: Iterable[Any],
    *,
    num_partitions: int | None = None,
    epochs: int | Mapping[int, int] | None = None,
    eval_epochs: Collection[int] | Mapping[int, Collection[int]] | None = None,
    complete: bool = True,
    tol: float = 1e-9,
) -> None:
    """Raise :class:`InvariantError` (an ``AssertionError``) if ``log`` breaks an invariant.

    Arguments as for :func:`find_violations`.
    """
    v = find_violations(log, num_partitions=num_partitions, epochs=epochs,
                        eval_epochs=eval_epochs, complete=complete, tol=tol)
    if v:
        raise InvariantError(v)


def lower_bound(log: Iterable[Any], num_workers: int) -> float:
    """Makespan lower bound of the work in ``log``.

    ``max(sum of successful training unit times / num_workers, longest config's total
    successful training unit time)``: no schedule of the same units on ``num_workers``
    workers can finish sooner (evaluation and failed attempts are not counted).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    per_config: dict[int, float] = defaultdict(float)
    for r in map(as_record, log):
        if r.ok and r.kind == TRAIN:
            per_config[r.config] += r.duration
    if not per_config:
        return 0.0
    return max(sum(per_config.values()) / num_workers, max(per_config.values()))


def partition_bound(log: Iterable[Any]) -> float:
    """The most successful unit time (training and evaluation) on any one partition.

    When every partition is held by one worker (no replicas, no worker changes), a
    partition's units run one after the other on its worker, so no schedule of units whose
    times are fixed per (config, epoch, partition, kind) finishes sooner. Unlike
    :func:`lower_bound` it counts evaluation units, and it can exceed ``sum / num_workers``
    when the partitions' loads differ.
    """
    per_partition: dict[int, float] = defaultdict(float)
    for r in map(as_record, log):
        if r.ok:
            per_partition[r.partition] += r.duration
    return max(per_partition.values(), default=0.0)
