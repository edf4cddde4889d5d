"""The ``automl_method`` names SQL uses, in one place: the look-ups by name and from a state.

Each tuner parses and checks its own ``automl_params`` (:meth:`.base.Tuner.parse_params`,
its constructor); the registry only finds the class.
"""
from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import invalid
from .base import STATE_FORMAT, Tuner

__all__ = [
    "TUNERS",
    "get_tuner",
    "tuner_class",
    "tuner_from_state",
    "tuner_from_state_json",
    "tuner_names",
]

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


def get_tuner(name: str, automl_params: str | None, *, model_ids: Sequence[int],
              compile_grid: str, fit_grid: str, num_workers: int,
              random_state: int | None) -> Tuner:
    """A new tuner from SQL's arguments. ``automl_params`` is ``key=value, ...``, read by
    the class (:meth:`~.base.Tuner.parse_params`) and checked by its constructor."""
    klass: Any = tuner_class(name)  # each tuner's own keyword parameters
    return klass(model_ids=list(model_ids), compile_grid=compile_grid, fit_grid=fit_grid,
                 num_workers=num_workers, random_state=random_state,
                 **klass.parse_params(automl_params))


def tuner_from_state(state: Mapping[str, Any]) -> Tuner:
    """Rebuild a tuner from :meth:`~.base.Tuner.state`: the registered class of
    ``state["tuner"]``, its options, then its dynamic state."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT \
            or "tuner" not in state:
        raise invalid("unsupported tuner state")
    tuner = tuner_class(str(state["tuner"]))(**dict(state.get("options") or {}))
    tuner._restore(state.get("state") or {})
    return tuner


def tuner_from_state_json(text: str) -> Tuner:
    """Rebuild a tuner from :meth:`~.base.Tuner.state_json` text."""
    try:
        state = json.loads(text)
    except (TypeError, ValueError) as e:
        raise invalid(f"tuner state is not valid JSON: {e}") from None
    return tuner_from_state(state)
