"""A small stand-in for the AutoML engine, for unit tests of single procedures.

It follows the engine semantics of ``cerebro_db/automl/base.py`` (launch/extend/stop
checks, paused trials, evaluated epochs, ``on_idle`` while slots are free, stall detection)
at epoch granularity: each step trains one whole epoch of one training trial chosen at
random (the order in which concurrent trials finish). Scores come from a callback.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cerebro_db.automl.base import (
    EngineView,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    UnitReport,
)

ScoreFn = Callable[[TrialSpec, int], float]


class EngineError(AssertionError):
    """A decision the real engine would reject, or a stalled procedure."""


@dataclass
class Trial:
    spec: TrialSpec
    target: int
    epochs: int = 0
    stopped: bool = False
    freed: bool = False
    scores: dict[int, float] = field(default_factory=dict)

    @property
    def training(self) -> bool:
        return not self.stopped and self.epochs < self.target


@dataclass
class Run:
    decisions: list[tuple[Any, ...]]
    trials: dict[int, Trial]
    tuner: Tuner
    reports: list[tuple[int, int, bool]]


def decision_tuple(d: Any) -> tuple[Any, ...]:
    if isinstance(d, Launch):
        s = d.spec
        return ("launch", s.trial_id, s.model_id, s.compile_params, s.fit_params, s.parent,
                dict(s.tunables), dict(s.meta), d.target)
    if isinstance(d, Extend):
        return ("extend", d.trial_id, d.target, dict(d.meta))
    if isinstance(d, Stop):
        return ("stop", d.trial_id, d.free)
    raise EngineError(f"not a decision: {d!r}")


def run(tuner: Tuner, score: ScoreFn, *, num_workers: int, seed: int = 0,
        frequency: int = 0, roundtrip_at: set[int] | None = None,
        max_steps: int = 100_000) -> Run:
    """Drive ``tuner`` to the end. ``roundtrip_at``: step numbers after which the tuner is
    replaced by ``Tuner.from_state_json(tuner.state_json())``."""
    rng = random.Random(seed)
    trials: dict[int, Trial] = {}
    log: list[tuple[Any, ...]] = []
    reports: list[tuple[int, int, bool]] = []
    now = 0.0

    def apply(decisions: list[Any]) -> None:
        for d in decisions:
            log.append(decision_tuple(d))
            if isinstance(d, Launch):
                s = d.spec
                if s.trial_id in trials:
                    raise EngineError(f"launch with a used trial_id {s.trial_id}")
                if s.parent is not None:
                    p = trials.get(s.parent)
                    if p is None or p.freed or p.training:
                        raise EngineError(f"bad parent {s.parent}")
                if d.target < 1:
                    raise EngineError(f"launch target {d.target}")
                trials[s.trial_id] = Trial(s, d.target)
            elif isinstance(d, Extend):
                t = trials.get(d.trial_id)
                if t is None or t.freed:
                    raise EngineError(f"extend of unknown trial {d.trial_id}")
                if t.stopped:
                    raise EngineError(f"extend of stopped trial {d.trial_id}")
                if d.target < t.epochs:
                    raise EngineError(f"extend below completed epochs {d.trial_id}")
                t.target = d.target
            elif isinstance(d, Stop):
                t = trials.get(d.trial_id)
                if t is None or t.freed:
                    raise EngineError(f"stop of unknown trial {d.trial_id}")
                t.stopped = True
                t.freed = d.free
            else:
                raise EngineError(f"not a decision: {d!r}")

    def view() -> EngineView:
        training = frozenset(k for k, t in trials.items() if t.training)
        paused = frozenset(k for k, t in trials.items()
                           if not t.stopped and not t.training)
        return EngineView(num_workers, training, paused, now)

    def idle() -> None:
        for _ in range(1000):
            v = view()
            if v.free_slots == 0:
                return
            ds = tuner.on_idle(v)
            if not ds:
                return
            apply(ds)
        raise EngineError("on_idle never returned []")

    apply(tuner.start())
    idle()
    for step in range(max_steps):
        training = sorted(k for k, t in trials.items() if t.training)
        if not training:
            if tuner.done():
                return Run(log, trials, tuner, reports)
            raise EngineError("the AutoML procedure stalled")
        # a trial among the first num_workers (by id) of those training is the one that ends
        k = rng.choice(training[:max(1, num_workers)] if rng.random() < 0.8 else training)
        t = trials[k]
        t.epochs += 1
        now += 1.0
        e = t.epochs
        apply(tuner.on_unit(UnitReport(k, e, 0, score(t.spec, e), 10, 1.0, now)))
        if e == t.target or (frequency and e % frequency == 0):
            sc = score(t.spec, e)
            t.scores[e] = sc
            at = e == t.target
            reports.append((k, e, at))
            apply(tuner.on_epoch(EpochReport(k, e, sc, {}, None, None, at, now)))
        idle()
        if roundtrip_at and step in roundtrip_at:
            tuner = Tuner.from_state_json(tuner.state_json())
    raise EngineError("too many steps")
