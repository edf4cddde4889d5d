"""Replicated partitions and elastic workers: the pure rule, the simulator with worker
churn, and the coordinator loop with a fake executor and worker pool (the real server is
exercised in tests/integration/test_replicas.py)."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cerebro_db.coordinator import run_fit
from cerebro_db.errors import CerebroError
from cerebro_db.scheduling import (
    EVAL,
    TRAIN,
    Assignment,
    Progress,
    RandomizedMOP,
    SchedulingError,
    auto_replicas,
    check_invariants,
    cover,
    get_policy,
    home_partitions,
    initial_workers,
    replica_partitions,
    uncovered,
)
from cerebro_db.simulation import WorkerChange, simulate

from .test_coordinator_faults import FakeExecutor


def test_replica_rule():
    assert replica_partitions(0, 4, 1) == {0}
    assert replica_partitions(3, 4, 2) == {3, 0}
    assert replica_partitions(2, 4, 3) == {2, 3, 0}
    assert replica_partitions(1, 3, 9) == {0, 1, 2}  # capped at p
    assert replica_partitions(7, 3, 1) == {0, 1, 2}  # beyond p: every partition
    with pytest.raises(SchedulingError):
        replica_partitions(0, 3, 0)
    ws = initial_workers(4, 4, 2)
    for q in range(4):  # every partition on exactly r workers
        assert sum(q in p for p in ws.values()) == 2
    assert initial_workers(1, 3, 1) == {0: frozenset({0, 1, 2})}
    assert initial_workers(2, 5, 1) == {0: {0, 2, 4}, 1: {1, 3}}


def test_home_partitions():
    # without replicas every held partition is its holder's home
    assert home_partitions({0: {0}, 1: {1}}, 2) == {0: {0}, 1: {1}}
    assert home_partitions({0: {0, 2, 4}, 1: {1, 3}}, 5) == {0: {0, 2, 4}, 1: {1, 3}}
    # replicas: worker q is at home on partition q; a partition whose worker is gone goes
    # to one of its holders; a worker that joined later is at home on all it holds
    assert home_partitions({0: {0, 1}, 1: {0, 1}}, 2) == {0: {0}, 1: {1}}
    assert home_partitions({0: {0, 1, 2}, 2: {0, 1, 2}}, 3) == {0: {0}, 2: {1, 2}}
    assert home_partitions({0: {0, 1}, 1: {1, 0}, 5: {0, 1}}, 2) == {0: {0}, 1: {1},
                                                                      5: {0, 1}}
    ws = initial_workers(4, 4, 2)
    home = home_partitions(ws, 4)
    assert home == {w: {w} for w in range(4)}


def test_auto_replicas():
    assert auto_replicas(2, 100, 200) == 2
    assert auto_replicas(4, 200, 200) == 4
    assert auto_replicas(2, 201, 200) == 1  # the data does not fit one worker's budget
    assert auto_replicas(2, None, 200) == 1  # size unknown (a MADlib-packed table)
    with pytest.raises(SchedulingError):
        auto_replicas(0, 1, 1)


def _steal_setup(workers):
    """Config 1 has trained partition 0 and waits for partition 1, where worker 1 trains
    config 2; worker 0 is idle."""
    prog = Progress({1: 1, 2: 1}, 2, workers, eval_epochs={1})
    prog.start(Assignment(0, 1, 1, 0))
    prog.finish(0, True)
    prog.start(Assignment(1, 2, 1, 1))
    return prog


def test_a_worker_takes_another_partitions_unit_only_when_it_would_idle():
    both = {0: (0, 1), 1: (0, 1)}
    snap = _steal_setup(both).snapshot()
    assert RandomizedMOP(0).assign(snap) == [Assignment(0, 1, 1, 1, TRAIN)]
    # not on a look-ahead snapshot (the worker is still busy; its home worker may come first)
    assert RandomizedMOP(0).assign(dataclasses.replace(snap, ahead=True)) == []
    # without replicas it waits
    assert RandomizedMOP(0).assign(_steal_setup({0: (0,), 1: (1,)}).snapshot()) == []
    # its home partition's evaluation comes before another partition's training unit
    prog = Progress({1: 1, 2: 1, 3: 1}, 2, both, eval_epochs={1})
    for c, w in ((3, 0), (3, 1), (1, 0)):
        prog.start(Assignment(w, c, 1, w))
        prog.finish(w, True)
    prog.start(Assignment(1, 2, 1, 1))
    assert RandomizedMOP(0).assign(prog.snapshot()) == [Assignment(0, 3, 1, 0, EVAL)]
    # ... and with none left at home it takes the other partition's oldest evaluation
    prog.start(Assignment(0, 3, 1, 0, EVAL))
    prog.finish(0, True)
    prog.start(Assignment(0, 1, 1, 1))
    prog.finish(0, True)  # config 1 done: its evaluations are pending on both partitions
    snap = prog.snapshot()
    assert RandomizedMOP(0).assign(snap) == [Assignment(0, 1, 1, 0, EVAL)]
    prog.start(Assignment(0, 1, 1, 0, EVAL))
    prog.finish(0, True)
    assert RandomizedMOP(0).assign(prog.snapshot()) == [Assignment(0, 3, 1, 1, EVAL)]


def test_progress_tells_policies_what_workers_have_read_and_what_reads_cost():
    prog = Progress({1: 2, 2: 2}, 2, {0: (0, 1), 1: (0, 1)}, eval_epochs={1})
    snap = prog.snapshot(5.0)
    assert (snap.warm, snap.started, snap.cold_read_seconds, snap.eval_seconds) == \
        ({}, {}, None, {})
    prog.start(Assignment(0, 1, 1, 0))
    snap = prog.snapshot(6.0)
    assert snap.warm == {0: frozenset({0})} and snap.started == {0: 5.0}
    prog.finish(0, True)
    prog.observe_read(0, 0, 0.3)
    prog.observe_read(0, 0, 0.001)  # a later read of a cached partition: not a cold one
    prog.start(Assignment(1, 1, 1, 1))
    prog.finish(1, True)
    prog.observe_read(1, 1, 0.5)
    prog.observe_read(1, 1, None)
    prog.observe_eval(1, 0.2)
    prog.observe_eval(1, 0.4)
    prog.observe_eval(9, 1.0)  # not a config of the fit
    snap = prog.snapshot(7.0)
    assert snap.cold_read_seconds == pytest.approx(0.4)
    assert snap.eval_seconds == {1: pytest.approx(0.3)}
    assert snap.started == {} and snap.warm == {0: frozenset({0}), 1: frozenset({1})}
    # a unit queued ahead counts as read by its worker, in the progress and in its copy
    prog.start(Assignment(0, 2, 1, 1))
    ahead = prog.ahead(0)
    prog.queue(Assignment(0, 1, 1, 0, EVAL), ahead)
    assert prog.snapshot(8.0).warm[0] == frozenset({0, 1})
    prog.remove_worker(1)
    assert 1 not in prog.snapshot(9.0).warm


def _tail(read: float | None, warm_other: bool = False) -> Any:
    """Three configs trained (1 s a unit), worker 0 done with its partition's evaluations
    (0.1 s each), worker 1 evaluating config 1 on partition 1 since t = 10, two
    evaluations left there; a snapshot at t = 10.05 with cold reads of ``read`` s."""
    prog = Progress({1: 1, 2: 1, 3: 1}, 2, {0: (0, 1), 1: (0, 1)}, eval_epochs={1})
    for c in (1, 2, 3):
        for w in (0, 1):
            q = 1 - w if warm_other and c == 3 else w
            prog.start(Assignment(w, c, 1, q))
            prog.finish(w, True)
            prog.observe(c, 1.0, 1)
            if read is not None:
                prog.observe_read(w, q, read)
    prog.snapshot(10.0)
    prog.start(Assignment(1, 1, 1, 1, EVAL))
    for c in (1, 2, 3):
        prog.start(Assignment(0, c, 1, 0, EVAL))
        prog.finish(0, True)
        prog.observe_eval(c, 0.1)
    return prog.snapshot(10.05)


def test_in_the_tail_a_worker_reads_another_partition_only_when_that_ends_sooner():
    """Worker 1 is free in 0.05 s and has 0.2 s of evaluations waiting: worker 0 ends one
    of them sooner only if its read of partition 1 takes less than 0.15 s."""
    eval_2 = [Assignment(0, 2, 1, 1, EVAL)]
    assert RandomizedMOP(0).assign(_tail(0.3)) == []
    assert RandomizedMOP(0).assign(_tail(0.05)) == eval_2
    assert RandomizedMOP(0).assign(_tail(None)) == eval_2  # no read measured: as before
    assert RandomizedMOP(0).assign(_tail(0.3, warm_other=True)) == eval_2  # already read
    # worker 1's evaluation is 0.5 s overdue at t = 10.6 (stalled): taken to need 0.5 s more
    assert RandomizedMOP(0).assign(dataclasses.replace(_tail(0.3), now=10.6)) == eval_2
    assert RandomizedMOP(0).assign(dataclasses.replace(_tail(0.3), now=10.15)) == []
    assert RandomizedMOP(0, priced_reads=False).assign(_tail(0.3)) == eval_2


def test_priced_reads_keep_a_fits_tail_at_home_and_never_lengthen_it(monkeypatch):
    """Equal workers holding both partitions, units within 15% of each other, a worker's
    first read of a partition 0.28 s against training units of 0.21 s and evaluations of
    0.07 s (the suite's 60k MLPs): without read times the policy sends a worker that ran
    out of home work to read the other partition for a unit its home worker would end
    sooner; with them the fit is never longer and sometimes shorter."""
    import random

    from .test_scheduling import FIT_DEFAULTS

    def run(seed):
        rng = random.Random(seed)
        res = simulate(get_policy("mop", random_state=seed, **FIT_DEFAULTS),
                       list(range(1, 9)), 2, 3, lambda c, q, w: 0.21 * (1 + 0.15 * rng.random()),
                       eval_epochs=range(1, 4),
                       eval_time=lambda c, q, w: 0.07 * (1 + 0.15 * rng.random()),
                       workers={0: (0, 1), 1: (0, 1)}, pipeline=True, read_time=0.28)
        check_invariants(res.log, num_partitions=2, epochs=3)
        return res.makespan, sum(u.worker != u.partition for u in res.log)

    priced = [run(seed) for seed in range(12)]
    monkeypatch.setattr(Progress, "observe_read", lambda self, *a: None)
    blind = [run(seed) for seed in range(12)]
    assert all(p[0] <= b[0] + 1e-9 for p, b in zip(priced, blind))
    assert any(p[0] < b[0] - 1e-3 for p, b in zip(priced, blind))
    assert sum(b[1] for b in blind) > 0 and sum(p[1] for p in priced) < sum(b[1] for b in blind)


def _ahead_snapshot(workers, configs):
    """Worker 0 trains config 1 on partition 0 and worker 1 config 2 on partition 1; the
    look-ahead snapshot of worker 0 (what the coordinator asks to queue its next unit)."""
    prog = Progress({c: 1 for c in configs}, 2, workers, eval_epochs={1})
    prog.start(Assignment(0, 1, 1, 0))
    prog.start(Assignment(1, 2, 1, 1))
    return dataclasses.replace(prog.ahead(0).snapshot(), idle_workers=(0,), ahead=True)


def test_no_unit_is_queued_ahead_in_the_tail_when_partitions_have_replicas():
    both = {0: (0, 1), 1: (0, 1)}
    policy = get_policy("mop", random_state=0)
    # 4 units left to start (configs 1 and 2 one each, config 3 two) <= 3 per worker: the
    # unit waits until a worker is idle, so whichever holder is idle first takes it
    assert policy.assign(_ahead_snapshot(both, (1, 2, 3))) == []
    # earlier in the fit (12 units left) the next unit is queued as before
    assert policy.assign(_ahead_snapshot(both, range(1, 7)))
    # without replicas only worker 0 can run it: queued as before
    assert policy.assign(_ahead_snapshot({0: (0,), 1: (1,)}, (1, 2, 3))) == \
        [Assignment(0, 3, 1, 0, TRAIN)]
    # tail_units=0 turns the rule off
    assert get_policy("mop", random_state=0, tail_units=0).assign(
        _ahead_snapshot(both, (1, 2, 3))) == [Assignment(0, 3, 1, 0, TRAIN)]
    with pytest.raises(CerebroError, match="tail_units"):
        get_policy("mop", tail_units=-1)


def _one_off_times(slow):
    """Unit times of a short fit (4 configs of 2 models, cheap units) where a worker's first
    unit of a model also builds and traces it (0.3 s, evaluation 0.14 s), worker 1 ``slow``
    times slower: the shape of the suite's synthetic-x16 workload."""
    group = {1: 0, 2: 0, 3: 1, 4: 1}
    train = {1: 0.06, 2: 0.06, 3: 0.2, 4: 0.2}
    built: set[tuple[str, int, int]] = set()

    def unit(kind, base, one_off):
        def time(c, q, w):
            t = base[c]
            if (kind, w, group[c]) not in built:
                built.add((kind, w, group[c]))
                t += one_off
            return t * (slow if w == 1 else 1.0)
        return time

    return unit("train", train, 0.3), unit("eval", {c: t / 3 for c, t in train.items()}, 0.14)


@pytest.mark.parametrize("tail_units, worst", [(None, 1.01), (0, None)])
def test_the_tail_without_queued_units_lets_the_faster_worker_finish_the_fit(tail_units,
                                                                            worst):
    """Through the real fit loop with pipelined dispatch, both partitions on both workers,
    worker 1 10% slower: span / (all unit time / 2) over seeds 0-5 is at most 1.004 with the
    tail rule, up to 1.048 without it (a unit queued on the slower worker is the last)."""
    from .test_scheduling import FIT_DEFAULTS

    opts = dict(FIT_DEFAULTS) if tail_units is None else {**FIT_DEFAULTS,
                                                          "tail_units": tail_units}
    ratios = []
    for seed in range(6):
        train, evaluate = _one_off_times(1.1)
        res = simulate(get_policy("mop", random_state=seed, **opts), [1, 2, 3, 4], 2, 1,
                       train, eval_time=evaluate, eval_epochs={1},
                       workers={0: (0, 1), 1: (0, 1)}, pipeline=True)
        check_invariants(res.log, num_partitions=2, epochs=1)
        ratios.append(res.makespan / (sum(u.duration for u in res.log) / 2))
    if worst is not None:
        assert max(ratios) <= worst
    else:
        assert max(ratios) > 1.03  # what the rule removes


@pytest.mark.parametrize("seed", range(3))
def test_replicas_absorb_a_slower_worker_and_change_nothing_when_workers_keep_pace(seed):
    """What fits use (seeded rotated orders, cost-aware, pipelined), 8 configs of different
    cost, 2 partitions, 3 epochs evaluated each: with equal workers, holding both
    partitions gives the very same schedule (nothing taken off its home); with worker 1
    slower, it evens the workers out. Measured: span / (all unit time / 2) 1.048 -> 1.008
    (10% slower), 1.111 -> 1.007 (25% slower), seeds 0-3."""
    from .test_scheduling import FIT_DEFAULTS, table_times

    base = table_times(seed, "per_config", 1.0, 4.0)
    for slow, worst in ((1.0, 1.0 + 1e-9), (1.1, 1.02), (1.25, 1.02)):
        def times(c, q, w, slow=slow):
            return base(c, q, w) * (slow if w == 1 else 1.0)

        logs = {}
        for r, ws in ((1, {0: (0,), 1: (1,)}), (2, {0: (0, 1), 1: (0, 1)})):
            res = simulate(get_policy("mop", random_state=seed, **FIT_DEFAULTS),
                           list(range(1, 9)), 2, 3, times, eval_epochs=range(1, 4),
                           workers=ws, pipeline=True)
            check_invariants(res.log, num_partitions=2, epochs=3)
            logs[r] = res
        one, two = logs[1], logs[2]
        if slow == 1.0:
            assert [(u.config, u.partition, u.worker, u.start) for u in two.log] == \
                [(u.config, u.partition, u.worker, u.start) for u in one.log]
        else:
            # pinned partitions: the faster worker idles while the slower one finishes
            idle_ratio = one.makespan / (sum(u.duration for u in one.log) / 2)
            assert idle_ratio >= 2 * slow / (1 + slow) - 0.005
            assert any(u.worker != u.partition for u in two.log)
        assert two.makespan / (sum(u.duration for u in two.log) / 2) <= worst


def test_cover_gives_orphans_to_the_least_loaded():
    ws = {0: frozenset({0}), 2: frozenset({2, 3})}
    assert uncovered(ws, 4) == [1]
    assert cover(ws, 4) == {0: {0, 1}, 2: {2, 3}}
    assert cover({}, 3) == {}


def test_progress_grant():
    p = Progress({1: 1}, 3, {0: {0}})
    p.grant(0, {2})
    assert p.workers[0] == {0, 2}
    with pytest.raises(SchedulingError):
        p.grant(0, {3})
    with pytest.raises(SchedulingError):
        p.grant(5, {1})


@pytest.mark.parametrize("seed", range(5))
def test_removed_worker_served_by_replicas(seed):
    """r = 2: a worker removed mid-run (its unit fails) leaves; the replicas finish the fit;
    with r = 1 the coordinator hands its partition to the workers left."""
    p, configs = 4, [1, 2, 3, 4, 5]
    churn = [WorkerChange(2.5, "remove", 1)]
    pol = get_policy("mop", random_state=seed, seeded_order=True)
    res = simulate(pol, configs, p, 2, 1.0, workers=initial_workers(4, p, 2),
                   worker_changes=churn, eval_epochs={2})
    assert res.completed
    check_invariants(res.log, num_partitions=p, epochs=2, eval_epochs={2})
    assert not [r for r in res.log if r.worker == 1 and r.start >= 2.5]
    # its unit in flight, if any, failed at the removal
    assert all(not r.ok and r.end == 2.5 for r in res.log if r.worker == 1 and r.end > 2.5)
    assert any(r.worker == 1 for r in res.log)
    covered = simulate(get_policy("mop", random_state=seed, seeded_order=True), configs, p, 2,
                       1.0, workers=initial_workers(4, p, 1), worker_changes=churn)
    assert covered.completed
    check_invariants(covered.log, num_partitions=p, epochs=2)
    assert not [r for r in covered.log if r.worker == 1 and r.start >= 2.5]


@pytest.mark.parametrize("seed", range(5))
def test_retire_waits_for_the_unit_in_flight_and_added_workers_help(seed):
    p, configs = 2, [1, 2, 3, 4]
    churn = [WorkerChange(0.5, "retire", 1), WorkerChange(1.5, "add", 5, (0, 1)),
             WorkerChange(3.2, "retire", 5)]
    pol = get_policy("mop", random_state=seed, seeded_order=True)
    res = simulate(pol, configs, p, 3, 1.0, workers=initial_workers(2, p, 1),
                   worker_changes=churn)
    assert res.completed and all(r.ok for r in res.log)  # no unit killed by a retirement
    check_invariants(res.log, num_partitions=p, epochs=3)
    assert [r.end for r in res.log if r.worker == 1] == [1.0]
    on5 = [r for r in res.log if r.worker == 2]  # worker "5" joins with a fresh id
    assert on5 and min(r.start for r in on5) >= 1.5 and max(r.start for r in on5) < 3.2
    assert max(r.end for r in on5) <= 4.0


class FakePool:
    """Requests come from a schedule keyed by the number of the coordinator's polls."""

    poll_interval = 0.0

    def __init__(self, requests: dict[int, int], p: int, replicas: int = 1,
                 refuse: frozenset[int] = frozenset()) -> None:
        self.requests, self.p, self.replicas, self.refuse = requests, p, replicas, refuse
        self.polls = 0
        self.events: list[tuple[str, int, Any]] = []

    def requested(self) -> int | None:
        self.polls += 1
        return self.requests.get(self.polls)

    def holds(self, worker: int) -> frozenset[int]:
        return replica_partitions(worker, self.p, self.replicas)

    def join(self, worker: int, partitions: frozenset[int]) -> bool:
        self.events.append(("join", worker, sorted(partitions)))
        return worker not in self.refuse

    def leave(self, worker: int, status: str) -> None:
        self.events.append(("leave", worker, status))

    def granted(self, worker: int, partitions: frozenset[int]) -> None:
        self.events.append(("grant", worker, sorted(partitions)))


class SlowExecutor(FakeExecutor):
    """Finishes one unit per wait (the oldest), so workers are busy across polls."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.order: list[int] = []
        self.units_by_worker: dict[int, list[tuple[int, int, int, str]]] = {}

    def submit(self, a, options):
        super().submit(a, options)
        self.order.append(a.worker)
        self.units_by_worker.setdefault(a.worker, []).append(
            (a.config, a.epoch, a.partition, a.kind))

    def wait(self, timeout=None):
        w = self.order.pop(0)
        keep = {k: v for k, v in self.inflight.items() if k != w}
        self.inflight = {w: self.inflight[w]}
        out = super().wait()
        self.inflight = keep
        return out


def elastic_run(pool, workers, epochs=3, ex=None):
    p = 2
    ex = ex or SlowExecutor()
    progress = Progress({1: epochs, 2: epochs, 3: epochs}, p, workers, {epochs})
    policy = get_policy("mop", random_state=5, seeded_order=True)
    out = run_fit(policy, progress, ex, eval_kinds=["eval_train"], num_partitions=p,
                  snapshot_epochs=lambda c, e: e == epochs, pool=pool)
    return out, ex, progress


def test_coordinator_grows_and_shrinks_between_units():
    pool = FakePool({3: 4, 9: 1}, p=2)
    out, ex, progress = elastic_run(pool, {0: {0}, 1: {1}})
    assert out.units == 3 * 3 * 2
    joins = [e for e in pool.events if e[0] == "join"]
    assert joins == [("join", 2, [0, 1]), ("join", 3, [0, 1])]
    leaves = [e[1] for e in pool.events if e[0] == "leave"]
    assert sorted(leaves) == [1, 2, 3] and all(e[2] == "removed" for e in pool.events
                                               if e[0] == "leave")
    assert ("grant", 0, [0, 1]) in pool.events  # partition 1 had only worker 1
    assert set(progress.workers) == {0}
    assert ex.units_by_worker.get(2) or ex.units_by_worker.get(3)
    assert not ex.failures


def test_coordinator_lost_worker_with_replicas_leaves():
    """r = 2, p = 2: worker 1 loses its session and cannot reconnect; worker 0 (which holds
    both partitions) does the rest; nothing is granted."""
    ex = SlowExecutor(lose={(1, 1, 0, "train", 0)}, recover_ok=False)
    pool = FakePool({}, p=2, replicas=2)
    out, ex, progress = elastic_run(pool, initial_workers(2, 2, 2), ex=ex)
    assert out.units == 18 and out.retried == 1
    gone = ex.recovered
    assert len(gone) == 1 and pool.events == [("leave", gone[0], "lost")]
    assert set(progress.workers) == {1 - gone[0]}


def test_coordinator_lost_worker_without_replicas_hands_over():
    ex = SlowExecutor(lose={(1, 1, 1, "train", 0)}, recover_ok=False)
    pool = FakePool({}, p=2)
    out, ex, progress = elastic_run(pool, {0: {0}, 1: {1}}, ex=ex)
    assert out.units == 18
    assert pool.events == [("leave", 1, "lost"), ("grant", 0, [0, 1])]
    assert progress.workers == {0: {0, 1}}


def test_the_simulator_follows_the_coordinators_choice_of_who_retires():
    """The coordinator retires the highest worker id; a change naming another one is refused
    rather than silently retiring a different worker."""
    with pytest.raises(SchedulingError, match="highest worker id"):
        simulate(get_policy("mop", random_state=0), [1, 2], 2, 2, 1.0,
                 worker_changes=[WorkerChange(0.5, "retire", 0)])


def test_a_worker_whose_session_was_lost_reads_its_partition_again():
    """A lost session reopens empty: the retried unit pays the partition's read again (the
    simulated cluster), and the policy sees no partition warm for that worker any more."""
    class Seeing:  # the policy, recording what it is told worker 0 has read
        def __init__(self):
            self.policy, self.lookahead, self.warm = get_policy("mop", random_state=1), True, []

        def assign(self, snap):
            if not snap.ahead:
                self.warm.append((snap.now, snap.warm.get(0, frozenset())))
            return self.policy.assign(snap)

    seeing = Seeing()
    res = simulate(seeing, [0, 1], 1, 1, 1.0, failures={(0, 1, 0): 0.5},  # type: ignore[arg-type]
                   read_time=1.0)
    # config 0: read + half its unit, lost at 1.0; again read + unit (2.0); config 1: 1.0
    assert res.makespan == pytest.approx(4.0)
    assert seeing.warm[:3] == [(0.0, frozenset()), (1.0, frozenset()), (3.0, frozenset({0}))]
    prog = Progress({1: 1}, 2, {0: (0, 1), 1: (0, 1)})
    prog.start(Assignment(0, 1, 1, 0))
    prog.finish(0, False)
    assert prog.snapshot().warm == {0: frozenset({0})}
    prog.forget_reads(0)
    assert prog.snapshot().warm == {}
