"""A static estimate of what a configuration's training unit costs, from its architecture
JSON and its batch size alone (no TensorFlow, no measurement).

The MOP scheduler plans each configuration's visit order from these estimates
(``RandomizedMOP(config_costs=...)``, :func:`~.randomized.balanced_offsets`): they depend only
on the fit's inputs, so the visit orders, hence the models, are the same whatever the timing.
Measured unit times still decide, at run time, which config a worker takes next.

The estimate per training row: ``3 x`` the forward pass's floating point operations (the
backward pass costs about twice the forward one), plus a fixed cost per row
(:data:`ROW_OVERHEAD_FLOPS`: reading and feeding it), plus a fixed cost per training step
(:data:`STEP_OVERHEAD_FLOPS`: the optimizer step, the callbacks and the Python loop) divided
by the batch size, all in operation equivalents. Only the ratios between configurations
matter. First calibrated by least squares on the unit logs of ``bench/results/results.json``
(48 configurations of six workloads; row cost 1e6, step cost 8e7). Recalibrated on
2026-11-29 (``bench/cost_check.py``, a grid of the two constants, each workload's scale fitted)
on the run committed in d61591d, with TensorFlow's oneDNN kernels on (cerebro_db's default; 62
configurations of eight workloads: Fashion-MNIST MLPs and CNNs at 4,000 to 60,000 rows, a mix
of MLPs and CNNs of very different cost, Adult, wide and synthetic tabular MLPs, batch sizes
64 to 256): the old constants' within-workload geometric mean error was 1.34x (1.52x on the
mixed workload: with oneDNN a small MLP's per-step overhead shrank, so they overestimated
small models), the new ones' 1.10x (1.03x to 1.16x per workload). On the run before it
(61588c6, oneDNN off) the new constants also beat the old ones, 1.20x against 1.49x. Counting a
convolution's operations 1.5 times a dense layer's gained only 0.01 more, so layers are not
weighted. The estimate only seeds the visit orders; measured unit times decide the rest.
The forward operations are counted by propagating the input shape through the layers of a
Sequential or Functional model (layers in their listed order, channels last);
:func:`unit_cost` returns ``None`` for a layer it does not know, and :func:`config_costs` then
falls back to equal costs for every configuration (the plan is then the seeded rotation
without costs).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ROW_OVERHEAD_FLOPS", "STEP_OVERHEAD_FLOPS", "config_costs", "forward_flops",
           "unit_cost"]

STEP_OVERHEAD_FLOPS = 1.0e7
"""The fixed cost of one training step, in operation equivalents (module docstring)."""
ROW_OVERHEAD_FLOPS = 2.0e5
"""The fixed cost of one training row, in operation equivalents (module docstring)."""

_ELEMENTWISE = {
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
    "GaussianDropout", "AlphaDropout", "BatchNormalization", "LayerNormalization",
    "Activation", "ReLU", "LeakyReLU", "PReLU", "ELU", "Softmax", "ThresholdedReLU",
    "Rescaling", "Normalization", "ActivityRegularization", "Masking", "UnitNormalization",
}
_RNN_GATES = {"SimpleRNN": 1, "GRU": 3, "LSTM": 4}


class _Unknown(Exception):
    """A layer or shape the estimate does not cover."""


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _tuple(value: Any, n: int) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise _Unknown(f"expected {n} values, got {value!r}")
        return tuple(int(v) for v in value)
    return (int(value),) * n


def _shape_of(cfg: Mapping[str, Any]) -> list[int] | None:
    for key in ("batch_shape", "batch_input_shape"):
        if cfg.get(key):
            return [int(d) if d is not None else 1 for d in list(cfg[key])[1:]]
    for key in ("input_shape", "shape"):
        if cfg.get(key):
            return [int(d) if d is not None else 1 for d in cfg[key]]
    if cfg.get("input_dim"):
        return [int(cfg["input_dim"])]
    return None


def _spatial(shape: list[int], n: int, kernel: tuple[int, ...], strides: tuple[int, ...],
             padding: str) -> list[int]:
    if len(shape) != n + 1:
        raise _Unknown(f"expected {n} spatial dimensions and channels, got {shape}")
    if padding == "same":
        return [math.ceil(d / s) for d, s in zip(shape[:n], strides)]
    return [max(0, (d - k) // s + 1) for d, k, s in zip(shape[:n], kernel, strides)]


def _layer(cls: str, cfg: Mapping[str, Any], shape: list[int]) -> tuple[float, list[int]]:
    """(forward operations per row, output shape) of one layer on ``shape``."""
    size = _prod(shape)
    if cls in ("InputLayer",):
        return 0.0, shape
    if cls == "Dense":
        units = int(cfg["units"])
        return 2.0 * size * units, shape[:-1] + [units]
    if cls in ("Conv1D", "Conv2D", "Conv3D"):
        n = int(cls[4])
        kernel = _tuple(cfg.get("kernel_size", 1), n)
        strides = _tuple(cfg.get("strides", 1), n)
        out = _spatial(shape, n, kernel, strides, str(cfg.get("padding", "valid")).lower())
        filters = int(cfg["filters"])
        return 2.0 * _prod(kernel) * shape[-1] * filters * _prod(out), out + [filters]
    if cls.startswith(("MaxPooling", "AveragePooling", "MaxPool", "AvgPool")) and cls[-2:] in (
            "1D", "2D", "3D"):
        n = int(cls[-2])
        pool = _tuple(cfg.get("pool_size", 2), n)
        strides = _tuple(cfg.get("strides") or pool, n)
        out = _spatial(shape, n, pool, strides, str(cfg.get("padding", "valid")).lower())
        return float(_prod(pool) * _prod(out) * shape[-1]), out + [shape[-1]]
    if cls.startswith(("GlobalMaxPooling", "GlobalAveragePooling", "GlobalMaxPool",
                       "GlobalAvgPool")):
        return float(size), [shape[-1]]
    if cls == "Flatten":
        return 0.0, [size]
    if cls == "Reshape":
        target = [int(d) for d in cfg["target_shape"]]
        if -1 in target:
            known = _prod(d for d in target if d != -1)
            target = [size // known if d == -1 else d for d in target]
        return 0.0, target
    if cls == "Embedding":
        return float(size), shape + [int(cfg["output_dim"])]
    if cls in _RNN_GATES:
        if len(shape) != 2:
            raise _Unknown(f"{cls} on shape {shape}")
        units = int(cfg["units"])
        steps, features = shape
        flops = 2.0 * _RNN_GATES[cls] * (features + units) * units * steps
        return flops, [steps, units] if cfg.get("return_sequences") else [units]
    if cls in _ELEMENTWISE:
        return float(size), shape
    raise _Unknown(f"layer {cls}")


def _layers(model: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    cfg = model.get("config")
    if isinstance(cfg, list):  # Keras 1/2 Sequential: the config is the list of layers
        return cfg
    if isinstance(cfg, Mapping) and isinstance(cfg.get("layers"), list):
        return cfg["layers"]
    raise _Unknown("no layers")


def forward_flops(arch: str | Mapping[str, Any]) -> float | None:
    """Floating point operations of one row's forward pass through ``arch`` (a Keras
    Sequential or Functional model as JSON), or ``None`` when a layer or shape is not
    covered."""
    try:
        model = json.loads(arch) if isinstance(arch, (str, bytes)) else arch
        if not isinstance(model, Mapping):
            return None
        shape: list[int] | None = None
        total = 0.0
        for layer in _layers(model):
            cls = str(layer.get("class_name", ""))
            cfg = layer.get("config") or {}
            if cls in ("Sequential", "Functional", "Model"):
                raise _Unknown("nested model")
            if shape is None:
                shape = _shape_of(cfg)
                if shape is None:
                    raise _Unknown("no input shape")
            flops, shape = _layer(cls, cfg, shape)
            total += flops
        return total if shape is not None and total > 0 else None
    except (_Unknown, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def unit_cost(arch: str | Mapping[str, Any], batch_size: int) -> float | None:
    """Estimated cost of training one row of ``arch`` in batches of ``batch_size`` (relative
    units; see the module docstring), or ``None`` when the architecture is not covered."""
    flops = forward_flops(arch)
    if flops is None or batch_size < 1:
        return None
    return 3.0 * flops + ROW_OVERHEAD_FLOPS + STEP_OVERHEAD_FLOPS / batch_size


def config_costs(configs: Iterable[tuple[int, str | Mapping[str, Any], int]]
                 ) -> dict[int, float]:
    """mst_key -> estimated relative unit cost for ``(mst_key, arch, batch_size)`` triples,
    normalised to a mean of 1; every cost 1.0 when any architecture is not covered (a
    partial estimate would rank the configs it misses arbitrarily)."""
    items = list(configs)
    raw = {key: unit_cost(arch, bs) for key, arch, bs in items}
    if not raw or any(v is None for v in raw.values()):
        return {key: 1.0 for key, _, _ in items}
    mean = sum(raw.values()) / len(raw)  # type: ignore[arg-type]
    return {key: round(v / mean, 6) for key, v in raw.items()}  # type: ignore[operator]
