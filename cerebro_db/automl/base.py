"""The AutoML template: what a tuning procedure sees, what it decides, and its contract.

Cerebro runs every AutoML procedure through one loop. The training engine (model hopper
parallelism over worker sessions) trains the *trials* it was told to train; whenever
something happens it reports to the procedure, which answers with decisions:

- :class:`Launch`: start a new trial (a config: ``model_id``, ``compile_params``,
  ``fit_params``), from fresh (or arch-table) weights, or *forked* from another trial's
  latest state (``parent``; optionally with changed tunables, MLtuner's branches);
- :class:`Extend`: let a trial train up to a larger number of epochs (a promotion);
- :class:`Stop`: no more training for a trial (its state is kept, and it still appears in
  the outputs) or, with ``free=True``, drop it entirely (an MLtuner branch that lost).

Epochs are MADlib *iterations*: one pass of a trial over every partition. Each trial counts
its own epochs from 1, also when forked (the fork's epochs continue the parent's state, but
the procedure keeps the lineage). A trial trains until it reaches its *target* and then
*pauses*: it is evaluated (validation when there is a validation table) and reported with
``at_target=True``; the procedure then extends, stops, or leaves it paused (a Hyperband round
waiting for its other trials). Paused trials cost nothing.

Reports: :class:`UnitReport` after every training unit (one partition pass: the loss trace
MLtuner reads) and :class:`EpochReport` after every *evaluated* epoch: each epoch at which a
trial reaches its target, plus every ``metrics_compute_frequency`` epochs. The score a
procedure ranks by is :attr:`EpochReport.score`: validation loss when there is validation
data, else training loss; lower is better and NaN is worst.

Contract of a :class:`Tuner` (checked by property tests on the engine, :mod:`.simulate`):

- decisions depend only on the constructor arguments (``random_state`` included) and the
  sequence of calls, so a seeded procedure is reproducible, and
  ``tuner_from_state_json(t.state_json())`` (:mod:`.registry`) continues exactly as ``t``
  would;
- trial ids are the ``mst_key`` s of the outputs: positive, unique, never reused;
- :meth:`Tuner.on_idle` is called when fewer trials are in flight (training, or waiting
  for their evaluation) than there are workers (``view.num_workers``): a procedure that can
  use the capacity launches or extends trials. A procedure that launches only from
  :meth:`Tuner.on_idle`, one trial per free slot, never has more trials in flight than
  workers, so each decision sees the results of all but those;
- :meth:`Tuner.done` becomes true once the procedure wants nothing more; the engine then
  finishes what is running and writes the outputs.

A procedure never touches the database, an executor or TensorFlow (docs/architecture.md, rule 2).
"""
from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Union

from ..errors import invalid
from ..params import parse_automl_params

__all__ = [
    "STATE_FORMAT",
    "Decision",
    "EngineView",
    "EpochReport",
    "Extend",
    "Launch",
    "Stop",
    "TrialSpec",
    "Tuner",
    "UnitReport",
    "score_key",
]

STATE_FORMAT = 1
"""Version of the JSON layout written by :meth:`Tuner.state_json`."""

TUNABLES: tuple[str, ...] = ("learning_rate", "momentum", "batch_size")
"""Training tunables a fork may change (MLtuner)."""


