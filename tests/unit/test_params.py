"""Unit tests for cerebro_db.params: the literal-only parser and compile/fit/automl params."""
from __future__ import annotations

import ast
import builtins
import contextlib
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cerebro_db import params
from cerebro_db.errors import CerebroError
from cerebro_db.params import (
    MAX_INPUT_CHARS,
    CompileParams,
    FitParams,
    OptimizerSpec,
    parse_automl_params,
    parse_compile_params,
    parse_fit_params,
    parse_keyword_string,
    parse_literal,
    parse_optimizer_spec,
    render_literal,
    validate_compile_params,
)
from cerebro_db.scheduling.registry import policy_names

from ..helpers import cerebro_error as err
from ..helpers import requires_keras

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture()
def no_code_execution(monkeypatch):
    """Fail the test if anything evals, execs or compiles to code (AST-only compile is fine)."""

    real_compile = builtins.compile

    def guarded_compile(source, filename, mode, flags=0, *args, **kwargs):
        assert flags & ast.PyCF_ONLY_AST, "compile() to code object called"
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "compile", guarded_compile)
    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)


# ------------------------------------------------------------------------------------------
# the key=value parser
# ------------------------------------------------------------------------------------------


def test_keyword_string_literals():
    d = parse_keyword_string(
        "a=1, b=-2.5, c=+3, d=1e-3, e='x,y=z', f=True, g=None, h=[1, (2, 3)], "
        "i={'k': [1, 2]}, j={1, 2}, k=(1,), l=\"dq\"",
        "p",
    )
    assert d == {
        "a": 1, "b": -2.5, "c": 3, "d": 0.001, "e": "x,y=z", "f": True, "g": None,
        "h": [1, (2, 3)], "i": {"k": [1, 2]}, "j": {1, 2}, "k": (1,), "l": "dq",
    }
    assert d["f"] is True


@pytest.mark.parametrize("text", [None, "", "   ", "\n\t "])
def test_keyword_string_empty(text):
    assert parse_keyword_string(text, "p") == {}


def test_keyword_string_trailing_comma_comment_and_newlines():
    assert parse_keyword_string("a=1,\n b=2, # note\n", "p") == {"a": 1, "b": 2}


def test_nested_commas():
    d = parse_keyword_string("metrics=['accuracy', 'mae'], loss='mse'", "compile_params")
    assert d == {"metrics": ["accuracy", "mae"], "loss": "mse"}


@pytest.mark.parametrize(
    "text",
    [
        "a=1, a=2",
        "1, a=2",
        "a=1, 'b'",
        "**{'a': 1}",
        "*x",
        "a=",
        "a=1 b=2",
        "a=(1",
        "a=1), (_(b=2",
        "a=1)\n_(b=2",
        "a=1\x00",
        "a=" + "1" * 5000,
        "a=" + "[" * 300 + "]" * 300,
        "a=" + "-" * 50_000 + "1",
        "a=" + "not " * 20_000 + "1",
    ],
)
def test_keyword_string_malformed(text):
    e = err(parse_keyword_string, text, "fit_params")
    assert e.sqlstate in ("42601", "22023")
    assert e.message.startswith("fit_params")


def test_duplicate_and_positional_are_syntax_errors():
    assert err(parse_keyword_string, "a=1, a=2", "p").sqlstate == "42601"
    assert "duplicate key 'a'" in err(parse_keyword_string, "a=1, a=2", "p").message
    assert err(parse_keyword_string, "1", "p").sqlstate == "42601"


@pytest.mark.parametrize(
    "value, described",
    [
        ("__import__('os').system('touch /tmp/cerebro_pwned')", "function call"),
        ("open('/etc/passwd').read()", "function call"),
        ("os.system", "attribute access"),
        ("().__class__.__bases__[0].__subclasses__()", "function call"),
        ("lambda: 1", "lambda"),
        ("f'{1}'", "f-string"),
        ("[x for x in range(3)]", "comprehension"),
        ("1 + 2", "expression"),
        ("x", "name 'x'"),
        ("[1, foo]", "name 'foo'"),
        ("{'a': exec}", "name 'exec'"),
        ("[*a]", "unpacking"),
        ("{**a}", "unpacking"),
        ("b'bytes'", "bytes literal"),
        ("1j", "complex literal"),
        ("...", "ellipsis literal"),
        ("-'x'", "sign"),
        ("(x := 1)", "expression"),
    ],
)
def test_non_literals_rejected_and_never_run(value, described, no_code_execution):
    e = err(parse_keyword_string, f"loss={value}", "compile_params")
    assert e.sqlstate == "22023"
    assert e.message.startswith("compile_params: loss")
    assert described in e.message.lower()
    assert not os.path.exists("/tmp/cerebro_pwned")


@pytest.mark.parametrize(
    "text",
    [
        "optimizer=__import__('os').system('touch /tmp/cerebro_pwned'), loss='mse'",
        "optimizer=os.system('x'), loss='mse'",
        "optimizer='__import__(\"os\").system(\"touch /tmp/cerebro_pwned\")', loss='mse'",
        "optimizer=Adam(learning_rate=__import__('os')), loss='mse'",
        "optimizer=Adam(0.1), loss='mse'",
        "optimizer='Adam(lr=0.1)(1)', loss='mse'",
        "optimizer='Adam.__init__', loss='mse'",
    ],
)
def test_hostile_compile_params(text, no_code_execution):
    e = err(parse_compile_params, text)
    assert e.sqlstate in ("22023", "42601")
    assert not os.path.exists("/tmp/cerebro_pwned")


