"""What a scheduling policy sees and returns, and the contract every policy follows.

The coordinator (or the simulator) keeps the bookkeeping (:class:`~.progress.Progress`) and
hands a policy a frozen :class:`Snapshot`; the policy answers with :class:`Assignment` s for
some idle workers. A policy never touches the database or an executor, and its options are JSON.

Vocabulary. A *training unit* is (config, epoch, partition): one pass of the config over one
partition. An *evaluation unit* is (config, epoch, partition, ``'eval'``): metrics of the
config's frozen end-of-epoch state on one partition. Epochs are numbered from 1: a config that
has completed ``k`` epochs is training epoch ``k + 1``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from ..errors import INTERNAL_ERROR, CerebroError, invalid

__all__ = [
    "EVAL",
    "KINDS",
    "TRAIN",
    "Assignment",
    "EvalUnit",
    "Policy",
    "RunningUnit",
    "SchedulingError",
    "Snapshot",
    "assign_evals",
    "evaluation_epochs",
]

TRAIN = "train"
EVAL = "eval"
KINDS: tuple[str, ...] = (TRAIN, EVAL)

class SchedulingError(CerebroError):
    """A policy (or a caller) asked for something the invariants forbid (SQLSTATE XX000)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, INTERNAL_ERROR)


@dataclass(frozen=True)
class RunningUnit:
    """A unit in flight on ``worker``."""

    worker: int
    config: int
    epoch: int
    partition: int
    kind: str = TRAIN


@dataclass(frozen=True)
class EvalUnit:
    """An evaluation unit waiting for a worker that holds ``partition``."""

    config: int
    epoch: int
    partition: int


@dataclass(frozen=True)
class Assignment:
    """A decision: ``worker`` runs (config, epoch, partition, kind).

    ``reset_optimizer`` asks the executor to drop the optimizer state before the unit (the
    MADlib ring does that at every hop); MOP keeps it.
    """

    worker: int
    config: int
    epoch: int
    partition: int
    kind: str = TRAIN
    reset_optimizer: bool = False


def _frozen_map(m: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(m))


