"""Model configurations: search grids -> (compile_params, fit_params) strings.

Implementation note. A grid is a Python-literal dict read by the literal-only parser of
:mod:`cerebro_db.params` (never ``eval``) whose values are lists. A list is a set of choices,
except a 3-element ``[low, high, 'linear' | 'log' | 'log_near_one']`` on a numeric parameter,
which is a distribution (random search only), as in MADlib's ``generate_model_configs``:

- ``linear``: uniform on [low, high];
- ``log``: ``10 ** uniform(log10(low), log10(high))`` (0 < low < high);
- ``log_near_one``: ``1 - 10 ** uniform(log10(1 - high), log10(1 - low))`` (0 <= low < high < 1),
  for values such as momentum close to one.

Sampled floats are rounded to 3 significant digits (for ``log_near_one``, of ``1 - x``) and kept
inside [low, high]; integer parameters (batch_size, epochs, ...) get integers. Grid search is the
full cartesian product (each dict of ``optimizer_params_list`` expands its own product). Random
search draws with ``numpy.random.default_rng(random_state)``. Every generated string is parsed
back with :func:`cerebro_db.params.parse_compile_params` / ``parse_fit_params`` and configs with
the same canonical content are kept once.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Union

import numpy as np

from .errors import NULL_VALUE_NOT_ALLOWED, CerebroError, invalid
from .interrupts import poll
from .params import (
    COMPILE_KEYS,
    FIT_KEYS,
    CompileParams,
    FitParams,
    fit_key_error,
    optimizer_arguments,
    parse_compile_params,
    parse_fit_params,
    parse_literal,
    render_literal,
    resolve_optimizer_name,
)

__all__ = [
    "DISTRIBUTIONS",
    "MAX_CONFIGS",
    "OPTIMIZER_PARAMS_LIST",
    "Distribution",
    "generate_model_configs",
    "parse_grid",
    "product_configs",
]

DISTRIBUTIONS: tuple[str, ...] = ("linear", "log", "log_near_one")
MAX_CONFIGS = 100_000
"""Most configurations one call may generate."""

OPTIMIZER_PARAMS_LIST = "optimizer_params_list"

# Parameters whose sampled values must be integers.
_INT_KEYS = frozenset(
    {
        "batch_size",
        "epochs",
        "steps_per_execution",
        "ema_overwrite_frequency",
        "gradient_accumulation_steps",
    }
)
# Top-level grid keys that may take a distribution (optimizer arguments always may).
_NUMERIC_KEYS = frozenset({"batch_size", "epochs", "steps_per_execution"})
_SIG_DIGITS = 3


@dataclass(frozen=True)
class Distribution:
    """``[low, high, kind]`` in a grid: sample from a distribution (random search only)."""

    low: float
    high: float
    kind: str
    integer: bool = False

    def sample(self, rng: np.random.Generator) -> float | int:
        """Draw one value, rounded (3 significant digits, or to an integer) and within bounds."""
        lo, hi = self.low, self.high
        if self.integer:
            ilo, ihi = math.ceil(lo), math.floor(hi)
            if self.kind == "linear":
                return int(rng.integers(ilo, ihi + 1))
            x = 10 ** rng.uniform(math.log10(lo), math.log10(hi))
            return int(min(max(round(x), ilo), ihi))
        if self.kind == "linear":
            x = float(_round_sig(rng.uniform(lo, hi)))
        elif self.kind == "log":
            x = float(_round_sig(10 ** rng.uniform(math.log10(lo), math.log10(hi))))
        else:
            gap = 10 ** rng.uniform(math.log10(1.0 - hi), math.log10(1.0 - lo))
            x = float(Decimal(1) - _round_sig(gap))
        return min(max(x, lo), hi)


def _round_sig(x: float) -> Decimal:
    return Decimal(f"{x:.{_SIG_DIGITS}g}")


Choices = Union[list, Distribution]
"""A grid value: a list of choices, or a distribution."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _choices(value: Any, key: str, where: str, numeric: bool) -> Choices:
    """Validate one grid value: a non-empty list of choices, or a distribution spec."""
    if not isinstance(value, list):
        raise invalid(
            f"{where}: value of {key} must be a list of choices, got {render_literal(value)}",
            hint=f"write {key!r}: [{render_literal(value)}]",
        )
    if not value:
        raise invalid(f"{where}: value of {key} must not be an empty list")
    looks_like_dist = (
        len(value) >= 2
        and isinstance(value[-1], str)
        and all(_is_number(v) for v in value[:-1])
        and (value[-1] in DISTRIBUTIONS or (numeric and len(value) == 3))
    )
    if not looks_like_dist:
        return value
    kind = value[-1]
    hint = f"write [low, high, kind] with kind one of {', '.join(DISTRIBUTIONS)}"
    if not numeric:
        raise invalid(f"{where}: {key} cannot take a distribution, got {render_literal(value)}",
                      hint="list the choices instead")
    if kind not in DISTRIBUTIONS:
        raise invalid(f"{where}: {key} has unknown distribution {kind!r}", hint=hint)
    if len(value) != 3:
        raise invalid(f"{where}: {key} distribution must have 3 elements, got {len(value)}",
                      hint=hint)
    low, high = value[0], value[1]
    if not low < high:
        raise invalid(f"{where}: {key} distribution needs low < high, got [{low}, {high}]",
                      hint=hint)
    integer = key in _INT_KEYS
    if kind == "log" and low <= 0:
        raise invalid(f"{where}: {key} log distribution needs low > 0, got {low}")
    if kind == "log_near_one":
        if integer:
            raise invalid(f"{where}: {key} is an integer and cannot take log_near_one")
        if not (low >= 0 and high < 1):
            raise invalid(
                f"{where}: {key} log_near_one distribution needs 0 <= low < high < 1, "
                f"got [{low}, {high}]"
            )
    if integer and math.ceil(low) > math.floor(high):
        raise invalid(f"{where}: {key} distribution [{low}, {high}] holds no integer")
    return Distribution(float(low), float(high), kind, integer)