def test_limits():
    e = err(parse_keyword_string, "a=" + "1" * MAX_INPUT_CHARS, "fit_params")
    assert "too long" in e.message
    deep = "a=" + "[" * 40 + "]" * 40
    assert "nested too deeply" in err(parse_keyword_string, deep, "p").message
    e = err(parse_keyword_string, "a=1e999", "p")
    assert e.message == "p: a must be a finite number, got inf"
    assert "must be a string" in err(parse_keyword_string, 12, "p").message


def test_dict_and_set_checks():
    assert "duplicate dict key" in err(parse_keyword_string, "a={'k': 1, 'k': 2}", "p").message
    assert "hashable" in err(parse_keyword_string, "a={[1]: 2}", "p").message
    assert "hashable" in err(parse_keyword_string, "a={[1]}", "p").message


def test_bare_names_only_for_named_keys():
    assert parse_keyword_string("algorithm=tpe", "p", bare_name_keys=("algorithm",)) == {
        "algorithm": "tpe"
    }
    assert "name 'tpe'" in err(parse_keyword_string, "other=tpe", "p").message


def test_parse_literal():
    assert parse_literal(" {'a': [1, 2.5, 'x']}\n", "g") == {"a": [1, 2.5, "x"]}
    assert err(parse_literal, None, "g").sqlstate == "22004"
    assert err(parse_literal, "  ", "g").sqlstate == "22023"
    assert err(parse_literal, "{'a': [1}", "g").sqlstate == "42601"
    assert err(parse_literal, "{'a': f(1)}", "g").sqlstate == "22023"


@FUZZ
@given(st.text(max_size=200))
def test_fuzz_text_only_raises_cerebro_error(text):
    for fn in (
        parse_compile_params,
        parse_fit_params,
        _tuner_params("hyperband"),
        _tuner_params("hyperopt"),
        lambda t: parse_literal(t, "g"),
        parse_optimizer_spec,
    ):
        with contextlib.suppress(CerebroError):
            fn(text)


_TOKENS = [
    "a", "=", "loss", "optimizer", "metrics", "batch_size", "epochs", "Adam", "sgd", "lr",
    "learning_rate", "(", ")", "[", "]", "{", "}", ",", ":", "'", '"', "1", "-", "+", "0.5",
    "1e-3", "True", "None", "x", ".", "*", "**", "lambda", "#", "\n", " ", "\\", "'mse'",
    "'Adam(lr=0.1)'", "__import__", "if", "else", "for", "in", ";", "@", "1e999", "0x1f",
]


@FUZZ
@given(st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join))
def test_fuzz_tokens_only_raises_cerebro_error(text):
    for fn in (parse_compile_params, parse_fit_params, lambda t: parse_literal(t, "g"),
               parse_optimizer_spec, _tuner_params("hyperopt")):
        with contextlib.suppress(CerebroError):
            fn(text)


_literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(0, 9), inner, max_size=3),
    max_leaves=10,
)


@FUZZ
@given(_literals)
def test_render_literal_round_trips(value):
    for inner in (False, True):
        assert parse_literal(render_literal(value, inner=inner), "v") == value


# ------------------------------------------------------------------------------------------
# optimizers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given_name, keras_name",
    [("adam", "Adam"), ("ADAM", "Adam"), ("Adam", "Adam"), ("sgd", "SGD"), ("Sgd", "SGD"),
     ("rmsprop", "RMSprop"), ("adamw", "AdamW"), ("NADAM", "Nadam"), ("adagrad", "Adagrad")],
)
def test_optimizer_names_case_insensitive(given_name, keras_name):
    assert parse_optimizer_spec(given_name).name == keras_name
    assert parse_optimizer_spec(f"{given_name}()").name == keras_name


def test_optimizer_list_from_keras():
    names = params.optimizer_names()
    assert {"Adam", "SGD", "RMSprop", "AdamW"} <= set(names)
    assert "Optimizer" not in names and "LossScaleOptimizer" not in names


@requires_keras
def test_amsgrad_false_is_false():
    spec = parse_optimizer_spec("Adam(learning_rate=0.001, amsgrad=False)")
    assert spec.kwargs == {"learning_rate": 0.001, "amsgrad": False}
    assert spec.kwargs["amsgrad"] is False
    assert spec.to_keras().amsgrad is False
    assert parse_optimizer_spec("Adam(amsgrad=True)").to_keras().amsgrad is True


@requires_keras
def test_lr_alias():
    spec = parse_optimizer_spec("SGD(lr=0.01, momentum=0.9, nesterov=True)")
    assert spec == OptimizerSpec("SGD", {"learning_rate": 0.01, "momentum": 0.9, "nesterov": True})
    assert spec.canonical() == parse_optimizer_spec(
        "sgd(nesterov=True, momentum=0.9, learning_rate=0.01)"
    ).canonical()
    opt = spec.to_keras()
    assert math.isclose(float(opt.learning_rate), 0.01, rel_tol=1e-6)
    e = err(parse_optimizer_spec, "SGD(lr=0.1, learning_rate=0.2)")
    assert "both lr and learning_rate" in e.message


