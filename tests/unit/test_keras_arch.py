"""Unit tests for cerebro_db.keras_arch: both JSON dialects, errors, shapes and weights.

The tf.keras 2.x fixtures under tests/fixtures/keras2 are written in the exact format that
``model.to_json()`` of the named Keras version emits (key order, dtype strings, initializer
objects without module keys, ``batch_input_shape`` on the first layer, the old bare-list
Sequential config, list-of-lists ``inbound_nodes``). Expected parameter counts are computed by
hand in FIXTURES.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cerebro_db import keras_arch as ka  # imports no TensorFlow
from cerebro_db.errors import CerebroError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
keras = pytest.importorskip("keras")

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "keras2"

# name -> (params, input shapes, output shapes, model type); params computed by hand.
FIXTURES: dict[str, tuple[int, list[tuple], list[tuple], str]] = {
    # tf 2.1: Dense 784->128 (100480) ->64 (8256) ->10 (650), batch_input_shape on a Dense
    "mlp_batch_input_shape": (100480 + 8256 + 650, [(784,)], [(10,)], "Sequential"),
    # tf 2.2 MNIST CNN: conv 3x3x1x32+32=320, conv 3x3x32x64+64=18496, pool -> 12x12x64=9216,
    # dense 9216x128+128=1179776, dense 128x10+10=1290
    "cnn_mnist": (320 + 18496 + 1179776 + 1290, [(28, 28, 1)], [(10,)], "Sequential"),
    # tf 2.4 iris with explicit InputLayer: 4x10+10=50, 10x10+10=110, 10x3+3=33
    "mlp_input_layer": (50 + 110 + 33, [(4,)], [(3,)], "Sequential"),
    # tf 2.5: dense 20x32+32=672 (L2), batchnorm 4x32=128, dense 32x16+16=528 (L1L2, MaxNorm),
    # dense 16x1+1=17
    "mlp_l2_regularizer": (672 + 128 + 528 + 17, [(20,)], [(1,)], "Sequential"),
    # Keras 2.1.6 bare-list Sequential (MADlib's iris test format): same sizes as iris above
    "sequential_bare_list": (50 + 110 + 33, [(4,)], [(3,)], "Sequential"),
    # tf 2.4: embedding 1000x16=16000, lstm 4x(16x32+32x32+32)=6272, dense 32+1=33
    "lstm_embedding": (16000 + 6272 + 33, [(20,)], [(1,)], "Sequential"),
    # tf 1.x "Model" (2.2.4-tf) two inputs, two outputs: 4x8+8=40, 3x8+8=32,
    # concat(16)x3+3=51, 8x1+1=9
    "functional_multi_io": (40 + 32 + 51 + 9, [(4,), (3,)], [(3,), (1,)], "Functional"),
    # tf 2.4 "Functional": conv 3x3x1x8+8=80, global average pool, dense 8x10+10=90
    "functional_cnn": (80 + 90, [(28, 28, 1)], [(10,)], "Functional"),
}


def fixture_text(name: str) -> str:
    return (FIXTURE_DIR / f"{name}.json").read_text()


def raises(text: Any, sqlstate: str) -> CerebroError:
    with pytest.raises(CerebroError) as info:
        ka.load_model(text)
    assert info.value.sqlstate == sqlstate, info.value.message
    return info.value


def keras2_sequential(layers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"class_name": "Sequential", "config": {"name": "s", "layers": layers},
            "keras_version": "2.4.0", "backend": "tensorflow"}


def keras3_mlp() -> Any:
    return keras.Sequential(
        [
            keras.Input(shape=(8,)),
            keras.layers.Dense(
                16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)
            ),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(3, activation="softmax"),
        ],
        name="k3_mlp",
    )


# --------------------------------------------------------------------------- Keras 2 fixtures


def test_fixture_set_is_complete() -> None:
    assert sorted(p.stem for p in FIXTURE_DIR.glob("*.json")) == sorted(FIXTURES)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_keras2_fixture_loads(name: str) -> None:
    params, inputs, outputs, kind = FIXTURES[name]
    text = fixture_text(name)
    assert ka.detect_dialect(json.loads(text)) == ka.KERAS2
    model = ka.load_model(text)
    assert isinstance(model, keras.Model)
    assert ka.count_params(model) == params
    assert model.count_params() == params
    assert ka.input_shapes(model) == inputs
    assert ka.output_shapes(model) == outputs
    assert ka.model_type_name(model) == kind
    assert len(ka.weights_to_bytes(model)) == 4 * params
    # the model runs on a batch of the declared input shape
    batch = [np.zeros((2,) + s, dtype="float32") for s in inputs]
    result = model.predict(batch if len(batch) > 1 else batch[0], verbose=0)
    result = result if isinstance(result, list) else [result]
    assert [r.shape[1:] for r in result] == outputs


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_keras2_conversion_is_plain_keras3(name: str) -> None:
    """The converted JSON loads with Keras 3's own model_from_json and is module-keyed."""
    converted = ka.to_keras3_json(fixture_text(name))
    arch = json.loads(converted)
    assert "keras_version" not in arch
    assert ka.detect_dialect(arch) == ka.KERAS3
    assert "batch_input_shape" not in converted
    layers = arch["config"]["layers"]
    assert layers[0]["class_name"] == "InputLayer"
    for layer in layers:
        assert layer["module"] == "keras.layers" and "registered_name" in layer
    model = keras.models.model_from_json(converted)
    assert model.count_params() == FIXTURES[name][0]
    # conversion of Keras 3 output is the identity
    assert ka.to_keras3_json(converted) == converted


