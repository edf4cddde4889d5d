"""Scheduling policies: invariants (property tests over every registered policy), makespan,
reproducibility, what a resumed fit reproduces, MADlib's ring rotation, the registry.

Observed with the simulator (homogeneous unit time 1, makespan / lower bound):

- randomized MOP (uniform, the paper's Algorithm 1), 16 configs, p=2, 3 epochs: 1.008 mean,
  1.042 max over 50 seeds. Over |S| in [2p, 4p], p in 1..6, 1..4 epochs, 5 seeds: mean 1.049,
  max 1.29, 10% of runs above 1.10 (small runs with |S| close to 2p: the tail where the last
  few configs cannot use every worker); with |S| >= 4p the max is 1.083.
- MOP with ``prefer_lagging=True`` on the same grid: mean 1.0005, max 1.091; 1.0 for
  |S| >= 4p.
- heterogeneous per-config times (uniform 1..4), p in 2..6, |S| in {2p, 3p, 4p}, 3 epochs:
  MOP mean 1.06 (max 1.21); ring mean 1.21 (max 1.48): every hop lasts as long as the
  slowest worker's group, and the others idle at the barrier.
"""
from __future__ import annotations

import json
import math
import random
import statistics
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro_db.coordinator import run_fit
from cerebro_db.errors import CerebroError
from cerebro_db.scheduling import (
    EVAL,
    POLICIES,
    TRAIN,
    Assignment,
    InvariantError,
    Policy,
    Progress,
    RandomizedMOP,
    RingPolicy,
    RunningUnit,
    SchedulingError,
    Snapshot,
    check_invariants,
    evaluation_epochs,
    find_violations,
    get_policy,
    lower_bound,
    policy_names,
)
from cerebro_db.scheduling.randomized import FIRST_UNIT_SHARE, balanced_offsets
from cerebro_db.simulation import WorkerChange, random_failures, simulate

# Every registered name, plus the non-default options worth exercising.
POLICY_CASES: list[tuple[str, dict[str, Any]]] = [
    ("mop", {}),
    ("mop", {"prefer_lagging": True}),
    ("mop", {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
             "rotated_order": True}),  # what fits use
    ("random", {}),
    ("ring", {}),
    ("ring", {"layout": "slots", "reset_optimizer_per_hop": True}),
]
CASE_IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}"
            for n, o in POLICY_CASES]


def make(name: str, options: dict[str, Any], seed: int = 0) -> Policy:
    opts = dict(options)
    if "random_state" in POLICIES[name].option_names:
        opts.setdefault("random_state", seed)
    return get_policy(name, **opts)


def table_times(seed: int, kind: str, low: float = 0.5, high: float = 3.0):
    """Deterministic unit times: constant, per config, or per (config, partition)."""
    memo: dict[tuple[int, int], float] = {}

    def t(c: int, q: int, w: int) -> float:
        if kind == "homogeneous":
            return 1.0
        key = (c, q if kind == "per_unit" else -1)
        if key not in memo:
            memo[key] = random.Random(f"{seed}:{key}").uniform(low, high)
        return memo[key]

    return t


def test_every_registered_policy_is_exercised():
    assert {n for n, _ in POLICY_CASES} == set(policy_names())


# ---------------------------------------------------------------------------------------------
# invariants, property-based


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 20))
    configs = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n, unique=True))
    p = draw(st.integers(1, 6))
    if draw(st.booleans()):
        epochs: Any = draw(st.integers(1, 4))
    else:
        epochs = {c: draw(st.integers(1, 4)) for c in configs}
    evals = draw(st.sampled_from(["none", "every", "every2", "last"]))
    top = max(epochs.values()) if isinstance(epochs, dict) else epochs
    eval_epochs = {
        "none": frozenset(),
        "every": evaluation_epochs(top, 1),
        "every2": evaluation_epochs(top, 2),
        "last": frozenset({top}),
    }[evals]
    return {
        "configs": configs,
        "num_partitions": p,
        "epochs": epochs,
        "eval_epochs": eval_epochs,
        "times": draw(st.sampled_from(["homogeneous", "per_config", "per_unit"])),
        "failure_rate": draw(st.sampled_from([0.0, 0.0, 0.2])),
        "seed": draw(st.integers(0, 2**16)),
        "pipeline": draw(st.booleans()),  # busy workers take their next unit ahead
        "bundle": draw(st.sampled_from([1, 4])),  # evaluation units per statement
    }


def run_scenario(name: str, options: dict[str, Any], sc: dict[str, Any]):
    return simulate(
        make(name, options, sc["seed"]),
        sc["configs"],
        sc["num_partitions"],
        sc["epochs"],
        table_times(sc["seed"], sc["times"]),
        eval_epochs=sc["eval_epochs"],
        failures=random_failures(sc["failure_rate"], sc["seed"]) if sc["failure_rate"] else None,
        pipeline=sc.get("pipeline", False),
        bundle=sc.get("bundle", 1),
    )


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_invariants_hold(name, options, sc):
    res = run_scenario(name, options, sc)
    assert res.completed
    check_invariants(res.log, num_partitions=sc["num_partitions"], epochs=sc["epochs"],
                     eval_epochs=sc["eval_epochs"])
    # The same checks on plain dicts, as the lead will feed them from the unit table.
    check_invariants([r.as_dict() for r in res.log], num_partitions=sc["num_partitions"],
                     epochs=sc["epochs"], eval_epochs=sc["eval_epochs"])
    if not sc["failure_rate"]:
        assert all(r.ok for r in res.log)
    assert res.makespan >= res.lower_bound - 1e-9


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
@settings(max_examples=30, deadline=None)
@given(
    p=st.integers(1, 4),
    n=st.integers(1, 10),
    epochs=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    churn=st.lists(st.tuples(st.floats(0, 30), st.integers(0, 7), st.floats(0.5, 10)),
                   max_size=4),
    pipeline=st.booleans(),
    bundle=st.sampled_from([1, 3]),
)
def test_invariants_hold_under_worker_churn(name, options, p, n, epochs, seed, churn, pipeline,
                                            bundle):
    """Two replicas of every partition; workers leave (their unit fails) and come back."""
    workers = {w: (w % p,) for w in range(2 * p)}
    changes = []
    for t, w, back in churn:
        w %= 2 * p
        changes += [WorkerChange(t, "remove", w), WorkerChange(t + back, "add", w, (w % p,))]
    changes = _feasible(changes, 2 * p)
    assert not churn or changes or p == 1
    res = simulate(make(name, options, seed), list(range(n)), p, epochs,
                   table_times(seed, "per_unit"), workers=workers, worker_changes=changes,
                   eval_epochs={epochs}, pipeline=pipeline, bundle=bundle)
    assert res.completed
    check_invariants(res.log, num_partitions=p, epochs=epochs, eval_epochs={epochs})


