"""The ``automl_method`` names SQL uses, in one place, and ``automl_params`` parsing."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from .. import params
from ..errors import invalid
from .base import Tuner

__all__ = [
    "LIMITS",
    "MAX_EPOCHS",
    "MAX_TRIALS",
    "TUNERS",
    "check_limits",
    "get_tuner",
    "tuner_class",
    "tuner_names",
]

MAX_EPOCHS = 100_000
"""The most epochs any one configuration may be asked for (as a fit's num_iterations)."""
MAX_TRIALS = 10_000
"""The most configurations one AutoML run may create."""
LIMITS: dict[str, int] = {
    "R": MAX_EPOCHS, "eta": 1_000, "skip_last": 64, "num_iterations": MAX_EPOCHS,
    "num_configs": MAX_TRIALS, "max_configs": MAX_TRIALS, "min_r": MAX_EPOCHS,
    "max_r": MAX_EPOCHS, "brackets": 64, "num_branches": 256, "search_steps": 256,
    "max_retunes": 10_000, "max_trial_epochs": MAX_EPOCHS,
}
"""Upper bounds of the integer ``automl_params`` that size the work, checked before any
tuner is built (their lower bounds and relations are the tuners' own checks)."""

TUNERS: dict[str, tuple[str, str]] = {
    "grid": ("grid", "GridSearch"),
    "random": ("grid", "RandomSearch"),
    "hyperband": ("hyperband", "Hyperband"),
    "hyperopt": ("hyperopt_search", "HyperoptSearch"),
    "asha": ("asha", "ASHA"),
    "mltuner": ("mltuner", "MLtuner"),
}
"""automl_method -> (module of this package, class name); modules load on first use."""


def tuner_names() -> tuple[str, ...]:
    return tuple(sorted(TUNERS))


def tuner_class(name: str) -> type[Tuner]:
    """The class registered as ``name`` (case-insensitive); a clear error otherwise."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in TUNERS:
        valid = ", ".join(repr(n) for n in tuner_names())
        raise invalid(f"automl_method must be one of {valid}, got {name!r}",
                      hint=f"valid methods: {valid}")
    module, cls = TUNERS[key]
    klass: type[Tuner] = getattr(importlib.import_module(f"{__package__}.{module}"), cls)
    return klass


def check_limits(opts: dict[str, object]) -> None:
    """Every work-sizing parameter within :data:`LIMITS` (22023 otherwise)."""
    for k, high in LIMITS.items():
        v = opts.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > high:
            raise invalid(f"automl_params: {k} must be at most {high}, got {v}",
                          hint="Bounds keep one call's work finite; see the README's limits.")


def get_tuner(name: str, automl_params: str | None, *, model_ids: Sequence[int],
              compile_grid: str, fit_grid: str, num_workers: int,
              random_state: int | None) -> Tuner:
    """A new tuner from SQL's arguments. ``automl_params`` is ``key=value, ...``; keys and
    defaults come from the class's ``defaults`` (hyperband and hyperopt keep the built-in
    checks of :func:`cerebro_db.params.parse_automl_params`)."""
    klass = tuner_class(name)
    key = klass.name
    builtin = key in params.AUTOML_DEFAULTS
    opts = params.parse_automl_params(automl_params, key,
                                      None if builtin else getattr(klass, "defaults", {}))
    check_limits(opts)
    make: Callable[..., Tuner] = klass  # each tuner's own keyword parameters
    return make(model_ids=list(model_ids), compile_grid=compile_grid, fit_grid=fit_grid,
                num_workers=num_workers, random_state=random_state, **opts)
