"""What every tuner shares: its own automl_params (keys, defaults, checks in the
constructor) and the common checks of automl/options.py, the same for every procedure."""
from __future__ import annotations

import pytest

from cerebro_db.automl.options import int_option, number_option
from cerebro_db.automl.registry import get_tuner, tuner_class, tuner_names
from cerebro_db.errors import CerebroError

pytest.importorskip("keras")  # the search space parses the compile params

GRID = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.1, 0.01]}]}"
FIT = "{'batch_size': [8, 16]}"


def make(method: str, text: str | None = None, **kw):
    args = {"model_ids": [1], "compile_grid": GRID, "fit_grid": FIT, "num_workers": 2,
            "random_state": 3, **kw}
    return get_tuner(method, text, **args)


def error(method: str, text: str | None = None, **kw) -> CerebroError:
    with pytest.raises(CerebroError) as info:
        make(method, text, **kw)
    assert info.value.sqlstate == "22023"
    return info.value


@pytest.mark.parametrize("method", tuner_names())
def test_each_tuner_declares_its_params(method):
    klass = tuner_class(method)
    assert klass.option_names == tuple(klass.defaults)
    assert klass.parse_params(None) == dict(klass.defaults)
    t = make(method)
    assert {k: t.options()[k] for k in klass.defaults} == dict(klass.defaults)
    e = error(method, "no_such_key=1")
    assert e.message == f"automl_params: unknown key 'no_such_key' for {method}"
    assert e.hint == "allowed keys: " + ", ".join(klass.defaults)


@pytest.mark.parametrize("method", tuner_names())
@pytest.mark.parametrize(("kw", "message"), [
    ({"random_state": -1}, "random_state must be a non-negative integer, got -1"),
    ({"random_state": True}, "random_state must be a non-negative integer, got True"),
    ({"random_state": "7"}, "random_state must be a non-negative integer, got '7'"),
    ({"num_workers": 0}, "num_workers must be at least 1, got 0"),
    ({"num_workers": 2.0}, "num_workers must be an integer, got 2.0"),
])
def test_every_tuner_checks_seed_and_workers_alike(method, kw, message):
    assert error(method, **kw).message == message


@pytest.mark.parametrize(("method", "text", "message"), [
    ("grid", "num_iterations=100001", "num_iterations must be at most 100000"),
    ("random", "num_configs=10001", "num_configs must be at most 10000"),
    ("hyperband", "eta=1001", "eta must be at most 1000"),
    ("hyperopt", "num_configs=10001", "num_configs must be at most 10000"),
    ("asha", "brackets=65", "brackets must be at most 64"),
    ("asha", "eta=1001", "eta must be at most 1000"),
    ("mltuner", "search_steps=257", "search_steps must be at most 256"),
    ("mltuner", "max_retunes=10001", "max_retunes must be at most 10000"),
])
def test_bounds_are_the_tuners_own_with_one_hint(method, text, message):
    e = error(method, text)
    assert message in e.message
    assert e.hint == "Bounds keep one call's work finite; see the README's limits."


def test_shared_checks():
    assert int_option("k", 3, 1, 3) == 3
    for bad, fragment in ((0, "at least 1, got 0"), (4, "at most 3, got 4"),
                          (True, "an integer, got True"), (2.0, "an integer, got 2.0")):
        with pytest.raises(CerebroError, match=fragment):
            int_option("k", bad, 1, 3)
    assert number_option("x", 1, 0.0, 1.0) == 1.0
    with pytest.raises(CerebroError, match="x must be a number above 0.0, got 0.0"):
        number_option("x", 0.0, 0.0, low_open=True)
    with pytest.raises(CerebroError, match="at least 0.0 and at most 1.0, got nan"):
        number_option("x", float("nan"), 0.0, 1.0)