def test_dense_batch_input_shape_becomes_2d_input() -> None:
    arch = json.loads(ka.to_keras3_json(fixture_text("mlp_batch_input_shape")))
    first, second = arch["config"]["layers"][:2]
    assert first["class_name"] == "InputLayer"
    assert first["config"]["batch_shape"] == [None, 784]
    assert first["config"]["name"] == "dense_input"
    assert second["class_name"] == "Dense"
    assert second["config"]["activation"] == "relu"
    assert second["config"]["kernel_initializer"] == {
        "module": "keras.initializers", "class_name": "GlorotUniform",
        "config": {"seed": None}, "registered_name": None,
    }
    model = ka.load_model(fixture_text("mlp_batch_input_shape"))
    assert tuple(model.inputs[0].shape) == (None, 784)
    assert len(model.inputs) == 1


def test_explicit_input_layer_is_not_duplicated() -> None:
    arch = json.loads(ka.to_keras3_json(fixture_text("mlp_input_layer")))
    classes = [layer["class_name"] for layer in arch["config"]["layers"]]
    assert classes == ["InputLayer", "Dense", "Dense", "Dense"]
    assert arch["config"]["layers"][0]["config"]["batch_shape"] == [None, 4]


def test_regularizers_constraints_and_batchnorm_converted() -> None:
    model = ka.load_model(fixture_text("mlp_l2_regularizer"))
    dense, bn, dense_1, _ = model.layers
    assert isinstance(dense.kernel_regularizer, keras.regularizers.L2)
    assert dense.kernel_regularizer.get_config()["l2"] == pytest.approx(0.001)
    assert isinstance(dense_1.kernel_regularizer, keras.regularizers.L1L2)
    assert dense_1.kernel_regularizer.get_config()["l2"] == pytest.approx(0.01)
    assert isinstance(dense_1.kernel_constraint, keras.constraints.MaxNorm)
    assert bn.axis == 1
    assert len(model.trainable_weights) == 8  # BN moving stats are not trainable
    assert len(model.losses) == 2  # both regularizers are active


def test_old_initializer_forms_converted() -> None:
    model = ka.load_model(fixture_text("sequential_bare_list"))
    # Keras 2's VarianceScaling "normal" was a truncated normal
    assert model.layers[1].kernel_initializer.get_config()["distribution"] == "truncated_normal"
    assert model.layers[0].kernel_initializer.get_config()["seed"] == 0
    assert model.name == "sequential"