def _feasible(changes: list[WorkerChange], num_workers: int) -> list[WorkerChange]:
    """Drop changes that would remove an absent worker or the last one (the coordinator
    fails a fit that has no worker left), or add a present one."""
    removed: set[int] = set()
    out = []
    for c in sorted(changes, key=lambda c: (c.time, c.action != "remove")):
        if c.action == "remove" and len(removed) + 1 >= num_workers:
            continue
        if (c.action == "remove") == (c.worker not in removed):
            (removed.add if c.action == "remove" else removed.discard)(c.worker)
            out.append(c)
    return out


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
def test_a_lost_only_copy_of_a_partition_goes_to_the_workers_left(name, options):
    """Worker 1 holds the only copy of partition 1 and leaves (its unit fails): the
    coordinator hands partition 1 to the workers left and the fit finishes."""
    res = simulate(make(name, options), list(range(4)), 3, 2, 1.0,
                   worker_changes=[WorkerChange(2.5, "remove", 1)])
    assert res.completed
    assert any(not r.ok and r.worker == 1 and r.end == 2.5 for r in res.log)
    assert not [r for r in res.log if r.worker == 1 and r.start >= 2.5]
    assert any(r.ok and r.partition == 1 and r.worker != 1 and r.start >= 2.5
               for r in res.log)
    check_invariants(res.log, num_partitions=3, epochs=2)


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
def test_losing_every_worker_cannot_finish_and_a_joining_worker_helps(name, options):
    res = simulate(make(name, options), list(range(4)), 3, 2, 1.0,
                   worker_changes=[WorkerChange(2.5, "remove", w) for w in range(3)])
    assert not res.completed
    check_invariants(res.log, num_partitions=3, complete=False)
    # a worker joining holding partition 1 gets a fresh id (3) and serves only partition 1
    # (a policy with a barrier may leave it idle)
    res = simulate(make(name, options), list(range(4)), 3, 2, 1.0,
                   worker_changes=[WorkerChange(0.5, "add", 9, (1,))])
    assert res.completed
    check_invariants(res.log, num_partitions=3, epochs=2)
    on3 = [r for r in res.log if r.worker == 3]
    assert {r.partition for r in on3} <= {1} and all(r.start >= 0.5 for r in on3)
    if name == "mop":
        assert on3


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
def test_injected_failure_is_requeued_and_counts_for_nothing(name, options):
    res = simulate(make(name, options), [1, 2, 3], 2, 2, 1.0,
                   failures={(2, 1, 0): 0.5, (3, 2, 1): 0.0}, eval_epochs={1, 2})
    failed = [r for r in res.log if not r.ok]
    assert {(r.config, r.epoch, r.partition) for r in failed} == {(2, 1, 0), (3, 2, 1)}
    assert [r.duration for r in sorted(failed, key=lambda r: r.config)] == [0.5, 0.0]
    check_invariants(res.log, num_partitions=2, epochs=2, eval_epochs={1, 2})


def unassigned_but_runnable(snap: Snapshot, assigned: list[Assignment]) -> list[int]:
    """Idle workers left without work although some unit could run on them."""
    busy = {a.worker for a in assigned}
    taken = {c for c in snap.configs if snap.is_training(c)}
    taken |= {a.config for a in assigned if a.kind == TRAIN}
    evals_taken = {(a.config, a.epoch, a.partition) for a in assigned if a.kind == EVAL}
    out = []
    for w in snap.idle_workers:
        if w in busy:
            continue
        can_train = any(c not in taken for c, _ in snap.trainable(w))
        can_eval = any(u.partition in snap.workers[w]
                       and (u.config, u.epoch, u.partition) not in evals_taken
                       for u in snap.pending_evals)
        if can_train or can_eval:
            out.append(w)
    return out


class Spy(Policy):
    """Wraps a policy and checks each of its decisions."""

    name = "spy"

    def __init__(self, inner: Policy, check) -> None:
        self.inner, self.check, self.calls = inner, check, 0

    def options(self) -> dict[str, Any]:
        return {}

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        self.calls += 1
        out = self.inner.assign(snapshot)
        self.check(self, snapshot, out)
        return out


@settings(max_examples=25, deadline=None)
@given(sc=scenarios(), lag=st.booleans())
def test_mop_is_work_conserving(sc, lag):
    """No barrier: after MOP's decision, no idle worker has anything it could run."""

    def check(spy, snap, out):
        assert not unassigned_but_runnable(snap, out)
        assert out or not snap.has_runnable()

    sc = {**sc, "failure_rate": 0.0}
    pol = Spy(RandomizedMOP(sc["seed"], prefer_lagging=lag), check)
    res = simulate(pol, sc["configs"], sc["num_partitions"], sc["epochs"],
                   table_times(sc["seed"], sc["times"]), eval_epochs=sc["eval_epochs"])
    assert res.completed


def test_idle_worker_prefers_training_over_evaluation():
    prog = Progress({1: 2, 2: 2}, 2, {0: (0,), 1: (1,)}, eval_epochs={1})
    for c, w in ((1, 0), (1, 1)):  # config 1 finishes epoch 1 -> evaluation units pending
        prog.start(Assignment(w, c, 1, w))
        prog.finish(w, True)
    snap = prog.snapshot()
    assert len(snap.pending_evals) == 2
    for pol in (RandomizedMOP(0), RingPolicy()):
        out = pol.assign(snap)
        assert len(out) == 2
        assert any(a.kind == TRAIN and a.config == 2 for a in out)
        kinds = sorted(a.kind for a in out)
        assert kinds in (["eval", "train"], ["train", "train"])
    # An evaluation of a frozen state does not stop the config's next epoch.
    prog.start(Assignment(0, 1, 1, 0, EVAL))
    out = RandomizedMOP(0).assign(prog.snapshot())
    assert [(a.worker, a.kind) for a in out] == [(1, TRAIN)]


