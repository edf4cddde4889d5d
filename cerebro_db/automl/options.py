"""Checks of ``automl_params`` values shared by the tuners, and the bounds that size the work.

Each tuner checks its own parameters in its constructor (their ranges, their upper bounds
and the relations between them) with these helpers, before it does any work, so an error
names the parameter and the bad value the same way in every procedure.
"""
from __future__ import annotations

import math
import random
from typing import Any

from ..errors import invalid

__all__ = [
    "MAX_EPOCHS",
    "MAX_TRIALS",
    "int_option",
    "num_workers_option",
    "number_option",
    "random_state_option",
    "seed_option",
]

MAX_EPOCHS = 100_000
"""The most epochs any one configuration may be asked for (as a fit's num_iterations)."""
MAX_TRIALS = 10_000
"""The most configurations one AutoML run may create."""

LIMITS_HINT = "Bounds keep one call's work finite; see the README's limits."


def int_option(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``automl_params`` ``name``: an integer from ``low`` to ``high`` (22023 otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"automl_params: {name} must be an integer, got {value!r}")
    if value < low:
        raise invalid(f"automl_params: {name} must be at least {low}, got {value}")
    if high is not None and value > high:
        raise invalid(f"automl_params: {name} must be at most {high}, got {value}",
                      hint=LIMITS_HINT)
    return value


def number_option(name: str, value: Any, low: float, high: float | None = None,
                  low_open: bool = False) -> float:
    """``automl_params`` ``name``: a finite number at least ``low`` (above it with
    ``low_open``) and at most ``high`` (22023 otherwise)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        rng = f"{'above' if low_open else 'at least'} {low}" + \
            (f" and at most {high}" if high is not None else "")
        raise invalid(f"automl_params: {name} must be a number {rng}, got {value!r}")
    return float(value)


def random_state_option(value: Any) -> int | None:
    """A tuner's ``random_state``: ``None`` (the tuner draws a seed) or a non-negative
    integer, as the SQL entry point passes it (22023 otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"random_state must be a non-negative integer, got {value!r}")
    return value


def seed_option(value: Any) -> int:
    """:func:`random_state_option`, with ``None`` replaced by a seed drawn from the system
    (a tuner that reports it in its options can be replayed)."""
    seed = random_state_option(value)
    return random.SystemRandom().randrange(2**32) if seed is None else seed


def num_workers_option(value: Any) -> int:
    """The worker sessions a tuner plans for: a positive integer (22023 otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"num_workers must be an integer, got {value!r}")
    if value < 1:
        raise invalid(f"num_workers must be at least 1, got {value}")
    return value