def test_embedding_lstm_options_converted() -> None:
    model = ka.load_model(fixture_text("lstm_embedding"))
    emb, lstm, _ = model.layers
    assert emb.input_dim == 1000 and emb.output_dim == 16
    assert lstm.units == 32


def test_functional_multi_io_graph() -> None:
    model = ka.load_model(fixture_text("functional_multi_io"))
    assert [t.name for t in model.inputs] == ["input_1", "input_2"]
    assert [layer.name for layer in model.layers][-2:] == ["dense_2", "dense_3"]
    # initializer configs carried a dtype key in tf 1.x; it is dropped
    assert "dtype" not in model.get_layer("dense").kernel_initializer.get_config()


def test_keras2_with_module_keys_is_converted() -> None:
    """Keras 2.13+ JSON already has module keys but still uses batch_input_shape."""
    arch = {
        "module": "keras", "class_name": "Sequential", "registered_name": None,
        "config": {"name": "sequential", "layers": [{
            "module": "keras.layers", "class_name": "Dense", "registered_name": None,
            "config": {"name": "dense", "trainable": True, "batch_input_shape": [None, 5],
                       "dtype": "float32", "units": 2, "activation": "linear",
                       "kernel_initializer": {"module": "keras.initializers",
                                              "class_name": "GlorotUniform",
                                              "config": {"seed": None}, "registered_name": None}},
            "build_config": {"input_shape": [None, 5]}}]},
        "keras_version": "2.13.1", "backend": "tensorflow",
    }
    assert ka.detect_dialect(arch) == ka.KERAS2
    model = ka.load_model(arch)
    assert ka.input_shapes(model) == [(5,)]
    assert ka.count_params(model) == 12


def test_keras2_input_dim_and_build_input_shape() -> None:
    base = {"class_name": "Sequential", "keras_version": "2.2.4", "backend": "tensorflow"}
    by_dim = dict(base, config={"name": "s", "layers": [
        {"class_name": "Dense", "config": {"name": "d", "units": 2, "input_dim": 7}}]})
    assert ka.input_shapes(ka.load_model(by_dim)) == [(7,)]
    built = dict(base, config={"name": "s", "build_input_shape": [None, 6], "layers": [
        {"class_name": "Dense", "config": {"name": "d", "units": 2}}]})
    assert ka.input_shapes(ka.load_model(built)) == [(6,)]
    shape_obj = dict(base, config={"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"name": "i", "batch_input_shape": {
            "class_name": "TensorShape", "items": [None, 3]}}},
        {"class_name": "Dense", "config": {"name": "d", "units": 2}}]})
    assert ka.input_shapes(ka.load_model(shape_obj)) == [(3,)]


def test_keras2_renamed_and_dropped_options() -> None:
    arch = {"class_name": "Sequential", "keras_version": "2.4.0", "backend": "tensorflow",
            "config": {"name": "s", "layers": [
                {"class_name": "Dense", "config": {"name": "d", "units": 4, "dynamic": False,
                                                   "batch_input_shape": [None, 3]}},
                {"class_name": "LeakyReLU", "config": {"name": "lr", "alpha": 0.2}},
                {"class_name": "ThresholdedReLU", "config": {"name": "tr", "theta": 0.5}},
                {"class_name": "BatchNormalization", "config": {"name": "bn", "axis": [1],
                                                                "fused": None}}]}}
    model = ka.load_model(arch)
    assert model.get_layer("lr").negative_slope == pytest.approx(0.2)
    assert isinstance(model.get_layer("tr"), keras.layers.ReLU)
    assert model.get_layer("tr").threshold == pytest.approx(0.5)


# --------------------------------------------------------------------------- Keras 3