# ---------------------------------------------------------------------------------------------
# makespan


def mop_ratios(shapes, seeds, lag=False, times="homogeneous"):
    out = []
    for p, n, k in shapes:
        for seed in seeds:
            res = simulate(RandomizedMOP(seed, prefer_lagging=lag), list(range(n)), p, k,
                           table_times(seed, times, 1.0, 4.0))
            out.append(res.ratio)
    return out


def test_mop_makespan_close_to_lower_bound_homogeneous():
    ratios = mop_ratios([(2, 16, 3)], range(20))
    assert max(ratios) <= 1.10, ratios  # observed: max 1.042, mean 1.008 over 50 seeds
    shapes = [(p, n, k) for p in (2, 3, 4, 6) for n in (2 * p, 3 * p, 4 * p) for k in (2, 3)]
    ratios = mop_ratios(shapes, range(3))
    assert statistics.mean(ratios) <= 1.08, ratios  # observed ~1.05
    assert max(mop_ratios([s for s in shapes if s[1] >= 4 * s[0]], range(3))) <= 1.10
    lagging = mop_ratios(shapes, range(3), lag=True)
    assert max(lagging) <= 1.10 and statistics.mean(lagging) <= 1.01, lagging


def test_mop_with_fewer_configs_than_workers():
    one = simulate(RandomizedMOP(3), [7], 4, 3, table_times(0, "per_unit"))
    assert one.ratio == pytest.approx(1.0)  # a lone config never waits for a worker
    few = mop_ratios([(6, 3, 2), (4, 4, 3)], range(3))
    assert max(few) <= 1.5


def test_ring_pays_for_its_barrier_under_heterogeneous_times():
    speeds = {c: 1.0 + 3.0 * random.Random(c).random() for c in range(8)}
    p, k = 4, 3

    def t(c, q, w):
        return speeds[c]

    ring = simulate(get_policy("ring"), list(range(8)), p, k, t)
    mop = simulate(get_policy("mop", random_state=0), list(range(8)), p, k, t)
    check_invariants(ring.log, num_partitions=p, epochs=k)
    # Why: every hop lasts as long as the slowest group, the other workers idle meanwhile.
    groups = [sum(speeds[c] for c in range(8) if c % p == g) for g in range(p)]
    assert ring.makespan == pytest.approx(k * p * max(groups))
    assert ring.lower_bound == pytest.approx(k * sum(groups))
    assert ring.ratio == pytest.approx(p * max(groups) / sum(groups))
    assert ring.ratio >= 1.25 and mop.ratio <= 1.15, (ring.ratio, mop.ratio)
    idle_ring = p * ring.makespan - ring.busy_time()
    idle_mop = p * mop.makespan - mop.busy_time()
    assert idle_ring > 3 * idle_mop
    # Across shapes, MOP is close to the bound and ring clearly above it.
    mops, rings = [], []
    for p in (2, 4, 6):
        for n in (2 * p, 3 * p):
            for seed in range(3):
                tt = table_times(seed, "per_config", 1.0, 4.0)
                mops.append(simulate(get_policy("mop", random_state=seed), list(range(n)), p,
                                     3, tt).ratio)
                rings.append(simulate(get_policy("ring"), list(range(n)), p, 3, tt).ratio)
    assert statistics.mean(mops) <= 1.10, mops  # observed ~1.06
    assert statistics.mean(rings) >= statistics.mean(mops) + 0.08, (rings, mops)


HETERO_SHAPES = [(p, n, 3) for p in (2, 3, 4, 6) for n in (2 * p, 3 * p, 4 * p)]
FIT_DEFAULTS = {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
                "rotated_order": True}
"""What fits use (``entrypoints.training._policy``); ``madlib_keras_fit_multiple_model``
adds ``config_costs``, the static cost estimate (see the random-profile survey below)."""
BEFORE = {"prefer_lagging": True, "seeded_order": True}
"""What fits with a random_state used before: independent seeded orders, no costs."""


def ratios_vs_ring(opts, kind, eval_every_epoch=False):
    """(makespan / lower bound, makespan / ring's makespan) over HETERO_SHAPES x 4 seeds."""
    bound, ring = [], []
    for p, n, k in HETERO_SHAPES:
        for seed in range(4):
            tt = table_times(seed, kind, 1.0, 4.0)
            ev = range(1, k + 1) if eval_every_epoch else ()
            cf = list(range(1, n + 1))
            mop = simulate(get_policy("mop", random_state=seed, **opts), cf, p, k, tt,
                           eval_epochs=ev)
            check_invariants(mop.log, num_partitions=p, epochs=k)
            r = simulate(get_policy("ring"), cf, p, k, tt, eval_epochs=ev)
            bound.append(mop.ratio)
            ring.append(mop.makespan / r.makespan)
    return bound, ring


def test_mop_as_fits_use_it_beats_the_ring_and_stays_near_the_bound():
    """Heterogeneous per-config unit times (uniform 1..4), p in {2, 3, 4, 6}, |S| in
    {2p, 3p, 4p}, 3 epochs, 4 seeds. Measured (makespan / lower bound; MOP / ring):

    - before (independent seeded orders, prefer_lagging): mean 1.084, max 1.259; up to
      1.075x the ring's makespan (homogeneous times: max 1.167, up to 1.167x the ring);
    - after (rotated seeded orders, prefer_lagging, cost-aware ties): mean 1.002, max 1.044,
      never slower than the ring (max 0.992x); homogeneous: exactly the bound;
    - ranking by remaining work (units left x measured unit time) instead of lock-step with
      rotated orders: mean 1.020, max 1.093 (rejected);
    - with an evaluation every epoch (a third of a training unit) MOP stays <= the ring
      (max 0.998x; before: up to 1.055x).
    """
    before, before_ring = ratios_vs_ring(BEFORE, "per_config")
    after, after_ring = ratios_vs_ring(FIT_DEFAULTS, "per_config")
    assert statistics.mean(before) >= 1.05 and max(before_ring) > 1.0  # the problem
    assert max(after) <= 1.05 and statistics.mean(after) <= 1.01, after
    assert max(after_ring) <= 1.0, after_ring
    hom, hom_ring = ratios_vs_ring(FIT_DEFAULTS, "homogeneous")
    assert max(hom) == pytest.approx(1.0) and max(hom_ring) <= 1.0 + 1e-9
    _, with_evals = ratios_vs_ring(FIT_DEFAULTS, "per_config", eval_every_epoch=True)
    assert max(with_evals) <= 1.0, with_evals