@requires_keras
def test_string_and_tuple_kwargs():
    assert parse_optimizer_spec('Adam(name="my_adam")').kwargs == {"name": "my_adam"}
    assert parse_optimizer_spec("Adam(name='my_adam')").kwargs == {"name": "my_adam"}
    assert parse_optimizer_spec("SGD(learning_rate=0.1, clipnorm=(1.0))").kwargs == {
        "learning_rate": 0.1, "clipnorm": 1.0,
    }
    assert parse_optimizer_spec('Adam(name="my_adam")').to_keras().name == "my_adam"


def test_bare_call_equals_quoted():
    a = parse_compile_params("optimizer=SGD(lr=0.1), loss='mse'")
    b = parse_compile_params("optimizer='SGD(lr=0.1)', loss='mse'")
    c = parse_compile_params("optimizer=sgd(learning_rate=0.1), loss='mse'")
    assert a == b == c
    assert parse_compile_params("optimizer=Adam, loss='mse'").optimizer.name == "Adam"


@requires_keras
def test_optimizer_errors():
    e = err(parse_optimizer_spec, "adamx")
    assert e.message == "compile_params: unknown optimizer 'adamx'"
    assert "Adam" in e.hint and "SGD" in e.hint
    e = err(parse_optimizer_spec, "Adam(decay=-0.01)")
    assert e.message == "compile_params: optimizer Adam: decay must be a non-negative number, got -0.01"
    e = err(parse_optimizer_spec, "SGD(betas=0.9)")
    assert e.message == "compile_params: optimizer SGD has no argument 'betas'"
    assert "momentum" in e.hint
    assert "positive" in err(parse_optimizer_spec, "Adam(lr=0)").message
    assert "positive" in err(parse_optimizer_spec, "Adam(lr='fast')").message
    assert "keyword arguments only" in err(parse_optimizer_spec, "Adam(0.1)").message
    assert err(parse_optimizer_spec, "").sqlstate == "22023"
    assert err(parse_optimizer_spec, 3).sqlstate == "22023"
    assert err(parse_optimizer_spec, "[1]").sqlstate == "22023"
    assert err(parse_optimizer_spec, "Adam(").sqlstate == "42601"
    assert "invalid" in err(parse_optimizer_spec("SGD(momentum=-1.0)").to_keras).message


def test_optimizer_fallback_without_keras(monkeypatch):
    def no_keras():
        raise ImportError("no keras")

    params._optimizer_table.cache_clear()
    monkeypatch.setattr(params, "_import_keras", no_keras)
    try:
        assert parse_optimizer_spec("adamw(weight_decay=0.1)").name == "AdamW"
        assert err(parse_optimizer_spec, "adamw(anything=1)").sqlstate == "22023"
        assert err(parse_optimizer_spec, "Adam(decay='x')").sqlstate == "22023"
        cp = parse_compile_params("optimizer='adam', loss='mse'")
        assert err(validate_compile_params, cp).sqlstate == "0A000"
    finally:
        params._optimizer_table.cache_clear()


def test_static_optimizer_table_is_what_keras_reports():
    """The table a coordinator uses without importing Keras equals Keras' own."""
    assert params._static_optimizer_table() == params._keras_optimizer_table()


# ------------------------------------------------------------------------------------------
# compile_params
# ------------------------------------------------------------------------------------------


@requires_keras
def test_compile_params_full():
    cp = parse_compile_params(
        "optimizer='Adam(learning_rate=0.001)', loss='categorical_crossentropy', "
        "metrics=['accuracy', 'top_k_categorical_accuracy'], loss_weights=[1.0], "
        "weighted_metrics=['acc'], jit_compile=False, steps_per_execution=2, run_eagerly=False"
    )
    assert cp.optimizer == OptimizerSpec("Adam", {"learning_rate": 0.001})
    assert cp.loss == "categorical_crossentropy"
    assert cp.metrics == ("accuracy", "top_k_categorical_accuracy")
    assert cp.loss_weights == (1.0,)
    assert cp.weighted_metrics == ("acc",)
    assert cp.steps_per_execution == 2 and cp.jit_compile is False and cp.run_eagerly is False
    validate_compile_params(cp)
    assert parse_compile_params(cp.canonical()) == cp
    assert hash(cp) == hash(parse_compile_params(cp.canonical()))


def test_compile_params_defaults_and_forms():
    cp = parse_compile_params("loss='mse', optimizer='adam'")
    assert cp.metrics == () and cp.loss_weights is None and cp.weighted_metrics is None
    assert cp.canonical() == "optimizer='Adam()',loss='mse',metrics=[]"
    assert parse_compile_params("optimizer='adam', loss='mse', metrics='mae'").metrics == ("mae",)
    multi = parse_compile_params(
        "optimizer='adam', loss={'a': 'mse', 'b': 'mae'}, loss_weights={'a': 1, 'b': 0.5}"
    )
    assert multi.loss == {"a": "mse", "b": "mae"}
    assert parse_compile_params("optimizer='adam', loss=['mse', 'mae']").loss == ("mse", "mae")
    assert parse_compile_params(multi.canonical()) == multi