def test_keras3_sequential_round_trip() -> None:
    original = keras3_mlp()
    text = original.to_json()
    assert ka.detect_dialect(json.loads(text)) == ka.KERAS3
    assert ka.to_keras3_json(text) == text  # passes through unchanged
    model = ka.load_model(text)
    assert ka.count_params(model) == original.count_params() == 8 * 16 + 16 + 16 * 3 + 3
    assert json.loads(model.to_json()) == json.loads(original.to_json())
    assert ka.input_shapes(model) == [(8,)]
    assert ka.output_shapes(model) == [(3,)]
    assert ka.model_type_name(model) == "Sequential"


def test_keras3_functional_round_trip() -> None:
    a = keras.Input(shape=(4,), name="a")
    b = keras.Input(shape=(2, 3), name="b")
    x = keras.layers.Concatenate()([keras.layers.Dense(5)(a), keras.layers.Flatten()(b)])
    original = keras.Model([a, b], [keras.layers.Dense(2)(x), keras.layers.Dense(1)(x)])
    model = ka.load_model(original.to_json())
    assert json.loads(model.to_json()) == json.loads(original.to_json())
    assert ka.count_params(model) == original.count_params() == 25 + 24 + 12
    assert ka.input_shapes(model) == [(4,), (2, 3)]
    assert ka.output_shapes(model) == [(2,), (1,)]
    assert ka.model_type_name(model) == "Functional"


def test_accepts_parsed_dict_and_bytes() -> None:
    text = keras3_mlp().to_json()
    assert ka.count_params(ka.load_model(json.loads(text))) == 195
    assert ka.count_params(ka.load_model(text.encode())) == 195
    assert ka.count_params(ka.load_model(json.loads(fixture_text("mlp_input_layer")))) == 193


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("text", ["{not json", "", "   ", '{"class_name": "Sequential",'])
def test_not_json(text: str) -> None:
    err = raises(text, "22P02")
    assert err.message.startswith("model_arch is not valid JSON: ")
    assert not err.message.endswith(".")


def test_null_arch() -> None:
    raises(None, "22004")


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        "[]",
        "42",
        '"Sequential"',
        "null",
        '{"class_name": "Dense", "config": {"units": 3}}',
        '{"class_name": "Sequential"}',
        '{"class_name": "Sequential", "config": 3, "keras_version": "2.4.0"}',
        '{"class_name": "Model", "config": {"layers": []}, "keras_version": "2.4.0"}',
    ],
)
def test_json_that_is_not_a_model(text: str) -> None:
    err = raises(text, "22023")
    assert err.message == "model_arch is not a Keras model"
    assert err.detail


def test_keras3_layer_json_is_not_a_model() -> None:
    layer_json = json.dumps(keras.saving.serialize_keras_object(keras.layers.Dense(3)))
    err = raises(layer_json, "22023")
    assert "Dense" in (err.detail or "")


def test_keras_error_goes_to_detail() -> None:
    arch = keras2_sequential([{"class_name": "Dense", "config": {
        "name": "d", "units": 3, "bogus_option": 1, "batch_input_shape": [None, 3]}}])
    err = raises(arch, "22023")
    assert err.message == "model_arch is not a valid Keras model"
    assert "bogus_option" in (err.detail or "")
    unknown = keras2_sequential([{"class_name": "NoSuchLayer", "config": {
        "name": "d", "batch_input_shape": [None, 3]}}])
    err = raises(unknown, "22023")
    assert "NoSuchLayer" in (err.detail or "")


def test_model_without_input_shape() -> None:
    keras2 = {"class_name": "Sequential", "keras_version": "2.4.0", "backend": "tensorflow",
              "config": {"name": "s", "layers": [
                  {"class_name": "Dense", "config": {"name": "d", "units": 3}}]}}
    keras3 = keras.Sequential([keras.layers.Dense(3)]).to_json()
    for text in (keras2, keras3):
        err = raises(text, "22023")
        assert err.message == "model_arch does not define an input shape"
        assert err.hint and err.hint.startswith("give the first layer an input shape")


