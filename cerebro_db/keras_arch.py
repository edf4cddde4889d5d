"""Keras model architectures: the two JSON dialects, building, shapes and weights.

``model_arch`` values come in two dialects and both load:

* **Keras 3** ``model.to_json()``: every serialized object carries ``module``, ``class_name``,
  ``config`` and ``registered_name``; each input is an ``InputLayer`` with ``batch_shape``. This
  dialect passes through :func:`to_keras3_json` unchanged once checked for safety.
* **tf.keras 2.x** ``model.to_json()`` (what MADlib users' tables hold): no ``module`` keys,
  ``"keras_version": "2.x"``, often no ``InputLayer`` but ``batch_input_shape`` on the first
  layer, dtypes as plain strings, Keras-2-only layer options, and for the oldest versions a
  Sequential ``config`` that is a bare list of layers. Keras 3 rejects this dialect, and its
  legacy loader turns ``batch_input_shape`` on a ``Dense`` layer into a 3-D input, so
  :func:`to_keras3_json` rewrites it into real Keras 3 JSON: an ``InputLayer`` with
  ``batch_shape`` is added, module keys are added to layers, initializers, regularizers and
  constraints, Keras-2-only options are dropped or renamed. Functional models (``"Model"`` or
  ``"Functional"``) keep their ``inbound_nodes`` in the list-of-lists form, which Keras 3 still
  reads natively.

The dialect is the major version of ``keras_version`` when present (Keras 3 omits the key),
else Keras 3 exactly when the top-level object has a ``module`` key.

Decisions:

* **What is stored.** The architecture table keeps the user's original JSON text (see
  :func:`normalize_arch`), so MADlib users see what they loaded and can hand it back to their
  own tf.keras. Conversion runs whenever a model is built; it is cheap and cached.
* **Safety.** JSON is parsed with :mod:`json` and objects are built with Keras's deserializer
  in safe mode; nothing is evaluated, executed or unpickled. ``Lambda``-style layers (which
  carry Python bytecode) are refused, as is any ``module`` outside Keras.
* **Caching.** :func:`build_from_json` caches the conversion keyed by the JSON text, and by
  default returns a freshly built model that the caller owns (it may set weights, compile and
  train it). ``shared=True`` returns one cached model per architecture for read-only questions
  (parameter counts, shapes); callers must not mutate it.
* **Weights** are the flat little-endian float32 concatenation of ``model.get_weights()``, as
  MADlib stores them in ``model_weights``.

TensorFlow/Keras is imported lazily inside the functions that need it.
"""
from __future__ import annotations

import collections
import functools
import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from cerebro_db.errors import (
    FEATURE_NOT_SUPPORTED,
    INVALID_PARAMETER_VALUE,
    INVALID_TEXT_REPRESENTATION,
    NULL_VALUE_NOT_ALLOWED,
    OUT_OF_MEMORY,
    PROGRAM_LIMIT_EXCEEDED,
    CerebroError,
    out_of_memory,
)

if TYPE_CHECKING:  # pragma: no cover
    import keras

__all__ = [
    "KERAS2",
    "KERAS3",
    "build_from_json",
    "bytes_to_weights",
    "check_weights",
    "count_params",
    "detect_dialect",
    "input_shapes",
    "load_model",
    "model_type_name",
    "normalize_arch",
    "output_shapes",
    "parse_arch",
    "set_weights_from_bytes",
    "to_keras3_json",
    "weight_shapes",
    "weights_to_bytes",
]

KERAS2 = "keras2"
KERAS3 = "keras3"

ArchInput = Union[str, bytes, Mapping[str, Any]]
Shape = tuple[Optional[int], ...]

