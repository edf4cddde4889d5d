"""Grid and random search as AutoML procedures (pure; run on the engine with the simulated
executor)."""
from __future__ import annotations

import pytest

from cerebro_db.automl.base import Decision, Launch, TrialSpec, Tuner
from cerebro_db.automl.grid import GridSearch, RandomSearch
from cerebro_db.automl.registry import get_tuner, tuner_from_state_json
from cerebro_db.automl.simulate import EpochScores, SimResult, random_unit_time, simulate_tuner
from cerebro_db.automl.space import Point, SearchSpace
from cerebro_db.errors import CerebroError
from cerebro_db.params import parse_compile_params, parse_fit_params

pytest.importorskip("keras")  # the search space parses the compile params

COMPILE = ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
           "'lr': [0.01, 0.1]}, {'optimizer': ['Adam'], 'lr': [0.001, 0.01, 0.1]}], "
           "'metrics': [['accuracy']]}")
FIT = "{'batch_size': [16, 32]}"
DIST = ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
        "'lr': [0.0001, 1.0, 'log']}]}")


def _args(compile_grid: str = COMPILE, fit_grid: str = FIT, **kw: object) -> dict:
    return {"model_ids": [1, 2], "compile_grid": compile_grid, "fit_grid": fit_grid,
            "num_workers": 3, "random_state": 7, **kw}


def _score(spec: TrialSpec, epoch: int) -> float:
    return 1.0 / epoch + spec.trial_id


def run(t: Tuner, *, num_workers: int, seed: int = 0) -> SimResult:
    return simulate_tuner(t, num_partitions=2, num_workers=num_workers,
                          loss_model=EpochScores(_score), unit_time=random_unit_time(seed),
                          seed=seed)


def _launches(decisions: list[Decision]) -> list[Launch]:
    assert all(isinstance(d, Launch) for d in decisions)
    return [d for d in decisions if isinstance(d, Launch)]


def _configs(decisions: list[Decision]) -> list[tuple[int, str, str]]:
    return [(d.spec.model_id, d.spec.compile_params, d.spec.fit_params)
            for d in _launches(decisions)]


def test_grid_launches_every_point_once() -> None:
    tuner = GridSearch(**_args(), num_iterations=3)
    expected = SearchSpace([1, 2], COMPILE, FIT).grid()
    assert len(expected) == 2 * (2 + 3) * 2
    assert not tuner.done()
    first = tuner.start()
    assert tuner.done()
    assert _configs(first) == [(p.model_id, p.compile_params, p.fit_params) for p in expected]
    assert [d.spec.trial_id for d in _launches(first)] == list(range(1, 21))
    assert {d.target for d in _launches(first)} == {3}


def test_grid_run_trains_every_trial_num_iterations() -> None:
    r = run(GridSearch(**_args(), num_iterations=2), num_workers=3, seed=1)
    assert len(r.trials) == 20
    assert all(t.completed == 2 and not t.stopped for t in r.trials.values())
    assert [k for k, _ in r.ranking] == list(range(1, 21))  # by score: 0.5 + trial id


def test_grid_rejects_distributions() -> None:
    with pytest.raises(CerebroError, match="grid search cannot use a distribution"):
        GridSearch(**_args(compile_grid=DIST), num_iterations=1)


def test_random_draws_distinct_points_reproducibly() -> None:
    a = RandomSearch(**_args(compile_grid=DIST), num_configs=12, num_iterations=2).start()
    b = RandomSearch(**_args(compile_grid=DIST), num_configs=12, num_iterations=2).start()
    c = RandomSearch(**_args(compile_grid=DIST, random_state=8), num_configs=12,
                     num_iterations=2).start()
    key = _configs(a)
    assert key == _configs(b)
    assert key != _configs(c)
    assert len(set(key)) == 12
    for _, cp, fp in key:
        parse_compile_params(cp)
        parse_fit_params(fp)


def test_random_takes_fewer_when_the_space_is_small() -> None:
    tuner = RandomSearch(**_args(), num_configs=50, num_iterations=1)
    r = run(tuner, num_workers=2)
    space = SearchSpace([1, 2], COMPILE, FIT)
    assert len(r.trials) == 20
    assert {space.key(Point(t.spec.model_id, t.spec.compile_params, t.spec.fit_params))
            for t in r.trials.values()} == {space.key(p) for p in space.grid()}


def test_registry_parses_automl_params_and_state_round_trips() -> None:
    tuner = get_tuner("random", "num_configs=4, num_iterations=3", model_ids=[1],
                      compile_grid=DIST, fit_grid=FIT, num_workers=2, random_state=3)
    assert isinstance(tuner, RandomSearch)
    assert (tuner.num_configs, tuner.num_iterations) == (4, 3)
    fresh = tuner_from_state_json(tuner.state_json())
    assert not fresh.done()
    assert fresh.start() == tuner.start()
    after = tuner_from_state_json(tuner.state_json())
    assert after.done() and after.options() == tuner.options()
    grid = get_tuner("grid", None, model_ids=[1], compile_grid=COMPILE, fit_grid=FIT,
                     num_workers=1, random_state=None)
    assert isinstance(grid, GridSearch) and grid.num_iterations == 5


@pytest.mark.parametrize("method,text,message", [
    ("grid", "num_iterations=0", "num_iterations must be at least 1, got 0"),
    ("random", "num_configs=0", "num_configs must be at least 1, got 0"),
    ("random", "R=3", "unknown key 'R'"),
])
def test_bad_automl_params(method: str, text: str, message: str) -> None:
    with pytest.raises(CerebroError, match=message):
        get_tuner(method, text, model_ids=[1], compile_grid=COMPILE, fit_grid=FIT,
                  num_workers=1, random_state=None)