def test_canonical_ignores_spelling():
    a = parse_compile_params(
        "optimizer='Adam(lr=0.01, amsgrad=False)', loss='mse', metrics=['mae']"
    )
    b = parse_compile_params(
        "metrics = [ 'mae' ] ,loss=\"mse\",optimizer=adam(amsgrad=False,learning_rate=0.01)"
    )
    assert a.canonical() == b.canonical()
    assert a.canonical() != parse_compile_params(
        "optimizer='Adam(lr=0.02, amsgrad=False)', loss='mse', metrics=['mae']"
    ).canonical()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("loss='mse'", "optimizer is required"),
        ("optimizer='adam'", "loss is required"),
        ("optimizer='adam', loss='mse', foo=1", "unknown key 'foo'"),
        ("optimizer='adam', loss='mse', foo=bar", "unknown key 'foo'"),
        ("optimizer='adam', loss=''", "must not be empty"),
        ("optimizer='adam', loss=[]", "empty list"),
        ("optimizer='adam', loss=1", "loss name"),
        ("optimizer='adam', loss='mse', metrics=[1]", "list of names"),
        ("optimizer='adam', loss='mse', metrics={'a': 'b'}", "list of names"),
        ("optimizer='adam', loss='mse', loss_weights=[-1]", "non-negative"),
        ("optimizer='adam', loss='mse', loss_weights='x'", "list or dict"),
        ("optimizer='adam', loss='mse', jit_compile='yes'", "jit_compile"),
        ("optimizer='adam', loss='mse', steps_per_execution=0", "steps_per_execution"),
        ("optimizer='adam', loss='mse', run_eagerly=1", "run_eagerly"),
        ("optimizer=1, loss='mse'", "optimizer must be a string"),
    ],
)
def test_compile_params_errors(text, fragment):
    e = err(parse_compile_params, text)
    assert fragment in e.message
    assert e.sqlstate == "22023"


def test_unknown_key_hint_lists_allowed():
    e = err(parse_compile_params, "optimizer='adam', loss='mse', sample_weights_mode='x'")
    assert "loss_weights" in e.hint and "metrics" in e.hint


@requires_keras
def test_validate_compile_params():
    ok = parse_compile_params(
        "optimizer='sgd', loss='sparse_categorical_crossentropy', "
        "metrics=['acc', 'accuracy', 'ce', 'crossentropy', 'mae', 'AUC']"
    )
    validate_compile_params(ok)
    bad_loss = parse_compile_params("optimizer='sgd', loss='no_such_loss'")
    e = err(validate_compile_params, bad_loss)
    assert e.message == "compile_params: unknown loss 'no_such_loss'"
    bad_metric = parse_compile_params("optimizer='sgd', loss='mse', metrics=['nope']")
    assert "unknown metric 'nope'" in err(validate_compile_params, bad_metric).message
    validate_compile_params(bad_metric, custom_functions=["nope"])
    bad_opt = parse_compile_params("optimizer='SGD(momentum=2.0)', loss='mse'")
    assert err(validate_compile_params, bad_opt).sqlstate == "22023"


@requires_keras
def test_compile_to_keras_compiles_a_model():
    import keras

    cp = parse_compile_params(
        "optimizer='Adam(learning_rate=0.01, amsgrad=False)', loss='mse', metrics=['mae']"
    )
    kwargs = cp.to_keras()
    assert isinstance(kwargs["optimizer"], keras.optimizers.Adam)
    assert kwargs["loss"] == "mse" and kwargs["metrics"] == ["mae"]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(**kwargs)


def test_compile_params_frozen():
    cp = parse_compile_params("optimizer='adam', loss='mse'")
    with pytest.raises(AttributeError):
        cp.loss = "mae"  # type: ignore[misc]
    assert isinstance(cp, CompileParams)


# ------------------------------------------------------------------------------------------
# fit_params
# ------------------------------------------------------------------------------------------


def test_fit_params_defaults():
    for text in (None, "", "  "):
        fp = parse_fit_params(text)
        assert fp == FitParams(batch_size=32, epochs=1)
        assert fp.canonical() == "batch_size=32,epochs=1"
    assert parse_fit_params("epochs=1").canonical() == parse_fit_params("batch_size=32").canonical()