def test_cost_aware_takes_the_dearest_of_the_most_lagging_configs():
    prog = Progress({1: 2, 2: 2, 3: 2}, 1, {0: {0}})
    for c, t in ((1, 1.0), (2, 5.0)):
        prog.observe(c, t)
    snap = prog.snapshot()
    assert dict(snap.unit_seconds) == {1: 1.0, 2: 5.0}
    for seed in range(10):
        a = RandomizedMOP(seed, prefer_lagging=True, cost_aware=True).assign(snap)
        assert [(x.worker, x.config) for x in a] == [(0, 2)]
    prog.observe(3, 9.0)  # an unmeasured config counts as the mean of the measured ones
    a = RandomizedMOP(0, prefer_lagging=True, cost_aware=True).assign(prog.snapshot())
    assert [x.config for x in a] == [3]
    prog.observe(1, None)  # nothing measured: ignored
    assert prog.snapshot().unit_seconds[1] == 1.0


def test_rotated_orders_spread_configs_over_partitions():
    pol = RandomizedMOP(11, seeded_order=True, rotated_order=True)
    for p in (2, 3, 5):
        for e in (1, 2):
            orders = [pol.visit_order(c, e, p) for c in range(1, 2 * p + 1)]
            assert all(sorted(o) == list(range(p)) for o in orders)
            firsts = [o[0] for o in orders]
            assert sorted(firsts) == sorted(list(range(p)) * 2)  # each partition twice
    assert pol.visit_order(1, 1, 4) == RandomizedMOP(11, seeded_order=True,
                                                     rotated_order=True).visit_order(1, 1, 4)


def test_lower_bound():
    log = [
        {"config": 1, "epoch": 1, "partition": 0, "worker": 0, "kind": "train",
         "start": 0, "end": 5, "ok": True},
        {"config": 1, "epoch": 1, "partition": 1, "worker": 1, "kind": "train",
         "start": 5, "end": 8, "ok": True},
        {"config": 2, "epoch": 1, "partition": 0, "worker": 0, "kind": "train",
         "start": 5, "end": 6, "ok": True},
        {"config": 2, "epoch": 1, "partition": 1, "worker": 1, "kind": "train",
         "start": 0, "end": 4, "ok": False},
        {"config": 2, "epoch": 1, "partition": 0, "worker": 0, "kind": "eval",
         "start": 9, "end": 19, "ok": True},
    ]
    assert lower_bound(log, 2) == 8.0  # config 1's chain (5 + 3) beats (5 + 3 + 1) / 2
    assert lower_bound(log, 1) == 9.0
    assert lower_bound([], 3) == 0.0


# ---------------------------------------------------------------------------------------------
# reproducibility and resume


@pytest.mark.parametrize(("name", "options"), POLICY_CASES, ids=CASE_IDS)
def test_reproducible_with_a_seed(name, options):
    sc = {"configs": list(range(12)), "num_partitions": 3, "epochs": 3,
          "eval_epochs": {2, 3}, "times": "per_unit", "failure_rate": 0.1, "seed": 5}
    a, b = run_scenario(name, options, sc), run_scenario(name, options, sc)
    assert a.log == b.log
    if name in ("mop", "random"):
        c = run_scenario(name, options, {**sc, "seed": 6})
        assert [(r.config, r.partition) for r in c.log] != [(r.config, r.partition)
                                                           for r in a.log]


def test_unseeded_mop_reports_its_seed():
    pol = get_policy("mop")
    seed = pol.options()["random_state"]
    assert isinstance(seed, int)
    again = get_policy("mop", random_state=seed)
    a = simulate(pol, list(range(6)), 2, 2, 1.0)
    b = simulate(again, list(range(6)), 2, 2, 1.0)
    assert a.log == b.log


class _Killed(Exception):
    """The coordinator dies (its session is terminated)."""


