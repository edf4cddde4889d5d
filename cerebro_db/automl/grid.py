"""Grid and random search as one-shot AutoML procedures.

Both launch every configuration at the start, each trained for ``num_iterations`` epochs,
and want nothing more afterwards (model hopper parallelism keeps the workers busy however
many trials there are). Grid search takes every point of the space (no distributions);
random search draws ``num_configs`` distinct points (fewer when the space holds fewer) with
``numpy.random.default_rng(random_state)``.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import invalid
from .base import Decision, EpochReport, Launch, TrialSpec, Tuner
from .options import (
    MAX_EPOCHS,
    MAX_TRIALS,
    int_option,
    num_workers_option,
    random_state_option,
)
from .space import Point, SearchSpace

__all__ = ["GridSearch", "RandomSearch"]


class _OneShot(Tuner):
    """Launch a fixed list of points at the start; done once launched."""

    defaults: ClassVar[dict[str, Any]] = {"num_iterations": 5}

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None, num_iterations: int = 5) -> None:
        self.num_iterations = int_option("num_iterations", num_iterations, 1, MAX_EPOCHS)
        self.space = SearchSpace(model_ids, compile_grid, fit_grid)
        self.num_workers = num_workers_option(num_workers)
        self.random_state = random_state_option(random_state)
        self.started = False
        self.num_trials = 0

    @abstractmethod
    def _points(self) -> list[Point]:
        """The points to launch (grid: all of them; random: a seeded sample)."""

    def start(self) -> list[Decision]:
        if self.started:
            raise RuntimeError(f"{self.name}: start() called twice")
        points = self._points()
        self.started = True
        self.num_trials = len(points)
        return [Launch(TrialSpec(k, p.model_id, p.compile_params, p.fit_params),
                       self.num_iterations)
                for k, p in enumerate(points, start=1)]

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        return []

    def done(self) -> bool:
        return self.started

    def _base_options(self) -> dict[str, Any]:
        return {**self.space.to_json(), "num_workers": self.num_workers,
                "random_state": self.random_state, "num_iterations": self.num_iterations}

    def options(self) -> dict[str, Any]:
        return self._base_options()

    def _dynamic_state(self) -> dict[str, Any]:
        return {"started": self.started, "num_trials": self.num_trials}

    def _restore(self, state: Mapping[str, Any]) -> None:
        self.started = bool(state.get("started", False))
        self.num_trials = int(state.get("num_trials", 0))


class GridSearch(_OneShot):
    """``automl_method => 'grid'``: every point of the space (``model_id_list`` outermost),
    ``num_iterations`` epochs each (``automl_params``: ``num_iterations=5``)."""

    name: ClassVar[str] = "grid"
    defaults: ClassVar[dict[str, Any]] = {"num_iterations": 5}
    option_names: ClassVar[tuple[str, ...]] = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None, num_iterations: int = 5) -> None:
        super().__init__(model_ids=model_ids, compile_grid=compile_grid, fit_grid=fit_grid,
                         num_workers=num_workers, random_state=random_state,
                         num_iterations=num_iterations)
        if self.space.has_distributions:
            raise invalid("grid search cannot use a distribution in compile_params_grid or "
                          "fit_params_grid",
                          hint="use automl_method 'random' or 'hyperopt', or list the values")
        self._grid = self.space.grid()

    def _points(self) -> list[Point]:
        return list(self._grid)


class RandomSearch(_OneShot):
    """``automl_method => 'random'``: ``num_configs`` distinct random points (fewer when the
    space holds fewer), ``num_iterations`` epochs each (``automl_params``:
    ``num_configs=20, num_iterations=5``)."""

    name: ClassVar[str] = "random"
    defaults: ClassVar[dict[str, Any]] = {"num_configs": 20, "num_iterations": 5}
    option_names: ClassVar[tuple[str, ...]] = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None, num_configs: int = 20,
                 num_iterations: int = 5) -> None:
        self.num_configs = int_option("num_configs", num_configs, 1, MAX_TRIALS)
        super().__init__(model_ids=model_ids, compile_grid=compile_grid, fit_grid=fit_grid,
                         num_workers=num_workers, random_state=random_state,
                         num_iterations=num_iterations)

    def _points(self) -> list[Point]:
        return self.space.sample_distinct(np.random.default_rng(self.random_state),
                                          self.num_configs)

    def options(self) -> dict[str, Any]:
        return {**self._base_options(), "num_configs": self.num_configs}