@requires_keras
def test_fit_params_full():
    fp = parse_fit_params(
        "batch_size=64, epochs=3, shuffle=False, class_weight={0: 1, 1: 2.5}, verbose=0, "
        "callbacks=['terminateonnan']"
    )
    assert fp.batch_size == 64 and fp.epochs == 3 and fp.shuffle is False
    assert fp.class_weight == {0: 1, 1: 2.5} and fp.verbose == 0
    assert fp.callbacks == ("TerminateOnNaN",)
    assert parse_fit_params(fp.canonical()) == fp
    kw = fp.to_keras()
    assert kw["batch_size"] == 64 and kw["epochs"] == 3 and kw["shuffle"] is False
    assert type(kw["callbacks"][0]).__name__ == "TerminateOnNaN"


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch_size=0", "fit_params: batch_size must be at least 1, got 0"),
        ("epochs=0", "fit_params: epochs must be at least 1, got 0"),
        ("batch_size=1.5", "fit_params: batch_size must be an integer, got 1.5"),
        ("batch_size=True", "fit_params: batch_size must be an integer, got True"),
        ("batch_size=1e999", "fit_params: batch_size must be a finite number, got inf"),
        ("shuffle=1", "fit_params: shuffle must be True or False, got 1"),
        ("verbose=3", "fit_params: verbose must be 0, 1, 2 or 'auto', got 3"),
        ("callbacks=['EarlyStopping']", "fit_params: callback 'EarlyStopping' is not allowed"),
        ("class_weight=[1, 2]", "fit_params: class_weight must be a dict"),
        ("class_weight={'a': 1}", "fit_params: class_weight keys must be class indexes"),
        ("class_weight={0: -1}", "fit_params: class_weight values must be non-negative"),
        ("foo=1", "fit_params: unknown key 'foo'"),
    ],
)
def test_fit_params_errors(text, message):
    e = err(parse_fit_params, text)
    assert e.message.startswith(message)
    assert e.sqlstate == "22023"


@pytest.mark.parametrize(
    "key",
    ["x", "y", "sample_weight", "validation_split", "validation_data", "workers",
     "use_multiprocessing", "validation_freq"],
)
def test_fit_params_forbidden_keys(key):
    e = err(parse_fit_params, f"{key}=1")
    assert e.message == f"fit_params: {key} is not allowed"
    assert e.hint


@FUZZ
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "batch_size": st.integers(1, 10**6),
            "epochs": st.integers(1, 1000),
            "shuffle": st.booleans(),
            "class_weight": st.dictionaries(
                st.integers(0, 20), st.floats(0, 1e6, allow_nan=False), max_size=4
            ),
            "verbose": st.sampled_from([0, 1, 2, "auto"]),
        },
    )
)
def test_fit_params_round_trip(d):
    text = ", ".join(f"{k}={render_literal(v)}" for k, v in d.items())
    fp = parse_fit_params(text)
    for k, v in d.items():
        assert getattr(fp, k) == v
    again = parse_fit_params(fp.canonical())
    assert again == fp and again.canonical() == fp.canonical()


# ------------------------------------------------------------------------------------------
# automl_params
# ------------------------------------------------------------------------------------------


def test_generic_automl_params():
    defaults = {"eta": 3, "min_r": 1.0, "flag": False, "mode": "min", "anything": None}
    out = parse_automl_params("ETA=4, min_r=2, flag=True, anything=[1]", "asha", defaults)
    assert out == {"eta": 4, "min_r": 2.0, "flag": True, "mode": "min", "anything": [1]}
    assert "must be a number" in err(parse_automl_params, "min_r='a'", "asha", defaults).message
    assert "True or False" in err(parse_automl_params, "flag=1", "asha", defaults).message
    assert "must be a string" in err(parse_automl_params, "mode=1", "asha", defaults).message
    assert "must be an integer" in err(parse_automl_params, "eta=True", "asha", defaults).message
    e = err(parse_automl_params, "foo=1", "ASHA", defaults)
    assert e.message == "automl_params: unknown key 'foo' for asha"
    assert e.hint == "allowed keys: eta, min_r, flag, mode, anything"
    assert "name 'tpe'" in err(parse_automl_params, "mode=tpe", "asha", defaults).message
    assert parse_automl_params("mode=tpe", "asha", defaults, bare_name_keys=("mode",))[
        "mode"] == "tpe"


def _tuner_params(method):
    """``automl_params`` text -> a tuner of ``method`` (parsed and checked by the tuner)."""
    from cerebro_db.automl.registry import get_tuner

    grid = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.1]}]}"
    return lambda text: get_tuner(method, text, model_ids=[1], compile_grid=grid,
                                  fit_grid="{'batch_size': [8]}", num_workers=1,
                                  random_state=1)


# ------------------------------------------------------------------------------------------
# every parameter-string parser under fuzz: only CerebroError, never any evaluation
# ------------------------------------------------------------------------------------------


def _warm_up() -> None:
    """Import what the parsers import lazily (Keras' optimizer list, the policies), so
    module loading (which execs module code) happens before the guard is on."""
    from cerebro_db import configs
    from cerebro_db.entrypoints.training import _policy

    parse_compile_params("loss='mse', optimizer='SGD(lr=0.1)', metrics=['mae']")
    configs.generate_model_configs("{'loss': ['mse'], 'optimizer_params_list': "
                                   "[{'optimizer': ['SGD'], 'lr': [0.1]}]}",
                                   "{'batch_size': [8]}", "random", 2, 1)
    for name in policy_names():
        _policy(name, None, 1)
    for method in ("hyperband", "hyperopt"):
        _tuner_params(method)(None)


