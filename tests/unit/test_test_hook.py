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
