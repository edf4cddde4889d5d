"""cerebro_db.test_hook's sleeps are bounded: another role's definer function can plant the
setting in a superuser's session (a red-team pass stalled a fit's workers for 28 hours)."""
import math

from cerebro_db.worker import HOOK_MAX_SECONDS, _hook_seconds


def test_hook_sleeps_are_bounded_and_sane():
    assert _hook_seconds(2) == 2.0
    assert _hook_seconds("0.5") == 0.5
    assert _hook_seconds(100000) == HOOK_MAX_SECONDS == 120.0
    assert _hook_seconds(math.inf) == HOOK_MAX_SECONDS
    for bad in (math.nan, -5, "x", None, [1]):
        assert _hook_seconds(bad) == 0.0


def test_hook_sleeps_add_up_to_the_bound_per_fit(monkeypatch):
    """Many matching entries (a red-team pass listed two 120 s entries for one unit and
    stalled it 240 s) sleep at most HOOK_MAX_SECONDS in all per fit in a process; another
    fit has its own allowance."""
    from cerebro_db import worker

    slept: list[float] = []
    monkeypatch.setattr(worker.units, "sleep", lambda cat, s: slept.append(s))
    monkeypatch.setattr(worker, "_hook_slept", {})
    spec = [{"point": "before_train", "seconds": 50}] * 5
    for unit in range(3):
        worker._hook(None, 7, "before_train", 1, 1, unit, {"_test_hooks": spec})
    assert sum(slept) == HOOK_MAX_SECONDS and slept[:3] == [50, 50, 20]
    slept.clear()
    worker._hook(None, 8, "before_train", 1, 1, 0, {"_test_hooks": spec})
    assert slept == [50, 50, 20]
    worker._hook(None, 8, "after_save", 1, 1, 0, {"_test_hooks": spec})  # no match
    assert slept == [50, 50, 20]
