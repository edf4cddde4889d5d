"""Unit tests for cerebro_db.configs: search grids, grid/random search, selection products."""
from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro_db import configs
from cerebro_db.configs import (
    Distribution,
    generate_model_configs,
    parse_grid,
    product_configs,
)
from cerebro_db.errors import CerebroError
from cerebro_db.params import parse_compile_params, parse_fit_params

from ..helpers import cerebro_error as err

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MADLIB_COMPILE_GRID = """{'loss': ['categorical_crossentropy'],
    'optimizer_params_list': [
        {'optimizer': ['SGD'], 'lr': [0.0001, 0.001, 'log'],
         'momentum': [0.95, 0.99, 'log_near_one']},
        {'optimizer': ['Adam'], 'lr': [0.01, 0.1, 'log']}],
    'metrics': ['accuracy']}"""
MADLIB_FIT_GRID = "{'batch_size': [32, 64], 'epochs': [1]}"


def parsed_optimizer(compile_str):
    return parse_compile_params(compile_str).optimizer


# ------------------------------------------------------------------------------------------
# parse_grid
# ------------------------------------------------------------------------------------------


def test_parse_grid_madlib_example():
    g = parse_grid(MADLIB_COMPILE_GRID, "compile")
    assert g["loss"] == ["categorical_crossentropy"]
    sgd, adam = g["optimizer_params_list"]
    assert sgd["optimizer"] == ["SGD"]
    assert sgd["lr"] == Distribution(0.0001, 0.001, "log")
    assert sgd["momentum"] == Distribution(0.95, 0.99, "log_near_one")
    assert adam["lr"] == Distribution(0.01, 0.1, "log")
    f = parse_grid(MADLIB_FIT_GRID, "fit")
    assert f == {"batch_size": [32, 64], "epochs": [1]}
    assert parse_grid({"batch_size": [8]}, "fit") == {"batch_size": [8]}


def test_parse_grid_normalises_optimizer_names():
    g = parse_grid("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['adam', 'SGD']}]}",
                   "compile")
    assert g["optimizer_params_list"][0]["optimizer"] == ["Adam", "SGD"]


def test_choices_that_look_odd_are_still_choices():
    g = parse_grid("{'verbose': [0, 'auto'], 'epochs': [1, 2, 3]}", "fit")
    assert g == {"verbose": [0, "auto"], "epochs": [1, 2, 3]}
    g = parse_grid("{'batch_size': [16, 64, 256]}", "fit")
    assert g["batch_size"] == [16, 64, 256]


@pytest.mark.parametrize(
    "text, which, fragment",
    [
        ("[1, 2]", "fit", "fit_params_grid must be a dict whose values are lists"),
        ("{'batch_size': 32}", "fit", "value of batch_size must be a list of choices, got 32"),
        ("{'batch_size': []}", "fit", "value of batch_size must not be an empty list"),
        ("{'batch_size': [1, 64, 'loglog']}", "fit", "unknown distribution 'loglog'"),
        ("{'batch_size': [1, 2, 64, 'log']}", "fit", "must have 3 elements, got 4"),
        ("{'batch_size': [64, 1, 'log']}", "fit", "needs low < high"),
        ("{'batch_size': [0, 64, 'log']}", "fit", "needs low > 0"),
        ("{'batch_size': [0.2, 0.7, 'linear']}", "fit", "holds no integer"),
        ("{'epochs': [0.1, 0.5, 'log_near_one']}", "fit", "cannot take log_near_one"),
        ("{'validation_split': [0.1]}", "fit", "validation_split is not allowed"),
        ("{'foo': [1]}", "fit", "unknown key 'foo'"),
        ("{1: [1]}", "fit", "keys must be parameter names"),
        ("{'shuffle': [0, 1, 'linear']}", "fit", "shuffle cannot take a distribution"),
        ("{'optimizer_params_list': [{'optimizer': ['Adam']}]}", "compile", "loss is required"),
        ("{'loss': ['mse']}", "compile", "optimizer_params_list is required"),
        (("{'loss': ['mse'], 'optimizer': ['adam'], 'optimizer_params_list': "
         "[{'optimizer': ['Adam']}]}"), "compile", "not both"),
        ("{'loss': ['mse'], 'optimizer_params_list': []}", "compile", "non-empty list of dicts"),
        ("{'loss': ['mse'], 'optimizer_params_list': [{}]}", "compile", "non-empty dict"),
        ("{'loss': ['mse'], 'optimizer_params_list': [{'lr': [0.1]}]}", "compile",
         "has no 'optimizer' key"),
        ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['adamx']}]}", "compile",
         "unknown optimizer 'adamx'"),
        ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['Adam(lr=0.1)']}]}",
         "compile", "must list optimizer names"),
        ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'betas': [1]}]}",
         "compile", "optimizer SGD has no argument 'betas'"),
        (("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.1], "
         "'learning_rate': [0.2]}]}"), "compile", "both lr and learning_rate"),
        (("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
         "'momentum': [0.5, 1.0, 'log_near_one']}]}"), "compile", "0 <= low < high < 1"),
        ("{'loss': [0.1, 1, 'log'], 'optimizer': ['adam']}", "compile",
         "loss cannot take a distribution"),
        ("{'loss': ['mse'], 'optimizer': ['adam'], 'sample_weights_mode': ['x']}", "compile",
         "unknown key 'sample_weights_mode'"),
        ("{'loss': ['mse'], 'optimizer': [__import__('os').system('true')]}", "compile",
         "must be a literal"),
    ],
)
def test_parse_grid_errors(text, which, fragment):
    e = err(parse_grid, text, which)
    assert fragment in e.message, e.message
    assert e.message.startswith(f"{which}_params_grid")
    assert e.sqlstate == "22023"