def _validate_optimizer_dict(d: Any, index: int, where: str) -> dict[str, Choices]:
    label = f"{OPTIMIZER_PARAMS_LIST}[{index}]"
    if not isinstance(d, dict) or not d:
        raise invalid(
            f"{where}: {label} must be a non-empty dict, got {render_literal(d)}",
            hint="e.g. {'optimizer': ['SGD'], 'lr': [0.01, 0.1]}",
        )
    if "optimizer" not in d:
        raise invalid(f"{where}: {label} has no 'optimizer' key",
                      hint="e.g. {'optimizer': ['Adam'], 'lr': [0.001, 0.01]}")
    if "lr" in d and "learning_rate" in d:
        raise invalid(f"{where}: {label} has both lr and learning_rate",
                      hint="lr is an old alias of learning_rate; give only one")
    out: dict[str, Choices] = {}
    names: list[str] = []
    for key, value in d.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise invalid(f"{where}: {label} keys must be argument names, got {key!r}")
        if key == "optimizer":
            choices = _choices(value, f"{label}['optimizer']", where, numeric=False)
            assert isinstance(choices, list)
            for name in choices:
                if not isinstance(name, str) or not name.isidentifier():
                    raise invalid(
                        f"{where}: {label}['optimizer'] must list optimizer names, got {name!r}",
                        hint="put arguments in their own keys: {'optimizer': ['SGD'], "
                        "'momentum': [0.9]}",
                    )
                names.append(resolve_optimizer_name(name, where))
            out[key] = names
        else:
            out[key] = _choices(value, f"{label}[{key!r}]", where, numeric=True)
    for name in names:
        accepted = optimizer_arguments(name)
        if accepted is None:
            continue
        for key in out:
            if key in ("optimizer", "lr", "decay") or key in accepted:  # decay: Keras 2
                continue
            raise invalid(f"{where}: optimizer {name} has no argument {key!r} (in {label})",
                          hint=f"{name} accepts: " + ", ".join(sorted(accepted | {"lr"})))
    return out