@dataclass(frozen=True)
class Snapshot:
    """The state of a fit, as handed to a policy.

    - ``num_partitions``: partitions are ``0 .. num_partitions - 1``;
    - ``target_epochs``: config (mst_key) -> epochs to train; its keys are the configs;
    - ``completed_epochs``: config -> epochs finished (missing means 0);
    - ``visited``: config -> partitions trained (successfully) in its current epoch;
    - ``running``: every unit in flight, training and evaluation;
    - ``workers``: every live worker -> the partitions it holds;
    - ``idle_workers``: live workers running nothing, ascending;
    - ``pending_evals``: evaluation units neither done nor running, oldest first;
    - ``now``: monotone clock in seconds, for policies that care;
    - ``unit_seconds``: config -> expected seconds of its next training unit, from its
      measured successful units (configs not measured yet are absent; see
      :meth:`~.progress.Progress.observe`), for cost-aware policies;
    - ``ahead``: a look-ahead snapshot (pipelined dispatch): its one idle worker is still
      running a unit, so a policy may leave it without work it would only take when idle;
    - ``warm``: worker -> the partitions it has started a unit on in this fit (their rows
      are in its cache; a unit on another partition first reads that partition);
    - ``started``: worker -> when (``now``'s clock) its unit in flight started;
    - ``cold_read_seconds``: the mean measured time of a worker's first read of a
      partition (None until one is measured), what a unit on a partition not ``warm`` on
      its worker costs on top of its own time;
    - ``eval_seconds``: config -> mean measured seconds of its evaluation units.
    """

    num_partitions: int
    target_epochs: Mapping[int, int]
    completed_epochs: Mapping[int, int]
    visited: Mapping[int, frozenset[int]]
    running: tuple[RunningUnit, ...]
    workers: Mapping[int, frozenset[int]]
    idle_workers: tuple[int, ...]
    pending_evals: tuple[EvalUnit, ...] = ()
    now: float = 0.0
    unit_seconds: Mapping[int, float] = field(default_factory=dict)
    ahead: bool = False
    warm: Mapping[int, frozenset[int]] = field(default_factory=dict)
    started: Mapping[int, float] = field(default_factory=dict)
    cold_read_seconds: float | None = None
    eval_seconds: Mapping[int, float] = field(default_factory=dict)
    _training: Mapping[int, RunningUnit] = field(init=False, repr=False, compare=False)
    _configs: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _partitions: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_epochs", _frozen_map(self.target_epochs))
        object.__setattr__(self, "completed_epochs", _frozen_map(self.completed_epochs))
        object.__setattr__(
            self, "visited", _frozen_map({c: frozenset(v) for c, v in self.visited.items()})
        )
        object.__setattr__(
            self, "workers", _frozen_map({w: frozenset(v) for w, v in self.workers.items()})
        )
        object.__setattr__(self, "running", tuple(self.running))
        object.__setattr__(self, "idle_workers", tuple(sorted(self.idle_workers)))
        object.__setattr__(self, "pending_evals", tuple(self.pending_evals))
        object.__setattr__(self, "unit_seconds", _frozen_map(self.unit_seconds))
        object.__setattr__(
            self, "warm", _frozen_map({w: frozenset(v) for w, v in self.warm.items()}))
        object.__setattr__(self, "started", _frozen_map(self.started))
        object.__setattr__(self, "eval_seconds", _frozen_map(self.eval_seconds))
        training = {u.config: u for u in self.running if u.kind == TRAIN}
        object.__setattr__(self, "_training", MappingProxyType(training))
        object.__setattr__(self, "_configs", tuple(sorted(self.target_epochs)))
        object.__setattr__(self, "_partitions", frozenset(range(self.num_partitions)))

    @property
    def configs(self) -> tuple[int, ...]:
        """All configs, ascending."""
        return self._configs

    def completed(self, config: int) -> int:
        """Epochs ``config`` has finished."""
        return self.completed_epochs.get(config, 0)

    def current_epoch(self, config: int) -> int:
        """The epoch ``config`` is training (1-based)."""
        return self.completed(config) + 1

    def finished(self, config: int) -> bool:
        """Whether ``config`` has trained all its epochs."""
        return self.completed(config) >= self.target_epochs[config]

    def is_training(self, config: int) -> bool:
        """Whether a training unit of ``config`` is in flight."""
        return config in self._training

    def unvisited(self, config: int) -> frozenset[int]:
        """Partitions ``config`` has still to train on in its current epoch."""
        return self._partitions - self.visited.get(config, frozenset())

    def trainable(self, worker: int) -> list[tuple[int, int]]:
        """(config, partition) pairs ``worker`` could train now, ignoring any barrier."""
        held = self.workers.get(worker, frozenset())
        out: list[tuple[int, int]] = []
        for c in self.configs:
            if self.finished(c) or self.is_training(c):
                continue
            out.extend((c, q) for q in sorted(held & self.unvisited(c)))
        return out

    def has_runnable(self) -> bool:
        """Whether some idle worker could start some unit (ignoring any barrier)."""
        for w in self.idle_workers:
            if self.trainable(w):
                return True
            held = self.workers[w]
            if any(u.partition in held for u in self.pending_evals):
                return True
        return False

    def all_done(self) -> bool:
        """Every config trained to its target, every evaluation done, nothing in flight."""
        return (
            not self.running
            and not self.pending_evals
            and all(self.finished(c) for c in self.target_epochs)
        )


def assign_evals(
    snapshot: Snapshot, workers: Iterable[int], reset_optimizer: bool = False,
    partitions: Mapping[int, Collection[int]] | None = None,
    taken: set[EvalUnit] | None = None,
) -> list[Assignment]:
    """Give each of ``workers`` the oldest pending evaluation unit on a partition it holds
    (among ``partitions[worker]`` when given) and not in ``taken`` (updated)."""
    taken = set() if taken is None else taken
    out: list[Assignment] = []
    for w in workers:
        held = snapshot.workers[w] if partitions is None else partitions[w]
        for u in snapshot.pending_evals:
            if u.partition in held and u not in taken:
                taken.add(u)
                out.append(Assignment(w, u.config, u.epoch, u.partition, EVAL, reset_optimizer))
                break
    return out


