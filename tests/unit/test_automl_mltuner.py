"""MLtuner on the engine (simulated executor): finds the learning rate, beats a bad fixed choice, frees
diverged branches, doubles the trial length, re-tunes on a stall within its bounds, state."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

import pytest

from cerebro_db.automl.base import EpochReport, Extend, Launch, Stop, TrialSpec, Tuner
from cerebro_db.automl.mltuner import Group, MLtuner, _rewrite, _settings, convergence
from cerebro_db.automl.registry import get_tuner, tuner_from_state_json
from cerebro_db.automl.simulate import SimResult, SyntheticLoss, simulate_tuner
from cerebro_db.errors import CerebroError

pytest.importorskip("keras")  # the search space and the simulated loss parse the compile params

FG = "{'batch_size': [32]}"


def grid(*lrs: float, optimizer: str = "SGD", extra: str = "") -> str:
    values = ", ".join(map(str, lrs))
    return ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': "
            f"['{optimizer}'], 'learning_rate': [{values}]{extra}}}]}}")


def mltuner(compile_grid: str, params: str = "", seed: int = 0, workers: int = 4,
            fit_grid: str = FG, model_ids: list[int] | None = None) -> MLtuner:
    t = get_tuner("mltuner", params, model_ids=model_ids or [1], compile_grid=compile_grid,
                  fit_grid=fit_grid, num_workers=workers, random_state=seed)
    assert isinstance(t, MLtuner)
    return t


def check_outputs(r: SimResult, t: MLtuner, n_configs: int) -> None:
    """One output per configuration; every candidate other than it is freed; trial ids are
    1, 2, ...; forks name their tunables in their strings; lineage within the budget."""
    assert sorted(r.trials) == list(range(1, len(r.trials) + 1))
    outs = r.outputs
    assert len(outs) == n_configs
    assert sorted(r.info[k]["config"] for k in outs) == list(range(1, n_configs + 1))
    for k, tr in r.trials.items():
        s = tr.spec
        for name, v in s.tunables.items():
            assert math.isclose(_settings(s.compile_params, s.fit_params)[name], v)
        if k not in outs:
            assert tr.freed
    assert t.done()
    for c in range(1, n_configs + 1):
        g = t.group(c)
        assert g.retunes <= t.max_retunes
        assert g.phase == "done"


class Fixed(Tuner):
    """Baseline: one trial with a fixed learning rate for ``n`` epochs."""

    name = "fixed"

    def __init__(self, lr: float, n: int) -> None:
        self.lr, self.n, self.finished = lr, n, False

    def options(self) -> dict[str, Any]:
        return {}

    def start(self) -> list[Any]:
        return [Launch(TrialSpec(1, 1, f"optimizer='SGD(learning_rate={self.lr})',loss='mse'",
                                 "batch_size=32"), self.n)]

    def on_epoch(self, report: EpochReport) -> list[Any]:
        self.finished = self.finished or report.at_target
        return []

    def done(self) -> bool:
        return self.finished


def test_convergence_measure() -> None:
    smooth = [(float(i), 2.0 * math.exp(-0.1 * i)) for i in range(12)]
    m = convergence(smooth)
    assert m.stable and m.speed > 0 and not m.diverged and not m.increasing
    assert convergence(smooth[:1]).speed != convergence(smooth[:1]).speed  # NaN: too short
    m = convergence([*smooth[:5], (5.0, math.nan)])
    assert m.diverged and not m.stable and m.speed == -math.inf
    m = convergence([(float(i), 1.0 + 0.1 * i) for i in range(8)])
    assert m.increasing and not m.stable and m.speed < 0
    flat_noisy = [(float(i), 1.0 + (0.2 if i % 3 == 0 else -0.1)) for i in range(10)]
    assert not convergence(flat_noisy).stable
    # the noise penalty: same slope, more scatter -> lower speed
    clean = [(float(i), 2.0 - 0.1 * i) for i in range(10)]
    noisy = [(float(i), 2.0 - 0.1 * i + (0.03 if i in (2, 3) else 0.0)) for i in range(10)]
    assert convergence(noisy).speed < convergence(clean).speed
    assert convergence(noisy, noise_penalty=0.0).speed == pytest.approx(
        convergence(clean).speed, rel=0.2)


def test_rewrite_strings() -> None:
    c, f = _rewrite("optimizer='SGD(learning_rate=0.01, momentum=0.5)', loss='mse'",
                    "batch_size=32", {"learning_rate": 0.003, "momentum": 0.9,
                                      "batch_size": 128})
    assert _settings(c, f) == {"learning_rate": 0.003, "momentum": 0.9, "batch_size": 128}
    c, f = _rewrite("optimizer='Adam', loss='mse', metrics=['mae']", "",
                    {"learning_rate": 0.02})
    assert "learning_rate=0.02" in c and "mae" in c
    assert _settings(c, f)["batch_size"] == 32


@pytest.mark.parametrize("best,start_lr,seed", [(0.003, 0.1, 0), (0.03, 0.0001, 1),
                                                (0.3, 0.001, 2), (0.03, 0.1, 3)])
def test_finds_the_learning_rate(best: float, start_lr: float, seed: int) -> None:
    t = mltuner(grid(start_lr), "num_iterations=12", seed=seed)
    model = SyntheticLoss(best_lr=best, floor_slope=0.0, seed=seed)
    r = simulate_tuner(t, num_partitions=4, num_workers=4, loss_model=model)
    check_outputs(r, t, 1)
    first = t.history(1)[0]
    assert best / 3 <= first["learning_rate"] <= best * 3
    out = r.outputs[0]
    assert r.info[out]["learning_rate"] == first["learning_rate"]
    assert t.history(1)[-1]["at_epoch"] + r.trials[out].completed == 12


def test_faster_than_the_worst_fixed_choice() -> None:
    model = SyntheticLoss(best_lr=0.03, floor_slope=0.0)
    spec = TrialSpec(1, 1, "optimizer='SGD(learning_rate=0.01)',loss='mse'", "batch_size=32")
    floor, init = model.floor(spec), model.initial(spec)
    target = floor + 0.1 * (init - floor)

    def reach(r: SimResult, trials: set[int] | None = None) -> float:
        times = [e.now for e in r.epoch_reports if e.score <= target
                 and (trials is None or e.trial_id in trials)]
        return min(times, default=math.inf)

    fixed = {}
    for lr in (1e-4, 1e-3, 1e-2, 1e-1, 0.2):
        r = simulate_tuner(Fixed(lr, 12), num_partitions=4, num_workers=4, loss_model=model,
                           metrics_compute_frequency=1, validation=False)
        fixed[lr] = reach(r)
    t = mltuner(grid(1e-4), "num_iterations=12", seed=0)
    r = simulate_tuner(t, num_partitions=4, num_workers=4, loss_model=model, validation=False)
    mine = reach(r, {h["winner"] for h in t.history(1)})
    worst = max(fixed.values())
    assert mine < worst
    assert math.isfinite(mine)
    # the configuration as given (1e-4) never gets there within the budget
    assert fixed[1e-4] == math.inf
    # and MLtuner is within 1.5x of the best fixed choice found by hindsight
    assert mine <= 1.5 * min(fixed.values())


def test_diverged_branches_are_freed() -> None:
    t = mltuner(grid(0.01), "num_iterations=6, lr_max=1.0", seed=4)
    r = simulate_tuner(t, num_partitions=3, num_workers=3,
                       loss_model=SyntheticLoss(best_lr=0.003))
    check_outputs(r, t, 1)
    nan_trials = {u.trial_id for u in r.unit_reports if math.isnan(u.loss)}
    assert nan_trials
    stops = {d.decision.trial_id: d for d in r.decisions if isinstance(d.decision, Stop)}
    for k in nan_trials:
        d = stops[k]
        assert d.decision.free and d.decision.reason == "diverged"
        first_nan = min(u.now for u in r.unit_reports if u.trial_id == k and math.isnan(u.loss))
        assert d.time == first_nan  # freed at the first NaN, not at the end of the round
        assert not [e for e in r.epoch_reports if e.trial_id == k and e.now > d.time]
    assert not set(r.outputs) & nan_trials


def test_all_diverged_keeps_the_main_trial() -> None:
    t = mltuner(grid(0.5), "num_iterations=4, lr_min=0.2, lr_max=1.0, num_branches=2")
    r = simulate_tuner(t, num_partitions=2, num_workers=2,
                       loss_model=SyntheticLoss(best_lr=0.001))
    assert r.outputs == [1] and not r.trials[1].freed
    assert r.trials[1].reason == "diverged" and t.done()
    assert all(r.trials[k].freed for k in r.trials if k != 1)


class Zigzag:
    """Loss that decreases by ``d`` per unit around a zigzag of amplitude ``a`` (units of a
    trial alternate up and down): with 5 partitions one epoch looks unstable, two do not."""

    def __init__(self, d: float = 0.01, a: float = 0.05) -> None:
        self.d, self.a = d, a
        self.count: dict[int, int] = defaultdict(int)

    def initial(self, spec: TrialSpec) -> float:
        return 2.0

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        lr = _settings(spec.compile_params, spec.fit_params)["learning_rate"]
        n = self.count[spec.trial_id]
        self.count[spec.trial_id] += 1
        new = level - self.d * (1 + lr)
        return new + (self.a if n % 2 else -self.a), new

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        return level, None


def test_trial_length_doubles_when_no_branch_is_stable() -> None:
    t = mltuner(grid(0.01), "num_iterations=8, num_branches=2, search_steps=1")
    r = simulate_tuner(t, num_partitions=5, num_workers=3, loss_model=Zigzag(),
                       unit_time=lambda s, p: 1.0, validation=False)
    check_outputs(r, t, 1)
    first = t.history(1)[0]
    assert first["trial_epochs"] == 2 and first["stable"]
    doubling = [d.decision for d in r.decisions if isinstance(d.decision, Extend)
                and d.decision.target == 2 and d.source == "epoch"]
    assert {d.trial_id for d in doubling} == {1, 2, 3}
    assert r.trials[r.outputs[0]].completed + first["at_epoch"] == 8


def test_doubling_is_bounded_by_max_trial_epochs() -> None:
    t = mltuner(grid(0.01), "num_iterations=8, num_branches=2, search_steps=1, "
                "max_trial_epochs=1")
    r = simulate_tuner(t, num_partitions=5, num_workers=3, loss_model=Zigzag(),
                       unit_time=lambda s, p: 1.0, validation=False)
    first = t.history(1)[0]
    assert first["trial_epochs"] == 1 and not first["stable"]
    assert t.history(1)[-1]["at_epoch"] + r.trials[r.outputs[0]].completed == 8
    assert all(h["trial_epochs"] == 1 for h in t.history(1))


def test_retunes_on_a_stall_within_bounds() -> None:
    model = SyntheticLoss(best_lr=0.03, floor_slope=2.0)
    t = mltuner(grid(0.03), "num_iterations=24, max_retunes=2", seed=1)
    r = simulate_tuner(t, num_partitions=3, num_workers=4, loss_model=model)
    check_outputs(r, t, 1)
    hist = t.history(1)
    g = t.group(1)
    assert g.retunes == len(hist) - 1 >= 1
    assert g.retunes <= 2
    # a higher learning rate stalls higher here: the re-tunings lower it
    assert hist[-1]["learning_rate"] < hist[0]["learning_rate"]
    # each re-tuning forked from the trial that stalled, with a keep branch
    keeps = [d.decision for d in r.decisions
             if isinstance(d.decision, Launch) and d.decision.spec.meta["role"] == "keep"]
    assert len(keeps) == g.retunes
    assert all(k.spec.parent is not None and not k.spec.tunables for k in keeps)
    # the tuning share bound held: losers' epochs vs all epochs
    total = g.tuning_epochs + 24
    assert g.tuning_epochs <= t.max_tuning_share * total
    out = r.outputs[0]
    assert hist[-1]["winner"] == out and r.info[out]["retunes"] == g.retunes

    none = mltuner(grid(0.03), "num_iterations=24, max_retunes=0", seed=1)
    simulate_tuner(none, num_partitions=3, num_workers=4, loss_model=model)
    assert none.group(1).retunes == 0 and len(none.history(1)) == 1
    share = mltuner(grid(0.03), "num_iterations=24, max_tuning_share=0.0", seed=1)
    simulate_tuner(share, num_partitions=3, num_workers=4, loss_model=model)
    assert share.group(1).retunes == 0


def test_parallel_configs_momentum_and_batch_size() -> None:
    cg = grid(0.001, 0.01, extra=", 'momentum': [0.5]")
    t = mltuner(cg, "num_iterations=6, tunables='learning_rate,momentum,batch_size'", seed=2,
                model_ids=[1, 2])
    r = simulate_tuner(t, num_partitions=2, num_workers=4, loss_model=SyntheticLoss())
    check_outputs(r, t, 4)
    branches = [d.decision.spec for d in r.decisions if isinstance(d.decision, Launch)
                and d.decision.spec.meta["role"] == "branch"]
    assert {_settings(s.compile_params, s.fit_params)["batch_size"] for s in branches} != {32}
    assert len({_settings(s.compile_params, s.fit_params)["momentum"] for s in branches}) > 2
    # configurations are tuned concurrently: units of different configs overlap in time
    cfg = {k: tr.spec.meta["config"] for k, tr in r.trials.items()}
    first_end = {c: min(u.end for u in r.units if cfg[u.config] == c) for c in range(1, 5)}
    assert max(first_end.values()) < r.makespan / 2
    assert len(r.info_columns) == 8 and r.info_columns[0] == ("config", "integer")


def test_distributions_sample_num_configs() -> None:
    cg = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['Adam'], " \
         "'learning_rate': [0.0001, 0.1, 'log']}]}"
    t = mltuner(cg, "num_configs=3, num_iterations=4, num_branches=2, search_steps=1")
    r = simulate_tuner(t, num_partitions=2, num_workers=2,
                       loss_model=SyntheticLoss(best_lr=0.001))
    check_outputs(r, t, 3)


def test_json_round_trip_and_reproducible() -> None:
    def run(seed: int, roundtrip: bool = False) -> SimResult:
        t = mltuner(grid(0.001, 0.1), "num_iterations=10, max_retunes=1", seed=seed)
        return simulate_tuner(t, num_partitions=3, num_workers=3,
                              loss_model=SyntheticLoss(best_lr=0.01, floor_slope=1.0),
                              roundtrip_state=roundtrip)
    a, b, c = run(7), run(7, roundtrip=True), run(8)
    assert a.decisions == b.decisions and a.final_state == b.final_state
    assert a.decisions == run(7).decisions
    assert [d.decision for d in a.decisions] != [d.decision for d in c.decisions]
    restored = tuner_from_state_json(a.final_state)
    assert isinstance(restored, MLtuner) and restored.done()
    assert restored.history(1) == tuner_from_state_json(b.final_state).history(1)


@pytest.mark.parametrize("params,message", [
    ("num_branches=0", "num_branches must be at least 1"),
    ("num_iterations=1", "num_iterations must be at least 2"),
    ("tunables='momentum'", "must include learning_rate"),
    ("tunables='lr'", "tunables must list"),
    ("max_tuning_share=1.5", "max_tuning_share must be a number"),
    ("lr_min=0.0", "lr_min must be a number above 0"),
    ("stall_fraction=2.0", "stall_fraction must be"),
    ("bogus=1", "unknown key 'bogus'"),
])
def test_bad_params(params: str, message: str) -> None:
    with pytest.raises(CerebroError, match=message):
        mltuner(grid(0.01), params)


class Overshoot:
    """Real-data shape (Fashion-MNIST, Adam): from a common start of 2.3, a learning rate
    above ``best`` spikes in its first unit (the unit's reported loss is the mean over its
    batches) and then drops steeply, but to a plateau that grows with the rate; below
    ``best`` the loss falls more slowly. Evaluations are exact."""

    def __init__(self, best: float = 0.003) -> None:
        self.best = best

    def _r(self, spec: TrialSpec) -> float:
        return _settings(spec.compile_params, spec.fit_params)["learning_rate"] / self.best

    def _floor(self, r: float) -> float:
        return 0.3 * (1.0 + 0.8 * max(0.0, math.log2(r)))

    def initial(self, spec: TrialSpec) -> float:
        return 2.3

    def step(self, spec: TrialSpec, level: float, epoch: int, partition: int,
             num_partitions: int) -> tuple[float, float]:
        r = self._r(spec)
        floor = self._floor(r)
        new = floor + (level - floor) * math.exp(-1.5 * min(r, 1.0) / num_partitions)
        spike = 2.5 * max(0.0, level - floor) * max(0.0, math.log10(r))
        return 0.5 * (level + new) + spike, new

    def evaluate(self, spec: TrialSpec, level: float, epoch: int,
                 validation: bool) -> tuple[float, float | None]:
        return level, (1.1 * level if validation else None)


def test_a_steep_drop_to_a_worse_plateau_loses() -> None:
    """Ranked by the slope of its own 2-point trace, a too-high rate whose first unit starts
    far above the others would look fastest; ranked from the common start to the loss
    reached (and with at least 3 points per branch) it loses."""
    high = [(1.0, 10.3), (2.0, 1.50), (3.0, 1.47), (4.0, 1.47)]
    good = [(1.0, 1.77), (2.0, 0.99), (3.0, 0.60), (4.0, 0.45)]
    assert convergence(high[:2]).speed > convergence(good[:2]).speed  # the trace-slope measure
    assert not convergence(good[:2]).stable  # two points are not enough
    h = convergence(high, start=2.3, reached=1.47, seconds=4.0)
    g = convergence(good, start=2.3, reached=0.40, seconds=4.0)
    assert g.stable and g.speed > h.speed
    # ending above the common start is a divergence even if the trace itself went down
    assert convergence(high, start=1.0, reached=1.47, seconds=4.0).increasing

    model = Overshoot(best=0.003)
    for partitions, seed in ((2, 0), (2, 1), (4, 2)):
        t = mltuner(grid(0.00316, optimizer="Adam"),
                    "num_iterations=6, lr_min=0.0001, lr_max=0.1", seed=seed,
                    workers=partitions)
        r = simulate_tuner(t, num_partitions=partitions, num_workers=partitions,
                           loss_model=model, unit_time=lambda s, p: 1.0)
        check_outputs(r, t, 1)
        first = t.history(1)[0]
        tried = {_settings(tr.spec.compile_params, tr.spec.fit_params)["learning_rate"]
                 for tr in r.trials.values()}
        assert max(tried) > 0.015  # a too-high rate was among the candidates
        assert 0.001 <= first["learning_rate"] <= 0.009, (partitions, seed, first)
        assert first["stable"] and first["trial_epochs"] * partitions >= 3
        out = r.outputs[0]
        final = [e.train_loss for e in r.epoch_reports if e.trial_id == out][-1]
        assert final < 0.7 < model._floor(0.03 / 0.003)


def test_group_state_is_typed_and_round_trips_as_json():
    g = Group(config=2, range=(1e-4, 0.5), phase="train", checkpoint=None, current=7,
              speed=math.inf, start_loss=-math.inf, last_loss=0.25, cands=[7, 8],
              history=[{"winner": 7}])
    d = g.to_json()
    assert json.loads(json.dumps(d)) == d
    assert d["range"] == [1e-4, 0.5] and d["speed"] == "inf" and d["start_loss"] == "-inf"
    back = Group.from_json(d)
    assert back == g and isinstance(back.range, tuple)
    back.cands.append(9)
    assert g.cands == [7, 8]