def _validate_grid(grid: Any, which: str) -> dict[str, Any]:
    where = f"{which}_params_grid"
    if not isinstance(grid, dict):
        example = ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['Adam']}]}"
                   if which == "compile" else "{'batch_size': [32, 64], 'epochs': [1]}")
        raise invalid(f"{where} must be a dict whose values are lists", hint=f"e.g. {example}")
    out: dict[str, Any] = {}
    for key, value in grid.items():
        if not isinstance(key, str):
            raise invalid(f"{where}: keys must be parameter names, got {key!r}")
        if which == "compile":
            if key == OPTIMIZER_PARAMS_LIST:
                if not isinstance(value, list) or not value:
                    raise invalid(
                        f"{where}: {OPTIMIZER_PARAMS_LIST} must be a non-empty list of dicts",
                        hint="e.g. [{'optimizer': ['SGD'], 'lr': [0.01, 0.1]}]",
                    )
                out[key] = [_validate_optimizer_dict(d, i, where) for i, d in enumerate(value)]
                continue
            if key not in COMPILE_KEYS:
                raise invalid(
                    f"{where}: unknown key {key!r}",
                    hint="allowed keys: " + ", ".join((*COMPILE_KEYS, OPTIMIZER_PARAMS_LIST)),
                )
        elif key not in FIT_KEYS:
            raise fit_key_error(key, where)
        out[key] = _choices(value, key, where, numeric=key in _NUMERIC_KEYS)
    if which == "compile":
        if "optimizer" in out and OPTIMIZER_PARAMS_LIST in out:
            raise invalid(f"{where}: give optimizer or {OPTIMIZER_PARAMS_LIST}, not both")
        if "optimizer" not in out and OPTIMIZER_PARAMS_LIST not in out:
            raise invalid(f"{where}: {OPTIMIZER_PARAMS_LIST} is required",
                          hint="e.g. 'optimizer_params_list': [{'optimizer': ['Adam']}]")
        if "loss" not in out:
            raise invalid(f"{where}: loss is required",
                          hint="e.g. 'loss': ['categorical_crossentropy']")
    return out


def parse_grid(text: str | Mapping[str, Any], which: str) -> dict[str, Any]:
    """Parse and check a search grid; ``which`` is ``'compile'`` or ``'fit'``.

    Returns a dict from parameter name to a list of choices or a :class:`Distribution`; for
    ``optimizer_params_list`` a list of such dicts, with optimizer names in Keras' spelling.
    Accepts an already-parsed dict too. Raises :class:`CerebroError` naming
    ``<which>_params_grid``.
    """
    if which not in ("compile", "fit"):
        raise ValueError(f"which must be 'compile' or 'fit', got {which!r}")
    grid = text if isinstance(text, Mapping) else parse_literal(text, f"{which}_params_grid")
    return _validate_grid(dict(grid) if isinstance(grid, Mapping) else grid, which)


# --------------------------------------------------------------------------------------------
# Rendering one configuration
# --------------------------------------------------------------------------------------------


def _render_compile(
    opt: tuple[str, dict[str, Any]] | str, others: Iterable[tuple[str, Any]]
) -> str:
    if isinstance(opt, str):
        parts = [f"optimizer={render_literal(opt)}"]
    else:
        name, kwargs = opt
        args = ",".join(f"{k}={render_literal(v, inner=True, sort_dicts=False)}"
                        for k, v in kwargs.items())
        parts = [f"optimizer={render_literal(f'{name}({args})')}"]
    for key, value in others:
        wrap = key in ("metrics", "weighted_metrics") and isinstance(value, str)
        parts.append(f"{key}={render_literal([value] if wrap else value, sort_dicts=False)}")
    return ",".join(parts)


def _render_fit(items: Iterable[tuple[str, Any]]) -> str:
    return ",".join(f"{k}={render_literal(v, sort_dicts=False)}" for k, v in items)


# --------------------------------------------------------------------------------------------
# Grid and random search
# --------------------------------------------------------------------------------------------


def _search_kind(search_type: Any) -> str:
    s = search_type.strip().lower() if isinstance(search_type, str) else ""
    if s and "grid".startswith(s):
        return "grid"
    if s and "random".startswith(s):
        return "random"
    raise invalid(f"search_type must be 'grid' or 'random', got {search_type!r}")


def _plain(choices: dict[str, Any], where: str) -> None:
    for key, value in choices.items():
        if isinstance(value, Distribution):
            raise invalid(
                f"{where}: {key} is a distribution, which grid search cannot use",
                hint="use search_type='random', or list the values to try",
            )


def _check_grid_search(cgrid: dict[str, Any], fgrid: dict[str, Any]) -> None:
    _plain(cgrid, "compile_params_grid")
    for i, od in enumerate(cgrid.get(OPTIMIZER_PARAMS_LIST, ())):
        _plain(od, f"compile_params_grid: {OPTIMIZER_PARAMS_LIST}[{i}]")
    _plain(fgrid, "fit_params_grid")