def test_parse_grid_syntax_and_null():
    assert err(parse_grid, "{'a': [1}", "fit").sqlstate == "42601"
    assert err(parse_grid, None, "fit").sqlstate == "22004"
    with pytest.raises(ValueError):
        parse_grid("{}", "other")


@FUZZ
@given(st.text(max_size=150))
def test_fuzz_grid_only_raises_cerebro_error(text):
    for which in ("compile", "fit"):
        with contextlib.suppress(CerebroError):
            parse_grid(text, which)


# ------------------------------------------------------------------------------------------
# grid search
# ------------------------------------------------------------------------------------------


def test_grid_counts():
    compile_grid = (
        "{'loss': ['mse', 'mae'], 'optimizer_params_list': ["
        "{'optimizer': ['SGD'], 'lr': [0.1, 0.01], 'momentum': [0.9, 0.99]},"
        "{'optimizer': ['Adam'], 'lr': [0.1, 0.001]}], 'metrics': ['accuracy']}"
    )
    out = generate_model_configs(compile_grid, MADLIB_FIT_GRID)
    # (2*2 + 2) optimizer configs x 2 losses x 1 metric, x 2 batch sizes x 1 epoch
    assert len(out) == 6 * 2 * 2
    assert len(set(out)) == len(out)
    compiles = {c for c, _ in out}
    assert len(compiles) == 12
    first = out[0]
    assert first == (
        "optimizer='SGD(lr=0.1,momentum=0.9)',loss='mse',metrics=['accuracy']",
        "batch_size=32,epochs=1",
    )
    for c, f in out:
        cp = parse_compile_params(c)
        assert cp.metrics == ("accuracy",)
        parse_fit_params(f)


def test_grid_two_optimizers_in_one_dict_and_top_level_optimizer():
    out = generate_model_configs(
        "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD', 'adam'], "
        "'lr': [0.1, 0.2, 0.3]}]}",
        "{'epochs': [1, 2]}",
        "g",
    )
    assert len(out) == 2 * 3 * 2
    assert {parsed_optimizer(c).name for c, _ in out} == {"SGD", "Adam"}
    out = generate_model_configs("{'loss': ['mse'], 'optimizer': ['Adam(lr=0.1)', 'sgd']}", "{}")
    assert out == [("optimizer='Adam(lr=0.1)',loss='mse'", ""),
                   ("optimizer='sgd',loss='mse'", "")]