def test_code_carrying_layers_are_refused() -> None:
    lambda_layer = {"class_name": "Sequential", "keras_version": "2.4.0", "config": {
        "name": "s", "layers": [{"class_name": "Lambda", "config": {
            "name": "l", "function": ["4wEAAAAAAAAA", None, None], "function_type": "lambda",
            "batch_input_shape": [None, 3]}}]}}
    err = raises(lambda_layer, "0A000")
    assert "Lambda" in err.message
    foreign = json.loads(keras3_mlp().to_json())
    foreign["config"]["layers"][1]["module"] = "os.path"
    err = raises(foreign, "0A000")
    assert "os.path" in err.message


def test_unsupported_keras2_option_is_reported() -> None:
    arch = keras2_sequential([{"class_name": "LSTM", "config": {
        "name": "l", "units": 2, "time_major": True, "batch_input_shape": [None, 5, 3]}}])
    err = raises(arch, "0A000")
    assert "time_major" in err.message


# --------------------------------------------------------------------------- normalize / cache


def test_normalize_arch_stores_original_text() -> None:
    text = fixture_text("mlp_input_layer")
    stored, model = ka.normalize_arch(text)
    assert stored == text
    assert ka.count_params(model) == 193
    stored, _ = ka.normalize_arch(json.loads(text))
    assert json.loads(stored) == json.loads(text)


def test_build_from_json_fresh_and_shared() -> None:
    text = fixture_text("mlp_input_layer")
    a, b = ka.build_from_json(text), ka.build_from_json(text)
    assert a is not b
    a.set_weights([np.ones_like(w) for w in a.get_weights()])
    assert not np.allclose(b.get_weights()[0], 1.0)
    shared = ka.build_from_json(text, shared=True)
    assert ka.build_from_json(text, shared=True) is shared
    assert shared is not a


# --------------------------------------------------------------------------- weights


def test_weights_round_trip() -> None:
    model = ka.load_model(fixture_text("mlp_l2_regularizer"))
    data = ka.weights_to_bytes(model)
    assert isinstance(data, bytes)
    assert len(data) == 4 * ka.count_params(model)
    weights = ka.bytes_to_weights(model, data)
    assert [w.shape for w in weights] == [w.shape for w in model.get_weights()]
    assert all(w.dtype == np.float32 for w in weights)
    for got, want in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert ka.weights_to_bytes(weights) == data
    # the arrays are writable copies, usable by set_weights
    weights[0][...] = 0.5
    other = ka.load_model(fixture_text("mlp_l2_regularizer"))
    other.set_weights(weights)
    assert ka.weights_to_bytes(other)[:4] == np.float32(0.5).tobytes()
    ka.set_weights_from_bytes(other, data)
    assert ka.weights_to_bytes(other) == data
    assert ka.bytes_to_weights(model, memoryview(data))[0].shape == weights[0].shape


def test_weights_are_little_endian_float32_concatenation() -> None:
    model = ka.load_model(fixture_text("mlp_input_layer"))
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype("float32") for w in model.get_weights()])
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype("<f4")
    assert ka.weights_to_bytes(model) == flat.tobytes()
    assert ka.weights_to_bytes([]) == b""


def test_wrong_weight_count() -> None:
    model = ka.load_model(fixture_text("mlp_input_layer"))
    ka.check_weights(model, b"\0" * (4 * 193))
    with pytest.raises(CerebroError) as info:
        ka.bytes_to_weights(model, b"\0" * (4 * 192))
    assert info.value.sqlstate == "22023"
    assert info.value.message == (
        "model_weights has 192 values but the architecture has 193 parameters"
    )
    with pytest.raises(CerebroError) as info:
        ka.check_weights(model, b"\0" * (4 * 193 + 2))
    assert info.value.sqlstate == "22023"
    assert "774 bytes" in info.value.message