def _grid_compile(grid: dict[str, Any]) -> list[str]:
    others = {k: v for k, v in grid.items() if k not in ("optimizer", OPTIMIZER_PARAMS_LIST)}
    opts: list[tuple[str, dict[str, Any]] | str] = []
    if OPTIMIZER_PARAMS_LIST in grid:
        for od in grid[OPTIMIZER_PARAMS_LIST]:
            keys = [k for k in od if k != "optimizer"]
            for name in od["optimizer"]:
                for combo in itertools.product(*(od[k] for k in keys)):
                    opts.append((name, dict(zip(keys, combo))))
    else:
        opts.extend(grid["optimizer"])
    keys = list(others)
    return [
        _render_compile(opt, zip(keys, combo))
        for opt in opts
        for combo in itertools.product(*(others[k] for k in keys))
    ]


def discrete_compiles(grid: dict[str, Any], limit: int = 1000) -> list[str]:
    """A compile_params string for every combination of a compile grid's listed choices (a
    distribution stands in by its low end), at most ``limit`` of them, distinct: what an
    AutoML run can draw, so that a bad loss, metric or optimizer name in any choice is
    refused before the run (an outside pass saw it fail in a worker instead)."""
    def low(v: Any) -> Any:
        return [v.low if not v.integer else math.ceil(v.low)] if isinstance(v, Distribution) \
            else v
    plain = {k: ([{kk: low(vv) for kk, vv in od.items()} for od in v]
                 if k == OPTIMIZER_PARAMS_LIST else low(v)) for k, v in grid.items()}
    if _grid_count(plain) > limit:
        rng = np.random.default_rng(0)
        return list(dict.fromkeys(_random_compile(plain, rng) for _ in range(limit)))
    return list(dict.fromkeys(_grid_compile(plain)))


def _grid_count(grid: dict[str, Any]) -> int:
    n = 1
    for key, value in grid.items():
        if key == OPTIMIZER_PARAMS_LIST:
            n *= sum(math.prod(len(v) for v in od.values()) for od in value)
        else:
            n *= len(value)
    return n


def _sample(value: Choices, rng: np.random.Generator) -> Any:
    if isinstance(value, Distribution):
        return value.sample(rng)
    return value[int(rng.integers(len(value)))]


def _random_compile(grid: dict[str, Any], rng: np.random.Generator) -> str:
    if OPTIMIZER_PARAMS_LIST in grid:
        od = _sample(grid[OPTIMIZER_PARAMS_LIST], rng)
        name = _sample(od["optimizer"], rng)
        opt: tuple[str, dict[str, Any]] | str = (
            name, {k: _sample(v, rng) for k, v in od.items() if k != "optimizer"})
    else:
        opt = _sample(grid["optimizer"], rng)
    others = [(k, _sample(v, rng)) for k, v in grid.items()
              if k not in ("optimizer", OPTIMIZER_PARAMS_LIST)]
    return _render_compile(opt, others)


class _Parsed:
    """Parse generated strings once each, with errors naming the grid."""

    def __init__(self) -> None:
        self.compile: dict[str, CompileParams] = {}
        self.fit: dict[str, FitParams] = {}

    def compile_key(self, s: str) -> str:
        if s not in self.compile:
            self.compile[s] = _reraise(parse_compile_params, s, "compile_params_grid")
        return self.compile[s].canonical()

    def fit_key(self, s: str) -> str:
        if s not in self.fit:
            self.fit[s] = _reraise(parse_fit_params, s, "fit_params_grid")
        return self.fit[s].canonical()


def _reraise(parse: Any, s: str, where: str) -> Any:
    try:
        return parse(s, where)
    except CerebroError as e:
        raise CerebroError(e.message, e.sqlstate, hint=e.hint,
                           detail=f"in the generated configuration {s}") from None


def _unique(strings: Iterable[str], key: Any) -> list[str]:
    seen: set[str] = set()
    out = []
    for s in strings:
        poll()
        k = key(s)
        if k not in seen:
            seen.add(k)
            out.append(s)
    return out