def test_grid_metrics_and_string_kwargs_round_trip():
    out = generate_model_configs(
        "{'loss': ['mse'], 'metrics': ['mae', ['mae', 'mse']], 'optimizer_params_list': "
        "[{'optimizer': ['Adam'], 'name': ['a', \"b'c\\\"d\"], 'amsgrad': [False]}]}",
        "{'batch_size': [8], 'class_weight': [{0: 1.0, 1: 2.0}]}",
    )
    assert len(out) == 4
    metrics = {parse_compile_params(c).metrics for c, _ in out}
    assert metrics == {("mae",), ("mae", "mse")}
    names = {parsed_optimizer(c).kwargs["name"] for c, _ in out}
    assert names == {"a", "b'c\"d"}
    assert all(parsed_optimizer(c).kwargs["amsgrad"] is False for c, _ in out)
    assert parse_fit_params(out[0][1]).class_weight == {0: 1.0, 1: 2.0}


def test_grid_deduplicates_equivalent_configs():
    out = generate_model_configs(
        "{'loss': ['mse', 'mse'], 'optimizer_params_list': ["
        "{'optimizer': ['SGD'], 'lr': [0.1]}, {'optimizer': ['sgd'], 'learning_rate': [0.1]},"
        "{'optimizer': ['SGD'], 'lr': [0.1, 0.2]}]}",
        "{'batch_size': [32, 32], 'epochs': [1]}",
    )
    assert out == [
        ("optimizer='SGD(lr=0.1)',loss='mse'", "batch_size=32,epochs=1"),
        ("optimizer='SGD(lr=0.2)',loss='mse'", "batch_size=32,epochs=1"),
    ]


def test_grid_rejects_distributions_and_random_arguments():
    e = err(generate_model_configs, MADLIB_COMPILE_GRID, MADLIB_FIT_GRID)
    assert "distribution" in e.message and "random" in e.hint
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer': ['adam']}",
            "{'batch_size': [8, 64, 'log']}")
    assert e.message.startswith("fit_params_grid: batch_size is a distribution")
    grid = "{'loss': ['mse'], 'optimizer': ['adam']}"
    assert "num_configs must be NULL" in err(generate_model_configs, grid, "{}", "grid", 3).message
    assert "random_state must be NULL" in err(
        generate_model_configs, grid, "{}", "grid", None, 1
    ).message


def test_grid_too_large(monkeypatch):
    monkeypatch.setattr(configs, "MAX_CONFIGS", 10)
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer': ['adam']}",
            "{'batch_size': [1, 2, 3, 4], 'epochs': [1, 2, 3]}")
    assert "12 configurations" in e.message


def test_grid_bad_generated_value_names_grid():
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer': ['adam']}",
            "{'batch_size': [0]}")
    assert e.message == "fit_params_grid: batch_size must be at least 1, got 0"
    assert "batch_size=0" in e.detail
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer_params_list': "
            "[{'optimizer': ['SGD'], 'lr': [-0.1]}]}", "{}")
    assert e.message.startswith("compile_params_grid: optimizer SGD: learning_rate")


@pytest.mark.parametrize("search_type", ["grid", "GRID", "g", "Gr", " grid "])
def test_search_type_grid_prefixes(search_type):
    assert len(generate_model_configs("{'loss': ['mse'], 'optimizer': ['adam']}", "{}",
                                      search_type)) == 1


@pytest.mark.parametrize("search_type", ["random", "RANDOM", "r", "Rand"])
def test_search_type_random_prefixes(search_type):
    assert len(generate_model_configs("{'loss': ['mse'], 'optimizer': ['adam']}", "{}",
                                      search_type, 1, 0)) == 1


@pytest.mark.parametrize("search_type", ["", "grids", "x", "randomly", None, 3])
def test_search_type_invalid(search_type):
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer': ['adam']}", "{}",
            search_type)
    assert e.message.startswith("search_type must be 'grid' or 'random'")


# ------------------------------------------------------------------------------------------
# random search
# ------------------------------------------------------------------------------------------


def test_random_madlib_example_reproducible_and_in_bounds():
    a = generate_model_configs(MADLIB_COMPILE_GRID, MADLIB_FIT_GRID, "random", 20, 42)
    b = generate_model_configs(MADLIB_COMPILE_GRID, MADLIB_FIT_GRID, "random", 20, 42)
    c = generate_model_configs(MADLIB_COMPILE_GRID, MADLIB_FIT_GRID, "random", 20, 43)
    assert a == b
    assert a != c
    assert len(a) == 20 and len(set(a)) == 20
    for compile_str, fit_str in a:
        opt = parsed_optimizer(compile_str)
        lr = opt.kwargs["learning_rate"]
        assert "lr=" in compile_str  # spelled like the grid
        if opt.name == "SGD":
            assert 0.0001 <= lr <= 0.001
            assert 0.95 <= opt.kwargs["momentum"] <= 0.99
        else:
            assert opt.name == "Adam" and 0.01 <= lr <= 0.1
        assert parse_fit_params(fit_str).batch_size in (32, 64)
        cp = parse_compile_params(compile_str)
        assert cp.loss == "categorical_crossentropy" and cp.metrics == ("accuracy",)


