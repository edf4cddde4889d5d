"""A search space: model ids plus the compile and fit parameter grids of MADlib's AutoML.

The grids are those of ``generate_model_configs`` (:mod:`cerebro_db.configs`): lists of
choices, or ``[low, high, 'linear' | 'log' | 'log_near_one']`` distributions. A point of the
space is ``(model_id, compile_params, fit_params)``, strings that parse back with
:func:`cerebro_db.params.parse_compile_params` / ``parse_fit_params``.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import configs as _c
from ..errors import invalid
from ..interrupts import poll

__all__ = ["Point", "SearchSpace"]


@dataclass(frozen=True)
class Point:
    """One configuration of the space."""

    model_id: int
    compile_params: str
    fit_params: str


class SearchSpace:
    """``model_ids`` x ``compile_grid`` x ``fit_grid`` (grid texts as SQL passes them)."""

    def __init__(self, model_ids: Sequence[int], compile_grid: str, fit_grid: str) -> None:
        if not model_ids:
            raise invalid("model_id_list must not be empty")
        ids = [int(m) for m in model_ids]
        if len(set(ids)) != len(ids):
            raise invalid(f"model_id_list has duplicates: {ids}")
        self.model_ids: tuple[int, ...] = tuple(ids)
        self.compile_text = compile_grid
        self.fit_text = fit_grid
        self.compile_grid: dict[str, Any] = _c.parse_grid(compile_grid, "compile")
        self.fit_grid: dict[str, Any] = _c.parse_grid(fit_grid, "fit")
        self._parsed = _c._Parsed()

    def to_json(self) -> dict[str, Any]:
        return {"model_ids": list(self.model_ids), "compile_grid": self.compile_text,
                "fit_grid": self.fit_text}

    @property
    def has_distributions(self) -> bool:
        """Whether some value is a distribution (grid search cannot enumerate it)."""
        try:
            _c._check_grid_search(self.compile_grid, self.fit_grid)
        except Exception:  # noqa: BLE001 - CerebroError: a distribution is present
            return True
        return False

    def grid(self) -> list[Point]:
        """Every point (grid search), model ids outermost; no distributions allowed."""
        pairs = _c.generate_model_configs(self.compile_grid, self.fit_grid, "grid")
        return [Point(m, c, f) for m in self.model_ids for c, f in pairs]

    def sample(self, rng: np.random.Generator) -> Point:
        """One random point (choices uniform, distributions as in ``generate_model_configs``)."""
        m = self.model_ids[int(rng.integers(len(self.model_ids)))]
        c = _c._random_compile(self.compile_grid, rng)
        f = _c._render_fit((k, _c._sample(v, rng)) for k, v in self.fit_grid.items())
        self._parsed.compile_key(c)
        self._parsed.fit_key(f)
        return Point(m, c, f)

    def key(self, p: Point) -> tuple[int, str, str]:
        """Canonical identity of a point (equal content, equal key)."""
        return (p.model_id, self._parsed.compile_key(p.compile_params),
                self._parsed.fit_key(p.fit_params))

    def sample_distinct(self, rng: np.random.Generator, n: int,
                        seen: set[tuple[int, str, str]] | None = None) -> list[Point]:
        """Up to ``n`` points not in ``seen`` (updated); fewer when the space runs out."""
        seen = set() if seen is None else seen
        out: list[Point] = []
        for _ in itertools.repeat(None, 10 * n + 100):
            if len(out) == n:
                break
            poll()
            p = self.sample(rng)
            k = self.key(p)
            if k not in seen:
                seen.add(k)
                out.append(p)
        return out