# --------------------------------------------------------------------------- size limit


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURE_DIR.glob("*.json")))
def test_unbuilt_sizes_count_the_parameters_the_build_makes(name: str) -> None:
    """The count made before any weight exists is the built model's, plus the 2-value
    states of its random seed generators (Dropout, LSTM), which are variables too."""
    text = ka.to_keras3_json(fixture_text(name))
    extra = ka.unbuilt_sizes(text)[0] - ka.count_params(ka.load_model(text))
    assert 0 <= extra <= 8 and extra % 2 == 0, extra


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_model_too_big_for_the_machine_is_refused_before_its_weights_exist() -> None:
    """784 x 10^9 weights (3 TB): refused 54000 with the count, the memory untouched, and
    Keras' registry of deferred variables left as it was (nothing initialized later)."""
    from keras.src.backend.common import global_state

    huge = keras2_sequential([
        {"class_name": "Dense", "config": {"name": "big", "units": 1_000_000_000,
                                           "batch_input_shape": [None, 784]}},
        {"class_name": "Dense", "config": {"name": "out", "units": 10}}])
    before_rss = _rss_mb()
    err = raises(json.dumps(huge), "54000")
    assert "784,000,000,000" in err.message or "784,000,001,000" in err.message or \
        "parameters, more than" in err.message, err.message
    assert f"{ka.max_params():,}" in err.message
    assert _rss_mb() - before_rss < 200
    assert not global_state.get_global_attribute("uninitialized_variables")


def test_a_config_that_fails_part_way_counts_what_it_made_first() -> None:
    """A huge first layer, then a layer whose stored input shape does not match: the build
    would allocate the first before failing, so the count includes it."""
    huge = keras.Sequential([keras.Input((784,)), keras.layers.Dense(4),
                             keras.layers.Dense(10)]).to_json()
    huge = huge.replace('"units": 4,', '"units": 900000000,')
    assert ka.unbuilt_sizes(ka.to_keras3_json(huge))[0] >= 784 * 900_000_000
    raises(huge, "54000")


def test_a_model_whose_one_row_would_not_fit_is_refused() -> None:
    """Two weights, but RepeatVector(10^10) makes 10^10 values of one row (40 GB at training
    time, times the batch): refused before anything is built (a red-team pass showed the
    parameter count alone let it through)."""
    i = keras.Input((1,))
    x = keras.layers.RepeatVector(10**10)(i)
    x = keras.layers.GlobalAveragePooling1D()(x)
    text = keras.Model(i, keras.layers.Dense(1)(x)).to_json()
    params, values = ka.unbuilt_sizes(ka.to_keras3_json(text))
    assert params < 10 and values >= 10**10
    err = raises(text, "54000")
    assert "values per row in its layers' outputs" in err.message, err.message
    # the suite's CNN makes about 124,000 values a row: far below the limit
    assert ka.unbuilt_sizes(ka.to_keras3_json(fixture_text("cnn_mnist")))[1] < 10**6


def test_a_batch_whose_activations_do_not_fit_is_refused_with_the_batch_size_that_does() -> None:
    """A 28 x 28 image through 2,000 3 x 3 filters: few weights (20,000), 1.57 million values
    a row. The largest batch within memory / BYTES_PER_BATCH_VALUE passes, one row more is
    refused (54000) and the hint names that largest batch."""
    arch = keras.Sequential([keras.Input((784,)), keras.layers.Reshape((28, 28, 1)),
                             keras.layers.Conv2D(2000, 3, padding="same"),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(10)]).to_json()
    params, per_row = ka.unbuilt_sizes(ka.to_keras3_json(arch))
    assert params < 100_000
    assert per_row == 784 + 784 + 784 * 2000 + 2000 + 10
    limit = ka.physical_memory() // ka.BYTES_PER_BATCH_VALUE
    most = limit // per_row
    ka.check_batch(arch, most)
    ka.check_batch(arch, 1)
    with pytest.raises(CerebroError) as e:
        ka.check_batch(arch, most + 1)
    assert e.value.sqlstate == "54000"
    assert f"a batch of {most + 1:,} rows makes {(most + 1) * per_row:,} values" in e.value.message
    assert f"Use batch_size {most:,} or less" in e.value.hint