class _TimedExecutor:
    """Ends a random subset of the units in flight at each wait (drawn from ``seed``: the
    workers' timing), logs the training units that end, and kills the fit when the
    ``stop_after``-th more would end."""

    def __init__(self, seed: int, stop_after: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.stop_after = stop_after
        self.inflight: dict[int, Assignment] = {}
        self.trained: list[Assignment] = []

    def submit(self, a: Assignment, options: dict[str, Any]) -> None:
        self.inflight[a.worker] = a

    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        ws = sorted(self.inflight)
        out: list[tuple[int, bool, dict[str, Any]]] = []
        for w in self.rng.sample(ws, self.rng.randint(1, len(ws))):
            a = self.inflight.pop(w)
            if a.kind == TRAIN:
                if self.stop_after is not None and len(self.trained) >= self.stop_after:
                    raise _Killed
                self.trained.append(a)
                out.append((w, True, {"loss": 1.0, "rows": 10}))
            else:
                out.append((w, True, {"evals": {"eval_train": {"loss": 1.0, "rows": 10,
                                                               "metrics": {}}}}))
        return out

    def recover(self, worker: int) -> bool:
        return True

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        raise AssertionError("no unit fails here")


def _visit_orders(units: list[Assignment]) -> dict[tuple[int, int], list[int]]:
    """(config, epoch) -> the partitions it trained on, in order."""
    out: dict[tuple[int, int], list[int]] = {}
    for a in units:
        out.setdefault((a.config, a.epoch), []).append(a.partition)
    return out


def _run(policy: Policy, ex: _TimedExecutor, progress: Progress, p: int) -> None:
    run_fit(policy, progress, ex, eval_kinds=["eval_train"], num_partitions=p,
            snapshot_epochs=lambda c, e: e == 3, done_units=sum(
                progress.completed.get(c, 0) * p + len(progress.visited.get(c, ()))
                for c in progress.targets))


@pytest.mark.parametrize(("name", "options"), [
    ("mop", {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
             "rotated_order": True}),
    ("mop", {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
             "rotated_order": True, "config_costs": {"3": 2.5, "5": 0.5, "8": 1.0, "9": 4.0,
                                                     "12": 0.25}}),  # as stored: JSON
    ("mop", {"seeded_order": True}),
    ("ring", {}),
])
@pytest.mark.parametrize("stop_after", [5, 23, 41])
def test_a_resumed_fit_trains_the_same_visit_orders(name, options, stop_after):
    """What a resume does (the policy is built anew from its stored options, the progress
    from the unit log; nothing of the old policy's state is kept) trains every config on
    the same partitions in the same order as an uninterrupted run with other timing, so
    the models are the same."""
    p, configs, targets = 4, [3, 5, 8, 9, 12], 3

    def policy() -> Policy:
        seeded = {"random_state": 17} if "random_state" in POLICIES[name].option_names else {}
        return get_policy(name, **seeded, **options)

    def fresh() -> Progress:
        return Progress({c: targets for c in configs}, p, {w: (w,) for w in range(p)}, {3})

    whole = _TimedExecutor(seed=1)
    _run(policy(), whole, fresh(), p)
    first = _TimedExecutor(seed=2, stop_after=stop_after)
    with pytest.raises(_Killed):
        _run(policy(), first, fresh(), p)
    log = [{"config": a.config, "epoch": a.epoch, "partition": a.partition, "worker": a.worker,
            "kind": TRAIN, "start": float(i), "end": float(i), "ok": True}
           for i, a in enumerate(first.trained)]
    progress = Progress.from_log(log, {c: targets for c in configs}, p,
                                 {w: (w,) for w in range(p)}, {3})
    rest = _TimedExecutor(seed=3)
    _run(policy(), rest, progress, p)
    resumed = _visit_orders(first.trained + rest.trained)
    assert len(first.trained) == stop_after
    assert resumed == _visit_orders(whole.trained)
    assert all(sorted(v) == list(range(p)) for v in resumed.values())
    assert len(resumed) == len(configs) * targets


def test_without_seeded_order_timing_changes_the_visit_orders():
    """The test above can fail: with the visit order left to the random stream, other
    timing gives other orders (which is why fits use seeded_order)."""
    p, configs = 4, [3, 5, 8, 9, 12]
    orders = []
    for seed in (1, 2):
        ex = _TimedExecutor(seed=seed)
        _run(get_policy("mop", random_state=17), ex,
             Progress({c: 3 for c in configs}, p, {w: (w,) for w in range(p)}, {3}), p)
        orders.append(_visit_orders(ex.trained))
    assert orders[0] != orders[1]


def test_progress_rebuilt_from_a_unit_log():
    res = simulate(RandomizedMOP(2), list(range(5)), 3, 2, table_times(2, "per_unit"),
                   eval_epochs={1, 2}, failures=random_failures(0.2, 2))
    full = Progress.from_log([r.as_dict() for r in res.log], {c: 2 for c in range(5)}, 3,
                             {w: (w,) for w in range(3)}, eval_epochs={1, 2})
    assert full.all_done()
    cut = res.makespan / 2
    part = Progress.from_log([r for r in res.log if r.end <= cut], {c: 2 for c in range(5)},
                             3, {w: (w,) for w in range(3)}, eval_epochs={1, 2})
    for c in range(5):
        ok = [r for r in res.log if r.config == c and r.kind == TRAIN and r.ok and r.end <= cut]
        assert part.completed[c] * 3 + len(part.visited[c]) == len(ok)
    # A resumed fit finishes with the work left.
    snap = part.snapshot(cut)
    assert not snap.all_done() and snap.has_runnable()


# ---------------------------------------------------------------------------------------------
# ring = MADlib's rotation


def test_ring_schedule_matches_madlib_rotation():
    """4 configs dealt to 3 groups: g0 = [0, 3], g1 = [1], g2 = [2]; worker w trains group
    (w + h) mod 3 in hop h; a barrier after each hop; unit time 1."""
    res = simulate(get_policy("ring", reset_optimizer_per_hop=True), [0, 1, 2, 3], 3, 2, 1.0)
    hop = [
        # hop 0: w0 <- g0, w1 <- g1, w2 <- g2
        (0, 0, 0, 0, 1), (3, 0, 0, 1, 2), (1, 1, 1, 0, 1), (2, 2, 2, 0, 1),
        # hop 1 (after the barrier at t=2): w0 <- g1, w1 <- g2, w2 <- g0
        (1, 0, 0, 2, 3), (2, 1, 1, 2, 3), (0, 2, 2, 2, 3), (3, 2, 2, 3, 4),
        # hop 2 (t=4): w0 <- g2, w1 <- g0, w2 <- g1
        (2, 0, 0, 4, 5), (0, 1, 1, 4, 5), (3, 1, 1, 5, 6), (1, 2, 2, 4, 5),
    ]
    expected = sorted(
        [(c, 1, q, w, s, e) for c, q, w, s, e in hop]
        + [(c, 2, q, w, s + 6, e + 6) for c, q, w, s, e in hop]
    )
    got = sorted((r.config, r.epoch, r.partition, r.worker, r.start, r.end) for r in res.log)
    assert got == expected
    assert res.makespan == 12.0
    # reset_optimizer_per_hop is carried into every training assignment.
    snap = Progress({0: 1, 1: 1}, 2, {0: (0,), 1: (1,)}).snapshot()
    assert all(a.reset_optimizer for a in get_policy("ring", reset_optimizer_per_hop=True)
               .assign(snap))
    assert not any(a.reset_optimizer for a in get_policy("ring").assign(snap))
    assert not any(a.reset_optimizer for a in get_policy("mop", random_state=0).assign(snap))


def test_ring_slots_layout_matches_madlib_118():
    """MADlib 1.18: n = max(|S|, p) slots; partition i trains slot (i + h) mod n in hop h."""
    res = simulate(get_policy("ring", layout="slots"), [10, 11, 12, 13], 2, 1, 1.0)
    got = sorted((r.start, r.partition, r.config) for r in res.log)
    assert got == [
        (0, 0, 10), (0, 1, 11),
        (1, 0, 11), (1, 1, 12),
        (2, 0, 12), (2, 1, 13),
        (3, 0, 13), (3, 1, 10),
    ]


def test_ring_barrier_holds_back_fast_workers():
    speeds = {0: 5.0, 1: 1.0}
    res = simulate(get_policy("ring"), [0, 1], 2, 1, lambda c, q, w: speeds[c])
    second = sorted((r for r in res.log if r.start > 0), key=lambda r: r.start)
    assert [r.start for r in second] == [5.0, 5.0]  # config 1 waited 4 s at the barrier


# ---------------------------------------------------------------------------------------------
# registry, options, helpers


def test_bad_policy_name_lists_the_valid_names():
    with pytest.raises(CerebroError) as e:
        get_policy("hyperband")
    assert e.value.sqlstate == "22023"
    assert "'mop', 'random', 'ring'" in e.value.message
    assert "'hyperband'" in e.value.message
    assert "mop" in (e.value.hint or "")


def test_policy_names_and_aliases():
    assert policy_names() == ("mop", "random", "ring")
    assert isinstance(get_policy(" MOP ", random_state=1), RandomizedMOP)
    assert isinstance(get_policy("random", random_state=1), RandomizedMOP)
    assert isinstance(get_policy(None, random_state=1), RandomizedMOP)
    assert isinstance(get_policy("Ring"), RingPolicy)
    assert get_policy("random", random_state=4).name == "mop"


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("ring", {"random_state": 1}, "no option 'random_state'"),
        ("mop", {"reset_optimizer_per_hop": True}, "no option"),
        ("mop", {"random_state": -1}, "random_state must be a non-negative integer"),
        ("mop", {"random_state": "7"}, "random_state must be a non-negative integer"),
        ("mop", {"random_state": True}, "random_state must be a non-negative integer"),
        ("mop", {"prefer_lagging": 1}, "prefer_lagging must be a boolean"),
        ("ring", {"reset_optimizer_per_hop": "yes"}, "reset_optimizer_per_hop must be"),
        ("ring", {"layout": "star"}, "layout must be one of 'groups', 'slots'"),
    ],
)
def test_bad_options(name, options, needle):
    with pytest.raises(CerebroError) as e:
        get_policy(name, **options)
    assert e.value.sqlstate == "22023"
    assert needle in e.value.message


