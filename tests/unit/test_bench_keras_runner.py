"""bench/keras_runner.py: the sequential baseline evaluates at its fastest batch size."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import keras_runner
import workloads


@pytest.mark.parametrize("pipeline", ["numpy", "dataset"])
def test_one_measured_batch_size_per_architecture(pipeline: str):
    rng = np.random.default_rng(0)
    x = rng.random((300, 12), dtype=np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 300)]
    # the same architecture made twice (Keras names its layers apart) and another one
    configs = [workloads.config("a", workloads.mlp(12, 3, [8]), 0.01, 32),
               workloads.config("a", workloads.mlp(12, 3, [8]), 0.1, 64),
               workloads.config("b", workloads.mlp(12, 3, [16, 8]), 0.01, 32)]
    assert configs[0]["arch_json"] != configs[1]["arch_json"]
    evaluation = keras_runner.pipelines(x, y, x, y)[1] if pipeline == "dataset" else None
    best = keras_runner.eval_batches({"configs": configs}, x, y, pipeline, evaluation)
    assert len(best) == 2
    assert set(best.values()) <= set(keras_runner.EVAL_BATCHES)


def test_the_ray_baseline_gets_each_configurations_measured_batch_size(tmp_path):
    """``eval-batches`` (for the Ray baseline, whose trials cannot measure before their
    clock): one size per configuration, in DATA.json's order, the same for configurations of
    one architecture."""
    rng = np.random.default_rng(1)
    x = rng.random((200, 12), dtype=np.float32)
    y = rng.integers(0, 3, 200)
    configs = [workloads.config("a", workloads.mlp(12, 3, [8]), 0.01, 32),
               workloads.config("b", workloads.mlp(12, 3, [16, 8]), 0.01, 32),
               workloads.config("a", workloads.mlp(12, 3, [8]), 0.1, 64)]
    w = workloads.Workload("t", "t", x, y, x[:50], y[:50], 3, configs, 1)
    w.save(tmp_path / "t.npz")
    out = keras_runner.config_eval_batches(str(tmp_path / "t.npz"), 1)
    sizes = out["eval_batch"]
    assert len(sizes) == 3 and sizes[0] == sizes[2]
    assert set(sizes) <= set(keras_runner.EVAL_BATCHES)