def test_values_per_row_count_each_call_of_the_graph_once() -> None:
    """A Sequential model's layers also hold the calls of the smaller graphs its
    deserialization built (layer k of n holds n - k): only the final graph counts. A shared
    layer counts once per call; a nested model counts its call's outputs and its own graph
    (its input included)."""
    layers = [keras.Input((100,))] + [keras.layers.Dense(10) for _ in range(30)]
    _, per_row = ka.unbuilt_sizes(ka.to_keras3_json(keras.Sequential(layers).to_json()))
    assert per_row == 100 + 30 * 10
    inp = keras.Input((784,))
    shared = keras.layers.Dense(5)
    x = shared(shared(keras.layers.Dense(5)(inp)))
    inner = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7)])
    model = keras.Model(inp, inner(x))
    _, per_row = ka.unbuilt_sizes(ka.to_keras3_json(model.to_json()))
    assert per_row == 784 + 5 + 5 + 5 + (5 + 7) + 7


def test_a_count_that_wraps_int64_is_still_refused() -> None:
    """An Embedding of 2**62 rows x 4: 2**64 weights, which int64 arithmetic counts as 0."""
    arch = keras.Sequential([keras.Input((1,)), keras.layers.Embedding(8, 4)]).to_json()
    arch = arch.replace('"input_dim": 8', f'"input_dim": {2**62}')
    params, _ = ka.unbuilt_sizes(ka.to_keras3_json(arch))
    assert params == 2**64
    raises(arch, "54000")


def test_a_compiled_models_json_is_counted_too() -> None:
    """Keras 3 puts compile_config in the JSON of a compiled model; building it in the
    counting scope would compile, fail on the optimizer's variables and lose the count
    (a red-team pass got a 275 GB batch through that way)."""
    m = keras.Sequential([keras.Input((32, 32, 1)), keras.layers.UpSampling2D(64),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    plain = ka.unbuilt_sizes(ka.to_keras3_json(m.to_json()))
    m.compile(optimizer="sgd", loss="mse")
    text = m.to_json()
    assert "compile_config" in text
    assert ka.unbuilt_sizes(ka.to_keras3_json(text)) == plain
    assert plain[1] > 4_000_000


def test_attention_recurrent_and_time_distributed_insides_are_counted() -> None:
    """Values a layer makes beside its outputs: attention scores and their softmax, the
    states a recurrent layer keeps for every step, a TimeDistributed model per step."""
    def per_row(*layers: Any, inputs: Any = None) -> int:
        m = keras.Sequential([keras.Input(inputs), *layers])
        return ka.unbuilt_sizes(ka.to_keras3_json(m.to_json()))[1]

    inp = keras.Input((64, 8))
    mha = keras.Model(inp, keras.layers.MultiHeadAttention(4, 8)(inp, inp))
    counted = ka.unbuilt_sizes(ka.to_keras3_json(mha.to_json()))[1]
    assert counted >= 2 * 4 * 64 * 64  # heads x Tq x Tk, scores and softmax
    lstm = per_row(keras.layers.LSTM(16), inputs=(100, 3))
    assert lstm >= 100 * 16 * 6  # steps x units x (4 gates + 2 states)
    both = per_row(keras.layers.Bidirectional(keras.layers.GRU(16)), inputs=(100, 3))
    assert both >= 2 * 100 * 16 * 5
    inner = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1000),
                              keras.layers.Dense(2)])
    td = per_row(keras.layers.TimeDistributed(inner), inputs=(50, 8))
    assert td >= 50 * 1000


