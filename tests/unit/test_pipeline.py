"""Pipelined dispatch in the pure core: a busy worker's queued unit (``Progress.queue``,
``Progress.ahead``) and the coordinator queuing one unit ahead per worker (``run_fit`` on
the simulator's executor with ``pipeline``)."""
from __future__ import annotations

from typing import Any

import pytest

from cerebro_db.coordinator import run_fit
from cerebro_db.scheduling import (
    EVAL,
    TRAIN,
    Assignment,
    Progress,
    SchedulingError,
    check_invariants,
    get_policy,
)
from cerebro_db.simulation import SimulatedExecutor, simulate


def two_workers(eval_epochs: Any = ()) -> Progress:
    return Progress({1: 2, 2: 2, 3: 2}, 2, {0: [0], 1: [1]}, eval_epochs)


def test_a_queued_unit_counts_as_in_flight_for_the_others_and_starts_when_its_worker_is_done():
    p = two_workers()
    p.start(Assignment(0, 1, 1, 0))
    p.start(Assignment(1, 2, 1, 1))
    ahead = p.ahead(0)
    assert ahead.visited[1] == {0} and 0 not in ahead.running and p.running[0].config == 1
    p.queue(Assignment(0, 3, 1, 0), ahead)
    snap = p.snapshot()
    assert snap.is_training(3) and 0 not in snap.idle_workers
    p.finish(1, True)
    with pytest.raises(SchedulingError, match="already training"):
        p.check(Assignment(1, 3, 1, 1))
    p.finish(0, True)
    assert p.running[0].config == 3 and not p.queued
    assert p.visited[1] == {0}


def test_a_queued_unit_is_dropped_when_its_workers_unit_fails():
    p = two_workers()
    p.start(Assignment(0, 1, 1, 0))
    p.queue(Assignment(0, 3, 1, 0), p.ahead(0))
    p.finish(0, False)
    assert not p.running and not p.queued and p.visited[1] == set()
    assert not p.snapshot().is_training(3)


def test_a_queued_unit_is_checked_on_the_progress_ahead():
    p = two_workers()
    p.start(Assignment(0, 1, 1, 0))
    with pytest.raises(SchedulingError, match="already visited"):
        p.queue(Assignment(0, 1, 1, 0), p.ahead(0))  # config 1 has just seen partition 0
    with pytest.raises(SchedulingError, match="not running"):
        p.queue(Assignment(1, 2, 1, 1), p.ahead(0))  # worker 1 is idle
    with pytest.raises(SchedulingError, match="not running"):
        p.ahead(1)
    p.queue(Assignment(0, 2, 1, 0), p.ahead(0))
    with pytest.raises(SchedulingError, match="queued already"):
        p.queue(Assignment(0, 3, 1, 0), p.ahead(0))


def test_an_evaluation_unit_the_running_unit_makes_pending_can_be_queued():
    """Config 1's last partition of epoch 1 runs on worker 0: ahead of it, epoch 1's
    evaluation on partition 0 is pending, and is queued; it starts when the unit ends
    well, and never shows as pending to the other workers."""
    p = Progress({1: 1, 2: 1}, 2, {0: [0], 1: [1]}, {1})
    p.start(Assignment(1, 1, 1, 1))
    p.finish(1, True)
    p.start(Assignment(0, 1, 1, 0))
    p.queue(Assignment(0, 1, 1, 0, EVAL), p.ahead(0))
    p.finish(0, True)
    assert p.running[0].kind == EVAL
    assert [(u.config, u.partition) for u in p.pending_evals] == [(1, 1)]


def test_a_pending_evaluation_unit_that_is_queued_goes_back_when_the_unit_before_fails():
    p = Progress({1: 1, 2: 1}, 2, {0: [0], 1: [1]}, {1})
    for w, q in ((0, 0), (1, 1)):
        p.start(Assignment(w, 1, 1, q))
        p.finish(w, True)
    p.start(Assignment(0, 2, 1, 0))
    p.queue(Assignment(0, 1, 1, 0, EVAL), p.ahead(0))
    assert [(u.config, u.partition) for u in p.pending_evals] == [(1, 1)]
    p.finish(0, False)
    assert sorted((u.config, u.partition) for u in p.pending_evals) == [(1, 0), (1, 1)]


class Counting(SimulatedExecutor):
    """Unit time by config; counts the units queued ahead."""

    def __init__(self, pipeline: bool) -> None:
        super().__init__(max_steps=10_000, pipeline=pipeline)
        self.queued = 0

    def unit_time(self, a, options):
        return 1.0 + a.config if a.kind == TRAIN else 0.3

    def result(self, a, options, start, end):
        if a.kind == EVAL:
            return {"evals": {"eval_train": {"loss": 0.0, "rows": 1, "metrics": {}}}}
        return {"loss": 0.0, "rows": 1, "seconds": end - start}

    def queue(self, a, options):
        self.queued += 1
        return super().queue(a, options)


def fit(policy: str, pipeline: bool, hooks: Any = None) -> Counting:
    ex = Counting(pipeline)
    pol = get_policy(policy, **({"random_state": 7, "prefer_lagging": True,
                                 "seeded_order": True, "cost_aware": True,
                                 "rotated_order": True} if policy == "mop" else {}))
    progress = Progress({c: 3 for c in range(6)}, 2, {0: [0], 1: [1]}, {1, 3})
    run_fit(pol, progress, ex, eval_kinds=["eval_train"], num_partitions=2,
            snapshot_epochs=lambda c, e: e in (1, 3), clock=ex.clock, hooks=hooks)
    check_invariants(ex.log, num_partitions=2, epochs=3, eval_epochs={1, 3})
    return ex


def visits(ex: Counting) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for r in sorted(ex.log, key=lambda r: r.start):
        if r.kind == TRAIN:
            out.setdefault(r.config, []).append((r.epoch, r.partition))
    return out


def test_the_coordinator_queues_ahead_and_every_config_keeps_its_seeded_visit_order():
    ahead, plain = fit("mop", True), fit("mop", False)
    assert ahead.queued > 0 and plain.queued == 0
    assert visits(ahead) == visits(plain)  # the same models


def test_a_policy_with_a_barrier_is_never_asked_ahead():
    assert fit("ring", True).queued == 0


def test_pipelined_simulations_keep_the_invariants_with_lost_sessions():
    res = simulate(get_policy("mop", random_state=3), list(range(5)), 3, 3,
                   lambda c, q, w: 1.0 + c / 2, eval_epochs={2, 3}, pipeline=True,
                   failures={(2, 1, 1): 0.5, (4, 2, 0): 0.3, (0, 3, 2): 0.9})
    assert res.completed
    assert sum(not r.ok for r in res.log) == 3
    check_invariants(res.log, num_partitions=3, epochs=3, eval_epochs={2, 3})
