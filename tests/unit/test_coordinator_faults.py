"""The coordinator loop under lost worker sessions, with a fake executor (pure logic; the
real faults are in tests/integration/test_faults.py)."""
from __future__ import annotations

from typing import Any

import pytest

from cerebro_db.coordinator import WorkerFailed, run_fit
from cerebro_db.scheduling import TRAIN, Assignment, Progress, RunningUnit, get_policy


class FakeExecutor:
    """Finishes every unit at once; ``lose`` lists (config, epoch, partition, kind, attempt)
    whose attempt loses its session; ``fail`` makes a unit fail inside the worker."""

    def __init__(self, lose=(), fail=(), recover_ok=True) -> None:
        self.lose = set(lose)
        self.fail = set(fail)
        self.recover_ok = recover_ok
        self.inflight: dict[int, tuple[Assignment, dict[str, Any]]] = {}
        self.log: list[tuple[int, int, int, str, int]] = []
        self.failures: list[tuple[RunningUnit, int]] = []
        self.recovered: list[int] = []

    def submit(self, a: Assignment, options: dict[str, Any]) -> None:
        self.inflight[a.worker] = (a, options)

    def wait(self) -> list[tuple[int, bool, dict[str, Any]]]:
        out = []
        for w, (a, opts) in sorted(self.inflight.items()):
            key = (a.config, a.epoch, a.partition, a.kind, opts["attempt"])
            self.log.append(key)
            if key in self.lose:
                out.append((w, False, {"lost": True, "message": "terminated"}))
            elif key[:4] in self.fail:
                out.append((w, False, {"message": "shape mismatch", "detail": "Traceback"}))
            elif a.kind == TRAIN:
                out.append((w, True, {"loss": 1.0, "rows": 10}))
            else:
                out.append((w, True, {"evals": {"eval_train": {"loss": 1.0, "rows": 10,
                                                               "metrics": {}}}}))
        self.inflight.clear()
        return out

    def recover(self, worker: int) -> bool:
        self.recovered.append(worker)
        return self.recover_ok

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        self.failures.append((unit, attempt))


def go(ex, retries=3, workers=None, epochs=2):
    p = 2
    progress = Progress({1: epochs, 2: epochs}, p, workers or {0: {0}, 1: {1}}, {epochs})
    policy = get_policy("mop", random_state=3, seeded_order=True)
    return run_fit(policy, progress, ex, eval_kinds=["eval_train"], num_partitions=p,
                   snapshot_epochs=lambda c, e: e == epochs, max_unit_retries=retries)


def test_lost_units_are_retried_once_each_and_counted_once():
    lose = {(1, 1, 0, "train", 0), (1, 1, 0, "train", 1), (2, 2, 1, "train", 0),
            (2, 2, 0, "eval", 0)}
    ex = FakeExecutor(lose=lose)
    out = go(ex)
    assert out.units == 8 and out.retried == 4
    ok = [k[:4] for k in ex.log if k not in lose]
    assert len(ok) == len(set(ok)) == 12  # 8 training + 4 evaluation units, each once
    assert sorted((u.config, u.epoch, u.partition, u.kind, a) for u, a in ex.failures) == \
        sorted(lose)
    assert len(ex.recovered) == 4


def test_retry_bound():
    ex = FakeExecutor(lose={(2, 1, 1, "train", a) for a in range(3)})
    with pytest.raises(WorkerFailed, match="lost its worker session 3 times"):
        go(ex, retries=2)


def test_user_error_is_not_retried():
    ex = FakeExecutor(fail={(1, 1, 0, "train")})
    with pytest.raises(WorkerFailed, match="failed on configuration 1") as e:
        go(ex)
    assert e.value.detail == "Traceback" and not ex.failures


def test_worker_that_cannot_reconnect_leaves_and_replicas_take_over():
    # every worker holds both partitions: losing worker 0 leaves worker 1 to finish
    ex = FakeExecutor(lose={(1, 1, 0, "train", 0)}, recover_ok=False)
    out = go(ex, workers={0: {0, 1}, 1: {0, 1}})
    assert out.units == 8 and len(ex.recovered) == 1
    assert (1, 1, 0, "train", 1) in ex.log  # run again, by the worker left


def test_every_worker_gone_is_a_connection_failure_not_an_internal_error():
    # both workers lose their sessions in the first round and cannot reconnect (a remote
    # cluster stopped mid-fit)
    ex = FakeExecutor(lose={(1, 1, 0, "train", 0), (2, 1, 1, "train", 0),
                            (1, 1, 1, "train", 0), (2, 1, 0, "train", 0)}, recover_ok=False)
    with pytest.raises(WorkerFailed, match="every worker of the fit is gone") as e:
        go(ex)
    assert e.value.sqlstate == "08006" and "madlib_keras_fit_resume" in e.value.hint
    assert sorted(ex.recovered) == [0, 1]


def test_resumed_results_and_counts_carry_on():
    """A resumed fit passes what its log holds; run_fit only runs the rest."""
    from cerebro_db.coordinator import ConfigResult

    ex = FakeExecutor()
    progress = Progress({1: 1, 2: 1}, 2, {0: {0}, 1: {1}}, {1})
    progress._visit(1, 0)
    progress._visit(1, 1)
    res = {1: ConfigResult(train_loss={1: [(2.0, 5), (2.0, 5)]})}
    policy = get_policy("mop", random_state=3, seeded_order=True)
    out = run_fit(policy, progress, ex, eval_kinds=["eval_train"], num_partitions=2,
                  snapshot_epochs=lambda c, e: True, results=res, done_units=2)
    assert out.units == 4
    assert sorted(k[:4] for k in ex.log if k[3] == TRAIN) == [(2, 1, 0, "train"),
                                                              (2, 1, 1, "train")]
    assert out.results[1].train_loss[1] == [(2.0, 5), (2.0, 5)]