def generate_model_configs(
    compile_grid: str | Mapping[str, Any],
    fit_grid: str | Mapping[str, Any],
    search_type: str = "grid",
    num_configs: int | None = None,
    random_state: int | None = None,
) -> list[tuple[str, str]]:
    """Generate ``(compile_params, fit_params)`` string pairs from two search grids.

    ``search_type`` is ``'grid'`` or ``'random'`` (a prefix, any case). Grid search needs
    ``num_configs`` and ``random_state`` to be None and returns the full cartesian product;
    random search needs ``num_configs >= 1`` and draws that many distinct configurations
    (fewer if the grid holds fewer), reproducibly for a given ``random_state``. Generated
    strings parse back with :func:`parse_compile_params` / :func:`parse_fit_params`;
    configurations with the same canonical content appear once. Raises :class:`CerebroError`.
    """
    kind = _search_kind(search_type)
    cgrid = parse_grid(compile_grid, "compile")
    fgrid = parse_grid(fit_grid, "fit")
    parsed = _Parsed()
    if kind == "grid":
        for name, value in (("num_configs", num_configs), ("random_state", random_state)):
            if value is not None:
                raise invalid(f"{name} must be NULL for grid search, got {value}",
                              hint="use search_type='random' to sample configurations")
        _check_grid_search(cgrid, fgrid)
        total = _grid_count(cgrid) * _grid_count(fgrid)
        if total > MAX_CONFIGS:
            raise invalid(f"the grid has {total} configurations, more than {MAX_CONFIGS}",
                          hint="use search_type='random' with num_configs")
        compiles = _unique(_grid_compile(cgrid), parsed.compile_key)
        keys = list(fgrid)
        fits = _unique(
            (_render_fit(zip(keys, combo)) for combo in itertools.product(*fgrid.values())),
            parsed.fit_key,
        )
        return [(c, f) for c in compiles for f in fits]

    if num_configs is None:
        raise CerebroError("num_configs must not be NULL for random search",
                           NULL_VALUE_NOT_ALLOWED, hint="Say how many configurations to draw.")
    if isinstance(num_configs, bool) or not isinstance(num_configs, int):
        raise invalid(f"num_configs must be an integer for random search, got {num_configs!r}")
    if num_configs < 1:
        raise invalid(f"num_configs must be at least 1 for random search, got {num_configs}")
    if num_configs > MAX_CONFIGS:
        raise invalid(f"num_configs must be at most {MAX_CONFIGS}, got {num_configs}")
    if random_state is not None and (isinstance(random_state, bool)
                                     or not isinstance(random_state, int)):
        raise invalid(f"random_state must be an integer, got {random_state!r}")
    rng = np.random.default_rng(None if random_state is None else random_state % 2**64)
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    attempts = 10 * num_configs + 100
    while len(out) < num_configs and attempts > 0:
        attempts -= 1
        poll()
        c = _random_compile(cgrid, rng)
        f = _render_fit((k, _sample(v, rng)) for k, v in fgrid.items())
        key = (parsed.compile_key(c), parsed.fit_key(f))
        if key not in seen:
            seen.add(key)
            out.append((c, f))
    return out


# --------------------------------------------------------------------------------------------
# load_model_selection_table
# --------------------------------------------------------------------------------------------


def _check_list(values: Sequence[Any] | None, name: str) -> Sequence[Any]:
    if values is None:
        raise CerebroError(f"{name} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise invalid(f"{name} must be an array, got {type(values).__name__}")
    if len(values) == 0:
        raise invalid(f"{name} must not be empty")
    for i, v in enumerate(values, start=1):
        if v is None:
            raise CerebroError(f"{name}[{i}] must not be NULL", NULL_VALUE_NOT_ALLOWED)
    return values


def product_configs(
    model_ids: Sequence[int],
    compile_list: Sequence[str],
    fit_list: Sequence[str],
) -> list[tuple[int, str, str]]:
    """The cartesian product model_ids x compile strings x fit strings, deduplicated.

    Each string is parsed and checked (errors name the element, 1-based as in SQL arrays,
    e.g. ``compile_params_list[2]: unknown optimizer 'adamx'``). Strings with the same
    canonical content count once, keeping the first spelling; order is preserved. NULL
    elements are an error (22004).
    """
    ids = _check_list(model_ids, "model_id_list")
    for i, m in enumerate(ids, start=1):
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
            raise invalid(f"model_id_list[{i}] must be an integer, got {m!r}")
    unique_ids = list(dict.fromkeys(int(m) for m in ids))
    compiles: dict[str, str] = {}
    for i, s in enumerate(_check_list(compile_list, "compile_params_list"), start=1):
        key = parse_compile_params(s, f"compile_params_list[{i}]").canonical()
        compiles.setdefault(key, s)
    fits: dict[str, str] = {}
    for i, s in enumerate(_check_list(fit_list, "fit_params_list"), start=1):
        key = parse_fit_params(s, f"fit_params_list[{i}]").canonical()
        fits.setdefault(key, s)
    return [(m, c, f) for m in unique_ids for c in compiles.values() for f in fits.values()]