def _frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class TrialSpec:
    """A trial the engine trains: one model configuration.

    - ``trial_id``: the ``mst_key`` in the outputs (positive, unique);
    - ``model_id``, ``compile_params``, ``fit_params``: as in a model selection table;
    - ``parent``: start from a copy of that trial's latest state instead of initial weights;
    - ``tunables``: values set on the copied state (``learning_rate``, ``momentum``,
      ``batch_size``; only with ``parent``). ``compile_params`` / ``fit_params`` must already
      say the same (so the outputs show what the trial trained with);
    - ``meta``: the procedure's labels (bracket ``s``, round ``i``, rung, branch, ...), JSON
      values; they reach ``_info`` and the catalog.
    """

    trial_id: int
    model_id: int
    compile_params: str
    fit_params: str
    parent: int | None = None
    tunables: Mapping[str, float] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tunables", _frozen(self.tunables))
        object.__setattr__(self, "meta", _frozen(self.meta))
        if isinstance(self.trial_id, bool) or not isinstance(self.trial_id, int) \
                or self.trial_id < 1:
            raise invalid(f"trial_id must be a positive integer, got {self.trial_id!r}")
        bad = sorted(set(self.tunables) - set(TUNABLES))
        if bad:
            raise invalid(f"unknown tunable {bad[0]!r}", hint=f"tunables: {', '.join(TUNABLES)}")
        if self.tunables and self.parent is None:
            raise invalid("tunables need a parent trial to fork from")

    def to_json(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "model_id": self.model_id,
                "compile_params": self.compile_params, "fit_params": self.fit_params,
                "parent": self.parent, "tunables": dict(self.tunables), "meta": dict(self.meta)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TrialSpec:
        return cls(int(d["trial_id"]), int(d["model_id"]), str(d["compile_params"]),
                   str(d["fit_params"]), None if d.get("parent") is None else int(d["parent"]),
                   dict(d.get("tunables") or {}), dict(d.get("meta") or {}))


@dataclass(frozen=True)
class Launch:
    """Start ``spec`` and train it up to ``target`` epochs (its own epochs, from 1)."""

    spec: TrialSpec
    target: int


@dataclass(frozen=True)
class Extend:
    """Raise the target of a (paused or running) trial to ``target`` epochs."""

    trial_id: int
    target: int
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Labels to merge into the trial's meta (for example its new rung)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", _frozen(self.meta))


@dataclass(frozen=True)
class Stop:
    """Train ``trial_id`` no further: it keeps its state and its outputs unless ``free``."""

    trial_id: int
    reason: str = "stopped"
    free: bool = False


Decision = Union[Launch, Extend, Stop]


@dataclass(frozen=True)
class UnitReport:
    """A training unit ended: ``trial_id`` trained ``epoch`` on ``partition``."""

    trial_id: int
    epoch: int
    partition: int
    loss: float
    rows: int
    seconds: float
    now: float
    """Seconds since the run started (the engine's clock)."""


@dataclass(frozen=True)
class EpochReport:
    """An evaluated epoch of a trial (training metrics always, validation when given)."""

    trial_id: int
    epoch: int
    train_loss: float
    train_metrics: Mapping[str, float]
    valid_loss: float | None
    valid_metrics: Mapping[str, float] | None
    at_target: bool
    """The trial has reached its target and is paused until a decision."""
    now: float

    @property
    def score(self) -> float:
        """What procedures rank by (lower is better; NaN is worst): validation loss when
        there is validation data, else training loss."""
        return self.train_loss if self.valid_loss is None else self.valid_loss


def score_key(score: float) -> tuple[int, float]:
    """Sort key that puts NaN (and +inf) last: ``sorted(trials, key=lambda t:
    score_key(s[t]))`` lists the best first."""
    if score is None or math.isnan(score):
        return (2, 0.0)
    if math.isinf(score) and score > 0:
        return (1, 0.0)
    return (0, float(score))


@dataclass(frozen=True)
class EngineView:
    """What the engine is doing, handed to :meth:`Tuner.on_idle`.

    ``training``: trials with epochs left before their target; ``paused``: trials at their
    target waiting for a decision; ``evaluating``: trials with an evaluation still to run or
    running (a trial at its target is in it until its result is reported); ``num_workers``:
    worker sessions; ``now``: seconds since the run started.
    """

    num_workers: int
    training: frozenset[int]
    paused: frozenset[int]
    now: float
    evaluating: frozenset[int] = frozenset()

    @property
    def free_slots(self) -> int:
        """Workers that would idle: ``num_workers`` minus the trials in flight, training or
        evaluating (at least 0). A trial waiting for its evaluation counts: its result is
        not known yet, and its evaluation units need a worker."""
        return max(0, self.num_workers - len(self.training | self.evaluating))


class Tuner(ABC):
    """An AutoML procedure (see the module docstring for the contract).

    Subclasses set :attr:`name` (the ``automl_method`` SQL uses), :attr:`defaults` (the
    ``automl_params`` keys they accept and their defaults) and :attr:`option_names`, check
    their parameters in the constructor (ranges, bounds, relations: :mod:`.options`), and
    implement :meth:`start`, :meth:`on_epoch`, :meth:`done`, :meth:`options` and, when they
    have state, ``_dynamic_state`` / ``_restore``.
    """

    name: ClassVar[str]
    defaults: ClassVar[Mapping[str, Any]] = {}
    """``automl_params`` keys and their defaults (a value's type is the type accepted)."""
    bare_words: ClassVar[tuple[str, ...]] = ()
    """``automl_params`` keys that may take a bare word (``algorithm=tpe``)."""
    option_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parse_params(cls, text: str | None) -> dict[str, Any]:
        """``automl_params`` text -> the constructor's keyword arguments: keys of
        :attr:`defaults` (case-insensitive), values of their types, defaults filled. The
        ranges are checked by the constructor."""
        return parse_automl_params(text, cls.name, cls.defaults, bare_name_keys=cls.bare_words)

    @abstractmethod
    def start(self) -> list[Decision]:
        """The first decisions (normally launches)."""

    def on_unit(self, report: UnitReport) -> list[Decision]:
        """A training unit ended (default: nothing to decide)."""
        return []

    @abstractmethod
    def on_epoch(self, report: EpochReport) -> list[Decision]:
        """An evaluated epoch of a trial."""

    def on_idle(self, view: EngineView) -> list[Decision]:
        """Workers would idle (default: nothing to add)."""
        return []

    @abstractmethod
    def done(self) -> bool:
        """Whether the procedure wants nothing more."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """Constructor options, JSON-serialisable (``type(t)(**t.options())`` is a fresh t)."""

    def info(self, trial_id: int) -> dict[str, Any]:
        """Extra ``_info`` columns for a trial (Hyperband: ``s`` and ``i``); default none."""
        return {}

    def info_columns(self) -> list[tuple[str, str]]:
        """(name, SQL type) of the columns :meth:`info` fills, in order."""
        return []

    def _dynamic_state(self) -> dict[str, Any]:
        return {}

    def _restore(self, state: Mapping[str, Any]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {"tuner": self.name, "format": STATE_FORMAT, "options": self.options(),
                "state": self._dynamic_state()}

    def state_json(self) -> str:
        """:meth:`state` as compact JSON (kept in the catalog, never pickled; the registry's
        :func:`~.registry.tuner_from_state_json` rebuilds the tuner from it)."""
        return json.dumps(self.state(), sort_keys=True, separators=(",", ":"))