@contextlib.contextmanager
def _no_evaluation():
    """Fail if anything evals, execs, compiles to code or imports a module by name while
    the block runs (hypothesis examples cannot use the function-scoped fixture)."""
    real_compile, real_import = builtins.compile, builtins.__import__
    saved = builtins.eval, builtins.exec, builtins.compile, builtins.__import__

    def guarded_compile(source, filename, mode, flags=0, *args, **kwargs):
        assert flags & ast.PyCF_ONLY_AST, "compile() to code object called"
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    def guarded_import(name, *args, **kwargs):
        assert name.split(".")[0] not in ("os", "subprocess", "shutil", "socket", "ctypes"), \
            f"imported {name}"
        return real_import(name, *args, **kwargs)

    _warm_up()
    builtins.eval, builtins.exec = forbidden, forbidden
    builtins.compile, builtins.__import__ = guarded_compile, guarded_import
    try:
        yield
    finally:
        builtins.eval, builtins.exec, builtins.compile, builtins.__import__ = saved


def _policy_parse(text):
    from cerebro_db.entrypoints.training import _policy

    for name in policy_names():
        with contextlib.suppress(CerebroError):
            _policy(name, text, 7)


def _grid_parse(text):
    from cerebro_db import configs

    for which in ("compile", "fit"):
        with contextlib.suppress(CerebroError):
            configs.parse_grid(text, which)
    for search, n in (("grid", None), ("random", 3)):
        with contextlib.suppress(CerebroError):
            configs.generate_model_configs(text, "{'batch_size': [8]}", search, n, 1)
        with contextlib.suppress(CerebroError):
            configs.generate_model_configs("{'loss': ['mse'], 'optimizer_params_list': "
                                           "[{'optimizer': ['SGD']}]}", text, search, n, 1)


_PARSERS = (
    parse_compile_params,
    parse_fit_params,
    _tuner_params("hyperband"),
    _tuner_params("hyperopt"),
    lambda t: parse_keyword_string(t, "policy_params"),
    _policy_parse,
    _grid_parse,
)

_HOSTILE = [
    "__import__('os').system('true')", "lambda: 0", "(lambda x: x)(1)", "f'{1}'",
    "keras.losses.__class__", "().__class__.__bases__[0]", "open('/etc/passwd')",
    "[" * 40 + "]" * 40, "1e309", "-1e309", "float('nan')", "nan", "inf", "'x' * 10**9",
    "10**10**10", "$$", ";", "--", '"', "'", "DROP TABLE t", "{1: 2}", "{'a': {'b': [1]}}",
    "[x for x in ()]", "exec('1')", "globals()", "__builtins__", "(1,)", "{1, 2}", "...",
]

_grid_tokens = st.lists(
    st.sampled_from(_TOKENS + _HOSTILE + [
        "'loss'", "'optimizer_params_list'", "'batch_size'", "'epochs'", "'lr'",
        "'optimizer'", "'metrics'", "['mse']", "[8, 16]", "{'optimizer': ['SGD']}",
        "{'lr': [0.1, 0.01]}", "('log', 1e-4, 1e-1)", "'uniform'", "'log_uniform'",
        "'reset_optimizer_per_hop'", "prefer_lagging", "seeded_order", "R", "eta",
        "skip_last", "num_configs", "algorithm",
    ]),
    max_size=30,
).map("".join)


@FUZZ
@given(st.one_of(st.text(max_size=200), _grid_tokens,
                 st.lists(st.sampled_from(_HOSTILE), min_size=1, max_size=4).map(", ".join),
                 st.builds(lambda k, v: f"{k}={v}",
                           st.sampled_from(["loss", "optimizer", "metrics", "batch_size",
                                            "epochs", "class_weight", "R", "eta",
                                            "prefer_lagging", "reset_optimizer_per_hop",
                                            "num_configs", "algorithm"]),
                           st.sampled_from(_HOSTILE))))
def test_fuzz_every_parser_only_cerebro_error_never_evaluates(text):
    """compile_params, fit_params, automl_params, policy_params and both search grids:
    any text either parses or raises CerebroError, and nothing in it is ever run."""
    with _no_evaluation():
        for fn in _PARSERS:
            with contextlib.suppress(CerebroError):
                fn(text)


@pytest.mark.parametrize("text", _HOSTILE)
def test_hostile_strings_are_refused_by_every_parser(text):
    """Each hostile literal, as the value of a key each parser knows, is refused with a
    CerebroError (not accepted, not another exception)."""
    from cerebro_db import configs
    from cerebro_db.entrypoints.training import _policy

    with _no_evaluation():
        for fn in (
            lambda: parse_compile_params(f"loss={text}, optimizer='SGD'"),
            lambda: parse_fit_params(f"batch_size={text}"),
            lambda: _tuner_params("hyperband")(f"R={text}"),
            lambda: _policy("ring", f"reset_optimizer_per_hop={text}", 1),
            lambda: configs.parse_grid(f"{{'batch_size': {text}}}", "fit"),
        ):
            err(fn)


def test_no_evaluation_guard_catches_evaluation():
    """The guard above is not vacuous: eval, exec and importing os inside it fail."""
    with pytest.raises(AssertionError), _no_evaluation():
        builtins.eval("1")
    with pytest.raises(AssertionError), _no_evaluation():
        builtins.exec("x = 1")  # noqa: S102 - the guard must stop it
    with pytest.raises(AssertionError), _no_evaluation():
        builtins.__import__("os")


