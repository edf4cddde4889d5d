"""ASHA on the engine (simulated executor): promotion rule (property test), rungs, budgets, state, seeds."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro_db.automl.asha import ASHA, rung_resources
from cerebro_db.automl.base import Extend, Launch, Stop, TrialSpec, Tuner, score_key
from cerebro_db.automl.registry import get_tuner, tuner_from_state_json
from cerebro_db.automl.simulate import SimResult, simulate_tuner
from cerebro_db.errors import CerebroError

pytest.importorskip("keras")  # the search space and the simulated loss parse the compile params

CG = ("{'loss': ['mse'], 'optimizer_params_list': "
      "[{'optimizer': ['SGD'], 'learning_rate': [0.0001, 0.5, 'log']}]}")
FG = "{'batch_size': [16, 32, 64]}"


class RandomScores:
    """Scores drawn from (seed, trial, epoch): an arbitrary score sequence per trial, with
    some NaN; training losses likewise."""

    def __init__(self, seed: int, nan_rate: float = 0.1) -> None:
        self.seed = seed
        self.nan_rate = nan_rate

    def initial(self, spec: TrialSpec) -> float:
        return 1.0

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        return level, level

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        rng = np.random.default_rng([self.seed, spec.trial_id, epoch])
        x = math.nan if rng.uniform() < self.nan_rate else float(rng.uniform())
        return x, (x if validation else None)


def random_times(seed: int):
    def t(spec: TrialSpec, partition: int) -> float:
        return float(np.random.default_rng([seed, spec.trial_id, partition]).uniform(0.2, 3.0))
    return t


def asha(params: str = "", workers: int = 3, seed: int = 0) -> Tuner:
    return get_tuner("asha", params, model_ids=[1, 2], compile_grid=CG, fit_grid=FG,
                     num_workers=workers, random_state=seed)


def check_asha(r: SimResult, t: ASHA) -> None:
    """Replay the log: every promotion is of a trial in the top floor(n/eta) of its rung at
    that moment, that had reached the rung; targets never pass max_r; launches <= max_configs;
    at the end every trial is stopped."""
    rung_of: dict[int, tuple[int, int]] = {}
    rungs: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    promoted: set[tuple[int, int, int]] = set()
    launches = 0
    for kind, x in r.log:
        if kind == "epoch" and x.at_target:
            b, k = rung_of[x.trial_id]
            assert x.epoch == t.resources[b][k]
            rungs[(b, k)][x.trial_id] = x.score
        if kind != "decision":
            continue
        d = x.decision
        if isinstance(d, Launch):
            launches += 1
            b = d.spec.meta["bracket"]
            rung_of[d.spec.trial_id] = (b, 0)
            assert d.target == t.resources[b][0] <= t.max_r
        elif isinstance(d, Extend):
            b, k = rung_of[d.trial_id]
            rung = rungs[(b, k)]
            assert d.trial_id in rung, "promoted a trial that had not reached its rung"
            assert (d.trial_id, b, k) not in promoted, "promoted twice"
            n = len(rung) // t.eta
            top = sorted(rung, key=lambda i: (score_key(rung[i]), i))[:n]
            assert d.trial_id in top, "promoted a trial outside the top 1/eta of its rung"
            assert math.isfinite(rung[d.trial_id])
            assert d.target == t.resources[b][k + 1] <= t.max_r
            assert d.meta["rung"] == k + 1
            promoted.add((d.trial_id, b, k))
            rung_of[d.trial_id] = (b, k + 1)
    assert launches <= t.max_configs
    assert all(tr.completed <= t.max_r for tr in r.trials.values())
    assert all(tr.stopped for tr in r.trials.values())
    assert t.done()
    ids = sorted(r.trials)
    assert ids == list(range(1, len(ids) + 1))
    for tid, tr in r.trials.items():
        b, k = rung_of[tid]
        assert r.info[tid] == {"bracket": b, "rung": k}
        top = k == len(t.resources[b]) - 1
        assert tr.reason == ("completed" if top else "not promoted")
    assert len(t.promotions) == len(promoted)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), workers=st.integers(1, 4), parts=st.integers(1, 3),
       eta=st.integers(2, 3), max_r=st.integers(1, 10), brackets=st.integers(1, 2),
       max_configs=st.integers(1, 14), freq=st.sampled_from([None, 1, 2]))
def test_asha_properties(seed: int, workers: int, parts: int, eta: int, max_r: int,
                         brackets: int, max_configs: int, freq: int | None) -> None:
    if eta ** (brackets - 1) > max_r:
        brackets = 1
    params = f"eta={eta}, max_r={max_r}, brackets={brackets}, max_configs={max_configs}"
    t = asha(params, workers, seed)
    assert isinstance(t, ASHA)
    r = simulate_tuner(t, num_partitions=parts, num_workers=workers,
                       metrics_compute_frequency=freq, loss_model=RandomScores(seed),
                       unit_time=random_times(seed), seed=seed)
    check_asha(r, t)
    # a trial waiting for its evaluation holds its worker's slot
    assert r.max_in_flight() <= workers
    # JSON round trip after every step continues identically
    t2 = asha(params, workers, seed)
    r2 = simulate_tuner(t2, num_partitions=parts, num_workers=workers,
                        metrics_compute_frequency=freq, loss_model=RandomScores(seed),
                        unit_time=random_times(seed), seed=seed, roundtrip_state=True)
    assert r2.decisions == r.decisions
    assert r2.final_state == r.final_state


def test_rung_resources() -> None:
    assert rung_resources(1, 9, 3, 0) == [1, 3, 9]
    assert rung_resources(1, 9, 3, 1) == [3, 9]
    assert rung_resources(1, 10, 3, 0) == [1, 3, 9, 10]
    assert rung_resources(2, 20, 2, 0) == [2, 4, 8, 16, 20]
    assert rung_resources(1, 1, 3, 0) == [1]
    assert rung_resources(1, 9, 3, 2) == [9]


def test_default_run_promotes_asynchronously() -> None:
    t = asha(workers=4, seed=3)
    assert isinstance(t, ASHA)
    r = simulate_tuner(t, num_partitions=4, num_workers=4)
    check_asha(r, t)
    launches = [d for d in r.decisions if isinstance(d.decision, Launch)]
    assert len(launches) == 27 == len(r.outputs)
    assert t.options()["max_r"] == 9 and t.options()["eta"] == 3
    assert [b for b in (r.info[k]["bracket"] for k in r.trials)] == [0] * 27
    rungs = [len(t.rung(0, k)) for k in range(3)]
    assert rungs[0] == 27 and 27 // 3 >= rungs[1] >= 3 and 1 <= rungs[2] <= rungs[1]
    # no barrier: the first promotion happens before rung 0 is full
    first = t.promotions[0]
    assert first[4] < max(d.time for d in launches)
    # the best output trained to max_r
    assert r.trials[r.outputs[0]].completed == 9
    assert r.info_columns == [("bracket", "integer"), ("rung", "integer")]


def test_seeded_runs_reproducible() -> None:
    def run(seed: int) -> list[Any]:
        t = asha("max_configs=10", seed=seed)
        return [d.decision for d in simulate_tuner(t, num_partitions=2, num_workers=3).decisions]
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_resume_from_json_after_every_step() -> None:
    """A resumed run (tuner rebuilt from state_json after every step, as after a kill)
    makes the same decisions as an uninterrupted one."""
    full = simulate_tuner(asha("max_configs=12", seed=11), num_partitions=2, num_workers=2)
    resumed = simulate_tuner(asha("max_configs=12", seed=11), num_partitions=2, num_workers=2,
                             roundtrip_state=True)
    assert resumed.decisions == full.decisions
    assert len([d for d in full.decisions if isinstance(d.decision, Extend)]) >= 3
    state = tuner_from_state_json(full.final_state)
    assert isinstance(state, ASHA) and state.done() and len(state.promotions) >= 3


def test_brackets_start_higher() -> None:
    t = asha("brackets=2, max_configs=20", workers=2, seed=1)
    assert isinstance(t, ASHA)
    assert t.resources == [[1, 3, 9], [3, 9]]
    r = simulate_tuner(t, num_partitions=2, num_workers=2)
    check_asha(r, t)
    first = {d.decision.spec.meta["bracket"]: d.decision.target for d in r.decisions
             if isinstance(d.decision, Launch)}
    assert first == {0: 1, 1: 3}


def test_time_budget_stops_new_configs() -> None:
    t = asha("time_budget=20.0, max_configs=100", workers=2, seed=2)
    r = simulate_tuner(t, num_partitions=2, num_workers=2)
    check_asha(r, t)
    launch_times = [d.time for d in r.decisions if isinstance(d.decision, Launch)]
    assert max(launch_times) < 20.0 < r.makespan
    assert len(launch_times) < 100


def test_small_grid_runs_out() -> None:
    grid = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], " \
           "'learning_rate': [0.001, 0.01, 0.1]}]}"
    t = get_tuner("asha", "max_configs=50", model_ids=[1], compile_grid=grid,
                  fit_grid="{'batch_size': [32]}", num_workers=2, random_state=0)
    r = simulate_tuner(t, num_partitions=2, num_workers=2)
    assert len(r.trials) == 3
    assert sorted(s.compile_params for s in r.specs().values()) == sorted(
        f"optimizer='SGD(learning_rate={x})',loss='mse'" for x in ("0.001", "0.01", "0.1"))


def test_nan_never_promoted() -> None:
    t = asha("max_configs=9", seed=0)
    r = simulate_tuner(t, num_partitions=1, num_workers=3, loss_model=RandomScores(1, 1.0))
    assert not [d for d in r.decisions if isinstance(d.decision, Extend)]
    assert all(tr.reason == "not promoted" for tr in r.trials.values())
    assert all(isinstance(d.decision, (Launch, Stop)) for d in r.decisions)


@pytest.mark.parametrize("params,message", [
    ("eta=1", "eta must be at least 2"),
    ("min_r=0", "min_r must be at least 1"),
    ("max_r=0", "max_r must be at least 1"),
    ("brackets=4", "brackets=4 needs"),
    ("max_configs=0", "max_configs must be at least 1"),
    ("time_budget=-1.0", "time_budget must be"),
    ("eta=2.5", "eta must be an integer"),
    ("R=3", "unknown key 'R'"),
])
def test_bad_params(params: str, message: str) -> None:
    with pytest.raises(CerebroError, match=message):
        asha(params)