_SEQUENTIAL = "Sequential"
_FUNCTIONAL = frozenset({"Model", "Functional"})
_MODEL_CLASSES = frozenset({_SEQUENTIAL}) | _FUNCTIONAL
# Layers that carry Python code (bytecode or TensorFlow op names) instead of a config.
_UNSAFE_CLASSES = frozenset({"Lambda", "TFOpLambda", "SlicingOpLambda", "__lambda__"})
_SAFE_MODULE_ROOTS = frozenset({"keras", "builtins"})
_RECURRENT = frozenset(
    {"LSTM", "GRU", "SimpleRNN", "RNN", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"}
)
_ATTENTION = frozenset({"Attention", "AdditiveAttention"})
# Keras-2-only base-layer options with no effect in Keras 3.
_DROP_KEYS = ("dynamic", "build_config", "compile_config")
_SHAPE_HINT = (
    "give the first layer an input shape, e.g. input_shape=(784,) on the first layer in "
    "tf.keras 2.x or keras.Input(shape=(784,)) in Keras 3"
)
_MAX_SHARED = 8
MAX_LAYERS = 1_000
"""The most layers (over all nested models) an architecture may have: checked on the JSON,
before Keras builds anything (building thousands of layers takes minutes)."""
MAX_ARCH_BYTES = 16 * 1024 * 1024
"""The largest ``model_arch`` JSON text accepted."""
BYTES_PER_PARAM = 64
""":func:`max_params` allows one parameter per this many bytes of the machine's memory:
training holds about 16 bytes a parameter (float32 weights, their gradients and two
optimizer slots), and a fit runs several workers beside the rest of the server."""
BYTES_PER_BATCH_VALUE = 32
""":func:`check_batch` allows a batch's layer outputs one value per this many bytes of the
machine's memory: training keeps them (4 bytes each) and their gradients for the backward
pass, and a fit runs several workers at once."""


# --------------------------------------------------------------------------- parsing


def parse_arch(text: ArchInput | None) -> dict[str, Any]:
    """Parse ``model_arch`` into a dict, raising :class:`CerebroError` when it is not JSON.

    Accepts JSON text (``str`` or ``bytes``) or an already parsed mapping (a ``json`` column
    read through a driver). The result is a fresh object the caller may modify. A JSON value
    that is not an object is rejected as not being a Keras model.
    """
    if text is None:
        raise CerebroError("model_arch must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if isinstance(text, Mapping):
        obj: Any = json.loads(json.dumps(text))
    else:
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CerebroError(
                    f"model_arch is not valid JSON: {exc}", INVALID_TEXT_REPRESENTATION
                ) from None
        if not isinstance(text, str):
            raise CerebroError(
                f"model_arch must be JSON text, got {type(text).__name__}",
                INVALID_PARAMETER_VALUE,
            )
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            msg = exc.msg[:1].lower() + exc.msg[1:]
            raise CerebroError(
                f"model_arch is not valid JSON: {msg} at line {exc.lineno} column {exc.colno}",
                INVALID_TEXT_REPRESENTATION,
            ) from None
    if not isinstance(obj, dict):
        raise _not_a_model(f"expected a JSON object, got {_json_kind(obj)}")
    cls = obj.get("class_name")
    if cls not in _MODEL_CLASSES or "config" not in obj:
        if cls is None:
            found = "an object without class_name and config"
        else:
            found = f"class_name {_short(cls)}"
        raise _not_a_model(
            f"expected an object with class_name Sequential, Functional or Model and a config, "
            f"got {found}"
        )
    return obj


def detect_dialect(arch: Mapping[str, Any]) -> str:
    """Return :data:`KERAS2` or :data:`KERAS3` for a parsed architecture.

    ``keras_version`` decides when present (``1.x``/``2.x`` are Keras 2, including Keras 2.13+
    whose JSON already has module keys); Keras 3 omits it, so otherwise a top-level ``module``
    key means Keras 3.
    """
    version = arch.get("keras_version")
    if isinstance(version, str) and version.strip():
        major = version.strip().split(".", 1)[0]
        return KERAS2 if major in ("1", "2") else KERAS3
    return KERAS3 if "module" in arch else KERAS2


def to_keras3_json(text: ArchInput) -> str:
    """Return Keras 3 JSON for ``model_arch`` in either dialect.

    Keras 3 input is checked (no code-carrying layers, no modules outside Keras) and returned
    unchanged when given as text. tf.keras 2.x input is converted as described in the module
    docstring. Raises :class:`CerebroError` for text that is not a JSON model; whether Keras can
    build the result is checked by :func:`load_model`.
    """
    if isinstance(text, str):
        return _to_keras3_text(text)
    return _to_keras3_text(json.dumps(parse_arch(text), sort_keys=True))


@functools.lru_cache(maxsize=64)
def _to_keras3_text(text: str) -> str:
    if len(text) > MAX_ARCH_BYTES:
        raise CerebroError(f"model_arch is {len(text)} characters long, more than "
                           f"{MAX_ARCH_BYTES}", PROGRAM_LIMIT_EXCEEDED)
    arch = parse_arch(text)
    _check_safe(arch)
    if detect_dialect(arch) == KERAS3:
        return text
    return json.dumps(_convert_model(arch))


def cache_key(text: ArchInput) -> str:
    """The architecture with its layer and model names replaced by positional ones
    (``n0``, ``n1``, ... in order of appearance), as canonical JSON.

    Keras names layers from a process-wide counter (``dense``, ``dense_7``), so the same
    architecture made twice (two rows of an architecture table, two sessions) has different
    JSON but builds the same model, whose weights are set by position. Worker caches key
    compiled models by this, so such configurations share one model instead of rebuilding
    it every unit. Only names in name positions are replaced (a layer's or model's
    ``name``, graph references ``keras_history``, ``input_layers``, ``output_layers``), so
    two architectures that differ in anything else keep different keys.
    """
    return _cache_key_text(to_keras3_json(text))


@functools.lru_cache(maxsize=64)
def _cache_key_text(keras3_text: str) -> str:
    arch = json.loads(keras3_text)
    names: dict[str, str] = {}

    def new(name: Any) -> Any:
        if not isinstance(name, str):
            return name
        return names.setdefault(name, f"n{len(names)}")

    def ref(value: Any) -> Any:
        # [name, node, tensor], or a list of those
        if isinstance(value, list) and len(value) == 3 and isinstance(value[0], str):
            return [new(value[0]), *value[1:]]
        if isinstance(value, list):
            return [ref(v) for v in value]
        return value

    def walk(obj: Any) -> Any:
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        out = {}
        # a layer or model entry (a dtype policy's config has a "name" too: its dtype)
        layer = isinstance(obj.get("config"), dict) and "name" in obj["config"] and \
            not str(obj.get("class_name", "")).endswith("DTypePolicy")
        for k, v in obj.items():
            if k == "config" and layer:
                cfg = walk(v)
                if "name" in cfg:
                    cfg["name"] = new(v["name"])
                out[k] = cfg
            elif k == "name" and layer:
                out[k] = new(v)
            elif k == "keras_history" and isinstance(v, list) and v:
                out[k] = [new(v[0]), *v[1:]]
            elif k in ("input_layers", "output_layers"):
                out[k] = ref(v)
            else:
                out[k] = walk(v)
        return out

    return json.dumps(walk(arch), sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- conversion


def _convert_model(obj: Mapping[str, Any]) -> dict[str, Any]:
    cls = obj.get("class_name")
    config = obj.get("config")
    if cls == _SEQUENTIAL:
        new_config = _convert_sequential(config)
        out_cls = "Sequential"
    elif cls in _FUNCTIONAL:
        new_config = _convert_functional(config)
        out_cls = "Model"  # keras.Model.from_config builds a Functional model
    else:  # pragma: no cover - callers check class_name
        raise _not_a_model(f"class_name {_short(cls)}")
    return {"module": "keras", "class_name": out_cls, "config": new_config,
            "registered_name": None}


def _convert_sequential(config: Any) -> dict[str, Any]:
    build_shape: Any = None
    layers: Any
    out: dict[str, Any] = {"name": "sequential"}
    if isinstance(config, list):
        layers = config
    elif isinstance(config, dict):
        layers = config.get("layers")
        build_shape = config.get("build_input_shape")
        if isinstance(config.get("name"), str):
            out["name"] = config["name"]
        if isinstance(config.get("trainable"), bool):
            out["trainable"] = config["trainable"]
    else:
        kind = _json_kind(config)
        raise _not_a_model(f"Sequential config must be an object or a list, got {kind}")
    if not isinstance(layers, list):
        raise _not_a_model("Sequential config has no list of layers")

    new_layers: list[dict[str, Any]] = []
    first_shape: Shape | None = None
    first_dtype: Any = None
    has_input = False
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise _not_a_model(f"layer {i} of the Sequential model is not an object")
        if layer.get("class_name") == "InputLayer":
            has_input = has_input or i == 0
            new_layers.append(_convert_input_layer(layer))
            continue
        converted, shape = _convert_layer(layer)
        if i == 0 and shape is not None:
            first_shape = shape
            first_dtype = (layer.get("config") or {}).get("dtype")
        new_layers.append(converted)

    if not has_input:
        shape = first_shape if first_shape is not None else _parse_shape(build_shape)
        if shape is not None:
            first_name = (layers[0].get("config") or {}).get("name") if layers else None
            name = f"{first_name}_input" if isinstance(first_name, str) else "input_layer"
            new_layers.insert(0, _input_layer(name, shape, _input_dtype(first_dtype)))
    out["layers"] = new_layers
    return out


def _convert_functional(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
        raise _not_a_model("functional model config has no list of layers")
    out: dict[str, Any] = {k: v for k, v in config.items() if k != "layers"}
    if "input_layers" not in out or "output_layers" not in out:
        raise _not_a_model("functional model config lacks input_layers or output_layers")
    new_layers = []
    for i, layer in enumerate(config["layers"]):
        if not isinstance(layer, dict):
            raise _not_a_model(f"layer {i} of the functional model is not an object")
        if layer.get("class_name") == "InputLayer":
            new_layers.append(_convert_input_layer(layer))
        else:
            new_layers.append(_convert_layer(layer)[0])
    nested = {layer.get("name") for layer in config["layers"]
              if isinstance(layer, dict) and layer.get("class_name") in _MODEL_CLASSES}
    if nested:
        _shift_nested_nodes(new_layers, out, nested)
    out["layers"] = new_layers
    return out


def _shift_nested_nodes(layers: list[dict[str, Any]], out: dict[str, Any],
                        nested: set[Any]) -> None:
    """tf.keras 2 numbers the nodes of a model nested as a layer from 1 (its node 0 is its
    own graph, made when it was built); Keras 3 numbers its calls from 0. References to such
    a model in ``inbound_nodes`` and ``output_layers`` move down by one (an outside pass:
    the usual transfer-learning shape, a base model nested in a functional head, was
    refused as a graph with disconnected nodes)."""
    def ref(r: Any) -> Any:
        if isinstance(r, list) and len(r) >= 3 and r[0] in nested \
                and isinstance(r[1], int) and r[1] >= 1:
            return [r[0], r[1] - 1, *r[2:]]
        return r

    for layer in layers:
        nodes = layer.get("inbound_nodes")
        if isinstance(nodes, list):
            layer["inbound_nodes"] = [[ref(r) for r in node] if isinstance(node, list)
                                      else node for node in nodes]
    if isinstance(out.get("output_layers"), list):
        out["output_layers"] = [ref(r) for r in out["output_layers"]]


def _convert_input_layer(layer: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dict(layer.get("config") or {})
    shape = _parse_shape(cfg.pop("batch_shape", None))
    bis = _parse_shape(cfg.pop("batch_input_shape", None))
    shape = shape if shape is not None else bis
    plain = cfg.pop("shape", None)
    plain = plain if plain is not None else cfg.pop("input_shape", None)
    batch_size = cfg.pop("batch_size", None)
    if shape is None and plain is not None:
        inner = _parse_shape(plain)
        if inner is not None:
            shape = (batch_size if isinstance(batch_size, int) else None,) + inner
    name = cfg.get("name") if isinstance(cfg.get("name"), str) else layer.get("name")
    if not isinstance(name, str):
        name = "input_layer"
    new_cfg: dict[str, Any] = {
        "batch_shape": list(shape) if shape is not None else None,
        "dtype": _input_dtype(cfg.get("dtype")),
        "sparse": bool(cfg.get("sparse", False)),
        "name": name,
    }
    if cfg.get("ragged"):
        new_cfg["ragged"] = True
    out = _entry("keras.layers", "InputLayer", new_cfg)
    _copy_graph_keys(layer, out)
    return out


def _input_layer(name: str, shape: Shape, dtype: str) -> dict[str, Any]:
    return _entry("keras.layers", "InputLayer", {
        "batch_shape": list(shape), "dtype": dtype, "sparse": False, "name": name})


def _convert_layer(layer: Mapping[str, Any]) -> tuple[dict[str, Any], Shape | None]:
    """Convert one Keras 2 layer entry; also return the input shape it declared, if any."""
    cls = layer.get("class_name")
    if not isinstance(cls, str) or not cls:
        raise _not_a_model("a layer has no class_name")
    if cls in _MODEL_CLASSES:  # a nested model used as a layer
        out = _convert_model(layer)
        _copy_graph_keys(layer, out)
        return out, None
    cfg_in = layer.get("config")
    if cfg_in is None:
        cfg_in = {}
    if not isinstance(cfg_in, dict):
        raise _not_a_model(f"the config of layer {cls} is not an object")
    cfg = dict(cfg_in)
    shape = _pop_input_shape(cls, cfg)
    cls, cfg = _convert_layer_config(cls, cfg)
    out = _entry("keras.layers", cls, cfg)
    _copy_graph_keys(layer, out)
    return out, shape


def _pop_input_shape(cls: str, cfg: dict[str, Any]) -> Shape | None:
    bis = _parse_shape(cfg.pop("batch_input_shape", None))
    input_shape = cfg.pop("input_shape", None)
    batch_size = cfg.pop("batch_size", None)
    input_dim = None if cls == "Embedding" else cfg.pop("input_dim", None)
    if bis is not None:
        return bis
    batch = batch_size if isinstance(batch_size, int) else None
    if input_shape is not None:
        inner = _parse_shape(input_shape)
        return None if inner is None else (batch,) + inner
    if isinstance(input_dim, int):
        return (batch, input_dim)
    return None


def _convert_layer_config(cls: str, cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    for key in _DROP_KEYS:
        cfg.pop(key, None)
    weights = cfg.pop("weights", None)
    if weights is not None:
        raise _unsupported(
            f"layer {cls} sets initial weights in its config, which is not supported",
            hint="pass initial weights as model_weights instead",
        )
    for key, value in list(cfg.items()):
        if key == "dtype":
            cfg[key] = _convert_dtype(value)
        elif key.endswith("_initializer"):
            cfg[key] = _convert_object(value, "initializers")
        elif key.endswith("_regularizer"):
            cfg[key] = _convert_object(value, "regularizers")
        elif key.endswith("_constraint"):
            cfg[key] = _convert_object(value, "constraints")
        elif key in ("layer", "backward_layer", "cell") and isinstance(value, dict):
            cfg[key] = _convert_layer(value)[0]
        elif key in ("cell", "cells") and isinstance(value, list):
            cfg[key] = [_convert_layer(v)[0] if isinstance(v, dict) else v for v in value]

    if cls == "BatchNormalization":
        axis = cfg.get("axis")
        if isinstance(axis, list) and len(axis) == 1:
            cfg["axis"] = axis[0]
        cfg.pop("fused", None)
        _drop_if_default(cls, cfg, "virtual_batch_size", None)
        _drop_if_default(cls, cfg, "adjustment", None)
    elif cls in _RECURRENT:
        _drop_if_default(cls, cfg, "time_major", False)
    elif cls in _ATTENTION:
        if cfg.get("causal"):
            raise _unsupported(
                f"layer {cls} uses causal=true, which Keras 3 only supports at call time",
                hint="use a functional model that calls the layer with use_causal_mask=True",
            )
        cfg.pop("causal", None)
    elif cls == "Embedding":
        cfg.pop("input_length", None)
    elif cls == "LeakyReLU":
        if "alpha" in cfg:
            cfg["negative_slope"] = cfg.pop("alpha")
    elif cls == "ThresholdedReLU":
        cls = "ReLU"
        cfg["threshold"] = cfg.pop("theta", 1.0)
    return cls, cfg


def _drop_if_default(cls: str, cfg: dict[str, Any], key: str, default: Any) -> None:
    if key not in cfg:
        return
    value = cfg.pop(key)
    if value != default:
        raise _unsupported(
            f"layer {cls} sets {key}={json.dumps(value)}, which Keras 3 does not support"
        )


def _convert_object(value: Any, kind: str) -> Any:
    """Convert a serialized initializer, regularizer or constraint to Keras 3 form."""
    if not isinstance(value, dict) or "class_name" not in value:
        return value  # None, or a string identifier such as "glorot_uniform"
    name = _camel(str(value["class_name"]))
    cfg = dict(value.get("config") or {})
    cfg.pop("dtype", None)
    if kind == "initializers" and name == "VarianceScaling" and cfg.get("distribution") == "normal":
        cfg["distribution"] = "truncated_normal"  # what "normal" meant in Keras 2
    return _entry(f"keras.{kind}", name, cfg)


def _convert_dtype(value: Any) -> Any:
    if isinstance(value, dict):  # a Keras 2 mixed-precision Policy object
        name = (value.get("config") or {}).get("name")
        return name if isinstance(name, str) else None
    return value


def _input_dtype(value: Any) -> str:
    value = _convert_dtype(value)
    if isinstance(value, str) and value and not value.startswith("mixed_"):
        return value
    return "float32"


def _entry(module: str, class_name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"module": module, "class_name": class_name, "config": config,
            "registered_name": None}


def _copy_graph_keys(src: Mapping[str, Any], dst: dict[str, Any]) -> None:
    if "name" in src:
        dst["name"] = src["name"]
    if "inbound_nodes" in src:
        dst["inbound_nodes"] = src["inbound_nodes"]


def _camel(name: str) -> str:
    """``glorot_uniform`` -> ``GlorotUniform``; names already in CamelCase are kept."""
    if name[:1].islower():
        return "".join(part[:1].upper() + part[1:] for part in name.split("_"))
    return name


def _parse_shape(value: Any) -> Shape | None:
    """A shape from a JSON list, or a Keras 2 ``{"class_name": "TensorShape", "items": ...}``."""
    if isinstance(value, dict) and value.get("class_name") == "TensorShape":
        value = value.get("items")
    if not isinstance(value, (list, tuple)):
        return None
    dims: list[int | None] = []
    for dim in value:
        if dim is None:
            dims.append(None)
        elif isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0:
            dims.append(dim)
        else:
            return None
    return tuple(dims)


def _check_safe(obj: Any) -> None:
    """Refuse code-carrying layers and modules outside Keras anywhere in the architecture."""
    stack = [obj]
    layers = 0
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("layers"), list):
                layers += len(item["layers"])
                if layers > MAX_LAYERS:
                    raise CerebroError(f"model_arch has more than {MAX_LAYERS} layers",
                                       PROGRAM_LIMIT_EXCEEDED,
                                       hint="Architectures are limited to "
                                       f"{MAX_LAYERS} layers.")
            cls = item.get("class_name")
            if isinstance(cls, str) and cls in _UNSAFE_CLASSES:
                raise _unsupported(
                    f"model_arch uses a {cls} layer, which cannot be loaded safely",
                    hint="replace the layer with built-in Keras layers",
                )
            module = item.get("module")
            if isinstance(module, str) and module.split(".", 1)[0] not in _SAFE_MODULE_ROOTS:
                raise _unsupported(
                    f"model_arch refers to module {_short(module)}, only Keras built-in objects "
                    "are supported",
                    hint="custom layers and functions cannot be loaded from model_arch",
                )
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# --------------------------------------------------------------------------- building


def load_model(text: ArchInput) -> keras.Model:
    """Build a fresh, uncompiled :class:`keras.Model` from ``model_arch`` in either dialect.

    Raises :class:`CerebroError`: ``22P02`` when the text is not JSON; ``22023`` when the JSON
    is not a Keras model (Keras's own message in ``detail``) or the model has no defined input
    shape; ``0A000`` for layers that cannot be loaded safely.
    """
    return build_from_json(text)


@functools.lru_cache(maxsize=1)
def physical_memory() -> int:
    """The machine's memory in bytes, or the lowest memory limit of this process's cgroup
    and its parents when that is lower (:func:`cgroup_limits`)."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min([total, *cgroup_limits()]))


def cgroup_limits(proc_cgroup: str = "/proc/self/cgroup",
                  root: str = "/sys/fs/cgroup") -> list[int]:
    """The memory limits (bytes) of this process's cgroup and of each group above it, in
    cgroup v2 (``memory.max``, under ``root`` or a hybrid layout's ``root/unified``) and v1
    (``memory/memory.limit_in_bytes``); 'max' (no limit) is left out. The process's own group
    comes from ``/proc/self/cgroup``: reading only the files at the hierarchy's top saw a
    container's limit (where the container's group is the top, as with a cgroup namespace)
    but not a limit on the server's own group (systemd's ``MemoryMax=`` for the PostgreSQL
    service, a nested group), and an outside pass had the kernel kill backends in a 3 GB
    group whose fits planned with the host's 24 GB."""
    import os

    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    places: list[tuple[str, str, str]] = []  # (hierarchy root, group path, limit file)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            places += [(root, path, "memory.max"),
                       (os.path.join(root, "unified"), path, "memory.max")]
        elif "memory" in controllers.split(","):
            places.append((os.path.join(root, "memory"), path, "memory.limit_in_bytes"))
    if not places:  # no /proc: the top of either hierarchy
        places = [(root, "/", "memory.max"),
                  (os.path.join(root, "memory"), "/", "memory.limit_in_bytes")]
    limits: list[int] = []
    for base, path, name in places:
        group = "/" + path.strip("/")
        while True:
            try:
                with open(os.path.join(base, group.lstrip("/"), name)) as f:
                    value = f.read().strip()
            except OSError:
                value = ""
            if value.isdigit():
                limits.append(int(value))
            if group == "/":
                break
            group = os.path.dirname(group)
    return limits


def max_params() -> int:
    """The most parameters an architecture may have: the machine's physical memory over
    :data:`BYTES_PER_PARAM` (about 390 million with 24 GiB)."""
    return max(1, physical_memory() // BYTES_PER_PARAM)


def unbuilt_sizes(keras3_text: str) -> tuple[int, int] | None:
    """(parameters, values per row) of the model ``keras3_text`` describes, before any
    weight exists: the parameters of the variables its build makes, and the values one row
    makes on its way through (the outputs of every layer call, nested models included;
    training keeps them for the backward pass, times the batch size).

    The model is deserialized in Keras' private ``StatelessScope``, which defers every
    variable's initializer and registers the variable; the registered variables (the
    weights, and the 2-value states of random seed generators) are counted and dropped
    after. A config that fails part way counts the variables made before the failure,
    which the real build would have allocated too. None where Keras has no such scope."""
    import keras

    try:
        from keras.src.backend.common import global_state
        from keras.src.backend.common.stateless_scope import StatelessScope
    except ImportError:
        return None
    import random

    key = "uninitialized_variables"
    values = 0
    before = list(global_state.get_global_attribute(key) or [])
    global_state.set_global_attribute(key, [])
    # layers draw their default seeds as they are made, from the generator Keras holds
    # (Python's global one, or the one a seeded build puts there): put the generators back,
    # so that the count changes no weights built after it
    try:
        from keras.src.random import seed_generator

        keras_rng = seed_generator.python_random
    except (ImportError, AttributeError):  # pragma: no cover - a Keras that moved it
        keras_rng = random
    keras_state = keras_rng.getstate()
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        with StatelessScope(initialize_variables=False), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            # a compiled model's JSON (its own or a nested model's) would compile at the end
            # of the build, which makes the optimizer's variables and fails in this scope:
            # the count would be lost
            config = _without_compile(json.loads(keras3_text))
            model = keras.saving.deserialize_keras_object(config, safe_mode=True)
            values = graph_values(model)
    except Exception:  # noqa: BLE001, S110 - the real build reports it; count what was made
        pass
    finally:
        made = list(global_state.get_global_attribute(key) or [])
        global_state.set_global_attribute(key, before)
        random.setstate(py_state)
        keras_rng.setstate(keras_state)
        np.random.set_state(np_state)
    return sum(math.prod(int(d) for d in v.shape) for v in made), values


def reshapes_to(row: Sequence[int], target: Sequence[int]) -> bool:
    """Whether rows of shape ``row`` are taken as rows of ``target``: the same number of
    values, and, once dimensions of size 1 are left out, either side flat (``[784]`` or
    ``[1, 784]`` for ``(28, 28, 1)``, as MADlib packs images) or the same dimensions
    (``[28, 28]`` for ``(28, 28, 1)``).
    Other shapes of the same size (``[3, 32, 32]`` for ``(32, 32, 3)``) would scramble the
    values: refused, as MADlib does."""
    row, target = tuple(int(d) for d in row), tuple(int(d) for d in target)
    if math.prod(row) != math.prod(target):
        return False
    row, target = tuple(d for d in row if d != 1), tuple(d for d in target if d != 1)
    return len(row) <= 1 or len(target) <= 1 or row == target


def _without_compile(config: Any) -> Any:
    """``config`` with every ``compile_config`` left out (nested models' too)."""
    if isinstance(config, dict):
        return {k: _without_compile(v) for k, v in config.items() if k != "compile_config"}
    if isinstance(config, list):
        return [_without_compile(v) for v in config]
    return config


def graph_values(model: Any) -> int:
    """The values one row makes in the outputs of the calls in ``model``'s graph (its
    inputs included), each call counted once, and a nested model's own graph once per call
    of it. The graph is walked back from the outputs: a Sequential model's layers also keep
    the calls of every smaller graph its deserialization built on the way (layer k of n
    holds n - k of them), which are not part of the model."""
    import keras

    graph = getattr(model, "_functional", None) or model
    seen: set[tuple[int, int]] = set()
    stack = [t._keras_history for t in keras.tree.flatten(graph.outputs)]
    total = 0
    while stack:
        op, node_index, _ = stack.pop()
        if (id(op), node_index) in seen:
            continue
        seen.add((id(op), node_index))
        node = op._inbound_nodes[node_index]
        for t in keras.tree.flatten(node.output_tensors):
            total += math.prod(int(d) for d in t.shape if d is not None)
        if op is not model and isinstance(op, keras.Model):
            total += graph_values(op)
        total += _inner_values(op, node)
        stack.extend(t._keras_history for t in keras.tree.flatten(node.input_tensors))
    return total


def _dims(t: Any) -> list[int]:
    """A tensor's dimensions after the batch (an unknown one counts as 1)."""
    return [int(d) if d is not None else 1 for d in tuple(t.shape)[1:]]


def _inner_values(op: Any, node: Any) -> int:
    """Values one row makes inside a layer call beyond its outputs, for the layers where
    they dwarf them (a red-team pass found these 90-260 times above the guard): attention
    scores and their softmax (``MultiHeadAttention``: heads x Tq x Tk; ``Attention``:
    Tq x Tk; ``AdditiveAttention``: Tq x Tk x dim), a recurrent layer's states kept for
    every step (steps x state values x (gates + 2); ``Bidirectional`` both directions), and
    a ``TimeDistributed`` model's graph once per step."""
    import keras

    ins = [t for t in keras.tree.flatten(node.input_tensors) if hasattr(t, "shape")]
    outs = [t for t in keras.tree.flatten(node.output_tensors) if hasattr(t, "shape")]
    if not ins or not outs:
        return 0
    name = type(op).__name__
    q = _dims(ins[0])
    if isinstance(op, keras.layers.MultiHeadAttention):
        kv = _dims(ins[1]) if len(ins) > 1 else q
        return 2 * int(op.num_heads) * math.prod(q[:-1]) * math.prod(kv[:-1])
    if isinstance(op, (keras.layers.Attention, keras.layers.AdditiveAttention)):
        kv = _dims(ins[1]) if len(ins) > 1 else q
        dim = q[-1] if isinstance(op, keras.layers.AdditiveAttention) else 1
        return 2 * math.prod(q[:-1]) * math.prod(kv[:-1]) * dim
    if isinstance(op, keras.layers.Bidirectional):
        return sum(_rnn_values(layer, q, _dims(outs[0]))
                   for layer in (op.forward_layer, op.backward_layer))
    if isinstance(op, keras.layers.RNN) or "ConvLSTM" in name:
        return _rnn_values(op, q, _dims(outs[0]))
    if isinstance(op, keras.layers.TimeDistributed) and isinstance(op.layer, keras.Model):
        return q[0] * graph_values(op.layer)
    return 0


def _rnn_values(op: Any, q: list[int], out: list[int]) -> int:
    """A recurrent layer's per-step states, kept for the backward pass."""
    steps = q[0] if q else 1
    per_step = math.prod(out[1:] if getattr(op, "return_sequences", False) else out)
    name = type(op).__name__
    gates = 4 if "LSTM" in name else 3 if "GRU" in name else 1
    return steps * per_step * (gates + 2)


@functools.lru_cache(maxsize=32)
def _sizes(keras3_text: str) -> tuple[int, int] | None:
    return unbuilt_sizes(keras3_text)


def check_batch(arch: ArchInput, batch_rows: int) -> None:
    """Refuse (54000) to run ``batch_rows`` rows at once through ``arch`` when their layer
    outputs together hold more values than the machine's memory over
    :data:`BYTES_PER_BATCH_VALUE` (790 million with 24 GiB: VGG16 at 224 x 224 makes about 15
    million a row, so a batch of 32 passes and one of 64 does not). Without this a large
    ``batch_size`` gets the backend killed by the kernel, and the server restarts every
    session with it. ``batch_rows`` is the batch a unit runs: the smaller of ``batch_size``
    and the rows it has. Counted once per architecture and process."""
    sizes = _sizes(to_keras3_json(arch))
    if sizes is None or batch_rows <= 0:
        return
    limit = max(1, physical_memory() // BYTES_PER_BATCH_VALUE)
    values = sizes[1] * int(batch_rows)
    if values > limit:
        most = max(1, limit // max(sizes[1], 1))
        raise CerebroError(
            f"a batch of {int(batch_rows):,} rows makes {values:,} values in model_arch's "
            f"layer outputs, more than the {limit:,} this server allows",
            PROGRAM_LIMIT_EXCEEDED,
            hint=f"Use batch_size {most:,} or less with this model (a server allows one value "
            f"of a batch's activations per {BYTES_PER_BATCH_VALUE} bytes of its memory).")


@functools.lru_cache(maxsize=32)
def check_size(keras3_text: str) -> None:
    """Refuse (54000) an architecture with more than :func:`max_params` parameters, or whose
    one row makes more values than that on its way through the layers, before its weights
    are made (every build: :func:`_build`; counted once per architecture and process):
    building or training one that does not fit in memory would get the backend killed by
    the kernel, and the server restarts every session with it. The values per row are a
    guard for one row: :func:`check_batch` checks a batch."""
    sizes = _sizes(keras3_text)
    if sizes is None:
        return
    limit = max_params()
    for n, what in zip(sizes, ("parameters", "values per row in its layers' outputs")):
        if n > limit:
            raise CerebroError(
                f"model_arch has {n:,} {what}, more than the {limit:,} this server allows",
                PROGRAM_LIMIT_EXCEEDED,
                hint=f"A server allows one parameter (and one value of a row's activations) "
                f"per {BYTES_PER_PARAM} bytes of its memory; use a smaller model.")


def build_from_json(text: ArchInput, *, shared: bool = False) -> keras.Model:
    """Build the model for ``model_arch``; conversion is cached by JSON text.

    With ``shared=False`` (the default) every call builds a new model the caller owns and may
    mutate (set weights, compile, train). With ``shared=True`` a cached instance per
    architecture is returned (at most a few are kept); use it only for read-only questions such
    as :func:`count_params` or :func:`input_shapes`, never set its weights or train it.
    """
    keras3_text = to_keras3_json(text)
    if not shared:
        return _build(keras3_text)
    model = _SHARED.get(keras3_text)
    if model is None:
        model = _build(keras3_text)
        _SHARED[keras3_text] = model
        while len(_SHARED) > _MAX_SHARED:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(keras3_text)
    return model


_SHARED: collections.OrderedDict[str, Any] = collections.OrderedDict()


def _build(keras3_text: str) -> keras.Model:
    import keras

    check_size(keras3_text)
    config = json.loads(keras3_text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            obj = keras.saving.deserialize_keras_object(config, safe_mode=True)
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for a bad config
        if out_of_memory(exc):
            raise CerebroError("out of memory while building model_arch", OUT_OF_MEMORY,
                               detail=_keras_detail(exc)) from None
        raise CerebroError(
            "model_arch is not a valid Keras model",
            INVALID_PARAMETER_VALUE,
            detail=_keras_detail(exc),
            hint="model_arch must be the output of model.to_json() for a Sequential or "
            "functional model built from built-in Keras layers",
        ) from None
    if not isinstance(obj, keras.Model):
        raise _not_a_model(f"it describes a {type(obj).__name__}, not a model")
    try:
        inputs = obj.inputs
    except (AttributeError, ValueError):
        inputs = None
    if not obj.built or not inputs:
        raise CerebroError(
            "model_arch does not define an input shape", INVALID_PARAMETER_VALUE, hint=_SHAPE_HINT
        )
    return obj


def normalize_arch(text: ArchInput) -> tuple[str, keras.Model]:
    """Validate ``model_arch`` and return ``(text_to_store, model)``.

    The text to store is the user's original JSON (``text`` itself when given as a string,
    compact JSON when given as a mapping), not the Keras 3 conversion: MADlib users see what
    they loaded, and :func:`build_from_json` converts on every build. The model is a fresh one
    the caller owns. Raises :class:`CerebroError` as :func:`load_model` does.
    """
    if isinstance(text, str):
        stored = text
    elif isinstance(text, (bytes, bytearray, memoryview)):
        parse_arch(text)  # reports bad UTF-8 or JSON
        stored = bytes(text).decode("utf-8")
    else:
        stored = json.dumps(parse_arch(text))
    return stored, build_from_json(stored)


# --------------------------------------------------------------------------- inspection


def count_params(model: keras.Model) -> int:
    """Total number of parameters, trainable or not (the length of the flat weight vector)."""
    return sum(math.prod(int(d) for d in shape) for shape in weight_shapes(model))


def weight_shapes(model: keras.Model) -> list[tuple[int, ...]]:
    """Shapes of ``model.get_weights()``, in order, without copying the values."""
    return [tuple(int(d) for d in v.shape) for v in model.weights]


def _shape_tuple(shape: Iterable[Any]) -> Shape:
    return tuple(None if d is None else int(d) for d in shape)


def input_shapes(model: keras.Model) -> list[Shape]:
    """Shape of each model input without the batch dimension, e.g. ``[(784,)]``."""
    return [_shape_tuple(t.shape)[1:] for t in model.inputs]


def output_shapes(model: keras.Model) -> list[Shape]:
    """Shape of each model output without the batch dimension, e.g. ``[(10,)]``."""
    return [_shape_tuple(t.shape)[1:] for t in model.outputs]


def model_type_name(model: keras.Model) -> str:
    """The Keras class of the model: ``Sequential`` or ``Functional``."""
    return type(model).__name__


# --------------------------------------------------------------------------- weights


def weights_to_bytes(model_or_list: keras.Model | Sequence[Any]) -> bytes:
    """Serialize weights as the flat little-endian float32 concatenation MADlib stores.

    Accepts a model (its ``get_weights()`` are used) or a list of arrays.
    """
    if hasattr(model_or_list, "get_weights"):
        weights = model_or_list.get_weights()  # type: ignore[union-attr]
    else:
        weights = list(model_or_list)
    if not weights:
        return b""
    flat = np.concatenate([np.asarray(w, dtype="<f4").ravel() for w in weights])
    return flat.tobytes()


def check_weights(model: keras.Model, data: bytes | bytearray | memoryview) -> None:
    """Raise :class:`CerebroError` (22023) unless ``data`` holds exactly one float32 per
    parameter of ``model``."""
    nbytes = len(memoryview(data).cast("B"))
    if nbytes % 4:
        raise CerebroError(
            f"model_weights has {nbytes} bytes, which is not a whole number of float32 values",
            INVALID_PARAMETER_VALUE,
            hint="model_weights must be the flat float32 concatenation of model.get_weights()",
        )
    n_values = nbytes // 4
    n_params = count_params(model)
    if n_values != n_params:
        raise CerebroError(
            f"model_weights has {n_values} values but the architecture has {n_params} parameters",
            INVALID_PARAMETER_VALUE,
            hint="model_weights must be the flat float32 concatenation of model.get_weights() "
            "for this model_arch",
        )


def bytes_to_weights(model: keras.Model, data: bytes | bytearray | memoryview) -> list[np.ndarray]:
    """Split ``model_weights`` bytes into float32 arrays shaped like ``model.get_weights()``.

    The arrays are writable copies. Raises :class:`CerebroError` when the byte count is not
    ``4 * count_params(model)``.
    """
    check_weights(model, data)
    flat = np.frombuffer(memoryview(data).cast("B"), dtype="<f4")
    out: list[np.ndarray] = []
    offset = 0
    for shape in weight_shapes(model):
        n = math.prod(int(d) for d in shape)
        out.append(flat[offset:offset + n].astype(np.float32).reshape(shape))
        offset += n
    return out


def set_weights_from_bytes(model: keras.Model, data: bytes | bytearray | memoryview) -> None:
    """Load ``model_weights`` bytes into ``model`` (which must be one the caller owns)."""
    model.set_weights(bytes_to_weights(model, data))


# --------------------------------------------------------------------------- errors


def _not_a_model(detail: str) -> CerebroError:
    return CerebroError(
        "model_arch is not a Keras model",
        INVALID_PARAMETER_VALUE,
        detail=detail,
        hint="model_arch must be the output of model.to_json() for a Sequential or "
        "functional model",
    )


def _unsupported(message: str, *, hint: str | None = None) -> CerebroError:
    return CerebroError(message, FEATURE_NOT_SUPPORTED, hint=hint)


def _keras_detail(exc: BaseException, limit: int = 1000) -> str:
    """Keras's message for a failed build: the innermost cause of its nested messages."""
    text = str(exc).strip()
    marker = "Exception encountered:"
    if marker in text:
        text = text.rsplit(marker, 1)[1].strip()
    text = text or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, (int, float)):
        return "a JSON number"
    if value is None:
        return "JSON null"
    return "a JSON object"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