# ---------------------------------------------------------------- Keras 2 arguments (MADlib)


@requires_keras
def test_keras2_decay_is_an_inverse_time_schedule():
    spec = parse_optimizer_spec("SGD(lr=0.01, decay=1e-6, nesterov=True)")
    assert spec.decayed and spec.kwargs == {"learning_rate": 0.01, "decay": 1e-6, "nesterov": True}
    opt = spec.to_keras()
    for step in (0, 1, 10, 1000):  # Keras 2: lr / (1 + decay * iterations)
        assert float(opt.learning_rate_schedule(step) if hasattr(opt, "learning_rate_schedule")
                     else opt._learning_rate(step)) == pytest.approx(0.01 / (1 + 1e-6 * step))
    assert not parse_optimizer_spec("SGD(lr=0.01, decay=0)").decayed  # Keras 2's default
    assert parse_optimizer_spec("SGD(decay=0.0)") == parse_optimizer_spec("SGD")
    assert parse_optimizer_spec("SGD(decay=0.1)") != parse_optimizer_spec("SGD(decay=0.2)")


@requires_keras
def test_keras2_decay_per_step_as_keras2():
    """Three SGD steps on a 1-weight linear model follow w -= lr/(1+decay*t) * grad."""
    import keras
    import numpy as np

    cp = parse_compile_params("optimizer=SGD(lr=0.1, decay=0.5), loss='mse'")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False,
                                                                    kernel_initializer="ones")])
    model.compile(**cp.to_keras())
    x = np.array([[1.0]], dtype="float32")
    y = np.array([[0.0]], dtype="float32")
    w = 1.0
    for t in range(3):
        model.train_on_batch(x, y)
        w -= 0.1 / (1 + 0.5 * t) * 2 * w  # d/dw (w*1 - 0)^2
        assert float(model.weights[0].numpy()[0, 0]) == pytest.approx(w, rel=1e-6)


@requires_keras
def test_keras2_epsilon_none_and_integer_arguments():
    spec = parse_optimizer_spec("Adam(lr=1, epsilon=None)")
    assert spec.kwargs == {"learning_rate": 1.0, "epsilon": 1e-7}
    assert isinstance(spec.to_keras().epsilon, float)
    assert parse_optimizer_spec("SGD(lr=1, momentum=0)").to_keras().momentum == 0.0
    assert parse_optimizer_spec("SGD(lr=1)") == parse_optimizer_spec("SGD(lr=1.0)")


@requires_keras
def test_keras2_sample_weight_mode_is_accepted_and_ignored():
    a = parse_compile_params("optimizer='adam', loss='mse', sample_weight_mode=None")
    b = parse_compile_params("optimizer='adam', loss='mse', sample_weight_mode='temporal'")
    assert a == b == parse_compile_params("optimizer='adam', loss='mse'")
    assert "sample_weight_mode" not in a.to_keras()
    e = err(parse_compile_params, "optimizer='adam', loss='mse', sample_weight_mode='x'")
    assert "sample_weight_mode must be None or 'temporal'" in e.message


def test_fit_params_initial_epoch_and_steps_per_epoch():
    fp = parse_fit_params("batch_size=4, epochs=3, initial_epoch=1, steps_per_epoch=2")
    assert fp.passes == 2 and fp.steps_per_epoch == 2
    assert fp.to_keras()["steps_per_epoch"] == 2
    assert parse_fit_params("epochs=2, initial_epoch=0") == parse_fit_params("epochs=2")
    e = err(parse_fit_params, "epochs=2, initial_epoch=2")
    assert e.message == "fit_params: initial_epoch must be less than epochs (2), got 2"
    assert "at least 1" in err(parse_fit_params, "steps_per_epoch=0").message


def test_tensorboard_callback_and_log_dir_confinement(tmp_path):
    from cerebro_db.params import confine_log_dir

    fp = parse_fit_params("batch_size=4, callbacks=[TensorBoard(log_dir='/tmp/logs/fit', "
                          "histogram_freq=1)]")
    assert fp.callbacks == ("TensorBoard",)
    assert dict(fp.tensorboard) == {"log_dir": "/tmp/logs/fit", "histogram_freq": 1}
    assert parse_fit_params(fp.canonical()) == fp
    assert dict(parse_fit_params("callbacks=[TensorBoard()]").tensorboard) == {"log_dir": "logs"}
    for bad, words in (("callbacks=[ModelCheckpoint(filepath='x')]", "is not allowed"),
                       ("callbacks=[TensorBoard(profile_batch=2)]", "no argument"),
                       ("callbacks=[TensorBoard(log_dir=3)]", "must be a str"),
                       ("callbacks=[TensorBoard(histogram_freq=True)]", "must be a int")):
        assert words in err(parse_fit_params, bad).message, bad
    base = tmp_path / "tb"
    base.mkdir()
    (base / "out").symlink_to(tmp_path)
    assert confine_log_dir("run1", str(base)) == str(base / "run1")
    assert confine_log_dir(str(base / "a" / ".." / "b"), str(base)) == str(base / "b")
    for bad in ("/etc", "../x", "a/../../x", "out/x", str(base) + "2"):
        e = err(confine_log_dir, bad, str(base))
        assert e.sqlstate == "42501" and "outside" in e.message, bad
    e = err(confine_log_dir, "run1", None)
    assert e.sqlstate == "42501" and "cerebro_db.tensorboard_log_dir" in e.hint