def test_random_format_like_madlib():
    out = generate_model_configs(MADLIB_COMPILE_GRID, MADLIB_FIT_GRID, "random", 5, 7)
    for compile_str, fit_str in out:
        assert compile_str.startswith("optimizer='")
        assert compile_str.endswith(",loss='categorical_crossentropy',metrics=['accuracy']")
        assert " " not in compile_str and " " not in fit_str
        assert fit_str in ("batch_size=32,epochs=1", "batch_size=64,epochs=1")
        lr = parsed_optimizer(compile_str).kwargs["learning_rate"]
        assert float(f"{lr:.3g}") == lr  # 3 significant digits


def test_random_state_none_and_negative():
    grid = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['adam'], " \
           "'lr': [0.001, 0.1, 'log']}]}"
    assert len(generate_model_configs(grid, "{}", "random", 3)) == 3
    assert generate_model_configs(grid, "{}", "random", 3, -5) == generate_model_configs(
        grid, "{}", "random", 3, -5
    )


def test_random_small_space_returns_every_distinct_config():
    out = generate_model_configs("{'loss': ['mse', 'mae'], 'optimizer': ['adam']}",
                                 "{'batch_size': [8, 16]}", "random", 50, 1)
    assert len(out) == 4
    assert len({(c, f) for c, f in out}) == 4


@pytest.mark.parametrize("num_configs", [None, 0, -1, 1.5, True])
def test_random_needs_num_configs(num_configs):
    e = err(generate_model_configs, "{'loss': ['mse'], 'optimizer': ['adam']}", "{}",
            "random", num_configs)
    assert "num_configs" in e.message


def test_random_bad_random_state():
    assert "random_state" in err(generate_model_configs, "{'loss': ['mse'], "
                                 "'optimizer': ['adam']}", "{}", "random", 1, "x").message


def test_random_integer_distributions():
    out = generate_model_configs(
        "{'loss': ['mse'], 'optimizer': ['adam']}",
        "{'batch_size': [8, 512, 'log'], 'epochs': [1, 3, 'linear']}",
        "random", 30, 3,
    )
    for _, f in out:
        fp = parse_fit_params(f)
        assert 8 <= fp.batch_size <= 512 and 1 <= fp.epochs <= 3


@FUZZ
@given(
    kind=st.sampled_from(["linear", "log", "log_near_one"]),
    a=st.floats(1e-6, 0.999, allow_nan=False),
    b=st.floats(1e-6, 0.999, allow_nan=False),
    seed=st.integers(0, 2**32),
)
def test_distribution_bounds(kind, a, b, seed):
    low, high = min(a, b), max(a, b)
    if not low < high:
        return
    dist = Distribution(low, high, kind)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        x = dist.sample(rng)
        assert isinstance(x, float) and math.isfinite(x)
        assert low <= x <= high


@FUZZ
@given(
    kind=st.sampled_from(["linear", "log"]),
    a=st.integers(1, 10_000),
    b=st.integers(1, 10_000),
    seed=st.integers(0, 2**32),
)
def test_integer_distribution_bounds(kind, a, b, seed):
    low, high = min(a, b), max(a, b)
    if not low < high:
        return
    dist = Distribution(low, high, kind, integer=True)
    rng = np.random.default_rng(seed)
    for _ in range(10):
        x = dist.sample(rng)
        assert isinstance(x, int) and low <= x <= high