def test_rows_reshape_only_without_scrambling() -> None:
    assert ka.reshapes_to([784], [28, 28, 1]) and ka.reshapes_to([1, 784], [28, 28, 1])
    assert ka.reshapes_to([784, 1], [28, 28, 1]) and ka.reshapes_to([28, 28], [28, 28, 1])
    assert ka.reshapes_to([32, 32, 3], [32, 32, 3])
    assert not ka.reshapes_to([3, 32, 32], [32, 32, 3])
    assert not ka.reshapes_to([2, 3], [3, 2]) and not ka.reshapes_to([785], [28, 28, 1])


def _k2_dense(name: str, units: int, activation: str, inbound: list | None = None,
              **extra: Any) -> dict[str, Any]:
    layer: dict[str, Any] = {"class_name": "Dense", "config": {
        "name": name, "trainable": True, "dtype": "float32", "units": units,
        "activation": activation, "use_bias": True, **extra,
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
        "bias_initializer": {"class_name": "Zeros", "config": {}}}, "name": name}
    if inbound is not None:
        layer["inbound_nodes"] = inbound
    return layer


def _k2_input(name: str, width: int) -> dict[str, Any]:
    return {"class_name": "InputLayer", "config": {
        "batch_input_shape": [None, width], "dtype": "float32", "sparse": False,
        "ragged": False, "name": name}, "name": name, "inbound_nodes": []}


K2_BASE = {"class_name": "Sequential", "name": "sequential", "config": {
    "name": "sequential", "layers": [
        {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 8],
                                                 "dtype": "float32", "name": "dense_input"}},
        _k2_dense("dense", 4, "relu", batch_input_shape=[None, 8])]}}


def test_keras2_nested_model_nodes_count_from_one() -> None:
    """tf.keras 2 numbers a nested model's calls from node 1 (node 0 is its own graph):
    a base model in a functional head, as tf.keras 2.6 wrote it, loads (an outside pass
    found it refused), with the weights in Keras' order; and a base called on two inputs
    (nodes 1 and 2) shares its weights."""
    head = {"class_name": "Functional", "keras_version": "2.6.0", "backend": "tensorflow",
            "config": {"name": "model", "layers": [
                _k2_input("input_1", 8),
                {**K2_BASE, "inbound_nodes": [[["input_1", 0, 0, {}]]]},
                _k2_dense("dense_1", 3, "softmax", [[["sequential", 1, 0, {}]]])],
                "input_layers": [["input_1", 0, 0]], "output_layers": [["dense_1", 0, 0]]}}
    model = ka.load_model(json.dumps(head))
    assert model.count_params() == 8 * 4 + 4 + 4 * 3 + 3
    rng = np.random.default_rng(0)
    ws = [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(ws)
    x = rng.normal(size=(5, 8)).astype("float32")
    h = np.maximum(x @ ws[0] + ws[1], 0) @ ws[2] + ws[3]
    want = np.exp(h - h.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(model.predict(x, verbose=0), want, rtol=1e-5, atol=1e-6)

    twice = {"class_name": "Functional", "keras_version": "2.6.0", "backend": "tensorflow",
             "config": {"name": "model", "layers": [
                 _k2_input("input_1", 8), _k2_input("input_2", 8),
                 {**K2_BASE, "inbound_nodes": [[["input_1", 0, 0, {}]],
                                               [["input_2", 0, 0, {}]]]},
                 {"class_name": "Concatenate", "name": "concatenate",
                  "config": {"name": "concatenate", "trainable": True, "dtype": "float32",
                             "axis": -1},
                  "inbound_nodes": [[["sequential", 1, 0, {}], ["sequential", 2, 0, {}]]]},
                 _k2_dense("dense_1", 3, "softmax", [[["concatenate", 0, 0, {}]]])],
                 "input_layers": [["input_1", 0, 0], ["input_2", 0, 0]],
                 "output_layers": [["dense_1", 0, 0]]}}
    model = ka.load_model(json.dumps(twice))
    assert model.count_params() == 8 * 4 + 4 + 8 * 3 + 3