def test_callbacks_as_a_string_holding_the_list_as_madlibs_grids_write_them():
    """madlib_keras_automl.sql_in: {'callbacks': ['[TensorBoard(log_dir="/tmp/x/")]']} makes
    callbacks='[TensorBoard(...)]', which MADlib splices into its fit call: the string is the
    list."""
    from cerebro_db.configs import generate_model_configs

    fp = parse_fit_params("""batch_size=4, callbacks='[TensorBoard(log_dir="/tmp/x/")]'""")
    assert fp == parse_fit_params("batch_size=4, callbacks=[TensorBoard(log_dir='/tmp/x/')]")
    assert dict(fp.tensorboard) == {"log_dir": "/tmp/x/"}
    (_, fit), = generate_model_configs(
        "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD']}]}",
        """{'batch_size': [50], 'callbacks': ['[TensorBoard(log_dir="/tmp/x/")]']}""")
    assert parse_fit_params(fit).callbacks == ("TensorBoard",)
    assert "is not allowed" in err(parse_fit_params, "callbacks='[EarlyStopping()]'").message


def test_static_float_arguments_equal_keras():
    """The coordinator converts integer float arguments without Keras: its static list is
    Keras' own (every optimizer argument whose default is a float)."""
    import inspect

    keras = pytest.importorskip("keras")
    want = set()
    for n in dir(keras.optimizers):
        c = getattr(keras.optimizers, n)
        if inspect.isclass(c) and issubclass(c, keras.optimizers.Optimizer):
            want |= {p.name for p in inspect.signature(c.__init__).parameters.values()
                     if isinstance(p.default, float)}
    assert params._STATIC_FLOAT_ARGS == want


@pytest.mark.parametrize("loss", ["sparse_categorical_crossentropy",
                                  "categorical_crossentropy"])
def test_class_metrics_measure_the_labels_the_loss_takes(loss):
    """The worker gives a sparse loss class indices (the one-hot rows' argmax): a
    categorical metric beside it read 0 (an outside pass), and sparse metrics beside a
    categorical loss failed inside the workers. Each now measures what its name says, under
    the name given."""
    keras = pytest.importorskip("keras")
    names = ["categorical_accuracy", "sparse_categorical_accuracy",
             "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy", "accuracy"]
    cp = parse_compile_params(f"loss='{loss}', optimizer='SGD', metrics={names!r}")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="softmax")])
    model.compile(**cp.to_keras())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 4)).astype("float32")
    onehot = np.eye(6, dtype="float32")[rng.integers(0, 6, 64)]
    y = onehot.argmax(1) if "sparse" in loss else onehot
    got = model.evaluate(x, y, verbose=0, return_dict=True)
    pred = model.predict(x, verbose=0)
    acc = float((pred.argmax(1) == onehot.argmax(1)).mean())
    top5 = float(np.mean([t in np.argsort(-p)[:5] for p, t in zip(pred, onehot.argmax(1))]))
    for name in names:
        want = top5 if "top_k" in name else acc
        assert got[name] == pytest.approx(want), (name, got)


@pytest.mark.parametrize("weights", ["[1.0, 0.5]", "{'a': 1.0, 'b': 0.5}"])
def test_one_loss_with_weights_per_output(weights):
    """One loss string applies to every output, and loss_weights weigh them (tf.keras 2's
    rule; an outside pass found Keras 3 refusing it inside the workers)."""
    keras = pytest.importorskip("keras")
    cp = parse_compile_params(f"loss='mse', optimizer='SGD', loss_weights={weights}")
    x = keras.Input((3,))
    model = keras.Model(x, {"a": keras.layers.Dense(1, name="a")(x),
                            "b": keras.layers.Dense(2, name="b")(x)})
    model.compile(**cp.to_keras())
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(16, 3)).astype("float32")
    ya, yb = rng.normal(size=(16, 1)), rng.normal(size=(16, 2))
    got = model.evaluate(xs, {"a": ya, "b": yb}, verbose=0, return_dict=True)
    pa, pb = (model.predict(xs, verbose=0)[k] for k in ("a", "b"))
    want = np.mean((pa - ya) ** 2) + 0.5 * np.mean((pb - yb) ** 2)
    assert got["loss"] == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("text", ["callbacks=[TerminateOnNaN()]", "callbacks='[TerminateOnNaN()]'",
                                  "callbacks=['TerminateOnNaN']"])
def test_terminate_on_nan_in_keras_own_spelling(text):
    """An outside pass: callbacks=[TerminateOnNaN()] was refused with a hint that listed
    TerminateOnNaN as allowed."""
    assert parse_fit_params(text).callbacks == ("TerminateOnNaN",)
    e = err(parse_fit_params, "callbacks=[TerminateOnNaN(x=1)]")
    assert e.sqlstate == "22023" and "takes no arguments" in e.message
