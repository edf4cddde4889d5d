"""The pure parts of the interrupt handling: the stall rule and what counts as a cancel
(the server side is tested in tests/reliability/test_interrupts.py)."""
from __future__ import annotations

import pytest

from cerebro_db.errors import CerebroError
from cerebro_db.executors import FitCancelled, StallRule, is_cancel, reraise_cancel


def test_stall_limit_is_k_times_the_median_of_the_configs_units_above_a_floor():
    rule = StallRule(floor=3.0, factor=10.0, first=600.0)
    assert rule.limit([0.2, 0.5, 0.4], []) == pytest.approx(4.0)
    assert rule.limit([0.1, 0.1], [5.0]) == 3.0  # the floor
    # a configuration with no completed unit of this kind yet: that kind's median overall
    assert rule.limit([], [1.0, 2.0, 30.0]) == pytest.approx(20.0)
    # nothing measured yet (first units include imports and compiles)
    assert rule.limit([], []) == 600.0
    assert StallRule(floor=700.0).limit([], []) == 700.0


def test_a_reopened_sessions_first_unit_gets_the_first_units_allowance():
    # its start-up (TensorFlow's import, first read, build and trace) is in that unit, and
    # no completed unit measured it: on a slow host it outlasted a 3 s floor at every retry
    rule = StallRule(floor=3.0, factor=10.0, first=600.0)
    assert rule.limit([0.2, 0.5, 0.4], [], fresh=True) == 600.0
    assert rule.limit([], [], fresh=True) == 600.0
    assert rule.limit([100.0], [], fresh=True) == pytest.approx(1000.0)  # never below
    assert StallRule(floor=3.0, first=30.0).limit([0.1], [], fresh=True) == 30.0


class _SPIError(Exception):
    def __init__(self, sqlstate):
        super().__init__("x")
        self.sqlstate = sqlstate


def test_only_57014_is_a_cancel():
    assert is_cancel(_SPIError("57014"))
    assert is_cancel(FitCancelled("canceling fit 1", "57014"))
    for e in (_SPIError("08006"), _SPIError("57P01"), CerebroError("x"), ValueError("x")):
        assert not is_cancel(e)
        reraise_cancel(e)  # returns: not a cancel
    with pytest.raises(_SPIError):
        reraise_cancel(_SPIError("57014"))