def test_evaluation_epochs():
    assert evaluation_epochs(10, 3) == {3, 6, 9, 10}
    assert evaluation_epochs(4, None) == {4}
    assert evaluation_epochs(4, 1) == {1, 2, 3, 4}
    with pytest.raises(CerebroError):
        evaluation_epochs(3, 0)
    with pytest.raises(CerebroError):
        evaluation_epochs(0, 1)


def test_progress_refuses_what_the_invariants_forbid():
    prog = Progress({1: 1, 2: 1}, 2, {0: (0,), 1: (1,), 2: (0, 1)}, eval_epochs={1})
    prog.start(Assignment(0, 1, 1, 0))
    bad = [
        Assignment(0, 2, 1, 0),          # worker busy
        Assignment(1, 1, 1, 1),          # config already training
        Assignment(1, 2, 1, 0),          # partition not held
        Assignment(1, 2, 2, 1),          # wrong epoch
        Assignment(1, 9, 1, 1),          # unknown config
        Assignment(7, 2, 1, 1),          # unknown worker
        Assignment(1, 2, 1, 1, EVAL),    # no such evaluation unit
        Assignment(1, 2, 1, 1, "dance"),  # unknown kind
    ]
    for a in bad:
        with pytest.raises(SchedulingError):
            prog.start(a)
    prog.finish(0, True)
    with pytest.raises(SchedulingError):
        prog.start(Assignment(2, 1, 1, 0))  # partition already visited this epoch
    with pytest.raises(SchedulingError):
        prog.finish(0, True)  # nothing running there
    prog.start(Assignment(2, 1, 1, 1))
    prog.finish(2, True)
    with pytest.raises(SchedulingError):
        prog.start(Assignment(2, 1, 2, 0))  # finished
    assert len(prog.snapshot().pending_evals) == 2


class BadPolicy(Policy):
    name = "bad"

    def options(self) -> dict[str, Any]:
        return {}

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        # Sends config 0 to every idle worker at once: model isolation broken.
        return [Assignment(w, 0, snapshot.current_epoch(0), w) for w in snapshot.idle_workers]


def test_simulator_rejects_a_policy_that_breaks_isolation():
    with pytest.raises(SchedulingError, match="already training"):
        simulate(BadPolicy(), [0, 1], 2, 1, 1.0)


# ---------------------------------------------------------------------------------------------
# check_invariants catches broken logs


def rec(c, e, q, w, s, t, ok=True, kind="train"):
    return {"config": c, "epoch": e, "partition": q, "worker": w, "kind": kind,
            "start": s, "end": t, "ok": ok}


GOOD = [rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 1, 1, 2), rec(2, 1, 1, 1, 0, 1),
        rec(2, 1, 0, 0, 1, 2), rec(1, 1, 0, 1, 2, 2.5, kind="eval"),
        rec(1, 1, 1, 0, 2, 2.5, kind="eval")]


def test_check_invariants_accepts_a_good_log():
    check_invariants(GOOD, num_partitions=2, epochs=1, eval_epochs={1: {1}})
    assert find_violations(GOOD) == []


@pytest.mark.parametrize(
    ("log", "needle"),
    [
        (GOOD + [rec(3, 1, 0, 0, 0.5, 0.7, ok=False)], "worker exclusivity"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 1, 0.5, 2)], "model isolation"),
        ([rec(1, 1, 0, 0, 0, 1)], "missed partitions [1]"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 0, 1, 2), rec(1, 1, 1, 1, 2, 3)],
         "succeeded 2 times"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 0, 1, 2, ok=False)], "never retried"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 0, 1, 2), rec(1, 2, 0, 1, 1.5, 3),
          rec(1, 2, 1, 0, 3, 4)], "epoch order"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 1, 1, 2, ok=False), rec(1, 2, 0, 0, 2, 3),
          rec(1, 2, 1, 1, 3, 4)], "never retried"),
        (GOOD[:5], "not evaluated on partitions [1]"),
        (GOOD[:4] + [rec(1, 1, 0, 1, 1.5, 2.5, kind="eval"), rec(1, 1, 1, 0, 2, 2.5,
                                                                  kind="eval")],
         "starts before config 1 finished epoch 1"),
        ([rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 1, 1, 2),
          rec(1, 2, 0, 0, 2, 3, kind="eval"), rec(1, 2, 1, 1, 2, 3, kind="eval")],
         "evaluated but never trained"),
        ([rec(1, 1, 0, 0, 2, 1), rec(1, 1, 1, 1, 2, 3)], "ends before it starts"),
    ],
)
def test_check_invariants_catches(log, needle):
    with pytest.raises(InvariantError) as e:
        check_invariants(log, num_partitions=2, eval_epochs={1: {1}})
    assert needle in str(e.value)
    assert isinstance(e.value, AssertionError)


