"""Hyperband (Li et al., JMLR 2018) run diagonally as MADlib does, on model hopper parallelism.

``automl_params``: ``R`` (most epochs one configuration gets), ``eta`` (the cut factor of
successive halving) and ``skip_last`` (rounds dropped at the end of every bracket), defaults
``R=6, eta=3, skip_last=0``.

Schedule (:func:`hyperband_schedule`, the table of MADlib's ``hyperband_schedule``):
``s_max = floor(log_eta(R))`` computed exactly with integers; brackets ``s = s_max .. 0``
start ``n = ceil((s_max + 1) / (s + 1) * eta**s)`` configurations with ``r = R * eta**-s``
epochs; round ``i`` keeps ``n_i = floor(n * eta**-i)`` configurations trained to
``r_i = r * eta**i`` epochs (rounded half up to an integer). ``skip_last`` drops the last
``skip_last`` rounds of every bracket, so brackets ``s < skip_last`` do not run at all.

Execution ("diagonal", as MADlib): on diagonal ``d = 0 .. s_max - skip_last`` every bracket
``s >= s_max - d`` runs its round ``i = d - (s_max - s)``; all of them train to the same
``r_i = R * eta**(d - s_max)`` epochs, together. When every trial of the diagonal has been
evaluated at its target, each bracket keeps its best ``n_{i+1}`` trials by score (ties by
trial id, NaN last), which continue from their weights up to ``r_{i+1}`` epochs in total
(:class:`Extend`); the others are stopped, and the next bracket starts. Configurations are
drawn once, at the start (``space.sample_distinct`` seeded by ``random_state``), and numbered
by bracket from ``s_max`` down as MADlib numbers its ``mst_key`` s.

Deliberate differences from MADlib: ``n`` is the paper's (MADlib truncates
``(s_max + 1) / (s + 1)`` to an integer first, giving 27 instead of 34 for ``R=81, s=3``);
``s_max`` is exact (MADlib's ``floor(math.log(243, 3))`` is 4); survivors train to ``r_i``
epochs *in total* (MADlib warm-starts them for another ``r_i`` epochs, so they end with the
sum of the round budgets); and they are chosen among the trials of the round just finished
(MADlib ranks every trial of the bracket by its last loss, pruned ones included).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import invalid
from .base import Decision, EpochReport, Extend, Launch, Stop, TrialSpec, Tuner, score_key
from .options import (
    MAX_EPOCHS,
    MAX_TRIALS,
    int_option,
    num_workers_option,
    random_state_option,
)
from .space import Point, SearchSpace

__all__ = [
    "MAX_ETA",
    "MAX_SKIP_LAST",
    "Hyperband",
    "bracket_size",
    "hyperband_s_max",
    "hyperband_schedule",
    "round_epochs",
]

MAX_ETA = 1_000
"""Largest ``eta`` accepted."""
MAX_SKIP_LAST = 64
"""Largest ``skip_last`` accepted."""


def hyperband_s_max(R: int, eta: int) -> int:
    """``floor(log_eta(R))`` computed exactly with integers (R >= 1, eta >= 2)."""
    s = 0
    power = eta
    while power <= R:
        s += 1
        power *= eta
    return s


def _check(R: int, eta: int, skip_last: int) -> int:
    """Hyperband's ``automl_params`` checked (22023 otherwise); returns ``s_max``. ``R`` is
    at most :data:`~.options.MAX_EPOCHS`, and the brackets run at most
    :data:`~.options.MAX_TRIALS` configurations in all."""
    int_option("R", R, 1, MAX_EPOCHS)
    int_option("eta", eta, 2, MAX_ETA)
    int_option("skip_last", skip_last, 0, MAX_SKIP_LAST)
    s_max = hyperband_s_max(R, eta)
    if skip_last > s_max:
        raise invalid(f"automl_params: skip_last must be less than the number of brackets "
                      f"({s_max + 1} for R={R}, eta={eta}), got {skip_last}")
    total = sum(bracket_size(s_max, s, eta) for s in range(s_max, skip_last - 1, -1))
    if total > MAX_TRIALS:
        raise invalid(f"automl_params: R={R}, eta={eta} make {total} configurations, more than "
                      f"{MAX_TRIALS}", hint="Use a smaller R or a larger eta.")
    return s_max


def bracket_size(s_max: int, s: int, eta: int) -> int:
    """Configurations bracket ``s`` starts with: ``ceil((s_max + 1) / (s + 1) * eta**s)``,
    exactly."""
    return -(-(s_max + 1) * eta**s // (s + 1))


def round_epochs(R: int, eta: int, s: int, i: int) -> int:
    """``R * eta**(i - s)`` rounded half up (at least 1 since ``eta**s_max <= R``)."""
    num, den = R * eta**i, eta**s
    return (2 * num + den) // (2 * den)


def hyperband_schedule(R: int, eta: int = 3, skip_last: int = 0
                       ) -> list[tuple[int, int, int, int]]:
    """Rows ``(s, i, n_i, r_i)`` of the Hyperband schedule, brackets ``s`` from ``s_max``
    down, rounds ``i`` up (as MADlib's ``hyperband_schedule`` table)."""
    s_max = _check(R, eta, skip_last)
    rows = []
    for s in range(s_max, -1, -1):
        n = bracket_size(s_max, s, eta)
        for i in range(s + 1 - skip_last):
            rows.append((s, i, n // eta**i, round_epochs(R, eta, s, i)))
    return rows


def _score_out(x: float) -> float | str | None:
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _score_in(x: Any) -> float:
    return math.nan if x is None else float(x)


class Hyperband(Tuner):
    """``automl_method => 'hyperband'`` (see the module docstring)."""

    name: ClassVar[str] = "hyperband"
    defaults: ClassVar[dict[str, Any]] = {"R": 6, "eta": 3, "skip_last": 0}
    option_names: ClassVar[tuple[str, ...]] = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None, R: int = 6, eta: int = 3,
                 skip_last: int = 0) -> None:
        self.s_max = _check(R, eta, skip_last)
        if R < eta:  # one configuration trained R epochs: nothing to compare (MADlib refuses)
            raise invalid(f"automl_params: R must be at least eta ({eta}), got {R}",
                          hint="Hyperband with R < eta runs a single configuration.")
        self.space = SearchSpace(model_ids, compile_grid, fit_grid)
        self.num_workers = num_workers_option(num_workers)
        self.random_state = random_state_option(random_state)
        self.R, self.eta, self.skip_last = R, eta, skip_last
        self.num_diagonals = self.s_max + 1 - skip_last
        self.started = False
        self.diagonal = 0
        self.points: dict[int, Point] = {}
        self.bracket: dict[int, int] = {}
        self.round: dict[int, int] = {}
        self.alive: dict[int, list[int]] = {}
        self.score: dict[int, float] = {}
        self.waiting: set[int] = set()

    def options(self) -> dict[str, Any]:
        return {**self.space.to_json(), "num_workers": self.num_workers,
                "random_state": self.random_state, "R": self.R, "eta": self.eta,
                "skip_last": self.skip_last}

    def schedule(self) -> list[tuple[int, int, int, int]]:
        """This run's :func:`hyperband_schedule`."""
        return hyperband_schedule(self.R, self.eta, self.skip_last)

    def _n(self, s: int, i: int) -> int:
        return bracket_size(self.s_max, s, self.eta) // self.eta**i

    def _launch_bracket(self, s: int) -> list[Decision]:
        target = round_epochs(self.R, self.eta, s, 0)
        ids = [t for t, b in self.bracket.items() if b == s]
        self.alive[s] = ids
        out: list[Decision] = []
        for t in ids:
            p = self.points[t]
            self.round[t] = 0
            self.waiting.add(t)
            out.append(Launch(TrialSpec(t, p.model_id, p.compile_params, p.fit_params,
                                        meta={"s": s, "i": 0}), target))
        return out

    def wanted(self) -> int:
        """How many configurations the brackets draw (fewer when the space has fewer)."""
        return sum(bracket_size(self.s_max, s, self.eta)
                   for s in range(self.s_max, self.skip_last - 1, -1))

    def start(self) -> list[Decision]:
        if self.started:
            raise RuntimeError("hyperband: start() called twice")
        self.started = True
        brackets = range(self.s_max, self.skip_last - 1, -1)
        total = self.wanted()
        seed = None if self.random_state is None else self.random_state % 2**64
        points = self.space.sample_distinct(np.random.default_rng(seed), total)
        first = 0
        for s in brackets:
            n = bracket_size(self.s_max, s, self.eta)
            for t, p in enumerate(points[first:first + n], start=first + 1):
                self.points[t] = p
                self.bracket[t] = s
            first += n
        return self._launch_bracket(self.s_max)

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        t = report.trial_id
        if not report.at_target or t not in self.waiting:
            return []
        self.score[t] = report.score
        self.waiting.discard(t)
        if self.waiting or self.diagonal + 1 >= self.num_diagonals:
            return []
        return self._next_diagonal()

    def _next_diagonal(self) -> list[Decision]:
        stops: list[Decision] = []
        extends: list[Decision] = []
        d = self.diagonal
        for s in range(self.s_max, self.s_max - d - 1, -1):
            i = d - (self.s_max - s)
            ranked = sorted(self.alive[s], key=lambda t: (score_key(self.score[t]), t))
            keep = ranked[:self._n(s, i + 1)]
            target = round_epochs(self.R, self.eta, s, i + 1)
            for t in ranked[len(keep):]:
                stops.append(Stop(t, reason=f"hyperband: not in the best {len(keep)} of "
                                            f"bracket {s} round {i}"))
            for t in sorted(keep):
                self.round[t] = i + 1
                self.waiting.add(t)
                extends.append(Extend(t, target, meta={"i": i + 1}))
            self.alive[s] = sorted(keep)
        self.diagonal = d + 1
        return stops + extends + self._launch_bracket(self.s_max - d - 1)

    def done(self) -> bool:
        return self.started and not self.waiting and self.diagonal + 1 >= self.num_diagonals

    def info(self, trial_id: int) -> dict[str, Any]:
        """Bracket ``s`` and the last round ``i`` the trial was in."""
        return {"s": self.bracket.get(trial_id), "i": self.round.get(trial_id)}

    def info_columns(self) -> list[tuple[str, str]]:
        return [("s", "integer"), ("i", "integer")]

    def _trial_state(self, t: int) -> dict[str, Any]:
        p = self.points[t]
        d: dict[str, Any] = {"id": t, "model_id": p.model_id, "compile_params": p.compile_params,
                             "fit_params": p.fit_params, "s": self.bracket[t]}
        if t in self.round:
            d["i"] = self.round[t]
        if t in self.score:
            d["score"] = _score_out(self.score[t])
        return d

    def _dynamic_state(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "diagonal": self.diagonal,
            "trials": [self._trial_state(t) for t in sorted(self.points)],
            "alive": {str(s): ids for s, ids in sorted(self.alive.items())},
            "waiting": sorted(self.waiting),
        }

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.started = bool(state.get("started", False))
        self.diagonal = int(state.get("diagonal", 0))
        for d in state.get("trials", []):
            t = int(d["id"])
            self.points[t] = Point(int(d["model_id"]), str(d["compile_params"]),
                                   str(d["fit_params"]))
            self.bracket[t] = int(d["s"])
            if "i" in d:
                self.round[t] = int(d["i"])
            if "score" in d:
                self.score[t] = _score_in(d["score"])
        self.alive = {int(s): [int(t) for t in ids]
                      for s, ids in dict(state.get("alive", {})).items()}
        self.waiting = {int(t) for t in state.get("waiting", [])}