def evaluation_epochs(num_epochs: int, metrics_compute_frequency: int | None) -> frozenset[int]:
    """Epochs after which metrics are computed: every ``frequency`` epochs, plus the last.

    ``None`` means the last epoch only (MADlib's default).
    """
    if num_epochs < 1:
        raise invalid(f"num_iterations must be at least 1, got {num_epochs}")
    if metrics_compute_frequency is None:
        return frozenset({num_epochs})
    if metrics_compute_frequency < 1:
        raise invalid(
            f"metrics_compute_frequency must be at least 1, got {metrics_compute_frequency}"
        )
    f = metrics_compute_frequency
    return frozenset(range(f, num_epochs + 1, f)) | {num_epochs}


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean, got {value!r}")
    return value


class Policy(ABC):
    """A scheduling policy: decides which idle worker runs which unit.

    Contract:

    - :meth:`assign` gets a :class:`Snapshot` and returns assignments for distinct idle
      workers. Each training assignment is for a config that is not finished, has no
      training unit in flight, in its current epoch, on a partition the worker holds and the
      config has not visited this epoch; each evaluation assignment is a pending evaluation
      unit on a partition the worker holds. It may leave idle workers unassigned (a barrier),
      and returns an empty list only when nothing may run now.
    - An idle worker prefers an eligible training unit; with none it takes a pending
      evaluation unit for a partition it holds. (A policy that ``steals`` applies this
      to the worker's home partitions first, then to the others it holds.)
    - Decisions depend only on the constructor options and the sequence of snapshots, so a
      seeded policy given the same snapshots makes the same decisions.
    - :meth:`done` says whether all work is finished.

    A policy keeps no state worth saving: a resumed fit builds a new one from the stored
    options (:meth:`options`, the fit's ``random_state``) and a snapshot rebuilt from the unit
    log. Its decisions then follow the resumed run's timing, as they follow the timing of
    any run; what a run's models depend on, each config's visit order, must therefore not
    depend on the timing (``'mop'`` with ``seeded_order`` draws it from ``random_state``,
    ``'ring'`` deals it from the configs' order), so a resumed fit trains the same models as
    an uninterrupted one.
    """

    name: ClassVar[str]
    """Registry name (the one SQL uses)."""
    option_names: ClassVar[tuple[str, ...]] = ()
    """Keyword options accepted by the constructor (and by ``get_policy``)."""
    lookahead: ClassVar[bool] = False
    """Whether the coordinator may ask the policy for a busy worker's next unit before its
    unit in flight ends (pipelined dispatch), on a snapshot as if that unit had ended and
    the worker were the only idle one. Only for a policy whose choice for a worker does not
    wait for others (no barrier) and whose :meth:`assign` has no effect but its choices."""

    steals: ClassVar[bool] = False
    """Whether the policy gives a worker units off its home partitions only when it would
    otherwise idle (:func:`~.replicas.home_partitions`), so that holding every partition
    (a fit's default replicas when its data fits, ``fitrun.fit_replicas``) changes nothing
    while the workers keep pace."""

    @abstractmethod
    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        """Decide what some idle workers run next."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The constructor options, JSON-serialisable (``type(p)(**p.options())`` is a fresh p)."""

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


def normalise_targets(
    configs: Iterable[int], epochs: int | Mapping[int, int]
) -> dict[int, int]:
    """config -> target epochs from one count for all or a per-config mapping."""
    configs = list(configs)
    if len(set(configs)) != len(configs):
        raise invalid("configs must be distinct")
    if isinstance(epochs, Mapping):
        missing = [c for c in configs if c not in epochs]
        if missing:
            raise invalid(f"no target epochs for configs {missing}")
        targets = {c: int(epochs[c]) for c in configs}
    else:
        targets = {c: int(epochs) for c in configs}
    bad = {c: e for c, e in targets.items() if e < 0}
    if bad:
        raise invalid(f"target epochs must be at least 0, got {bad}")
    return targets


def eval_epochs_for(
    eval_epochs: Collection[int] | Mapping[int, Collection[int]], config: int
) -> frozenset[int]:
    """The evaluation epochs of ``config`` (one set for all, or a per-config mapping)."""
    if isinstance(eval_epochs, Mapping):
        return frozenset(eval_epochs.get(config, ()))
    return frozenset(eval_epochs)