def test_check_invariants_targets_and_partial_logs():
    with pytest.raises(InvariantError, match="target 2"):
        check_invariants(GOOD, num_partitions=2, epochs=2)
    cut = [rec(1, 1, 0, 0, 0, 1), rec(1, 1, 1, 1, 1, 2, ok=False)]
    check_invariants(cut, num_partitions=2, complete=False)
    with pytest.raises(InvariantError, match="unknown partition"):
        check_invariants(GOOD + [rec(5, 1, 4, 3, 0, 1)], num_partitions=2, complete=False)


def test_unit_time_estimate_leaves_out_one_off_costs():
    """A config's first unit also builds its model and traces the training step (and a
    worker's first unit reads its partition cold): the estimate is the mean of the latest
    epoch measured, without that first unit once another unit of the epoch is measured."""
    prog = Progress({1: 3, 2: 3}, 2, {0: {0}, 1: {1}})
    prog.observe(1, 5.0, 1)  # first unit: 1 s of work + 4 s of one-off costs
    assert prog.snapshot().unit_seconds[1] == 5.0  # nothing better known yet
    prog.observe(1, 1.2, 1)
    assert prog.snapshot().unit_seconds[1] == pytest.approx(1.2)
    prog.observe(1, 1.0, 2)
    prog.observe(1, 0.8, 2)
    assert prog.snapshot().unit_seconds[1] == pytest.approx(0.9)  # latest epoch only
    # The running mean over every unit (the earlier rule) would rank config 1 as dearer than
    # config 2, whose units take 1.5 s.
    for t in (1.5, 1.5):
        prog.observe(2, t, 1)
    snap = prog.snapshot()
    assert snap.unit_seconds[1] < snap.unit_seconds[2]
    assert (5.0 + 1.2 + 1.0 + 0.8) / 4 > snap.unit_seconds[2]


def random_profile(seed: int) -> tuple[int, int, int, str, Any]:
    """A random heterogeneous cost profile: p in 2..8, |S| in 2p..32 (at least 4), 2..4
    epochs, per-config unit times of one of four shapes (log-normal sigma 1; bimodal: 30%
    of the configs 5-12x dearer; uniform 1..4; one config 3-15x the others), +-5% per
    partition, and a one-off first-unit cost (model build and trace) of 0, 0.5 or 1 mean
    unit time."""
    r = random.Random(f"profile:{seed}")
    p = r.randint(2, 8)
    n = r.randint(max(4, 2 * p), 32)
    k = r.randint(2, 4)
    kind = r.choice(["lognormal", "bimodal", "uniform", "one_big"])
    if kind == "lognormal":
        base = {c: math.exp(r.gauss(0, 1.0)) for c in range(1, n + 1)}
    elif kind == "bimodal":
        base = {c: r.uniform(5, 12) if r.random() < 0.3 else r.uniform(0.5, 1.5)
                for c in range(1, n + 1)}
    elif kind == "uniform":
        base = {c: r.uniform(1, 4) for c in range(1, n + 1)}
    else:
        base = {c: r.uniform(0.8, 1.2) for c in range(1, n + 1)}
        base[r.randint(1, n)] *= r.uniform(3, 15)
    jitter = {(c, q): r.uniform(0.95, 1.05) for c in base for q in range(p)}
    first = r.choice([0.0, 0.5, 1.0]) * statistics.mean(base.values())

    def times():
        seen: set[int] = set()

        def t(c: int, q: int, w: int) -> float:
            x = base[c] * jitter[(c, q)]
            if c not in seen:
                seen.add(c)
                x += first
            return x

        return t

    return p, n, k, kind, times


def profile_costs(p: int, n: int, times: Any, noise: float = 0.0, seed: int = 0
                  ) -> dict[int, float]:
    """A static estimate of a profile's per-config unit cost: the mean over the partitions of
    its steady unit time (first-unit costs left out, as the architecture says nothing of
    them), times a log-normal error of sigma ``noise``."""
    t = times()
    for c in range(1, n + 1):
        t(c, 0, 0)  # the one-off first unit
    r = random.Random(f"estimate:{seed}")
    return {c: statistics.mean(t(c, q, 0) for q in range(p)) * math.exp(r.gauss(0, noise))
            for c in range(1, n + 1)}


def profile_bound(res: Any, p: int, k: int, times: Any) -> float:
    """What no schedule of the profile beats: the log's lower bound, and the busiest
    partition's own steady units (a partition has one worker)."""
    t = times()
    for c in {r.config for r in res.log}:
        t(c, 0, 0)
    configs = {r.config for r in res.log}
    busiest = max(sum(k * t(c, q, 0) for c in configs) for q in range(p))
    return max(res.lower_bound, busiest)


def survey(num_profiles: int, options: dict[str, Any] | None, noise: float = 0.0
           ) -> tuple[list[float], list[float]]:
    """(makespan / bound, makespan / ring's makespan) of MOP over :func:`random_profile` s;
    ``options=None``: what fits use, with the profile's static cost estimate."""
    ratios, vs_ring = [], []
    for seed in range(num_profiles):
        p, n, k, _, times = random_profile(seed)
        cf = list(range(1, n + 1))
        opts = dict(FIT_DEFAULTS, config_costs=profile_costs(p, n, times, noise, seed)) \
            if options is None else options
        mop = simulate(get_policy("mop", random_state=seed, **opts), cf, p, k, times())
        assert mop.completed
        check_invariants(mop.log, num_partitions=p, epochs=k)
        ring = simulate(get_policy("ring"), cf, p, k, times())
        ratios.append(mop.makespan / profile_bound(mop, p, k, times))
        vs_ring.append(mop.makespan / ring.makespan)
    return ratios, vs_ring


