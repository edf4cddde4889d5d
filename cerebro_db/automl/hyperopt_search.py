"""Hyperopt (TPE or random) as an AutoML procedure, asked and told without ``fmin``.

``automl_params``: ``num_configs`` (trials in all), ``num_iterations`` (epochs per trial) and
``algorithm`` (``tpe`` or ``rand``), defaults ``num_configs=20, num_iterations=5,
algorithm=tpe`` (MADlib's).

The search space is the :class:`SearchSpace` written as a hyperopt expression: ``model_id``
and every list of choices are ``hp.choice`` (over indices), ``optimizer_params_list`` a
nested ``hp.choice`` of one dict per entry; distributions ``linear`` -> ``hp.uniform``,
``log`` -> ``hp.loguniform`` (natural-log bounds), ``log_near_one`` -> ``hp.loguniform`` of
``1 - x``; integer keys (``batch_size``, ...) are quantised (``hp.quniform`` /
``hp.qloguniform``) and cast. Values are rounded as random search rounds them (3
significant digits) and rendered with :mod:`cerebro_db.configs`, so the strings parse back.

Schedule: ``num_workers`` trials at the start, then one new trial per free slot
(:meth:`HyperoptSearch.on_idle`): a trial holds its slot until its result is reported (its
evaluation counts), so at most ``num_workers`` trials are in flight and TPE conditions every
suggestion on the results of all trials but those. Each suggestion is
one call of ``tpe.suggest`` / ``rand.suggest`` with a seed derived from ``random_state``
and a counter. A suggestion equal to an earlier configuration is asked again (up to 5
times), then replaced by a random one (up to 20 draws; TPE tends to repeat the best point
of a small discrete space, and a repeated configuration teaches nothing new), and only then
accepted as a repeat (a space smaller than ``num_configs``). Results are told as loss = score; NaN or infinite
scores as a failed trial (TPE ranks those last). Only finished trials are in hyperopt's
``Trials`` (hyperopt would count running ones as infinitely bad). TPE starts from
``n_startup_jobs = clamp(num_configs // 4, 1, 20)`` random suggestions (hyperopt's default is
20, which would make TPE plain random search for MADlib's default of 20 configurations).

The JSON state keeps every suggestion's raw hyperopt values and results; ``Trials`` is
rebuilt from them on resume, so a restored run suggests exactly what the original would.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .. import configs as _c
from ..errors import invalid
from .base import Decision, EngineView, EpochReport, Launch, TrialSpec, Tuner
from .options import (
    MAX_EPOCHS,
    MAX_TRIALS,
    int_option,
    num_workers_option,
    random_state_option,
)
from .space import Point, SearchSpace

__all__ = ["HyperoptSearch"]

_ALGORITHMS = ("tpe", "rand")
_RETRIES = 5
_RANDOM_RETRIES = 20
_OPL = _c.OPTIMIZER_PARAMS_LIST


def _py(v: Any) -> int | float:
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    return float(v)


class _SpaceMap:
    """The hyperopt expression of a :class:`SearchSpace`, and hyperopt values -> a point."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def expression(self) -> Any:
        from hyperopt import hp

        def node(label: str, value: _c.Choices) -> Any:
            if isinstance(value, list):
                return hp.choice(label, list(range(len(value))))
            lo, hi = value.low, value.high
            if value.integer:
                ilo, ihi = math.ceil(lo), math.floor(hi)
                if value.kind == "linear":
                    return hp.quniform(label, ilo - 0.499, ihi + 0.499, 1)
                return hp.qloguniform(label, math.log(lo), math.log(hi), 1)
            if value.kind == "linear":
                return hp.uniform(label, lo, hi)
            if value.kind == "log":
                return hp.loguniform(label, math.log(lo), math.log(hi))
            return hp.loguniform(label, math.log(1.0 - hi), math.log(1.0 - lo))

        cg, fg = self.space.compile_grid, self.space.fit_grid
        expr: dict[str, Any] = {"model_id": hp.choice("model_id", list(range(len(
            self.space.model_ids))))}
        for key, value in cg.items():
            if key == _OPL:
                expr[_OPL] = hp.choice(_OPL, [
                    {k: node(f"{_OPL}{n}/{k}", v) for k, v in od.items()}
                    for n, od in enumerate(value)])
            else:
                expr[f"compile/{key}"] = node(f"compile/{key}", value)
        for key, value in fg.items():
            expr[f"fit/{key}"] = node(f"fit/{key}", value)
        return expr

    @staticmethod
    def value(value: _c.Choices, v: float) -> Any:
        if isinstance(value, list):
            return value[int(v)]
        lo, hi = value.low, value.high
        if value.integer:
            return int(min(max(round(v), math.ceil(lo)), math.floor(hi)))
        if value.kind == "log_near_one":
            x = float(1 - _c._round_sig(v))
        else:
            x = float(_c._round_sig(v))
        return min(max(x, lo), hi)

    def point(self, vals: Mapping[str, list[Any]]) -> Point:
        def get(label: str, value: _c.Choices) -> Any:
            return self.value(value, vals[label][0])

        cg, fg = self.space.compile_grid, self.space.fit_grid
        model_id = self.space.model_ids[int(vals["model_id"][0])]
        opt: tuple[str, dict[str, Any]] | str
        if _OPL in cg:
            n = int(vals[_OPL][0])
            od = cg[_OPL][n]
            opt = (get(f"{_OPL}{n}/optimizer", od["optimizer"]),
                   {k: get(f"{_OPL}{n}/{k}", v) for k, v in od.items() if k != "optimizer"})
        else:
            opt = get("compile/optimizer", cg["optimizer"])
        others = [(k, get(f"compile/{k}", v)) for k, v in cg.items()
                  if k not in ("optimizer", _OPL)]
        compile_params = _c._render_compile(opt, others)
        fit_params = _c._render_fit((k, get(f"fit/{k}", v)) for k, v in fg.items())
        return Point(model_id, compile_params, fit_params)


