"""References to custom functions: parsed as literals, checked against the granted modules,
resolved only when allowed (no database)."""
from __future__ import annotations

from cerebro_db import custom_functions as cf
from cerebro_db.params import parse_compile_params

from ..helpers import cerebro_error as err
from ..helpers import requires_keras


def test_parse_reference():
    r = cf.parse_reference("pkg.losses:focal(gamma=2.0, name='f')")
    assert (r.module, r.attr, r.kwargs) == ("pkg.losses", "focal", {"gamma": 2.0, "name": "f"})
    assert cf.parse_reference(cf.top_k_reference(3)).builtin
    for bad, words in (("pkg", "module.path:name"), ("pkg:", "name an object"),
                       ("pkg:a.b", "name an object"), ("pkg:_x", "private"),
                       ("pkg:f(1)", "keyword arguments only"),
                       ("pkg:f(x=__import__('os'))", "literal"), ("1pkg:f", "module.path"),
                       ("builtin:system", "unknown built-in"), ("", "non-empty")):
        e = err(cf.parse_reference, bad)
        assert words in e.message and e.sqlstate in ("22023", "42601"), (bad, e.message)


def test_module_grants_cover_submodules_only():
    assert cf.module_allowed("pkg", ["pkg"]) and cf.module_allowed("pkg.a.b", ["pkg"])
    assert not cf.module_allowed("pkgx", ["pkg"]) and not cf.module_allowed("os", ["pkg"])
    e = err(cf.require_allowed, cf.parse_reference("os:system"), ["pkg"], "x")
    assert e.sqlstate == "42501" and "custom_function_modules" in e.hint
    cf.require_allowed(cf.parse_reference("builtin:top_k_accuracy(k=2)"), [], "top_2_accuracy")


@requires_keras
def test_resolve_and_keras_objects():
    import keras

    fn = cf.resolve(cf.parse_reference("keras.losses:categorical_crossentropy"), "ce")
    assert fn is keras.losses.categorical_crossentropy
    bound = cf.resolve(cf.parse_reference("keras.metrics:top_k_categorical_accuracy(k=2)"), "t")
    assert bound.keywords == {"k": 2}
    metric = cf.keras_object("keras.metrics:top_k_categorical_accuracy(k=2)", "my_top2", "metric")
    assert isinstance(metric, keras.metrics.Metric) and metric.name == "my_top2"
    top = cf.keras_object(cf.top_k_reference(3), "top_3_accuracy", "metric")
    assert isinstance(top, keras.metrics.TopKCategoricalAccuracy) and top.k == 3
    assert "cannot import" in err(cf.resolve, cf.parse_reference("no_such_mod:f"), "x").message
    assert "not a callable" in err(cf.resolve, cf.parse_reference("keras:version_missing"),
                                   "x").message


@requires_keras
def test_compile_params_carry_the_references_they_use():
    cp = parse_compile_params("loss='my_loss', optimizer='Adam', metrics=['top_3_accuracy', "
                              "'accuracy']")
    refs = {"my_loss": "keras.losses:mean_squared_error", "top_3_accuracy":
            cf.top_k_reference(3), "unused": "pkg:f"}
    c2 = cp.with_custom(refs)
    assert dict(c2.custom) == {k: refs[k] for k in ("my_loss", "top_3_accuracy")}
    assert c2 != cp and "custom=" in c2.canonical()
    kw = c2.to_keras()
    assert callable(kw["loss"]) and kw["metrics"][1] == "accuracy"
    assert kw["metrics"][0].name == "top_3_accuracy"
