"""cerebro_db.sessions: how the coordinator's assignments reach an executor. Executors of
other kinds subclass DblinkExecutor and override submit_unit; the adapter must hand every
unit to that method (never compose a unit statement itself)."""
from __future__ import annotations

import inspect
from typing import Any

from cerebro_db.executors import DblinkExecutor
from cerebro_db.scheduling import EVAL, TRAIN, Assignment
from cerebro_db.sessions import UnitExecutor


class _Elsewhere(DblinkExecutor):
    """An executor that runs units somewhere else: it records what it is given."""

    def __init__(self) -> None:
        super().__init__(None, "t", 2, None)  # type: ignore[arg-type] - no session opened
        self.units: list[tuple[Any, ...]] = []

    def submit_unit(self, worker: int, fit_id: int, mst_key: int, epoch: int,
                    partition: int, kind: str, options: dict[str, Any],
                    key: tuple[Any, str] | None = None) -> None:
        self.units.append((worker, fit_id, mst_key, epoch, partition, kind, options, key))


def test_assignments_reach_submit_unit_with_their_kind_and_stall_key():
    ex = _Elsewhere()
    units = UnitExecutor(None, ex, 42)  # type: ignore[arg-type]
    units.submit(Assignment(1, 7, 3, 0, TRAIN), {"attempt": 0})
    units.submit(Assignment(0, 8, 2, 1, EVAL), {"attempt": 1, "kinds": ["eval_train"]})
    assert ex.units == [
        (1, 42, 7, 3, 0, "train", {"attempt": 0}, (7, "train")),
        (0, 42, 8, 2, 1, "eval", {"attempt": 1, "kinds": ["eval_train"]}, (8, "eval")),
    ]


def test_submit_unit_has_the_signature_other_executors_override():
    sig = inspect.signature(DblinkExecutor.submit_unit)
    assert list(sig.parameters) == ["self", "worker", "fit_id", "mst_key", "epoch",
                                    "partition", "kind", "options", "key", "then"]
    assert sig.parameters["key"].default is None
    assert sig.parameters["then"].default == ()  # a bundle's further units: none


class _Bundling(_Elsewhere):
    def submit_unit(self, worker, fit_id, mst_key, epoch, partition, kind, options, key=None,
                    then=()):
        self.units.append((worker, fit_id, mst_key, epoch, partition, kind, options, key,
                           list(then)))


def test_a_bundle_reaches_submit_unit_as_its_first_unit_and_then_the_others():
    ex = _Bundling()
    UnitExecutor(None, ex, 42).submit(  # type: ignore[arg-type]
        Assignment(0, 8, 2, 0, EVAL), {"attempt": 0},
        [(Assignment(0, 9, 1, 0, EVAL), {"attempt": 0, "kinds": ["eval_train"]})])
    assert ex.units == [(0, 42, 8, 2, 0, "eval", {"attempt": 0}, (8, "eval"), [
        ({"mst_key": 9, "epoch": 1, "partition": 0, "kind": "eval",
          "options": {"attempt": 0, "kinds": ["eval_train"]}}, (9, "eval"))])]