@FUZZ
@given(
    lr=st.tuples(st.floats(1e-6, 1.0), st.floats(1e-6, 1.0)),
    mom=st.tuples(st.floats(0.0, 0.999), st.floats(0.0, 0.999)),
    seed=st.integers(0, 2**31),
)
def test_random_configs_round_trip(lr, mom, seed):
    (lr_lo, lr_hi), (m_lo, m_hi) = sorted(lr), sorted(mom)
    if not (lr_lo < lr_hi and m_lo < m_hi):
        return
    grid = {
        "loss": ["mse"],
        "optimizer_params_list": [
            {"optimizer": ["SGD"], "lr": [lr_lo, lr_hi, "log"],
             "momentum": [m_lo, m_hi, "log_near_one"]},
            {"optimizer": ["RMSprop"], "learning_rate": [lr_lo, lr_hi, "linear"]},
        ],
    }
    out = generate_model_configs(grid, {"epochs": [1, 2]}, "random", 4, seed)
    canon = set()
    for c, f in out:
        cp = parse_compile_params(c)
        assert parse_compile_params(cp.canonical()).canonical() == cp.canonical()
        assert lr_lo <= cp.optimizer.kwargs["learning_rate"] <= lr_hi
        if cp.optimizer.name == "SGD":
            assert m_lo <= cp.optimizer.kwargs["momentum"] <= m_hi
        canon.add((cp.canonical(), parse_fit_params(f).canonical()))
    assert len(canon) == len(out)


# ------------------------------------------------------------------------------------------
# product_configs (load_model_selection_table)
# ------------------------------------------------------------------------------------------


def test_product_configs_dedup_keeps_first_spelling_and_order():
    out = product_configs(
        [2, 1, 2],
        ["optimizer='Adam(lr=0.1)', loss='mse'",
         "loss='mse', optimizer=adam(learning_rate=0.1)",
         "optimizer='SGD', loss='mse', metrics=['mae']"],
        ["batch_size=32", "", "epochs=2, batch_size=64", "batch_size=64,epochs=2"],
    )
    c1 = "optimizer='Adam(lr=0.1)', loss='mse'"
    c2 = "optimizer='SGD', loss='mse', metrics=['mae']"
    f1, f2 = "batch_size=32", "epochs=2, batch_size=64"
    assert out == [
        (2, c1, f1), (2, c1, f2), (2, c2, f1), (2, c2, f2),
        (1, c1, f1), (1, c1, f2), (1, c2, f1), (1, c2, f2),
    ]


def test_product_configs_errors_name_the_element():
    e = err(product_configs, [1], ["optimizer='adam', loss='mse'", "optimizer='adamx', loss='mse'"],
            [""])
    assert e.message == "compile_params_list[2]: unknown optimizer 'adamx'"
    e = err(product_configs, [1], ["optimizer='adam', loss='mse'"], ["epochs=1", "batch_size=0"])
    assert e.message == "fit_params_list[2]: batch_size must be at least 1, got 0"
    e = err(product_configs, [1], ["optimizer='adam', loss='mse'", None], [""])
    assert e.message == "compile_params_list[2] must not be NULL" and e.sqlstate == "22004"
    e = err(product_configs, [1, None], ["optimizer='adam', loss='mse'"], [""])
    assert e.sqlstate == "22004"
    assert err(product_configs, None, ["x"], [""]).sqlstate == "22004"
    assert "must not be empty" in err(product_configs, [1], [], [""]).message
    assert "must be an integer" in err(product_configs, ["1"], ["x"], [""]).message
    assert "must be an array" in err(product_configs, [1], "optimizer='adam'", [""]).message


def test_discrete_compiles_cover_every_listed_choice():
    """What an AutoML run can draw, each listed choice at least once (a distribution by its
    low end), distinct, and bounded."""
    from cerebro_db.configs import discrete_compiles, parse_grid
    g = parse_grid("{'loss': ['categorical_crossentropy', 'no_such_loss'], "
                   "'optimizer_params_list': [{'optimizer': ['Adam', 'SGD'], "
                   "'lr': [0.0001, 0.01, 'log']}], 'metrics': ['accuracy', 'mae']}", "compile")
    out = discrete_compiles(g)
    assert len(out) == len(set(out)) == 8
    assert all("lr=0.0001" in s for s in out)
    for piece in ("no_such_loss", "SGD", "'mae'"):
        assert any(piece in s for s in out)
    big = parse_grid("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
                     "'lr': [0.1, 0.2, 0.3, 0.4], 'momentum': [0.1, 0.2, 0.3, 0.4]}], "
                     "'metrics': ['mae']}", "compile")
    assert len(discrete_compiles(big)) == 16
    assert 0 < len(discrete_compiles(big, limit=5)) <= 5
