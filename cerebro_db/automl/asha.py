"""ASHA: asynchronous successive halving (``automl_method => 'asha'``).

Implementation note. Algorithm 2 of Li et al., "A System for Massively Parallel
Hyperparameter Tuning" (MLSys 2020), emulated on model hopper parallelism: a *job* is a trial
trained up to the resource of a rung. Bracket ``b`` has rungs ``k = 0, 1, ...`` with
resources ``min_r * eta**(b + k)`` epochs while below ``max_r``, then a last rung at
``max_r`` (so bracket ``b`` starts at ``min_r * eta**b``, as Ray Tune's ASHAScheduler
does). A trial trained to its rung's resource reports ``at_target`` and joins the rung with
its score. Whenever a worker would idle, :meth:`ASHA.on_idle` runs ``get_job``: for each
bracket, from the top rung down, the best trial among the top ``floor(|rung k| / eta)`` of
rung ``k`` that has not been promoted yet (and whose score is finite) is promoted, i.e.
extended to the next rung's resource; otherwise a new configuration is sampled and launched
at rung 0 of a bracket drawn as Ray does (probability proportional to ``e**(number of
rungs)``). There is no rung barrier: a trial never waits for the others of its rung.

Parameters (``automl_params``): ``min_r`` (grace period, 1), ``max_r`` (9), ``eta``
(reduction factor, 3), ``brackets`` (1), ``max_configs`` (27: most configurations ever
launched), ``time_budget`` (seconds of the engine clock after which no new configuration is
launched, promotions continue; 0 = none). A trial that reaches ``max_r`` is stopped
('completed'); one never promoted stays paused, and when nothing can happen any more (no
launch allowed, nothing promotable, no report awaited) ASHA stops every remaining trial
('not promoted') and is done. Configurations are drawn without repetition from the search
space (grid choices and distributions), so a small grid ends the search early.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import invalid
from .base import (
    Decision,
    EngineView,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    score_key,
)
from .options import (
    MAX_EPOCHS,
    MAX_TRIALS,
    int_option,
    num_workers_option,
    seed_option,
)
from .space import SearchSpace

__all__ = ["ASHA", "MAX_BRACKETS", "MAX_ETA", "rung_resources"]

MAX_ETA = 1_000
"""Largest ``eta`` accepted."""
MAX_BRACKETS = 64
"""Most brackets accepted."""


def _enc(x: float) -> float | str:
    return x if math.isfinite(x) else repr(float(x))


def _dec(x: float | str) -> float:
    return float(x)


def rung_resources(min_r: int, max_r: int, eta: int, bracket: int) -> list[int]:
    """Epochs of each rung of ``bracket``: ``min_r * eta**(bracket + k)`` below ``max_r``,
    then ``max_r``."""
    out: list[int] = []
    r = min_r * eta**bracket
    while r < max_r:
        out.append(r)
        r *= eta
    out.append(max_r)
    return out


class ASHA(Tuner):
    """Asynchronous successive halving (see the module docstring)."""

    name = "asha"
    defaults: ClassVar[dict[str, Any]] = {"min_r": 1, "max_r": 9, "eta": 3, "brackets": 1,
                                          "max_configs": 27, "time_budget": 0.0}
    option_names = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None = None, min_r: int = 1,
                 max_r: int = 9, eta: int = 3, brackets: int = 1, max_configs: int = 27,
                 time_budget: float = 0.0) -> None:
        self.min_r = int_option("min_r", min_r, 1, MAX_EPOCHS)
        self.max_r = int_option("max_r", max_r, min_r, MAX_EPOCHS)
        self.eta = int_option("eta", eta, 2, MAX_ETA)
        self.brackets = int_option("brackets", brackets, 1, MAX_BRACKETS)
        self.max_configs = int_option("max_configs", max_configs, 1, MAX_TRIALS)
        if isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)) \
                or not time_budget >= 0:
            raise invalid(f"automl_params: time_budget must be a number of seconds at least 0, "
                          f"got {time_budget!r}")
        self.time_budget = float(time_budget)
        if min_r * eta ** (brackets - 1) > max_r:
            raise invalid(
                f"automl_params: brackets={brackets} needs min_r * eta**(brackets - 1) <= max_r, "
                f"got {min_r * eta ** (brackets - 1)} > {max_r}",
                hint="use fewer brackets or a larger max_r")
        self.space = SearchSpace(model_ids, compile_grid, fit_grid)
        self.num_workers = num_workers_option(num_workers)
        self.random_state = seed_option(random_state)
        self.resources = [rung_resources(self.min_r, self.max_r, self.eta, b)
                          for b in range(self.brackets)]
        self._rng = np.random.default_rng(self.random_state)
        self._next_id = 1
        self._trials: dict[int, tuple[int, int]] = {}
        self._results: list[list[dict[int, float]]] = [[{} for _ in rs] for rs in self.resources]
        self._promoted: list[list[set[int]]] = [[set() for _ in rs] for rs in self.resources]
        self._promotions: list[list[Any]] = []
        self._awaiting: set[int] = set()
        self._stopped: set[int] = set()
        self._seen: set[tuple[int, str, str]] = set()
        self._exhausted = False
        self._finished = False

    # -- contract ------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        return {"model_ids": list(self.space.model_ids), "compile_grid": self.space.compile_text,
                "fit_grid": self.space.fit_text, "num_workers": self.num_workers,
                "random_state": self.random_state, "min_r": self.min_r, "max_r": self.max_r,
                "eta": self.eta, "brackets": self.brackets, "max_configs": self.max_configs,
                "time_budget": self.time_budget}

    def start(self) -> list[Decision]:
        return []

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        tid = report.trial_id
        if tid not in self._trials or not report.at_target or tid not in self._awaiting:
            return []
        b, k = self._trials[tid]
        if report.epoch != self.resources[b][k]:
            return []
        self._awaiting.discard(tid)
        self._results[b][k][tid] = float(report.score)
        if k == len(self.resources[b]) - 1:
            self._stopped.add(tid)
            return [Stop(tid, "completed")]
        return []

    def on_idle(self, view: EngineView) -> list[Decision]:
        if self._finished:
            return []
        job = self._promotion(view.now) or self._launch(view.now)
        if job is not None:
            return [job]
        if self._awaiting or self._can_launch(view.now):
            return []
        self._finished = True
        out: list[Decision] = [Stop(t, "not promoted") for t in sorted(self._trials)
                               if t not in self._stopped]
        self._stopped.update(t for t in self._trials)
        return out

    def done(self) -> bool:
        return self._finished

    def info(self, trial_id: int) -> dict[str, Any]:
        b, k = self._trials.get(trial_id, (None, None))
        return {"bracket": b, "rung": k}

    def info_columns(self) -> list[tuple[str, str]]:
        return [("bracket", "integer"), ("rung", "integer")]

    @property
    def promotions(self) -> list[tuple[int, int, int, int, float]]:
        """(trial_id, bracket, from rung, to rung, time) of every promotion, in order."""
        return [tuple(p) for p in self._promotions]  # type: ignore[misc]

    def rung(self, bracket: int, k: int) -> dict[int, float]:
        """trial_id -> score of the trials that reached rung ``k`` of ``bracket``."""
        return dict(self._results[bracket][k])

    # -- get_job -------------------------------------------------------------------------

    def _promotion(self, now: float) -> Decision | None:
        for b, rs in enumerate(self.resources):
            for k in range(len(rs) - 2, -1, -1):
                rung = self._results[b][k]
                n = len(rung) // self.eta
                if n == 0:
                    continue
                top = sorted(rung.items(), key=lambda kv: (score_key(kv[1]), kv[0]))[:n]
                for tid, score in top:
                    if tid in self._promoted[b][k] or not math.isfinite(score):
                        continue
                    self._promoted[b][k].add(tid)
                    self._trials[tid] = (b, k + 1)
                    self._awaiting.add(tid)
                    self._promotions.append([tid, b, k, k + 1, now])
                    return Extend(tid, rs[k + 1], meta={"rung": k + 1})
        return None

    def _can_launch(self, now: float) -> bool:
        return (not self._exhausted and self._next_id - 1 < self.max_configs
                and (self.time_budget == 0 or now < self.time_budget))

    def _launch(self, now: float) -> Decision | None:
        if not self._can_launch(now):
            return None
        points = self.space.sample_distinct(self._rng, 1, self._seen)
        if not points:
            self._exhausted = True
            return None
        p = points[0]
        b = 0
        if self.brackets > 1:
            sizes = np.array([len(rs) for rs in self.resources], dtype=float)
            probs = np.exp(sizes - sizes.max())
            b = int(self._rng.choice(self.brackets, p=probs / probs.sum()))
        tid = self._next_id
        self._next_id += 1
        self._trials[tid] = (b, 0)
        self._awaiting.add(tid)
        spec = TrialSpec(tid, p.model_id, p.compile_params, p.fit_params,
                         meta={"bracket": b, "rung": 0})
        return Launch(spec, self.resources[b][0])

    # -- state ---------------------------------------------------------------------------

    def _dynamic_state(self) -> dict[str, Any]:
        return {
            "rng": self._rng.bit_generator.state,
            "next_id": self._next_id,
            "trials": [[t, b, k] for t, (b, k) in sorted(self._trials.items())],
            "results": [[[[t, _enc(s)] for t, s in rung.items()] for rung in br]
                        for br in self._results],
            "promoted": [[sorted(s) for s in br] for br in self._promoted],
            "promotions": self._promotions,
            "awaiting": sorted(self._awaiting),
            "stopped": sorted(self._stopped),
            "seen": sorted([list(k) for k in self._seen]),
            "exhausted": self._exhausted,
            "finished": self._finished,
        }

    def _restore(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self._rng.bit_generator.state = state["rng"]
        self._next_id = int(state["next_id"])
        self._trials = {int(t): (int(b), int(k)) for t, b, k in state["trials"]}
        self._results = [[{int(t): _dec(s) for t, s in rung} for rung in br]
                         for br in state["results"]]
        self._promoted = [[{int(t) for t in s} for s in br] for br in state["promoted"]]
        self._promotions = [list(p) for p in state["promotions"]]
        self._awaiting = {int(t) for t in state["awaiting"]}
        self._stopped = {int(t) for t in state["stopped"]}
        self._seen = {(int(m), str(c), str(f)) for m, c, f in state["seen"]}
        self._exhausted = bool(state["exhausted"])
        self._finished = bool(state["finished"])
