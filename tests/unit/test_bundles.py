"""Evaluation bundles: the coordinator hands a worker given an evaluation unit its next
evaluation units in the same submit (``cerebro_db.eval_bundle``), decided by the policy on
look-ahead snapshots; the fit keeps its invariants, its visit orders and every evaluation,
and a bundle whose session is lost gives its units back."""
from __future__ import annotations

from typing import Any

from cerebro_db.coordinator import run_fit
from cerebro_db.scheduling import EVAL, TRAIN, Assignment, Progress, check_invariants, get_policy
from cerebro_db.simulation import SimulatedExecutor

from .test_pipeline import visits


class Recording(SimulatedExecutor):
    """Unit time by config; records every submit's units; loses the first bundle whose
    first unit is ``lose`` (config, epoch, partition), once."""

    def __init__(self, bundle: int, lose: tuple[int, int, int] | None = None) -> None:
        super().__init__(max_steps=10_000, bundle=bundle)
        self.submits: list[list[Assignment]] = []
        self.lose_at, self.lost, self.bundling = lose, 0, False
        self.failed: list[tuple[int, int, int, str, int]] = []

    def unit_failed(self, unit, attempt, data):
        self.failed.append((unit.config, unit.epoch, unit.partition, unit.kind, attempt))

    def unit_time(self, a, options):
        return 1.0 + a.config if a.kind == TRAIN else 0.3

    def failure(self, a, options):
        if (a.config, a.epoch, a.partition) == self.lose_at and a.kind == EVAL \
                and self.bundling and not self.lost:
            self.lost += 1
            return 0.5
        return None

    def submit(self, a, options, then=None):
        self.submits.append([a, *(b for b, _ in then or [])])
        self.bundling = bool(then)
        super().submit(a, options, then)

    def result(self, a, options, start, end):
        if a.kind == EVAL:
            return {"evals": {"eval_train": {"loss": 0.0, "rows": 1, "metrics": {}}},
                    "seconds": end - start}
        return {"loss": 0.0, "rows": 1, "seconds": end - start}


def fit(bundle: int, policy: str = "mop", lose: tuple[int, int, int] | None = None,
        hooks: Any = None) -> Recording:
    ex = Recording(bundle, lose)
    pol = get_policy(policy, **({"random_state": 7, "rotated_order": True}
                                if policy == "mop" else {}))
    progress = Progress({c: 3 for c in range(6)}, 2, {0: [0], 1: [1]}, {1, 2, 3})
    out = run_fit(pol, progress, ex, eval_kinds=["eval_train"], num_partitions=2,
                  snapshot_epochs=lambda c, e: True, clock=ex.clock, hooks=hooks)
    check_invariants(ex.log, num_partitions=2, epochs=3, eval_epochs={1, 2, 3})
    assert progress.all_done() and not progress.pending_evals
    assert all(len(out.results[c].evals[(e, "eval_train")]) == 2
               for c in range(6) for e in (1, 2, 3))
    return ex


def test_evaluation_units_go_in_bundles_of_one_worker_and_its_own_partition():
    ex = fit(4)
    bundles = [s for s in ex.submits if len(s) > 1]
    assert bundles, "no bundle formed"
    for s in bundles:
        assert len(s) <= 4
        assert all(a.kind == EVAL for a in s)
        assert {a.worker for a in s} == {s[0].worker}
        assert {a.partition for a in s} == {s[0].worker}  # a worker's home partition
    assert all(len(s) == 1 for s in fit(1).submits)


def test_bundles_change_no_configs_visits_and_run_every_evaluation_once():
    with_bundles, plain = fit(4), fit(1)
    assert visits(with_bundles) == visits(plain)
    evals = sorted((r.config, r.epoch, r.partition) for r in with_bundles.log if r.kind == EVAL)
    assert evals == sorted((r.config, r.epoch, r.partition) for r in plain.log
                           if r.kind == EVAL)
    assert len(evals) == len(set(evals)) == 6 * 3 * 2


def test_a_lost_bundle_gives_its_units_back_and_they_run_again():
    """Every unit of the lost bundle counts an attempt (each is recorded as lost) and is
    retried alone, outside any bundle."""
    probe = fit(4)
    first = next(s for s in probe.submits if len(s) > 1)[0]
    ex = fit(4, lose=(first.config, first.epoch, first.partition))
    assert ex.lost == 1
    bundle = next(s for s in ex.submits if len(s) > 1 and s[0] == first)
    assert ex.failed == [(b.config, b.epoch, b.partition, EVAL, 0) for b in bundle]
    retried = {(b.config, b.epoch, b.partition) for b in bundle}
    later = ex.submits[ex.submits.index(bundle) + 1:]
    assert all(len(s) == 1 for s in later if retried & {(b.config, b.epoch, b.partition)
                                                        for b in s})
    assert sum(len(s) for s in later if (s[0].config, s[0].epoch, s[0].partition)
               in retried) == len(bundle)


def test_no_bundles_under_a_policy_with_a_barrier_or_under_automl():
    assert all(len(s) == 1 for s in fit(4, policy="ring").submits)

    class Hooks:  # an AutoML run that changes nothing
        def before_assign(self, now): pass
        def finished(self): return True
        def stalled(self): pass
        def total_units(self): return 36
        def on_train(self, *a): pass
        def on_evaluated(self, *a): pass

    assert all(len(s) == 1 for s in fit(4, hooks=Hooks()).submits)


def test_progress_take_and_give_back():
    p = Progress({1: 1}, 2, {0: [0], 1: [1]}, {1})
    for w in (0, 1):
        p.start(Assignment(w, 1, 1, w))
        p.finish(w, True)
    a, b = Assignment(0, 1, 1, 0, EVAL), Assignment(0, 1, 1, 1, EVAL)
    p.start(a)
    p.take(Assignment(1, 1, 1, 1, EVAL))
    assert p.pending_evals == []
    p.give_back(b)
    assert [(u.config, u.partition) for u in p.pending_evals] == [(1, 1)]


def test_trained_at_is_when_the_epochs_training_ended_not_its_evaluation():
    """``ConfigResult.trained_at`` (metrics_elapsed_time) is, per config and epoch, the end
    of the epoch's last training unit on the fit's clock, however late its evaluations ran
    (in bundles, after other training)."""
    ex = Recording(4)
    pol = get_policy("mop", random_state=7, rotated_order=True)
    progress = Progress({c: 3 for c in range(6)}, 2, {0: [0], 1: [1]}, {1, 2, 3})
    start = ex.clock()
    out = run_fit(pol, progress, ex, eval_kinds=["eval_train"], num_partitions=2,
                  snapshot_epochs=lambda c, e: True, clock=ex.clock)
    later = 0
    for c in range(6):
        for e in (1, 2, 3):
            train = [r.end for r in ex.log if (r.config, r.epoch, r.kind) == (c, e, TRAIN)]
            evals = [r.end for r in ex.log if (r.config, r.epoch, r.kind) == (c, e, EVAL)]
            assert out.results[c].trained_at[e] == max(train) - start
            later += max(evals) - start > out.results[c].trained_at[e] + 1.0
    assert later, "no evaluation ran well after its training: the test tells nothing"