class HyperoptSearch(Tuner):
    """``automl_method => 'hyperopt'`` (see the module docstring)."""

    name: ClassVar[str] = "hyperopt"
    defaults: ClassVar[dict[str, Any]] = {"num_configs": 20, "num_iterations": 5,
                                          "algorithm": "tpe"}
    bare_words: ClassVar[tuple[str, ...]] = ("algorithm",)
    option_names: ClassVar[tuple[str, ...]] = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None, num_configs: int = 20,
                 num_iterations: int = 5, algorithm: str = "tpe") -> None:
        self.num_configs = int_option("num_configs", num_configs, 1, MAX_TRIALS)
        self.num_iterations = int_option("num_iterations", num_iterations, 1, MAX_EPOCHS)
        algo = algorithm.lower() if isinstance(algorithm, str) else algorithm
        if algo not in _ALGORITHMS:
            raise invalid(f"automl_params: algorithm must be 'tpe' or 'rand', got {algorithm!r}")
        self.algorithm = algo
        self.space = SearchSpace(model_ids, compile_grid, fit_grid)
        self.num_workers = num_workers_option(num_workers)
        self.random_state = random_state_option(random_state)
        self.n_startup_jobs = max(1, min(20, num_configs // 4))
        self.base_seed = (int(np.random.default_rng().integers(2**63))
                          if random_state is None else random_state % 2**64)
        self.asks = 0
        self.history: list[dict[str, Any]] = []
        self.told: list[int] = []
        self.started = False
        self._seen: set[tuple[int, str, str]] = set()
        self._map = _SpaceMap(self.space)
        self._hyperopt: tuple[Any, Any, Any] | None = None

    def options(self) -> dict[str, Any]:
        return {**self.space.to_json(), "num_workers": self.num_workers,
                "random_state": self.random_state, "num_configs": self.num_configs,
                "num_iterations": self.num_iterations, "algorithm": self.algorithm}

    # -- hyperopt objects (built on first use, rebuilt from the history after a restore)

    def _objects(self) -> tuple[Any, Any, Any]:
        if self._hyperopt is None:
            from functools import partial

            from hyperopt import Trials, rand, tpe
            from hyperopt.base import Domain

            domain = Domain(None, self._map.expression())
            algo = (partial(tpe.suggest, n_startup_jobs=self.n_startup_jobs, verbose=False)
                    if self.algorithm == "tpe" else rand.suggest)
            self._hyperopt = (domain, Trials(), algo)
            for t in self.told:
                self._insert(self.history[t - 1])
        return self._hyperopt

    def _insert(self, h: Mapping[str, Any]) -> None:
        from hyperopt import JOB_STATE_DONE, STATUS_FAIL, STATUS_OK

        domain, trials, _ = self._objects()
        t = int(h["id"])
        vals = {k: list(v) for k, v in h["vals"].items()}
        misc = {"tid": t, "cmd": domain.cmd, "workdir": domain.workdir,
                "idxs": {k: [t] if v else [] for k, v in vals.items()}, "vals": vals}
        loss = h.get("loss")
        result = ({"status": STATUS_FAIL} if loss is None
                  else {"status": STATUS_OK, "loss": float(loss)})
        doc = trials.new_trial_docs([t], [None], [result], [misc])[0]
        doc["state"] = JOB_STATE_DONE
        trials.insert_trial_docs([doc])
        trials.refresh()

    def _seed(self) -> int:
        seq = np.random.SeedSequence([self.base_seed, self.asks])
        self.asks += 1
        return int(seq.generate_state(1, np.uint32)[0])

    def _suggest(self, t: int) -> tuple[dict[str, list[Any]], Point]:
        from hyperopt import rand

        domain, trials, algo = self._objects()
        vals: dict[str, list[Any]] = {}
        point: Point | None = None
        for attempt in range(_RETRIES + _RANDOM_RETRIES):
            suggest = algo if attempt < _RETRIES else rand.suggest
            doc = suggest([t], domain, trials, self._seed())[0]
            vals = {k: [_py(x) for x in v] for k, v in sorted(doc["misc"]["vals"].items())}
            point = self._map.point(vals)
            if self.space.key(point) not in self._seen:
                break
        assert point is not None
        self._seen.add(self.space.key(point))
        return vals, point

    def _launch(self, n: int) -> list[Decision]:
        out: list[Decision] = []
        for _ in range(min(n, self.num_configs - len(self.history))):
            t = len(self.history) + 1
            vals, p = self._suggest(t)
            self.history.append({"id": t, "vals": vals, "model_id": p.model_id,
                                 "compile_params": p.compile_params,
                                 "fit_params": p.fit_params})
            out.append(Launch(TrialSpec(t, p.model_id, p.compile_params, p.fit_params,
                                        meta={"algorithm": self.algorithm}),
                              self.num_iterations))
        return out

    # -- the Tuner contract

    def start(self) -> list[Decision]:
        if self.started:
            raise RuntimeError("hyperopt: start() called twice")
        self.started = True
        return self._launch(self.num_workers)

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        t = report.trial_id
        if not report.at_target or not 1 <= t <= len(self.history) \
                or "done" in self.history[t - 1]:
            return []
        h = self.history[t - 1]
        score = report.score
        h["loss"] = None if math.isnan(score) or math.isinf(score) else float(score)
        h["done"] = True
        self.told.append(t)
        if self._hyperopt is not None:
            self._insert(h)
        return []  # the slot it leaves is filled from on_idle, knowing this result

    def on_idle(self, view: EngineView) -> list[Decision]:
        if not self.started:
            return []
        return self._launch(view.free_slots)

    def done(self) -> bool:
        return len(self.told) >= self.num_configs

    def _dynamic_state(self) -> dict[str, Any]:
        return {"started": self.started, "base_seed": self.base_seed, "asks": self.asks,
                "history": self.history, "told": self.told}

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.started = bool(state.get("started", False))
        self.base_seed = int(state.get("base_seed", self.base_seed))
        self.asks = int(state.get("asks", 0))
        self.history = [dict(h) for h in state.get("history", [])]
        self.told = [int(t) for t in state.get("told", [])]
        self._seen = {self.space.key(Point(int(h["model_id"]), str(h["compile_params"]),
                                           str(h["fit_params"]))) for h in self.history}
        self._hyperopt = None
