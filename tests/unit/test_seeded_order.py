"""MOP with seeded_order: visit orders depend on the seed only, not on worker timing."""
from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_db.scheduling import RandomizedMOP, check_invariants
from cerebro_db.simulation import simulate


def orders(log):
    out: dict[tuple[int, int], list[int]] = {}
    for r in sorted((r for r in log if r.kind == "train" and r.ok), key=lambda r: r.start):
        out.setdefault((r.config, r.epoch), []).append(r.partition)
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 3), st.integers(0, 10**6))
def test_visit_orders_do_not_depend_on_timing(n_configs, p, epochs, seed):
    configs = list(range(1, n_configs + 1))
    logs = []
    for timing_seed in (1, 2):
        rng = random.Random(timing_seed)
        times = {(c, q): rng.uniform(0.5, 3.0) for c in configs for q in range(p)}
        res = simulate(RandomizedMOP(seed, prefer_lagging=True, seeded_order=True), configs, p,
                       epochs, lambda c, q, w, times=times: times[(c, q)])
        assert res.completed
        check_invariants(res.log, num_partitions=p, epochs=epochs)
        logs.append(res.log)
    assert orders(logs[0]) == orders(logs[1])
    pol = RandomizedMOP(seed, seeded_order=True)
    for (c, e), order in orders(logs[0]).items():
        assert order == pol.visit_order(c, e, p)


def test_seeded_order_keeps_workers_busy():
    """16 configs on 2 partitions: the order constraint costs little utilisation."""
    res = simulate(RandomizedMOP(3, prefer_lagging=True, seeded_order=True), list(range(16)), 2,
                   3, 1.0)
    assert res.makespan / res.lower_bound <= 1.10


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(1, 3), st.integers(0, 10**6))
def test_orders_planned_from_static_costs_do_not_depend_on_timing(n_configs, p, epochs, seed):
    """What fits use: rotations balanced by a static cost estimate, measured unit times
    deciding which config goes next. Other timing (and other measured costs) gives other
    schedules, never other visit orders."""
    configs = list(range(1, n_configs + 1))
    costs = {c: random.Random(f"{seed}:{c}").uniform(0.2, 5.0) for c in configs}
    opts = {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
            "rotated_order": True, "config_costs": costs}
    logs = []
    for timing_seed in (1, 2):
        rng = random.Random(timing_seed)
        times = {(c, q): rng.uniform(0.5, 3.0) for c in configs for q in range(p)}
        res = simulate(RandomizedMOP(seed, **opts), configs, p, epochs,
                       lambda c, q, w, times=times: times[(c, q)])
        assert res.completed
        check_invariants(res.log, num_partitions=p, epochs=epochs)
        logs.append(res.log)
    assert orders(logs[0]) == orders(logs[1])
    pol = RandomizedMOP(seed, **opts)
    for (c, e), order in orders(logs[0]).items():
        assert order == pol.visit_order(c, e, p)
