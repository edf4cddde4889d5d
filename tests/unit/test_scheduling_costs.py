"""The static unit cost estimate MOP plans its visit orders from (cerebro_db.scheduling.costs):
forward operations counted from the architecture JSON without TensorFlow, checked against
hand counts and against the JSON Keras itself writes (Keras 3 and tf.keras 2 dialects)."""
from __future__ import annotations

import json

import pytest

from cerebro_db.scheduling.costs import (
    ROW_OVERHEAD_FLOPS,
    STEP_OVERHEAD_FLOPS,
    config_costs,
    forward_flops,
    unit_cost,
)


def keras2_mlp(inputs: int, hidden: list[int], outputs: int) -> str:
    """tf.keras 2.x Sequential JSON (batch_input_shape on the first layer)."""
    layers = []
    for i, h in enumerate(hidden + [outputs]):
        cfg: dict = {"units": h, "activation": "relu"}
        if i == 0:
            cfg["batch_input_shape"] = [None, inputs]
        layers.append({"class_name": "Dense", "config": cfg})
    return json.dumps({"class_name": "Sequential", "keras_version": "2.15.0",
                       "config": {"name": "s", "layers": layers}})


def test_dense_operations_by_hand():
    # 784 -> 32 -> 10: 2 x (784 x 32 + 32 x 10) multiply-adds per row
    assert forward_flops(keras2_mlp(784, [32], 10)) == 2 * (784 * 32 + 32 * 10)
    assert unit_cost(keras2_mlp(784, [32], 10), 128) == pytest.approx(
        3 * 2 * (784 * 32 + 32 * 10) + ROW_OVERHEAD_FLOPS + STEP_OVERHEAD_FLOPS / 128)


def test_keras3_json_of_real_models():
    keras = pytest.importorskip("keras")
    L = keras.layers
    mlp = keras.Sequential([keras.Input((784,)), L.Dense(512, activation="relu"),
                            L.Dropout(0.2), L.Dense(256), L.Dense(10)])
    assert forward_flops(mlp.to_json()) == 2 * (784 * 512 + 512 * 256 + 256 * 10) + 512
    cnn = keras.Sequential([keras.Input((28, 28, 1)),
                            L.Conv2D(16, 3, activation="relu"),       # 26 x 26 x 16
                            L.MaxPooling2D(),                         # 13 x 13 x 16
                            L.Conv2D(32, (3, 3), padding="same"),     # 13 x 13 x 32
                            L.Flatten(), L.Dense(10)])
    conv1 = 2 * 9 * 1 * 16 * 26 * 26
    pool = 4 * 13 * 13 * 16
    conv2 = 2 * 9 * 16 * 32 * 13 * 13
    dense = 2 * 13 * 13 * 32 * 10
    assert forward_flops(cnn.to_json()) == conv1 + pool + conv2 + dense
    # a functional model of the same layers counts the same
    x = keras.Input((784,))
    y = L.Dense(10)(L.Dense(512)(x))
    assert forward_flops(keras.Model(x, y).to_json()) == 2 * (784 * 512 + 512 * 10)


def test_ranks_what_costs_more():
    small, big = keras2_mlp(784, [32], 10), keras2_mlp(784, [512, 256], 10)
    costs = config_costs([(1, small, 128), (2, big, 128), (3, small, 32)])
    assert costs[2] > costs[3] > costs[1]  # a smaller batch: more steps per row
    assert sum(costs.values()) / 3 == pytest.approx(1.0)


def test_not_covered_means_equal_costs():
    unknown = json.dumps({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "Dense", "config": {"units": 4, "batch_input_shape": [None, 3]}},
        {"class_name": "MyCustomLayer", "config": {}}]}})
    no_shape = json.dumps({"class_name": "Sequential", "config": {"layers": [
        {"class_name": "Dense", "config": {"units": 4}}]}})
    assert forward_flops(unknown) is None
    assert forward_flops(no_shape) is None
    assert forward_flops("not json") is None
    assert unit_cost(keras2_mlp(3, [4], 2), 0) is None
    assert config_costs([(1, keras2_mlp(784, [32], 10), 32), (2, unknown, 32)]) == {1: 1.0,
                                                                                 2: 1.0}
    assert config_costs([]) == {}
