"""The AutoML engine (run_fit, TrialBook, the engine hooks) on the simulated executor: MOP
invariants, evaluation and report rules, the error rules."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from cerebro_db.automl.base import (
    Decision,
    EngineView,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    UnitReport,
)
from cerebro_db.automl.simulate import SimResult, SyntheticLoss, simulate_tuner
from cerebro_db.automl.trials import AutoMLError
from cerebro_db.scheduling import check_invariants

pytest.importorskip("keras")  # the simulated loss and unit times parse the compile params

SGD = "optimizer='SGD(learning_rate={lr})',loss='mse'"
FIT = "batch_size=32"


def spec(tid: int, lr: float = 0.01, parent: int | None = None, model: int = 1,
         tunables: dict[str, float] | None = None) -> TrialSpec:
    return TrialSpec(tid, model, SGD.format(lr=lr), FIT, parent, tunables or {})


class Script(Tuner):
    """A test procedure: launches ``launches`` at start; ``react(tuner, report)`` answers
    epoch reports; done once every launched trial reported at its target (or ``forever``)."""

    name = "script"

    def __init__(self, launches: list[Decision], react: Callable[..., list[Decision]] | None =
                 None, on_unit: Callable[..., list[Decision]] | None = None,
                 idle: Callable[..., list[Decision]] | None = None,
                 forever: bool = False) -> None:
        self.launches = launches
        self.react = react
        self.unit_cb = on_unit
        self.idle_cb = idle
        self.forever = forever
        self.waiting = {d.spec.trial_id for d in launches if isinstance(d, Launch)}
        self.units: list[UnitReport] = []
        self.epochs: list[EpochReport] = []

    def options(self) -> dict[str, Any]:
        return {}

    def start(self) -> list[Decision]:
        return list(self.launches)

    def on_unit(self, report: UnitReport) -> list[Decision]:
        self.units.append(report)
        return self.unit_cb(self, report) if self.unit_cb else []

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        self.epochs.append(report)
        out = self.react(self, report) if self.react else []
        if report.at_target and not any(isinstance(d, Extend) and d.trial_id == report.trial_id
                                        for d in out):
            self.waiting.discard(report.trial_id)
        for d in out:
            if isinstance(d, Launch):
                self.waiting.add(d.spec.trial_id)
        return out

    def on_idle(self, view: EngineView) -> list[Decision]:
        return self.idle_cb(self, view) if self.idle_cb else []

    def done(self) -> bool:
        return not self.forever and not self.waiting


@pytest.mark.parametrize("workers,parts,freq", [(1, 1, None), (2, 3, None), (3, 3, 2),
                                                (4, 2, 1), (3, 5, 3)])
def test_fixed_trials_invariants(workers: int, parts: int, freq: int | None) -> None:
    launches: list[Decision] = [Launch(spec(i, 0.001 * i), 2 + i % 3) for i in range(1, 6)]
    t = Script(launches)
    r = simulate_tuner(t, num_partitions=parts, num_workers=workers,
                       metrics_compute_frequency=freq)
    targets = {i: 2 + i % 3 for i in range(1, 6)}
    every = {e for e in range(1, 5) if freq and e % freq == 0}
    check_invariants(r.units, num_partitions=parts, epochs=targets,
                     eval_epochs={i: every | {t} for i, t in targets.items()})
    for i in range(1, 6):
        target = 2 + i % 3
        assert r.trials[i].completed == target
        evaluated = sorted(e.epoch for e in t.epochs if e.trial_id == i)
        expected = {target} | ({e for e in range(1, target + 1) if e % freq == 0} if freq else set())
        assert evaluated == sorted(expected)
        assert [e.at_target for e in t.epochs if e.trial_id == i] == \
            [e == target for e in evaluated]
        n_units = len([u for u in t.units if u.trial_id == i])
        assert n_units == target * parts
        evals = [u for u in r.units if u.kind == "eval" and u.config == i]
        assert len(evals) == len(expected) * parts
    # every report is logged, in time order
    times = [x.now if not hasattr(x, "decision") else x.time for _, x in r.log]
    assert times == sorted(times)
    assert r.makespan == max(u.end for u in r.units)
    assert [k for k, _ in r.ranking] == sorted(r.trials, key=lambda k: r.trials[k].score)
    # the book's sink got every decision, numbered in order
    assert [rec[0] for rec in r.records] == list(range(1, len(r.decisions) + 1))
    assert [rec[1:3] for rec in r.records] == [("launch", i) for i in range(1, 6)]


def test_lagging_trials_first_and_parallel_speedup() -> None:
    launches: list[Decision] = [Launch(spec(i), 3) for i in range(1, 5)]
    one = simulate_tuner(Script(list(launches)), num_partitions=4, num_workers=1,
                         unit_time=lambda s, p: 1.0, eval_time=lambda s, p: 0.0)
    four = simulate_tuner(Script(list(launches)), num_partitions=4, num_workers=4,
                          unit_time=lambda s, p: 1.0, eval_time=lambda s, p: 0.0)
    assert one.makespan == pytest.approx(48.0)
    # each trial's visit order per epoch is seeded (the same models whatever the timing), so
    # two trials may wait for the same partition: not always the ideal 12, but parallel
    assert 12.0 <= four.makespan < one.makespan / 2
    check_invariants(four.units, num_partitions=4, epochs=3, eval_epochs={3})
    # with one worker and equal work, lagging-first keeps the trials within one unit of
    # each other
    done: dict[int, int] = defaultdict(int)
    for u in sorted((u for u in one.units if u.kind == "train"), key=lambda u: u.start):
        done[u.config] += 1
        assert max(done.values()) - min(done.get(i, 0) for i in range(1, 5)) <= 1


def test_reproducible_and_seed_changes_tiebreaks() -> None:
    def run(seed: int) -> SimResult:
        return simulate_tuner(Script([Launch(spec(i), 2) for i in range(1, 7)]),
                              num_partitions=3, num_workers=3, seed=seed,
                              unit_time=lambda s, p: 1.0)
    a, b, c = run(1), run(1), run(2)
    assert a.units == b.units and a.decisions == b.decisions
    assert [(u.config, u.partition) for u in a.units] != \
        [(u.config, u.partition) for u in c.units]


def test_extend_pauses_and_stop_and_free() -> None:
    def react(t: Script, r: EpochReport) -> list[Decision]:
        if r.trial_id == 1 and r.epoch == 1:
            return [Extend(1, 3, meta={"rung": 1}), Extend(1, 2)]  # the second is a no-op
        if r.trial_id == 2 and r.at_target:
            return [Stop(2, "enough"), Stop(3, "lost", free=True)]
        return []

    t = Script([Launch(spec(1), 1), Launch(spec(2), 1), Launch(spec(3), 50)], react)
    t.waiting.discard(3)
    r = simulate_tuner(t, num_partitions=2, num_workers=2, unit_time=lambda s, p: 1.0)
    assert r.trials[1].completed == 3 and r.trials[1].target == 3
    assert r.trials[1].meta["rung"] == 1
    assert r.trials[2].stopped and not r.trials[2].freed and r.trials[2].reason == "enough"
    assert r.trials[3].freed and 3 not in r.outputs and 3 not in r.info
    freed_at = next(d.time for d in r.decisions if isinstance(d.decision, Stop)
                    and d.decision.free)
    assert all(u.start <= freed_at for u in r.units if u.config == 3)
    assert r.trials[3].completed < 50
    assert not [e for e in t.epochs if e.trial_id == 3]
    assert sorted(r.outputs) == [1, 2]


def test_stop_lets_the_unit_in_flight_finish() -> None:
    def on_unit(t: Script, u: UnitReport) -> list[Decision]:
        if u.trial_id == 2 and u.epoch == 1 and u.partition is not None and len(
                [x for x in t.units if x.trial_id == 2]) == 1:
            return [Stop(1, "cut")]
        return []

    t = Script([Launch(spec(1), 4), Launch(spec(2), 1)], on_unit=on_unit)
    t.waiting.discard(1)
    r = simulate_tuner(t, num_partitions=2, num_workers=2, unit_time=lambda s, p: 1.0 + s.trial_id)
    stop_time = next(d.time for d in r.decisions if isinstance(d.decision, Stop))
    ones = [u for u in r.units if u.config == 1 and u.kind == "train"]
    assert all(u.start < stop_time for u in ones)
    assert len(ones) == len([x for x in t.units if x.trial_id == 1])
    assert r.trials[1].completed < 4 and r.trials[1].stopped


def test_fork_copies_parent_state() -> None:
    model = SyntheticLoss(noise=0.0, partition_spread=0.0)

    def react(t: Script, r: EpochReport) -> list[Decision]:
        if r.trial_id == 1 and r.epoch == 3:
            return [Launch(spec(2, 0.02, parent=1, tunables={"learning_rate": 0.02}), 1),
                    Launch(spec(3, 0.01), 1)]
        return []

    t = Script([Launch(spec(1), 3)], react)
    simulate_tuner(t, num_partitions=2, num_workers=1, loss_model=model)
    last_parent = [u.loss for u in t.units if u.trial_id == 1][-1]
    first_child = next(u.loss for u in t.units if u.trial_id == 2)
    first_fresh = next(u.loss for u in t.units if u.trial_id == 3)
    assert first_child < last_parent < first_fresh


def test_synthetic_loss_learning_rate_shape() -> None:
    model = SyntheticLoss(best_lr=0.01, noise=0.0, partition_spread=0.0)

    def final(lr: float, epochs: int = 4) -> float:
        s = spec(1, lr)
        level = model.initial(s)
        for e in range(1, epochs + 1):
            for p in range(2):
                _, level = model.step(s, level, e, p, 2)
        return level

    assert final(0.01) < final(0.003) < final(0.0003)
    assert final(0.01) < final(0.05)
    assert math.isnan(final(1.0))  # 100x the best rate: NaN at once
    s = spec(1, 0.1)  # 10x: grows, then NaN
    _loss, level = model.step(s, 1.0, 1, 0, 2)
    assert level > 1.0
    _, v = model.evaluate(spec(1), 0.5, 1, validation=True)
    t, none = model.evaluate(spec(1), 0.5, 1, validation=False)
    assert v is not None and v > 0.5 and none is None and t == pytest.approx(0.5, rel=0.1)


def test_validation_flag_and_score() -> None:
    t = Script([Launch(spec(1), 2)])
    simulate_tuner(t, num_partitions=2, num_workers=2, validation=False)
    assert t.epochs[-1].valid_loss is None and t.epochs[-1].score == t.epochs[-1].train_loss
    t = Script([Launch(spec(1), 2)])
    simulate_tuner(t, num_partitions=2, num_workers=2)
    assert t.epochs[-1].score == t.epochs[-1].valid_loss


def test_nan_ranks_last() -> None:
    t = Script([Launch(spec(1, 1.0), 1), Launch(spec(2, 0.01), 1), Launch(spec(3, 0.001), 1)])
    r = simulate_tuner(t, num_partitions=2, num_workers=3)
    assert r.outputs[-1] == 1 and math.isnan(r.ranking[-1][1])
    assert r.outputs[:2] == [2, 3]


def run_script(launches: list[Decision], **kw: Any) -> SimResult:
    return simulate_tuner(Script(launches, **kw), num_partitions=2, num_workers=2)


@pytest.mark.parametrize("make,message", [
    (lambda: [Launch(spec(1), 1), Launch(spec(1), 1)], "launched trial 1 twice"),
    (lambda: [Launch(spec(1), 0)], "launched trial 1 with target 0"),
    (lambda: [Launch(spec(1), 1), Launch(spec(2, parent=1), 1)],
     "forked trial 2 from trial 1, which is still training"),
    (lambda: [Launch(spec(2, parent=9), 1)], "asked to fork trial 9, which was never launched"),
    (lambda: [Extend(4, 2)], "asked to extend trial 4, which was never launched"),
    (lambda: [Stop(4)], "asked to stop trial 4, which was never launched"),
    (lambda: [Launch(spec(1), 1), Stop(1), Extend(1, 3)], "extended trial 1, which was stopped"),
    (lambda: [Launch(spec(1), 1), Stop(1, free=True), Stop(1)],
     "asked to stop trial 1, which was freed"),
    (lambda: [Launch(spec(1), 1), Stop(1, free=True), Extend(1, 2)],
     "asked to extend trial 1, which was freed"),
    (lambda: [Launch(spec(1), 1), Stop(1, free=True), Launch(spec(2, parent=1), 1)],
     "asked to fork trial 1, which was freed"),
    (lambda: [Launch(spec(1), 1), Stop(1), Launch(spec(2, 0.5, parent=1,
                                                       tunables={"learning_rate": 0.02}), 1)],
     "launched trial 2 with tunable learning_rate=0.02, which disagrees with"),
])
def test_error_rules_at_start(make: Callable[[], list[Decision]], message: str) -> None:
    with pytest.raises(AutoMLError, match=message) as e:
        run_script(make())
    assert e.value.sqlstate == "XX000"
    assert str(e.value).startswith("the AutoML procedure ")


def test_extend_below_completed_is_an_error() -> None:
    def react(t: Script, r: EpochReport) -> list[Decision]:
        return [Extend(1, 1)] if r.epoch == 2 else []

    with pytest.raises(AutoMLError, match="extended trial 1 to 1 epochs, but it has trained 2"):
        run_script([Launch(spec(1), 2)], react=react)


def test_tunables_without_parent_refused_by_spec() -> None:
    with pytest.raises(Exception, match="tunables need a parent"):
        spec(1, tunables={"learning_rate": 0.01})


def test_fork_from_paused_and_stopped_is_allowed() -> None:
    def react(t: Script, r: EpochReport) -> list[Decision]:
        if r.trial_id == 1:
            return [Launch(spec(2, parent=1), 1), Stop(1), Launch(spec(3, parent=1), 1)]
        return []

    r = run_script([Launch(spec(1), 1)], react=react)
    assert r.trials[2].completed == 1 and r.trials[3].completed == 1


def test_stall_is_an_error() -> None:
    with pytest.raises(AutoMLError, match="'script' stalled: nothing is training"):
        simulate_tuner(Script([Launch(spec(1), 1)], forever=True), num_partitions=1,
                       num_workers=1)


def test_on_idle_must_fill_workers() -> None:
    with pytest.raises(AutoMLError, match="kept deciding for 1000 calls without filling"):
        simulate_tuner(Script([Launch(spec(1), 1), Stop(1)],
                              idle=lambda t, v: [Stop(1)], forever=True),
                       num_partitions=1, num_workers=1)


def test_on_idle_fills_free_slots() -> None:
    counter = iter(range(2, 1000))

    def idle(t: Script, v: EngineView) -> list[Decision]:
        assert v.free_slots > 0
        tid = next(counter)
        if tid > 6:
            return []
        t.waiting.add(tid)
        return [Launch(spec(tid), 1)]

    t = Script([Launch(spec(1), 1)], idle=idle)
    r = simulate_tuner(t, num_partitions=3, num_workers=3)
    idle_launches = [d for d in r.decisions if d.source == "idle"]
    assert len(idle_launches) == 5
    assert [d.time for d in idle_launches][:2] == [0.0, 0.0]


def test_max_steps() -> None:
    with pytest.raises(RuntimeError, match="did not end within 3 steps"):
        simulate_tuner(Script([Launch(spec(1), 3)]), num_partitions=2, num_workers=1,
                       max_steps=3)


def test_a_stopped_trials_last_unit_counts_but_its_epoch_is_not_evaluated() -> None:
    """A Stop lowers the trial's target to the epochs it has completed: its unit in flight
    still ends and is reported, but the epoch that unit completes is past the target and is
    not evaluated, whatever metrics_compute_frequency says."""
    def on_unit(t: Script, u: UnitReport) -> list[Decision]:
        return [Stop(1, "cut")] if (u.trial_id, u.epoch) == (2, 1) else []

    for freq in (None, 1):
        t = Script([Launch(spec(1), 1), Launch(spec(2), 5)], on_unit=on_unit)
        t.waiting = {2}
        r = simulate_tuner(t, num_partitions=1, num_workers=2, metrics_compute_frequency=freq,
                           unit_time=lambda s, p: 1.0 if s.trial_id == 2 else 3.0)
        assert r.trials[1].stopped and r.trials[1].completed == 1
        assert [u.epoch for u in t.units if u.trial_id == 1] == [1]
        assert not [e for e in t.epochs if e.trial_id == 1]
        assert not [u for u in r.units if u.config == 1 and u.kind == "eval"]
        assert r.trials[1].target == 0 and 1 in r.outputs



def test_the_sql_entry_point_runs_the_same_engine() -> None:
    """The server's hooks are the engine's, with the catalog writes added: only the step's
    persistence differs from what these tests run."""
    from cerebro_db.automl.engine import AutoMLHooks
    from cerebro_db.automl_run import CatalogHooks

    assert issubclass(CatalogHooks, AutoMLHooks)
    assert {n for n in vars(CatalogHooks) if not n.startswith("__")} == {"persist"}


def test_unit_times_reach_the_cost_aware_policy(monkeypatch):
    """The engine's 'mop' policy is cost-aware: a simulated unit reports its duration as a
    worker does, so the policy's estimate sees the simulated times."""
    from cerebro_db.scheduling import Progress

    seen: list[tuple[int, float | None]] = []
    observe = Progress.observe

    def spy(self, config, seconds, epoch=None):
        seen.append((config, seconds))
        return observe(self, config, seconds, epoch)

    monkeypatch.setattr(Progress, "observe", spy)
    times = {1: 1.0, 2: 3.0}
    r = simulate_tuner(Script([Launch(spec(1), 1), Launch(spec(2), 1)]), num_partitions=2,
                       num_workers=2, unit_time=lambda s, p: times[s.trial_id])
    assert sorted(seen) == sorted((u.config, times[u.config]) for u in r.units
                                  if u.kind == "train")