def test_mop_as_fits_use_it_over_random_heterogeneous_profiles():
    """The production loop (:func:`simulate` with fits' policy: lock-step, cost-aware, seeded
    rotations balanced by a static cost estimate) over random profiles
    (:func:`random_profile`: p 2..8, |S| 2p..32, 2..4 epochs, four shapes of cost, one-off
    first units): never slower than the ring, within 1.05x of the bound on nearly all.

    Measured over 400 profiles (makespan / bound: the larger of the log's lower bound and
    the busiest partition's steady units; MOP / ring):

    - before (rotations by mst_key, no cost estimate): mean 1.039, max 1.31, 118 of 400
      above 1.05; MOP / ring max 1.000, mean 0.78;
    - rotations balanced by the costs alone (LPT over the offsets): mean 1.017, max 1.16, 35
      above 1.05, but up to 1.023x the ring (a p = 2 profile whose many cheap configs,
      sharing an offset, put their one-off first units on one partition);
    - balanced by cost plus a one-off share (what fits use): mean 1.016, max 1.15, 28 above
      1.05, never slower than the ring (mean 0.77); with the estimate off by a log-normal
      factor of sigma 0.3: mean 1.017, max 1.15, 34 above 1.05, never slower than the ring.

    The profiles still above 1.05 are chain-bound (against the log's bound alone, 29
    profiles, 26 of them with one config's units at 0.9 x sum / p or more): such a config
    waits at each hop for the unit running on its next partition. Free (timing-chosen) visit
    orders with the same rule (best of 5 seeds) bring 20 of the 29 under 1.05, which seeded
    orders forgo for reproducibility; no proof that 1.05 is out of reach for the other 9. Tried and rejected: leaving a
    worker idle for a chain-critical config about to arrive (mean 1.012 to 1.015, 8 to 16
    above 1.05 by threshold: no clear gain, and the policy would no longer be
    work-conserving); choosing among several candidate rotations by simulating them on the
    estimated costs (no gain over one balanced rotation); a planned schedule replayed in its
    start order (mean 1.043: the plan breaks as soon as the real times differ); a
    chain-critical config (remaining work >= 0.7 .. 1.0 x the remaining work / p) first,
    lock-step for the rest (200 profiles: mean 1.0125, 9 above 1.05, against 1.0129 and 10)."""
    ratios, vs_ring = survey(120, None)
    assert max(vs_ring) <= 1.0 + 1e-9, max(vs_ring)
    assert statistics.mean(ratios) <= 1.02, statistics.mean(ratios)
    assert sum(r <= 1.05 for r in ratios) >= 0.9 * len(ratios), sorted(ratios)[-20:]
    noisy, noisy_ring = survey(80, None, noise=0.3)
    assert max(noisy_ring) <= 1.0 + 1e-9, max(noisy_ring)
    assert statistics.mean(noisy) <= 1.025, statistics.mean(noisy)
    before, _ = survey(120, FIT_DEFAULTS)  # the problem, on the same profiles
    assert sum(r > 1.05 for r in before) >= 2 * sum(r > 1.05 for r in ratios) + 10


def test_static_costs_balance_the_rotations():
    costs = {1: 9.0, 2: 1.0, 3: 1.0, 4: 8.0, 5: 1.0, 6: 1.0, 7: 1.0, 8: 1.0}
    off = balanced_offsets(costs, 2, seed=3)
    one_off = FIRST_UNIT_SHARE * statistics.mean(costs.values())
    loads = [sum(costs[c] + one_off for c in costs if off[c] == q) for q in range(2)]
    assert off[1] != off[4]  # the two dear configs start apart
    assert abs(loads[0] - loads[1]) <= max(costs.values())
    assert balanced_offsets(costs, 2, seed=3) == off  # the inputs decide, nothing else
    pol = RandomizedMOP(3, seeded_order=True, rotated_order=True, config_costs=costs)
    for e in (1, 2, 3):
        orders = {c: pol.visit_order(c, e, 2) for c in costs}
        assert all(sorted(o) == [0, 1] for o in orders.values())
        assert orders[1][0] != orders[4][0]
        starts = [sum(costs[c] + one_off for c in costs if orders[c][0] == q) for q in (0, 1)]
        assert sorted(starts) == sorted(loads)
    # a config without an estimate (an AutoML trial added later) keeps the mst_key rotation
    plain = RandomizedMOP(3, seeded_order=True, rotated_order=True)
    assert pol.visit_order(99, 2, 4) == plain.visit_order(99, 2, 4)


def test_config_costs_survive_the_stored_options():
    """A resumed fit rebuilds the policy from its options as stored (JSON: text keys) and
    plans the same visit orders."""
    costs = {3: 2.5, 5: 0.5, 8: 1.0, 9: 4.0, 12: 0.25}
    pol = get_policy("mop", random_state=17, **FIT_DEFAULTS, config_costs=costs)
    stored = json.loads(json.dumps(pol.options()))
    assert stored["config_costs"] == {str(c): v for c, v in costs.items()}
    again = get_policy("mop", **stored)
    for c in costs:
        for e in (1, 2, 3):
            assert again.visit_order(c, e, 4) == pol.visit_order(c, e, 4)


@pytest.mark.parametrize("costs", [[1, 2], {1: 0}, {1: -1.0}, {1: "x"}, {"a": 1.0},
                                   {1: True}, {1: math.inf}, {1: math.nan}])
def test_bad_config_costs(costs):
    with pytest.raises(CerebroError) as e:
        get_policy("mop", random_state=1, config_costs=costs)
    assert e.value.sqlstate == "22023"
    assert "config_costs" in e.value.message


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_invariants_hold_with_static_costs(sc):
    r = random.Random(sc["seed"])
    costs = {c: r.uniform(0.1, 10) for c in sc["configs"] if r.random() < 0.9}
    opts = dict(FIT_DEFAULTS, config_costs=costs)
    res = run_scenario("mop", opts, sc)
    assert res.completed
    check_invariants(res.log, num_partitions=sc["num_partitions"], epochs=sc["epochs"],
                     eval_epochs=sc["eval_epochs"])


def test_a_unit_failing_past_the_retry_limit_fails_the_simulated_fit():
    """Failures go through the coordinator's retry limit (max_unit_retries)."""
    from cerebro_db.coordinator import WorkerFailed

    always = lambda c, e, q, w, kind, attempt: 0.5
    with pytest.raises(WorkerFailed, match="lost its worker session 3 times"):
        simulate(get_policy("mop", random_state=0), [1], 2, 1, 1.0, failures=always,
                 max_unit_retries=2)
    res = simulate(get_policy("mop", random_state=0), [1], 2, 1, 1.0,
                   failures=random_failures(1.0, max_attempts=3), max_unit_retries=2)
    assert res.completed and sum(not r.ok for r in res.log) == 4
