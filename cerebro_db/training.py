"""Keras on one worker: build, train one unit, evaluate, predict (TensorFlow imported lazily).

A *training unit* is one configuration making ``epochs`` passes (from ``fit_params``) over one
partition's rows. A unit starts from a model state (:mod:`cerebro_db.state`: weights and
optimizer variables), trains, and returns the new state; nothing else about the model survives
between units, so the state can hop to another worker.

Decisions:

* **Compiled models are cached per worker** (:class:`ModelCache`), keyed by what forces a
  rebuild: the architecture, the optimizer class and its arguments other than the learning
  rate, the loss, the metrics and the other compile options. A unit swaps its state into the
  cached model (weights, then every optimizer variable, then the learning rate from its
  ``compile_params``) instead of building and tracing a new model. Measured on this machine
  (2 cores, Keras 3 / TF 2.21, Adam, batch 64, one epoch): 512 Fashion-MNIST rows through a
  784-32-10 MLP take ~0.53 s as a unit on a fresh model and ~0.19 s on a cached one; 5,000
  rows through 784-64-10 take ~1.05 s and ~0.40 s. Loading plus saving the state costs ~4 ms.
  A new batch size or a new last-batch size retraces once.
* **Learning rates never force a rebuild**: Keras 3 keeps the learning rate in a variable
  (``optimizer.learning_rate``, also among ``optimizer.variables``); it is assigned from the
  unit's ``compile_params`` after the state is loaded, so ``compile_params`` are authoritative.
* **Reproducibility**: each unit shuffles its rows with a numpy generator seeded from its seed
  (Keras then fits with ``shuffle=False``; seeding Keras' own shuffle would need
  ``tf.random.set_seed``, which retraces the training step every unit) and resets every
  per-layer random-seed generator (dropout, noise layers) to values derived from the seed. Seeds are taken modulo 2**32. The
  result of a unit is therefore a function of (state, data, fit_params, seed): a model that
  hops between workers ends bitwise equal to one model trained in a single process over the
  same visit order (:func:`replay`), given deterministic kernels (plain CPU TensorFlow is; on
  GPU call :func:`configure_runtime` with ``deterministic=True``; not checked on a GPU yet).
* **A unit's pass is one call of the model's own traced loop**: unless something needs
  Keras' fit loop (callbacks, ``steps_per_epoch``, ``class_weight``, a ``steps_per_execution``
  or ``jit_compile`` from ``compile_params``), a pass runs :func:`_train_fn`: Keras'
  ``train_step`` on each batch, gathered inside the graph from the partition's features
  tensor (copied once, or shared with the worker's aligned array) in the unit's seeded row
  order. The same batches in the same order as ``model.fit`` makes: bitwise the same
  weights, optimizer variables, loss and metrics as Keras' fit with one batch per call
  (tested). It replaces ``model.fit`` over a cached tf.data pipeline (:class:`_TrainFeed`,
  still used where Keras' fit is needed), which cost three things: a pipeline thread handed
  each batch to the step (with two workers on two cores the step waited at every batch: CPU
  86% of wall time), each ``fit`` made a new iterator whose batch function was instantiated
  and optimized again, and Keras' per-call fit loop. Measured on one process doing a
  worker's share of the 20,000-row Fashion-MNIST fit (8 MLPs, 3 epochs, training and
  validation evaluation; the same states and logs bitwise): 4.65 s -> 3.50 s alone, 5.6-5.8 s
  -> 3.4-3.6 s with a second such process beside it; a new model's first unit 0.50-0.58 s
  -> 0.27-0.35 s (tracing skips Keras' multi-step plumbing).
* **Whole passes per call on Keras' path too**: unless ``compile_params`` set
  ``steps_per_execution``, models are compiled with :data:`STEPS_PER_EXECUTION`, so where
  Keras' fit runs a unit (see above) it runs the unit's batches in one call
  of its traced train function (a loop inside the graph) instead of one Python call per
  batch: the same steps in the same order (bitwise the same weights, losses and metrics),
  without the per-batch Python overhead (measured on 30,000 Fashion-MNIST rows, one thread:
  MLP units 2.1-2.7x, a small CNN 1.5x faster). Fits with batch-level callbacks
  (``TerminateOnNaN``, ``TensorBoard``) or ``steps_per_epoch`` train one batch per call, as
  Keras' default does (:func:`_match_steps`).
* **Memory**: a unit over arrays needs the partition in memory; its features become the
  feed's tensor (:func:`_features`, at most ``MAX_TRAIN_FEEDS``), shared with the array
  when it is aligned (:func:`aligned_empty`, as the worker's reader makes it), else a copy.
  A unit over a :class:`BufferSource` (a partition the worker streams) holds one packed
  buffer at a time, so a partition larger than memory trains as long as a buffer fits; the
  worker's reader decodes buffers into one reusable array per shape (:func:`stream_array`),
  whose tensor and training feed are kept as a cached partition's are;
  batches then stay within a buffer and the shuffle is a seeded buffer order, then a
  seeded row order within each buffer, as MADlib trains buffer by buffer. A partition of
  one buffer trains bitwise as its arrays do.
* **Partitions combine exactly** in evaluation: Keras reports the loss and mean-type metrics
  (accuracy variants, crossentropies, mae, mse, ...) as means weighted by rows, so
  :func:`combine_results` (a row-weighted mean) equals the value over the concatenated data up to
  float32 rounding. Metrics that are ratios of counts (AUC, precision, recall, F-scores) do not
  combine this way; evaluate them over all rows at once.

Errors are :class:`~cerebro_db.errors.CerebroError`: 22000 for data that does not fit the
model or a Keras failure caused by the inputs, 42804 for a feature shape that cannot be
reshaped to the model's input, XX000 (with the traceback in ``detail``) for unexpected ones.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import math
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from cerebro_db import keras_arch
from cerebro_db.errors import (
    DATA_EXCEPTION,
    DATATYPE_MISMATCH,
    FEATURE_NOT_SUPPORTED,
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    CerebroError,
)
from cerebro_db.params import (
    CompileParams,
    FitParams,
    OptimizerSpec,
    parse_compile_params,
    parse_fit_params,
)
from cerebro_db.state import (
    ModelState,
    StateBytes,
    decode_state,
    encode_state,
    is_state,
)

if TYPE_CHECKING:  # pragma: no cover
    import keras

__all__ = [
    "BufferSource",
    "CachedModel",
    "EvalResult",
    "ModelCache",
    "UnitResult",
    "aligned_empty",
    "as_tensor",
    "capture_state",
    "combine_results",
    "configure_runtime",
    "decode_buffer",
    "eval_batch_size",
    "evaluate",
    "fit_input_shape",
    "initial_state",
    "mark_stream",
    "onednn_enabled",
    "predict",
    "release",
    "replay",
    "restore_state",
    "stream_array",
    "stream_holding",
    "train_unit",
]

BytesLike = Union[bytes, bytearray, memoryview]
CompileInput = Union[str, CompileParams]
FitInput = Union[str, FitParams, None]

_SEED_MOD = 1 << 32
_Y_DTYPES = {
    "int2": "<i2", "smallint": "<i2", "int16": "<i2",
    "int4": "<i4", "integer": "<i4", "int32": "<i4",
    "float4": "<f4", "real": "<f4", "float32": "<f4",
    "float8": "<f8", "double precision": "<f8", "float64": "<f8",
}


# --------------------------------------------------------------------------- runtime


def configure_runtime(
    threads: int | None = None, *, deterministic: bool = False
) -> None:
    """Set TensorFlow's thread pools and, optionally, deterministic kernels.

    ``threads`` sets both the intra-op and inter-op pool sizes; it only takes effect before
    TensorFlow has run anything in this process (later calls leave the pools as they are).
    ``deterministic`` calls ``tf.config.experimental.enable_op_determinism()`` (needed for
    bitwise reproducibility on GPUs; ops without a deterministic kernel then raise).
    """
    import tensorflow as tf  # type: ignore[import-untyped]

    if threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass  # the runtime is already initialised
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def onednn_enabled() -> bool:
    """Whether TensorFlow in this process runs its oneDNN kernels (imports TensorFlow;
    ``cerebro_db.ONEDNN_ENV`` decides it at that import)."""
    from tensorflow.python.util import _pywrap_util_port  # type: ignore[import-untyped]

    return bool(_pywrap_util_port.IsMklEnabled())


# --------------------------------------------------------------------------- data


def _dtype(value: Any, what: str) -> np.dtype:
    if isinstance(value, str) and value.strip().lower() in _Y_DTYPES:
        value = _Y_DTYPES[value.strip().lower()]
    try:
        dt = np.dtype(value)
    except TypeError:
        raise CerebroError(f"{what} {value!r} is not a numeric type", INVALID_PARAMETER_VALUE)
    if dt.kind not in "biuf":
        raise CerebroError(f"{what} {value!r} is not a numeric type", INVALID_PARAMETER_VALUE)
    return dt.newbyteorder("<") if dt.itemsize > 1 else dt


def _shape(value: Sequence[Any], what: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in value)
    except (TypeError, ValueError):
        raise CerebroError(f"{what} must be a list of integers, got {value!r}",
                           INVALID_PARAMETER_VALUE) from None
    if not shape or min(shape) < 0:
        raise CerebroError(f"{what} must be a non-empty list of non-negative integers, "
                           f"got {list(shape)}", INVALID_PARAMETER_VALUE)
    return shape


def _frombuffer(
    data: BytesLike, shape: tuple[int, ...], dtype: np.dtype, what: str
) -> np.ndarray:
    view = memoryview(data).cast("B")
    count = math.prod(int(d) for d in shape)  # Python ints: no int64 wrap
    need = count * dtype.itemsize
    if len(view) != need:
        raise CerebroError(
            f"{what} buffer has {len(view)} bytes but shape {list(shape)} of {dtype.name} needs "
            f"{need}",
            DATA_EXCEPTION,
            hint="the packed table may be corrupt; run the preprocessor again",
        )
    return np.frombuffer(view, dtype=dtype, count=count).reshape(shape)


def decode_buffer(
    x_bytes: BytesLike,
    x_shape: Sequence[int],
    y_bytes: BytesLike | None = None,
    y_shape: Sequence[int] | None = None,
    y_dtype: Any = "int16",
) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode one packed buffer into ``(x, y)`` numpy arrays.

    ``x`` is little-endian float32 of shape ``x_shape`` (``[rows, dims...]``), returned as a
    zero-copy, read-only float32 view. ``y`` is ``y_dtype`` (``'int16'``/``'int2'`` one-hot or
    integer labels, ``'float32'``/``'float4'`` targets, or any numpy dtype) of shape
    ``y_shape``, returned as float32; with ``y_bytes`` None, ``y`` is None. Raises
    :class:`CerebroError`: 22000 when a byte count does not match its shape or the row counts
    differ, 22023 for a bad shape or dtype.
    """
    xs = _shape(x_shape, "x_shape")
    x = _frombuffer(x_bytes, xs, np.dtype("<f4"), "x")
    if y_bytes is None:
        return x, None
    if y_shape is None:
        raise CerebroError("y_shape is required with y_bytes", INVALID_PARAMETER_VALUE)
    ys = _shape(y_shape, "y_shape")
    y = _frombuffer(y_bytes, ys, _dtype(y_dtype, "y_dtype"), "y")
    if ys[0] != xs[0]:
        raise CerebroError(
            f"x buffer has {xs[0]} rows but y buffer has {ys[0]}", DATA_EXCEPTION,
            hint="the packed table may be corrupt; run the preprocessor again",
        )
    return x, y.astype(np.float32)


_ALIGN = 64  # TensorFlow's tensor alignment (EIGEN_MAX_ALIGN_BYTES)


def aligned_empty(shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised, writable, C-contiguous array whose data starts on a 64-byte
    boundary, so :func:`as_tensor` can hand it to TensorFlow without a copy (a reader
    decodes packed buffers straight into it)."""
    dt = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape) * dt.itemsize
    raw = np.empty(n + _ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % _ALIGN
    return raw[off:off + n].view(dt).reshape(shape)


def as_tensor(a: np.ndarray) -> Any:
    """``a`` as a float32 TensorFlow tensor; the tensor shares ``a``'s memory (DLPack, no
    copy) when ``a`` is a writable, C-contiguous float32 array on a 64-byte boundary (as
    :func:`aligned_empty` makes), else it is a copy. A shared array must not change while
    the tensor lives (the tensor keeps it alive)."""
    import tensorflow as tf  # type: ignore[import-untyped]

    a = np.asarray(a, dtype=np.float32)
    if a.size and a.flags.c_contiguous and a.flags.writeable and a.ctypes.data % _ALIGN == 0:
        try:
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        except (AttributeError, BufferError, TypeError, ValueError):  # pragma: no cover
            pass
    return tf.constant(a)


def fit_input_shape(x: np.ndarray, model: keras.Model) -> np.ndarray:
    """Return ``x`` shaped for ``model``'s single input, reshaping rows when needed.

    ``[rows, 784]`` becomes ``[rows, 28, 28, 1]`` for a model whose input shape is
    ``(28, 28, 1)``: any per-row shape with the same number of elements is reshaped (a view,
    no copy) when :func:`keras_arch.reshapes_to` allows it. Per-row shapes already matching (with
    ``None`` dimensions matching anything) are returned unchanged. Raises :class:`CerebroError` with SQLSTATE 42804 (datatype mismatch)
    naming both shapes when the element counts differ or the model's input has undefined
    dimensions that the data does not match, and 0A000 for models with several inputs.
    """
    shapes = keras_arch.input_shapes(model)
    if len(shapes) != 1:
        raise CerebroError(
            f"models with {len(shapes)} inputs are not supported", FEATURE_NOT_SUPPORTED
        )
    target = shapes[0]
    x = np.asarray(x)
    row = tuple(x.shape[1:])
    if len(row) == len(target) and all(t is None or t == r for t, r in zip(target, row)):
        return x
    known = tuple(int(t) for t in target if t is not None)
    if len(known) == len(target) and x.ndim >= 1 and keras_arch.reshapes_to(row, known):
        return x.reshape((x.shape[0],) + known)
    raise CerebroError(
        f"independent variable has shape {_fmt_shape(row)} per row but the model expects "
        f"{_fmt_shape(target)}",
        DATATYPE_MISMATCH,
        hint="Rows are taken as the model's input when they have the same number of values "
        "and are flat or have the same dimensions (besides dimensions of size 1).",
    )


def _fmt_shape(shape: Sequence[Any]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"


def _fit_xy(model: keras.Model, x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    x = fit_input_shape(np.asarray(x, dtype=np.float32), model)
    y = np.asarray(y, dtype=np.float32)
    if y.ndim == 0 or y.shape[0] != x.shape[0]:
        raise CerebroError(
            f"x has {x.shape[0]} rows but y has {y.shape[0] if y.ndim else 0}", DATA_EXCEPTION
        )
    outs = keras_arch.output_shapes(model)
    if len(outs) == 1 and y.ndim == 2 and len(outs[0]) == 1 and outs[0][0] is not None:
        k = outs[0][0]
        if y.shape[1] not in (k, 1):
            raise CerebroError(
                f"dependent variable has {y.shape[1]} values per row but the model has "
                f"{k} outputs",
                DATATYPE_MISMATCH,
                hint="the last layer must have one unit per class (or per target)",
            )
    return x, y


# --------------------------------------------------------------------------- params


def _compile_params(value: CompileInput) -> CompileParams:
    if isinstance(value, CompileParams):
        return value
    return parse_compile_params(value)


def _fit_params(value: FitInput) -> FitParams:
    if isinstance(value, FitParams):
        return value
    return parse_fit_params(value)


def _learning_rate(cp: CompileParams) -> float | None:
    """The configuration's learning rate: given, else the optimizer class' default.

    None for Keras 2's ``decay``: the learning rate is then a schedule built into the
    optimizer from ``compile_params`` (part of :func:`_rebuild_key`), a function of the
    optimizer's ``iterations``, which travels with the state.
    """
    if cp.optimizer.decayed:
        return None
    lr = cp.optimizer.kwargs.get("learning_rate")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return float(lr)
    return _default_learning_rate(cp.optimizer.name)


def _default_learning_rate(name: str) -> float | None:
    from .params import default_learning_rate

    return default_learning_rate(name)


def _rebuild_key(cp: CompileParams) -> str:
    """Canonical compile parameters with the learning rate left out (kept with ``decay``)."""
    if cp.optimizer.decayed:
        return cp.canonical()
    kwargs = {k: v for k, v in cp.optimizer.kwargs.items() if k != "learning_rate"}
    return replace(cp, optimizer=OptimizerSpec(cp.optimizer.name, kwargs)).canonical()


def _seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise CerebroError(f"seed must be an integer, got {seed!r}", INVALID_PARAMETER_VALUE)
    return int(seed) % _SEED_MOD


# --------------------------------------------------------------------------- cache


@dataclass
class CachedModel:
    """A built, compiled Keras model whose optimizer variables exist (``optimizer.build``).

    ``rng_vars`` are the per-layer seed-generator states (dropout etc.), reset per unit.
    ``compiled`` is False for models built only for prediction.
    """

    key: tuple[str, str | None]
    model: Any
    compiled: bool
    n_params: int
    rng_vars: list[Any] = field(default_factory=list)
    eval_fns: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)
    train_fns: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)
    traced: set[tuple[Any, ...]] = field(default_factory=set, repr=False)
    """Argument layouts :func:`_call_any_rows` has traced the loops for."""
    metrics_built: bool = False
    metric_order: tuple[str, ...] = ()
    steps_chosen: bool = False
    """Whether ``steps_per_execution`` is ours (:data:`STEPS_PER_EXECUTION`), not the
    user's: :func:`_match_steps` may change it per unit then."""

    def in_compile_order(self, logs: dict[str, float]) -> dict[str, float]:
        """Keras reports logs sorted by name; metrics in the order compile_params list them
        (the order of ``metrics_type``), any other keys after."""
        out = {k: logs[k] for k in self.metric_order if k in logs}
        out.update((k, v) for k, v in logs.items() if k not in out)
        return out

    @property
    def optimizer(self) -> Any:
        """The model's optimizer (None when not compiled)."""
        return self.model.optimizer if self.compiled else None


class ModelCache:
    """A worker's compiled Keras models, reused across training units of many configs.

    Keys are (Keras 3 JSON of the architecture, compile parameters without the learning
    rate), so configurations that differ only in learning rate share one model. Predict-only
    requests reuse any cached model of the architecture, else build an uncompiled one.

    Memory rule: at most ``max_models`` models are kept (least recently used evicted first,
    default 4); with ``max_params`` set, models are also evicted, least recent first, while
    the cached models together have more than ``max_params`` parameters (the model just used
    is always kept). Each entry costs about (1 + optimizer slots per weight) x parameters x 4
    bytes (Adam: 3x the weights) plus its traced functions. ``hits``, ``misses`` (= builds)
    and ``evictions`` count what happened. Not thread-safe: one cache per worker process.
    """

    def __init__(self, max_models: int = 4, max_params: int | None = None) -> None:
        if isinstance(max_models, bool) or not isinstance(max_models, int) or max_models < 1:
            raise CerebroError(
                f"max_models must be at least 1, got {max_models!r}", INVALID_PARAMETER_VALUE
            )
        if max_params is not None and (not isinstance(max_params, int) or max_params < 1):
            raise CerebroError(
                f"max_params must be at least 1, got {max_params!r}", INVALID_PARAMETER_VALUE
            )
        self.max_models = max_models
        self.max_params = max_params
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._entries: collections.OrderedDict[tuple[str, str | None], CachedModel] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every cached model."""
        self._entries.clear()

    def get(self, arch_json: Any, compile_params: CompileInput) -> CachedModel:
        """The compiled model for this architecture and compile parameters (built if new).

        The returned model holds the weights and optimizer state of whatever used it last;
        callers load a state before using it.
        """
        cp = _compile_params(compile_params)
        key = (keras_arch.cache_key(arch_json), _rebuild_key(cp))
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        entry = _build_entry(key, arch_json, cp)
        self._add(key, entry)
        return entry

    def get_for_predict(self, arch_json: Any) -> CachedModel:
        """Any cached model of this architecture (most recent first), else an uncompiled one."""
        arch = keras_arch.cache_key(arch_json)
        for key in reversed(self._entries):
            if key[0] == arch:
                self.hits += 1
                self._entries.move_to_end(key)
                return self._entries[key]
        self.misses += 1
        key = (arch, None)
        entry = _build_entry(key, arch_json, None)
        self._add(key, entry)
        return entry

    def discard(self, entry: CachedModel) -> None:
        """Forget ``entry`` (after a failure left its model in an unknown state)."""
        if self._entries.get(entry.key) is entry:
            del self._entries[entry.key]

    def _add(self, key: tuple[str, str | None], entry: CachedModel) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.max_models:
            self._entries.popitem(last=False)
            self.evictions += 1
        if self.max_params is not None:
            while len(self._entries) > 1 and (
                sum(e.n_params for e in self._entries.values()) > self.max_params
            ):
                self._entries.popitem(last=False)
                self.evictions += 1


def _build_entry(
    key: tuple[str, str | None], arch_json: Any, cp: CompileParams | None
) -> CachedModel:
    model = keras_arch.build_from_json(arch_json)
    if cp is not None:
        _compile(model, cp)
    return CachedModel(
        key=key,
        model=model,
        compiled=cp is not None,
        n_params=keras_arch.count_params(model),
        rng_vars=_rng_vars(model),
        metric_order=tuple(cp.metrics) + tuple(cp.weighted_metrics or ()) if cp else (),
        steps_chosen=cp is not None and cp.steps_per_execution is None,
    )


STEPS_PER_EXECUTION = 1 << 20
"""Batches per call of Keras' train function when ``compile_params`` do not say: more than a
unit has, so a unit's pass is one call (Keras' loop stops when the data ends)."""


def _compile(model: keras.Model, cp: CompileParams) -> None:
    kwargs = _per_output(model, cp.to_keras(), cp.to_keras)
    if cp.steps_per_execution is None:
        kwargs["steps_per_execution"] = STEPS_PER_EXECUTION
    try:
        model.compile(**kwargs)
    except CerebroError:
        raise
    except (ValueError, TypeError) as exc:
        raise CerebroError(
            f"compile_params cannot be used with this model: {_first_line(exc)}",
            INVALID_PARAMETER_VALUE,
            detail=_traceback(),
        ) from None
    model.optimizer.build(model.trainable_variables)


def _match_steps(entry: CachedModel, fp: FitParams) -> None:
    """One batch per call for a fit whose callbacks act per batch or that stops after
    ``steps_per_epoch`` batches (Keras counts those in calls of its train function), else
    :data:`STEPS_PER_EXECUTION`; only where the count is ours (``entry.steps_chosen``). A
    change drops Keras' traced functions (retraced at the next call)."""
    if not entry.steps_chosen:
        return
    want = 1 if (fp.callbacks or fp.steps_per_epoch) else STEPS_PER_EXECUTION
    model = entry.model
    if model.steps_per_execution != want:
        model.steps_per_execution = want
        model.train_function = model.test_function = model.predict_function = None


def _rng_vars(model: keras.Model) -> list[Any]:
    """Variables of ``model`` that are not weights: the seed-generator states."""
    weight_ids = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weight_ids]


# --------------------------------------------------------------------------- state swap


def _state_mismatch(message: str) -> CerebroError:
    return CerebroError(
        f"model state does not match the model: {message}",
        DATA_EXCEPTION,
        hint="the state was made for another model_arch or optimizer",
    )


def _load_weights(model: keras.Model, weights: Sequence[np.ndarray]) -> None:
    variables = model.weights
    if len(weights) != len(variables):
        raise _state_mismatch(
            f"the state has {len(weights)} weight arrays, the model {len(variables)}"
        )
    for i, (v, w) in enumerate(zip(variables, weights)):
        if tuple(v.shape) != tuple(w.shape):
            raise _state_mismatch(
                f"weight {i} has shape {_fmt_shape(w.shape)} in the state, "
                f"{_fmt_shape(tuple(v.shape))} in the model"
            )
        v.assign(w)


def _load_any(entry: CachedModel, data: BytesLike) -> ModelState | None:
    """Load weights from a state (returned) or from MADlib flat float32 weights (None)."""
    if is_state(data):
        state = decode_state(data)
        _load_weights(entry.model, state.weights)
        return state
    keras_arch.set_weights_from_bytes(entry.model, data)
    return None


def _optimizer_vars(entry: CachedModel) -> list[Any]:
    return list(entry.model.optimizer.variables)


def _load_optimizer(entry: CachedModel, values: Sequence[np.ndarray]) -> None:
    variables = _optimizer_vars(entry)
    if len(values) != len(variables):
        raise _state_mismatch(
            f"the state has {len(values)} optimizer variables, the optimizer "
            f"{len(variables)}"
        )
    for i, (v, a) in enumerate(zip(variables, values)):
        if tuple(v.shape) != tuple(a.shape):
            raise _state_mismatch(
                f"optimizer variable {i} ({v.name}) has shape {_fmt_shape(a.shape)} in the "
                f"state, {_fmt_shape(tuple(v.shape))} in the optimizer"
            )
        v.assign(a)


def _reset_optimizer(entry: CachedModel, cp: CompileParams, keep_iteration: bool) -> None:
    """Give the optimizer the values of a freshly built one (optionally keeping ``iteration``)."""
    opt = entry.model.optimizer
    fresh = cp.optimizer.to_keras()
    fresh.build(entry.model.trainable_variables)
    keep = {id(opt.iterations)} if keep_iteration else set()
    for v, f in zip(opt.variables, fresh.variables):
        if id(v) not in keep:
            v.assign(f.numpy())


def _set_learning_rate(entry: CachedModel, lr: float | None) -> None:
    if lr is not None:
        entry.model.optimizer.learning_rate = lr  # assigns the learning-rate variable


def restore_state(
    entry: CachedModel,
    compile_params: CompileInput,
    state_bytes: BytesLike,
    reset_optimizer: bool = False,
) -> ModelState | None:
    """Swap a configuration's state into a cached compiled model.

    Loads the weights and every optimizer variable of ``state_bytes``, then assigns the
    learning rate of ``compile_params`` (given or the optimizer's default). With
    ``reset_optimizer`` the optimizer variables are re-initialised (as a freshly built
    optimizer has them) except the iteration count. MADlib flat float32 weights (no state
    header) load the weights and a fresh optimizer; they return None, a state returns its
    decoded :class:`~cerebro_db.state.ModelState`. Raises :class:`CerebroError` (22000) when
    the state does not fit the model.
    """
    cp = _compile_params(compile_params)
    state = _load_any(entry, state_bytes)
    if state is None or not state.optimizer_vars:
        _reset_optimizer(entry, cp, keep_iteration=False)
    else:
        _load_optimizer(entry, state.optimizer_vars)
        if reset_optimizer:
            _reset_optimizer(entry, cp, keep_iteration=True)
    _set_learning_rate(entry, _learning_rate(cp))
    return state


def capture_state(entry: CachedModel, meta: Mapping[str, Any] | None = None) -> StateBytes:
    """Encode the cached model's weights and optimizer variables with ``meta`` (counters, info)."""
    weights = [v.numpy() for v in entry.model.weights]
    opt = [v.numpy() for v in _optimizer_vars(entry)] if entry.compiled else []
    return encode_state(weights, opt, meta)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class UnitResult:
    """What one training unit did.

    ``loss`` is the last epoch's mean training loss from Keras' history (NaN stays NaN);
    ``metrics`` the last epoch's compiled metrics by Keras name; ``seconds`` the whole unit
    (state load, fit, state save); ``rebuilt`` whether the cache had to build the model.
    """

    rows: int
    loss: float
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    epochs: int = 1
    rebuilt: bool = False


@dataclass(frozen=True)
class EvalResult:
    """Loss and metrics over ``rows`` rows (row-weighted means, as Keras reports them)."""

    loss: float
    metrics: dict[str, float]
    rows: int

    @property
    def loss_sum(self) -> float:
        """``loss * rows``: add these over partitions and divide by the total rows."""
        return self.loss * self.rows


def combine_results(results: Sequence[EvalResult]) -> EvalResult:
    """Combine per-partition results into the result over all their rows.

    A row-weighted mean (accumulated in float64); exact, up to float32 rounding inside Keras,
    for the loss and mean-type metrics (accuracy, crossentropy, mae, mse, ...), not for
    ratio-of-count metrics such as AUC, precision or recall. NaN in any part gives NaN.
    """
    rows = sum(r.rows for r in results)
    if rows == 0:
        return EvalResult(float("nan"), {}, 0)
    names = list(results[0].metrics) if results else []
    loss = math.fsum(r.loss * r.rows for r in results) / rows
    metrics = {
        k: math.fsum(r.metrics.get(k, float("nan")) * r.rows for r in results) / rows
        for k in names
    }
    return EvalResult(float(loss), metrics, rows)


# --------------------------------------------------------------------------- errors


def _first_line(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _traceback(limit: int = 4000) -> str:
    text = traceback.format_exc()
    return text if len(text) <= limit else "..." + text[-limit:]


def _keras_failure(what: str, exc: Exception) -> CerebroError:
    try:
        import tensorflow as tf  # type: ignore[import-untyped]

        input_errors: tuple[type[BaseException], ...] = (
            ValueError, TypeError, tf.errors.InvalidArgumentError,
        )
    except ImportError:  # pragma: no cover
        input_errors = (ValueError, TypeError)
    if isinstance(exc, input_errors):
        return CerebroError(
            f"{what} failed: {_first_line(exc)}", DATA_EXCEPTION, detail=_traceback()
        )
    return CerebroError(
        f"{what} failed unexpectedly: {type(exc).__name__}: {_first_line(exc)}",
        INTERNAL_ERROR,
        detail=_traceback(),
    )


# --------------------------------------------------------------------------- training


def _seed_layers(entry: CachedModel, seed: int) -> None:
    """Seed the model's own random state (dropout, noise layers) for this unit."""
    if entry.rng_vars:
        values = np.random.SeedSequence(seed).generate_state(len(entry.rng_vars), np.uint32)
        for v, s in zip(entry.rng_vars, values):
            v.assign(np.array([int(s) & 0x7FFFFFFF, 0], dtype=v.dtype))


def _last(values: Any) -> float:
    if not values:
        return float("nan")
    return float(values[-1])


@dataclass(frozen=True)
class BufferSource:
    """A partition read one packed buffer at a time, for partitions that need not fit in memory.

    ``rows[i]`` is the number of rows of buffer ``i``; ``load(i)`` returns its ``(x, y)``
    (as :func:`decode_buffer` gives them, labels already in the loss' layout). A unit over
    a source holds one decoded buffer at a time (see :func:`train_unit`). ``load_rows``
    (optional) reads buffer ``i`` as ``load`` does but yields ``(x, y, ready)`` as it
    goes, rows ``[0, ready)`` of ``x`` final: ``load_rows(i, step)`` yields whenever a
    further multiple of ``step`` rows is in and once at the end (all rows), so an
    evaluation can run on the first rows while the rest is read (:func:`evaluate`).
    """

    rows: tuple[int, ...]
    load: Callable[[int], tuple[np.ndarray, np.ndarray]]
    load_rows: Callable[[int, int], Iterator[tuple[np.ndarray, np.ndarray, int]]] | None = None

    @property
    def total_rows(self) -> int:
        """Rows over all buffers."""
        return int(sum(self.rows))


Data = Union[np.ndarray, BufferSource]


def _fit(
    entry: CachedModel, fp: FitParams, x: Data, y: np.ndarray | None, seed: int
) -> tuple[float, dict[str, float]]:
    """One unit's ``model.fit`` on an already loaded model; returns (loss, metrics).

    ``x`` and ``y`` are the caller's arrays (``x`` before reshaping to the model's input).
    Each epoch's row order is a numpy permutation seeded from ``seed`` (the identity with
    ``shuffle=False``), fed to Keras through the partition's cached :class:`_TrainFeed`
    (Keras fits it with ``shuffle=False``): seeding Keras' own shuffle needs
    ``tf.random.set_seed``, which makes TensorFlow retrace the training step (measured:
    0.29 s -> 0.42 s a unit of 10,000 rows). Dropout and other layer randomness are seeded
    through the model's seed generator variables.

    With ``x`` a :class:`BufferSource` (``y`` None) each epoch visits the buffers in a
    seeded order (drawn only when there are several), loads one at a time and fits its rows
    in a seeded order, through a feed made for that buffer and dropped after it; batches
    never span two buffers. A partition of one buffer therefore trains exactly as its
    arrays would. The loss and metrics of an epoch are the row-weighted means over its
    buffers (what Keras reports for one array: its metrics are means over rows).
    """
    _seed_layers(entry, seed)
    _match_steps(entry, fp)
    kwargs = fp.to_keras()
    kwargs["verbose"] = 0
    kwargs.pop("epochs", None)
    kwargs.pop("initial_epoch", None)
    epochs = fp.passes
    shuffle = kwargs.pop("shuffle", True)
    batch_size = int(kwargs.pop("batch_size", 32) or 32)
    kwargs["shuffle"] = False
    rng = np.random.default_rng(seed)
    direct = _direct_loop(entry, fp)
    hist: dict[str, float] = {}
    for _ in range(epochs):
        if isinstance(x, BufferSource):
            hist = _fit_buffers(entry, x, batch_size, shuffle, rng, kwargs, direct)
            continue
        if direct:
            xs, ys = _fit_xy(entry.model, x, y)
            n = int(xs.shape[0])
            hist = _train_pass(entry, _features(x), tuple(xs.shape[1:]), ys,
                               rng.permutation(n) if shuffle else None, batch_size)
            continue
        feed = _train_feed(entry.model, x, y, batch_size)
        feed.order(rng.permutation(feed.rows) if shuffle else None)
        h = entry.model.fit(feed.dataset, epochs=1, **kwargs).history
        hist = {k: _last(v) for k, v in h.items()}
    loss = hist.pop("loss", float("nan"))
    return loss, entry.in_compile_order(hist)


def _direct_loop(entry: CachedModel, fp: FitParams) -> bool:
    """Whether a unit's passes run in :func:`_train_fn`'s loop rather than ``model.fit``:
    when nothing needs Keras' fit loop (no callbacks, no ``steps_per_epoch`` or
    ``class_weight``, our own ``steps_per_execution``, no XLA compilation)."""
    return (entry.steps_chosen and not fp.callbacks and not fp.steps_per_epoch
            and not fp.class_weight and not getattr(entry.model, "jit_compile", False))


def _train_pass(entry: CachedModel, features: Any, row_shape: tuple[int, ...], ys: np.ndarray,
                permutation: np.ndarray | None, batch_size: int) -> dict[str, float]:
    """One pass of ``model.fit``'s work over the rows of ``features`` (2-D) in the order
    ``permutation`` (None: stored order), as :func:`_train_fn` runs it; returns the pass's
    logs (what Keras' history records for the epoch: its metrics, reset at the pass's start)."""
    import tensorflow as tf  # type: ignore[import-untyped]

    rows = int(ys.shape[0])
    labels = tf.constant(ys)
    _build_metrics(entry, features, row_shape, labels)
    order = np.arange(rows, dtype=np.int64) if permutation is None \
        else np.asarray(permutation, dtype=np.int64)
    entry.model.reset_metrics()
    _call_any_rows(entry, ("train", row_shape), _train_fn(entry, row_shape), features, labels,
                   tf.constant(order), tf.constant(int(batch_size), tf.int64),
                   tf.constant(rows, tf.int64))
    return {k: float(v) for k, v in entry.model.get_metrics_result().items()}


def _train_fn(entry: CachedModel, row_shape: tuple[int, ...]) -> Any:
    """The model's traced training loop for rows of ``row_shape``: Keras' ``train_step``
    (what ``model.fit`` runs per batch) on batches ``order[i*b:(i+1)*b]`` of a 2-D feature
    tensor and its labels, one after another (the last batch partial), exactly the batches
    ``fit(x[order], y[order], batch_size=b, shuffle=False)`` makes. Traced once per model,
    row shape and label layout; the order, batch size and row count are arguments.

    Instead of ``model.fit`` over a tf.data pipeline: a batch is gathered inside the step's
    graph, so no pipeline thread hands batches to the step (a wait at every step when the
    worker shares the machine's cores), no iterator is made per unit (each one instantiated
    and optimized the pipeline's batch function again) and Keras' per-call fit loop is not
    run; tracing skips Keras' multi-step plumbing. Measured in :mod:`bench` and in the
    module docstring."""
    fn = entry.train_fns.get(row_shape)
    if fn is not None:
        return fn
    import tensorflow as tf  # type: ignore[import-untyped]

    model = entry.model
    shape = [-1, *row_shape]

    @tf.function(autograph=False, reduce_retracing=True)
    def run(features: Any, labels: Any, order: Any, batch_size: Any, rows: Any) -> Any:
        def body(start: Any) -> Any:
            idx = order[start:tf.minimum(start + batch_size, rows)]
            model.train_step((tf.reshape(tf.gather(features, idx), shape),
                              tf.gather(labels, idx)))
            return (start + batch_size,)

        return tf.while_loop(lambda start: start < rows, body,
                             (tf.constant(0, tf.int64),), parallel_iterations=1)

    entry.train_fns[row_shape] = run
    return run


def _fit_buffers(
    entry: CachedModel, source: BufferSource, batch_size: int, shuffle: bool,
    rng: np.random.Generator, kwargs: dict[str, Any], direct: bool = False,
) -> dict[str, float]:
    """One pass over ``source``, a buffer at a time; the row-weighted means of the history."""
    count = len(source.rows)
    order = rng.permutation(count) if shuffle and count > 1 else range(count)
    sums: dict[str, float] = {}
    rows = 0
    for b in order:
        xb, yb = source.load(int(b))
        xs, ys = _fit_xy(entry.model, xb, yb)
        n = int(xs.shape[0])
        if n == 0:
            continue
        if direct:  # a stream array's kept tensor reads it in place; others are copied
            features = _features(xb) if is_stream_array(xb) else as_tensor(xs.reshape(n, -1))
            h = {k: [v] for k, v in _train_pass(
                entry, features, tuple(xs.shape[1:]), ys,
                rng.permutation(n) if shuffle else None, batch_size).items()}
            del features, xb, xs, yb, ys
        elif is_stream_array(xb):  # decoded in place: its kept tensor and feed read it as is
            del xs
            feed = _train_feed(entry.model, xb, yb, batch_size)
            feed.order(rng.permutation(n) if shuffle else None)
            h = entry.model.fit(feed.dataset, epochs=1, **kwargs).history
            del feed, xb, yb, ys
        else:
            row_shape = tuple(xs.shape[1:])
            features = as_tensor(xs.reshape(n, -1))
            del xb, xs
            feed = _TrainFeed(features, row_shape, ys, batch_size)
            feed.order(rng.permutation(n) if shuffle else None)
            h = entry.model.fit(feed.dataset, epochs=1, **kwargs).history
            del feed, features, yb, ys
            gc.collect(1)  # the pipeline sits in young reference cycles: free it now
        for k, v in h.items():
            sums[k] = sums.get(k, 0.0) + _last(v) * n
        rows += n
    return {k: v / rows for k, v in sums.items()} if rows else {"loss": float("nan")}


MAX_TRAIN_FEEDS = 4
"""Training feeds kept per process (partitions x batch sizes x label layouts)."""


class _TrainFeed:
    """A batched tf.data pipeline over one partition, in an order set per epoch.

    Keras turns numpy arrays into a new tf.data pipeline on every ``fit`` call (a copy of
    the features into a tensor, a shuffle and a traced gather: ~60-80 ms for 10,000
    Fashion-MNIST rows, a fifth of a unit). A worker trains many configurations on the
    same partition, so the features are copied into a tensor once (:func:`_features`) and
    the pipeline is built once per batch size; a unit writes its row permutation into a
    variable that the pipeline's batch function (traced once) gathers by, and its labels
    into a variable (they are small, and a caller may pass new label arrays for the same
    features, e.g. class indices for a sparse loss). Batch ``i`` holds rows
    ``order[i*b:(i+1)*b]``, the last one partial, exactly as ``fit(x[order], y[order],
    batch_size=b, shuffle=False)`` would batch them. Batches are prefetched (as Keras' own
    pipeline does): without it the training step waits for the batch function's thread at
    every step, which on a busy machine made batch-32 units 1.7x slower in wall-clock time
    at the same CPU time. The order and labels are written before ``fit`` makes the
    iterator and not touched while it runs, so prefetching reads the unit's own values.

    tf.data's default graph rewrites are off for this pipeline: to apply them, tf.data
    serializes the pipeline with the tensors its functions capture and rebuilds it, which
    copied the whole features tensor (94 MB for 30,000 Fashion-MNIST rows) once per feed and
    kept the copy as long as the feed; none of the rewrites applies to this pipeline (one
    sequential map, prefetched explicitly). Measured on 30,000 x 784 rows: a worker's private
    memory 94 MB lower, the same model bytes after 12 units, the first unit 25-35 ms faster,
    later units unchanged.
    """

    def __init__(self, features: Any, row_shape: tuple[int, ...], y: np.ndarray,
                 batch_size: int) -> None:
        import tensorflow as tf  # type: ignore[import-untyped]

        rows = int(y.shape[0])
        self.rows = rows
        self.identity = np.arange(rows, dtype=np.int64)
        self.perm = tf.Variable(self.identity, trainable=False, name="feed_order")
        self.labels = tf.Variable(y, trainable=False, name="feed_labels")
        perm, labels, bs = self.perm, self.labels, batch_size
        shape = [-1, *row_shape]

        @tf.autograph.experimental.do_not_convert  # no Python control flow: trace it as is
        def batch(i: Any) -> tuple[Any, Any]:
            start = i * bs
            idx = perm[start:tf.minimum(start + bs, rows)]
            return tf.reshape(tf.gather(features, idx), shape), tf.gather(labels, idx)

        batches = -(-rows // bs)
        options = tf.data.Options()
        options.experimental_optimization.apply_default_optimizations = False
        self.dataset = tf.data.Dataset.range(batches).map(batch).prefetch(
            tf.data.AUTOTUNE).with_options(options)

    def order(self, permutation: np.ndarray | None) -> None:
        """Set the row order of the next pass (None: the stored order)."""
        self.perm.assign(self.identity if permutation is None else permutation)

    def set_labels(self, y: np.ndarray) -> None:
        """Set the labels (same shape and dtype as the feed was built with)."""
        self.labels.assign(y)


MAX_STREAM_ARRAYS = 3
"""Reusable arrays for streamed buffers kept per process, one per buffer shape: three, so a
worker alternating training and validation units over a partition of several buffers keeps
its full training buffers', its last (shorter) training buffer's and its validation
buffer's (with two, its evaluation units released and rebuilt an array, tensor and training
feed at every buffer: measured 11% more CPU time over a training and an evaluation unit of
60,000 Fashion-MNIST rows in 8,572-row buffers with 10,000 validation rows)."""

_STREAM_ARRAYS: collections.OrderedDict[tuple[int, ...], np.ndarray] = \
    collections.OrderedDict()
_STREAM_HOLDS: dict[tuple[int, ...], Hashable] = {}


def stream_array(shape: Sequence[int]) -> np.ndarray:
    """The process' reusable float32 array of ``shape`` (from :func:`aligned_empty`) for one
    streamed buffer: a reader decodes each buffer into it in place, and training and
    evaluation keep its tensor (shared, :func:`as_tensor`) and training feed as they do for a
    cached partition, so a unit over a :class:`BufferSource` whose buffers have one shape
    (a partition of one buffer, or buffers of ``buffer_size`` rows) makes no new array,
    tensor or pipeline per buffer: the next unit's rows are written where the tensor reads.
    The array's contents are valid until the next buffer of that shape is read; at most
    ``MAX_STREAM_ARRAYS`` shapes are kept (the least recently used one is released).
    The caller is taken to overwrite the array: what it held (:func:`mark_stream`) is
    forgotten."""
    key = tuple(int(d) for d in shape)
    _STREAM_HOLDS.pop(key, None)
    hit = _STREAM_ARRAYS.get(key)
    if hit is not None:
        _STREAM_ARRAYS.move_to_end(key)
        return hit
    while len(_STREAM_ARRAYS) >= MAX_STREAM_ARRAYS:
        old, arr = _STREAM_ARRAYS.popitem(last=False)
        _STREAM_HOLDS.pop(old, None)
        release(arr)
    out = aligned_empty(key, np.float32)
    _STREAM_ARRAYS[key] = out
    return out


def mark_stream(x: np.ndarray, contents: Hashable) -> None:
    """Record that the stream array ``x`` now holds ``contents`` (a reader's key for the
    stored buffer version it decoded into ``x``, set once the whole buffer is written)."""
    key = tuple(x.shape)
    if _STREAM_ARRAYS.get(key) is not x:
        raise ValueError("not a stream array")
    _STREAM_HOLDS[key] = contents


def stream_holding(shape: Sequence[int], contents: Hashable) -> np.ndarray | None:
    """The stream array of ``shape`` when it still holds ``contents`` (as marked by
    :func:`mark_stream` and not overwritten since), else None: a reader then skips decoding
    a buffer that the array already holds."""
    key = tuple(int(d) for d in shape)
    hit = _STREAM_ARRAYS.get(key)
    if hit is None or key not in _STREAM_HOLDS or _STREAM_HOLDS[key] != contents:
        return None
    _STREAM_ARRAYS.move_to_end(key)
    return hit


def drop_streams(holding: Callable[[Hashable], bool]) -> int:
    """Release the stream arrays whose contents (as :func:`mark_stream` recorded them)
    satisfy ``holding``, with their tensors and feeds (:func:`release`); returns how many.
    A reader calls it when it caches a partition whose buffers a stream array also holds
    (e.g. left by an earlier fit of the session that streamed them): the array would
    only double what the cache keeps."""
    gone = [k for k, c in _STREAM_HOLDS.items() if holding(c)]
    for key in gone:
        del _STREAM_HOLDS[key]
        release(_STREAM_ARRAYS.pop(key))
    if gone:  # its feed's pipeline sits in reference cycles: free the array now
        gc.collect()
    return len(gone)


def is_stream_array(x: Any) -> bool:
    """Whether ``x`` is one of the reusable arrays of :func:`stream_array`."""
    return isinstance(x, np.ndarray) and _STREAM_ARRAYS.get(tuple(x.shape)) is x


_FEATURES: collections.OrderedDict[int, tuple[np.ndarray, Any]] = collections.OrderedDict()
_TRAIN_FEEDS: collections.OrderedDict[tuple[Any, ...], tuple[np.ndarray, _TrainFeed]] = \
    collections.OrderedDict()


def _features(x: np.ndarray) -> Any:
    """The rows of ``x`` as a 2-D float32 tensor, cached by the array's identity (the array
    is held so its identity stays valid); at most ``MAX_TRAIN_FEEDS`` kept. An array from
    :func:`aligned_empty` is shared, not copied (:func:`as_tensor`)."""
    hit = _FEATURES.get(id(x))
    if hit is not None and hit[0] is x:
        _FEATURES.move_to_end(id(x))
        return hit[1]
    t = as_tensor(np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1))
    _FEATURES[id(x)] = (x, t)
    while len(_FEATURES) > MAX_TRAIN_FEEDS:
        _FEATURES.popitem(last=False)
    return t


def release(x: np.ndarray) -> None:
    """Forget the tensor and training feeds kept for the array ``x`` (its caller is dropping
    it), so their memory is freed with it."""
    hit = _FEATURES.get(id(x))
    if hit is not None and hit[0] is x:
        del _FEATURES[id(x)]
    for key in [k for k, v in _TRAIN_FEEDS.items() if v[0] is x]:
        del _TRAIN_FEEDS[key]


def _train_feed(model: keras.Model, x: np.ndarray, y: np.ndarray | None,
                batch_size: int) -> _TrainFeed:
    """The cached :class:`_TrainFeed` for (``x``, the model's input, ``y``'s layout, batch
    size), with ``y`` loaded; validates the data against the model as :func:`_fit_xy`."""
    xs, ys = _fit_xy(model, x, y)
    key = (id(x), xs.shape[1:], ys.shape, batch_size)
    hit = _TRAIN_FEEDS.get(key)
    if hit is not None and hit[0] is x:
        _TRAIN_FEEDS.move_to_end(key)
        feed = hit[1]
        feed.set_labels(ys)
        return feed
    feed = _TrainFeed(_features(x), tuple(xs.shape[1:]), ys, batch_size)
    _TRAIN_FEEDS[key] = (x, feed)
    while len(_TRAIN_FEEDS) > MAX_TRAIN_FEEDS:
        _TRAIN_FEEDS.popitem(last=False)
    return feed


def _rows(model: keras.Model, x: Data, y: np.ndarray | None) -> int:
    """Rows of a unit's data (arrays are checked against the model here, buffers when read)."""
    if isinstance(x, (BufferSource, MultiData)):
        return x.total_rows
    return int(_fit_xy(model, x, y)[0].shape[0])


def _next_meta(
    state: ModelState | None, rows: int, epochs: int, completes_epoch: bool,
    info: Mapping[str, Any] | None,
) -> dict[str, Any]:
    base = state.meta() if state is not None else {"info": {}}
    base["units_done"] = base.get("units_done", 0) + 1
    base["samples_seen"] = base.get("samples_seen", 0) + rows * epochs
    if completes_epoch:
        base["epochs_done"] = base.get("epochs_done", 0) + 1
    if info:
        base["info"] = {**base["info"], **dict(info)}
    return base


def train_unit(
    cache: ModelCache,
    arch_json: Any,
    compile_params: CompileInput,
    fit_params: FitInput,
    state_bytes: BytesLike,
    x: Data,
    y: np.ndarray | None,
    seed: int,
    reset_optimizer: bool = False,
    *,
    completes_epoch: bool = False,
    info: Mapping[str, Any] | None = None,
) -> tuple[StateBytes, UnitResult]:
    """Train one unit: load ``state_bytes``, ``model.fit`` over ``(x, y)``, return the new state.

    The cached compiled model for (architecture, compile parameters without learning rate) is
    loaded with the state's weights and optimizer variables, then the learning rate of
    ``compile_params``; ``fit`` runs with ``fit_params``' batch_size, epochs, shuffle,
    class_weight and callbacks (always ``verbose=0``) after seeding every random source from
    ``seed``. ``state_bytes`` may also be MADlib flat float32 weights (the optimizer then
    starts fresh). ``reset_optimizer=True`` re-initialises the optimizer variables but keeps
    its iteration count (the 'ring' policy's emulation of MADlib losing optimizer state at
    each hop). The new state's counters add one unit and ``rows * epochs`` samples, and one
    epoch when ``completes_epoch``; ``info`` is merged into the state's info. A NaN loss is
    reported as NaN (the state is saved as it is). Raises :class:`CerebroError`; on failure
    nothing is returned, and after an unexpected Keras failure the cached model is dropped.

    Memory: ``x`` as arrays is a whole partition in memory; the features are also copied
    once into a tensor kept for later units (see :class:`_TrainFeed`, at most
    ``MAX_TRAIN_FEEDS``). ``x`` as a :class:`BufferSource` (``y`` None) holds one buffer at a
    time (its decoded arrays and one tensor copy), for partitions larger than memory; it is
    trained buffer by buffer as :func:`_fit` describes.
    """
    start = time.perf_counter()
    cp = _compile_params(compile_params)
    fp = _fit_params(fit_params)
    seed = _seed(seed)
    misses = cache.misses
    entry = cache.get(arch_json, cp)
    rebuilt = cache.misses != misses
    try:
        rows = _rows(entry.model, x, y)
        keras_arch.check_batch(arch_json, min(fp.batch_size, rows))
        state = restore_state(entry, cp, state_bytes, reset_optimizer)
        loss, metrics = _fit_multi(entry, fp, x, seed) if isinstance(x, MultiData) \
            else _fit(entry, fp, x, y, seed)
        meta = _next_meta(state, rows, fp.passes, completes_epoch, info)
        new_state = capture_state(entry, meta)
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001 - Keras/TF raise many types
        cache.discard(entry)
        raise _keras_failure("training unit", exc) from None
    result = UnitResult(
        rows=rows,
        loss=loss,
        seconds=time.perf_counter() - start,
        metrics=metrics,
        epochs=fp.passes,
        rebuilt=rebuilt,
    )
    return new_state, result


def empty_unit(state_bytes: BytesLike, completes_epoch: bool = False) -> tuple[StateBytes, UnitResult]:
    """A unit over a partition that holds no rows: the weights and optimizer variables stay
    as they are, the counters add one unit (and one epoch when ``completes_epoch``); the
    result has no rows, a NaN loss and no metrics (it weighs nothing in the means)."""
    start = time.perf_counter()
    state = decode_state(state_bytes)
    meta = _next_meta(state, 0, 1, completes_epoch, None)
    new_state = encode_state(state.weights, state.optimizer_vars, meta)
    return new_state, UnitResult(rows=0, loss=float("nan"),
                                 seconds=time.perf_counter() - start)


_SEEDS_LOCK = threading.Lock()


def _seed_keras(seed: int) -> None:
    """Seed what builds a model's initial weights, as ``keras.utils.set_random_seed(seed)``
    does (Keras' global seed and seed generator, Python's ``random``, numpy's global
    generator), except TensorFlow's global seed: setting that (``tf.random.set_seed``) clears
    every kernel TensorFlow has cached in the process, so each traced function (the cached
    models' train and evaluation loops, the training feeds' batch functions) was instantiated
    and optimized again at its next call, ~60-80 ms for an MLP's train step. A worker builds
    the initial state of each configuration whose first unit it runs, between units.
    Measured on one process running all 8 initial states of the 20,000-row Fashion-MNIST
    fit with a worker's share of its units (8 MLPs, 3 epochs, training and validation
    evaluation, Keras' fit path): 5.8 s -> 4.7 s in a plain process, 5.3 s -> 4.8 s in a
    backend, the same final states bitwise; in a fit each worker builds about half of them.
    Nothing the initial weights depend on reads TensorFlow's seed: a ``model_arch`` holds
    only Keras' built-in layers (:mod:`cerebro_db.keras_arch`), whose initializers draw
    from Keras' seed generator with stateless ops (the initial weights equal
    ``set_random_seed``'s, tested)."""
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
        from keras.src.utils import rng_utils

        names = (rng_utils.GLOBAL_RANDOM_SEED, seed_generator.GLOBAL_SEED_GENERATOR)
    except (ImportError, AttributeError):  # pragma: no cover - a Keras that moved them
        import keras

        keras.utils.set_random_seed(seed)  # the same seeds, TensorFlow's too
        return
    global_state.set_global_attribute(names[0], seed)
    global_state.set_global_attribute(names[1], None)
    random.seed(seed)
    np.random.seed(seed)


@contextlib.contextmanager
def _own_default_seeds(seed: int) -> Iterator[None]:
    """Keras draws the seed of every initializer built without one from Python's global
    ``random`` (seeded by :func:`_seed_keras`). In a process with other threads (a Dask
    worker's event loop, a Ray actor's) those may draw from it too, between the seeding and
    the build, and the initial weights then differ from run to run. During the build Keras
    draws from a private generator seeded the same way instead: the same numbers a
    single-threaded process gets, whatever the other threads do."""
    from keras.src.random import seed_generator

    with _SEEDS_LOCK:
        shared = seed_generator.python_random
        seed_generator.python_random = random.Random(seed)  # type: ignore[assignment]
        try:
            yield
        finally:
            seed_generator.python_random = shared


def initial_state(
    arch_json: Any,
    compile_params: CompileInput,
    seed: int,
    init_weights: BytesLike | None = None,
) -> StateBytes:
    """The state a configuration starts from, reproducible from ``seed``.

    The model is built after seeding Keras as ``keras.utils.set_random_seed(seed)`` does,
    except TensorFlow's global seed (:func:`_seed_keras`), so the same seed gives the same
    initial weights; ``init_weights`` (MADlib flat float32 bytes, e.g. an architecture
    table's ``model_weights`` for transfer learning) override them. The optimizer is built on
    the model's trainable variables so its variables (iteration 0, the learning rate, zeroed
    slots) are in the state from the start. Counters are zero; ``info`` records the seed and
    optimizer. Raises :class:`CerebroError`.
    """
    cp = _compile_params(compile_params)
    seed = _seed(seed)
    _seed_keras(seed)
    with _own_default_seeds(seed):
        model = keras_arch.build_from_json(arch_json)
    if init_weights is not None:
        keras_arch.set_weights_from_bytes(model, init_weights)
    optimizer = cp.optimizer.to_keras()
    optimizer.build(model.trainable_variables)
    weights = [v.numpy() for v in model.weights]
    opt = [v.numpy() for v in optimizer.variables]
    info = {"seed": seed, "optimizer": cp.optimizer.name}
    return encode_state(weights, opt, {"info": info})


def replay(
    arch_json: Any,
    compile_params: CompileInput,
    fit_params: FitInput,
    init_state: BytesLike,
    units: Sequence[tuple[Data, np.ndarray | None, int]],
) -> StateBytes:
    """Train one model object over ``units`` in order, without saving or loading between them.

    The reference for sequential equivalence: a configuration trained by :func:`train_unit`
    hopping between workers (state saved and loaded around every unit) over the same
    ``(x, y, seed)`` sequence ends with bitwise the same weights and optimizer variables (and,
    as no epoch is marked complete here, the same state bytes when ``train_unit`` is called
    with its defaults); ``x`` may be a :class:`BufferSource` (``y`` None) as in
    :func:`train_unit`. Builds a fresh model; returns the final state.
    """
    cp = _compile_params(compile_params)
    fp = _fit_params(fit_params)
    entry = _build_entry(("", None), arch_json, cp)
    state = restore_state(entry, cp, init_state)
    meta: dict[str, Any] = state.meta() if state is not None else {"info": {}}
    for x, y, seed in units:
        _fit(entry, fp, x, y, _seed(seed))
        meta["units_done"] = meta.get("units_done", 0) + 1
        meta["samples_seen"] = meta.get("samples_seen", 0) + _rows(entry.model, x, y) * fp.passes
    return capture_state(entry, meta)


# --------------------------------------------------------------------------- eval / predict


def evaluate(
    cache: ModelCache,
    arch_json: Any,
    compile_params: CompileInput,
    state_bytes: BytesLike,
    x: Data,
    y: np.ndarray | None,
    batch_size: int = 32,
    weights_loaded: bool = False,
) -> EvalResult:
    """Loss and compiled metrics of the state's weights over all rows of ``(x, y)``.

    Uses the cached compiled model (optimizer untouched); ``state_bytes`` may be a state or
    MADlib flat float32 weights. The values are what ``model.evaluate(x, y, batch_size)``
    returns (Keras' ``test_step`` over the same batches, in the same order, accumulated in
    the model's metric variables), computed by one traced loop per call (:func:`_eval_fn`)
    instead of Keras' per-batch Python and per-call input pipeline. Loss and mean-type
    metrics are row-weighted means, so partitions combine exactly with
    :func:`combine_results` (see the module docstring for which metrics). ``x`` may be a
    :class:`BufferSource` (``y`` None): buffers are then read one at a time and accumulate
    into the same metric variables, which gives the value over all the rows (for every
    metric kind); a source with ``load_rows`` is evaluated part by part while each buffer
    is read (:func:`_eval_overlapped`, bitwise the same values). Arrays are kept as a
    tensor for later calls (:func:`_features`, shared with training); a buffer's tensor is
    dropped after it. ``weights_loaded``: the cached model already holds this state's
    weights (the caller's previous ``evaluate`` of the same state, with nothing run on the
    model since: an evaluation unit's second kind), so they are not decoded and assigned
    again. Raises :class:`CerebroError`.
    """
    cp = _compile_params(compile_params)
    entry = cache.get(arch_json, cp)
    if isinstance(x, (BufferSource, MultiData)):
        keras_arch.check_batch(arch_json, min(int(batch_size), x.total_rows))
    if isinstance(x, MultiData):
        return _evaluate_multi(cache, entry, x, state_bytes, batch_size, weights_loaded)
    try:
        if not weights_loaded:
            _load_any(entry, state_bytes)
        entry.model.reset_metrics()
        if isinstance(x, BufferSource):
            rows = 0
            for b in range(len(x.rows)):
                if x.load_rows is not None:
                    rows += _eval_overlapped(entry, x, b, batch_size)
                    continue
                xb, yb = x.load(b)
                xs, ys = _fit_xy(entry.model, xb, yb)
                features = _features(xb) if is_stream_array(xb) else as_tensor(xs)
                rows += _eval_rows(entry, features, tuple(xs.shape[1:]), ys, batch_size)
                del xb, yb, xs, ys, features
        else:
            xs, ys = _fit_xy(entry.model, x, y)
            keras_arch.check_batch(arch_json, min(int(batch_size), int(xs.shape[0])))
            rows = _eval_rows(entry, _features(x), tuple(xs.shape[1:]), ys, batch_size)
        if rows == 0:
            return EvalResult(float("nan"), {}, 0)
        out = {k: float(v) for k, v in entry.model.get_metrics_result().items()}
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001
        cache.discard(entry)
        raise _keras_failure("evaluation", exc) from None
    out = entry.in_compile_order(out)
    loss = out.pop("loss", float("nan"))
    return EvalResult(loss=loss, metrics=out, rows=rows)


EVAL_ACTIVATION_BYTES = 4 << 20
"""Evaluation batches hold about this many bytes of inputs and layer outputs (see
:func:`eval_batch_size`)."""
MAX_EVAL_BATCH = 8192


def eval_batch_size(model: keras.Model, batch_size: int) -> int:
    """The batch size an evaluation of ``model`` runs at: at least the configuration's
    ``batch_size``, more when a batch's inputs and layer outputs stay within
    ``EVAL_ACTIVATION_BYTES`` (at most ``MAX_EVAL_BATCH`` rows).

    Measured in one process with 1 thread (CPU seconds, 20,000 Fashion-MNIST rows): a
    784-128-64-10 MLP evaluates in 0.044 s at batch 64, 0.031 s from 512 rows on; a small CNN
    (conv8-conv16) in 0.24 s at 64, 0.26 s at 128 and 0.30-0.35 s at 256-4096, as its
    activations (about 9,500 values a row) leave the caches. Per-batch work is then mostly
    in the kernels and larger batches only cost memory.
    """
    per_row = 0
    try:
        for t in list(model.inputs) + [layer.output for layer in model.layers]:
            per_row += int(np.prod([int(d) for d in t.shape[1:]], dtype=np.int64))
    except (AttributeError, TypeError, ValueError):  # a layer without a static output shape
        return max(int(batch_size), 1)
    rows = EVAL_ACTIVATION_BYTES // max(4 * per_row, 1)
    return int(max(int(batch_size), min(rows, MAX_EVAL_BATCH), 1))


OVERLAP_STEPS = 8
"""An overlapped evaluation hands a buffer's rows to its thread in about this many parts."""
OVERLAP_SWITCH = 0.0002
"""Python's thread switch interval (seconds) during an overlapped evaluation: the reading
thread holds the GIL between its queries, and at the default 5 ms the evaluation thread
waited up to that long to start and to end each part."""


def _eval_overlapped(entry: CachedModel, source: BufferSource, b: int, batch_size: int) -> int:
    """Evaluate buffer ``b`` of ``source`` while it is read: the calling thread reads (a
    worker's database access stays on its main thread) and one other thread runs the traced
    evaluation loop on each part of whole batches as soon as it is in (TensorFlow releases
    the GIL while it computes). The parts are evaluated one after the other, in row order,
    on the same batches as one call over the buffer would make, so the metrics are bitwise
    the same. Only for the reader's reusable arrays (:func:`stream_array`), whose tensor
    reads the array's memory as it is written; other arrays are read whole first."""
    import concurrent.futures

    import tensorflow as tf  # type: ignore[import-untyped]

    assert source.load_rows is not None
    bs = max(int(batch_size), 1)
    total = int(source.rows[b])
    step = bs * max(1, -(-total // (bs * OVERLAP_STEPS)))
    done = 0
    prepared: tuple[Any, tuple[int, ...], Any] | None = None
    pending: list[concurrent.futures.Future[None]] = []
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="cerebro-eval")
    switch = sys.getswitchinterval()
    sys.setswitchinterval(OVERLAP_SWITCH)
    try:
        parts = source.load_rows(b, step)
        for xb, yb, ready in parts:
            if ready == 0:
                continue  # a buffer without rows
            if prepared is None:
                if not is_stream_array(xb) and ready < total:
                    continue  # not shared with its tensor: evaluate once it is whole
                xs, ys = _fit_xy(entry.model, xb, yb)
                features = _features(xb) if is_stream_array(xb) else as_tensor(xs)
                prepared = (features, tuple(xs.shape[1:]), tf.constant(ys))
                del xs, ys
                # build and trace here (an empty range): the thread only runs the loop
                _eval_range(entry, *prepared, bs, 0, 0)
            if pending and pending[-1].done() and pending[-1].exception() is not None:
                break  # raised below
            if ready > done and not pending and ready == total:
                _eval_range(entry, *prepared, bs, done, ready)  # held or read at once
                done = ready
            elif ready > done:
                pending.append(pool.submit(_eval_range, entry, *prepared, bs, done, ready))
                done = ready
    except BaseException:
        for f in pending:
            f.cancel()
        raise
    finally:
        pool.shutdown(wait=True)  # the evaluation thread never outlives the buffer's read
        sys.setswitchinterval(switch)
    for f in pending:
        f.result()  # its error, if any, raised here
    return done


def _eval_range(entry: CachedModel, features: Any, row_shape: tuple[int, ...], labels: Any,
                batch_size: int, start: int, stop: int) -> None:
    import tensorflow as tf  # type: ignore[import-untyped]

    _build_metrics(entry, features, row_shape, labels)
    _call_any_rows(entry, ("eval", row_shape), _eval_fn(entry, row_shape), features, labels,
                   tf.constant(int(batch_size), tf.int32), tf.constant(int(start), tf.int32),
                   tf.constant(int(stop), tf.int32))


def _call_any_rows(entry: CachedModel, which: tuple[Any, ...], fn: Any, *args: Any) -> Any:
    """Call the traced loop ``fn`` with ``args``, having traced it first (once per argument
    dtypes and trailing dimensions) with every tensor's leading dimension open: the rows of
    another table or partition (a unit's validation rows after its training partition's,
    another partition a worker took a unit of, a shorter buffer) then reuse the trace
    instead of tracing the model's step again, 0.1-0.2 s for a small MLP, more for larger
    models. (``reduce_retracing`` traces the first call for its exact row count and opens
    the dimension only on the second.)"""
    import tensorflow as tf  # type: ignore[import-untyped]

    if not all(isinstance(a, tf.Tensor) for a in args):
        return fn(*args)
    key = (*which, *((a.dtype, tuple(a.shape[1:])) for a in args))
    if key not in entry.traced:
        fn.get_concrete_function(*(tf.TensorSpec([None, *a.shape[1:]] if a.shape.rank else [],
                                                  a.dtype) for a in args))
        entry.traced.add(key)
    return fn(*args)


def _build_metrics(entry: CachedModel, features: Any, row_shape: tuple[int, ...],
                   labels: Any) -> None:
    """Build the compiled loss and metrics as ``fit()`` and ``evaluate()`` would, once per
    model, before a loop that updates them is traced."""
    import tensorflow as tf  # type: ignore[import-untyped]

    if entry.metrics_built:
        return
    first = (tf.reshape(features[:1], [-1, *row_shape]), labels[:1])
    build = getattr(entry.model, "_symbolic_build", None)
    if build is not None:
        build(data_batch=first)
    else:  # pragma: no cover - a Keras without it
        entry.model.evaluate(*first, verbose=0)
        entry.model.reset_metrics()
    entry.metrics_built = True


def _eval_rows(entry: CachedModel, features: Any, row_shape: tuple[int, ...], ys: np.ndarray,
               batch_size: int) -> int:
    """Accumulate ``test_step`` over the rows of ``features`` (2-D) into the model's metrics."""
    import tensorflow as tf  # type: ignore[import-untyped]

    rows = int(ys.shape[0])
    if rows == 0:
        return 0
    _eval_range(entry, features, row_shape, tf.constant(ys), batch_size, 0, rows)
    return rows


def _eval_fn(entry: CachedModel, row_shape: tuple[int, ...]) -> Any:
    """The model's traced evaluation loop for rows of ``row_shape``: ``test_step`` (what
    ``model.evaluate`` runs per batch) on batches ``[start+i*b, start+(i+1)*b)`` (the last
    one ending at ``stop``) of a 2-D feature tensor and its labels, one after another
    (``parallel_iterations=1``: the metric updates keep Keras' order). Traced once per model,
    row shape and label layout; the batch size and the row range are arguments."""
    fn = entry.eval_fns.get(row_shape)
    if fn is not None:
        return fn
    import tensorflow as tf  # type: ignore[import-untyped]

    model = entry.model
    shape = [-1, *row_shape]

    @tf.function(autograph=False, reduce_retracing=True)
    def run(features: Any, labels: Any, batch_size: Any, first: Any, stop: Any) -> Any:
        def body(start: Any) -> Any:
            end = tf.minimum(start + batch_size, stop)
            model.test_step((tf.reshape(features[start:end], shape), labels[start:end]))
            return (start + batch_size,)

        return tf.while_loop(lambda start: start < stop, body, (first,),
                             parallel_iterations=1)

    entry.eval_fns[row_shape] = run
    return run


def predict(
    cache: ModelCache,
    arch_json: Any,
    state_or_weights: BytesLike,
    x: np.ndarray,
    batch_size: int = 256,
) -> np.ndarray:
    """The model's outputs for ``x`` (e.g. class probabilities), computed in batches.

    ``state_or_weights`` is a state or MADlib flat float32 weights; ``x`` is reshaped to the
    model's input as by :func:`fit_input_shape`. Returns float32 ``[rows, outputs...]``.
    Raises :class:`CerebroError`.
    """
    entry = cache.get_for_predict(arch_json)
    _predict_guard(arch_json, entry.model, batch_size, len(x))
    try:
        xs = fit_input_shape(np.asarray(x, dtype=np.float32), entry.model)
        _load_any(entry, state_or_weights)
        if xs.shape[0] == 0:
            shape = keras_arch.output_shapes(entry.model)[0]
            return np.zeros((0,) + tuple(d or 0 for d in shape), dtype=np.float32)
        out = entry.model.predict(xs, batch_size=batch_size, verbose=0)
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001
        cache.discard(entry)
        raise _keras_failure("prediction", exc) from None
    return np.asarray(out, dtype=np.float32)


def _predict_guard(arch_json: Any, model: keras.Model, batch_size: int, rows: int) -> None:
    """Prediction's memory guard: the model's inputs must have every dimension (the fit
    refuses others too: a value count needs them, and an undefined one would take any row
    size), and a batch must fit (:func:`keras_arch.check_batch`)."""
    for shape in keras_arch.input_shapes(model):
        if None in tuple(shape):
            raise CerebroError(
                f"the model's input shape {_fmt_shape(shape)} has undefined dimensions",
                FEATURE_NOT_SUPPORTED,
                hint="Give the model's Input a fixed shape (a batch's memory is checked "
                "before it runs, which needs every dimension).")
    keras_arch.check_batch(arch_json, min(int(batch_size), int(rows)))


# --------------------------------------------------------------------------- several inputs/outputs


@dataclass
class MultiData:
    """A partition's rows for a model with several inputs or outputs: one array per input
    (``[rows, values...]``, in ``independent_varname`` order, matched to the model's
    inputs in order) and one per output (``[rows, width]``, in ``dependent_varname``
    order, matched to the model's outputs). Trained and evaluated with Keras' own
    pipeline (not the cached feeds of the one-input path)."""

    xs: list[np.ndarray]
    ys: list[np.ndarray]

    @property
    def total_rows(self) -> int:
        return int(self.xs[0].shape[0]) if self.xs else 0


def _per_output(model: keras.Model, kwargs: dict[str, Any],
                fresh: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Compile arguments for ``model``: with several outputs, a flat metrics list applies to
    every output (as Keras 2, which MADlib uses, did; Keras 3 wants one list per output).
    A list holding metric objects (custom functions by reference, top k accuracy) gives
    each output objects of its own, from ``fresh()`` (new compile arguments): a metric
    object keeps its state, so two outputs cannot share one."""
    n = len(model.outputs)
    if n < 2:
        return kwargs
    out = dict(kwargs)
    for key in ("metrics", "weighted_metrics"):
        v = out.get(key)
        if not isinstance(v, (list, tuple)) or not v:
            continue
        if all(isinstance(m, str) for m in v):
            out[key] = [list(v) for _ in range(n)]
        elif fresh is not None:
            out[key] = [list(v)] + [list(fresh()[key]) for _ in range(n - 1)]
    return out


def _multi_xy(model: keras.Model, data: MultiData) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The arrays shaped for the model's inputs and outputs (one-hot labels as float32;
    sparse losses get class indices from the caller)."""
    shapes = keras_arch.input_shapes(model)
    outs = keras_arch.output_shapes(model)
    if len(shapes) != len(data.xs) or len(outs) != len(data.ys):
        raise CerebroError(
            f"the model has {len(shapes)} inputs and {len(outs)} outputs, the data "
            f"{len(data.xs)} and {len(data.ys)}", DATATYPE_MISMATCH)
    xs = []
    for i, (x, target) in enumerate(zip(data.xs, shapes)):
        x = np.asarray(x, dtype=np.float32)
        known = tuple(int(t) for t in target if t is not None)
        if len(known) != len(target) or not keras_arch.reshapes_to(x.shape[1:], known):
            raise CerebroError(
                f"independent variable {i + 1} has shape {_fmt_shape(x.shape[1:])} per row but "
                f"model input {i + 1} expects {_fmt_shape(target)}", DATATYPE_MISMATCH)
        xs.append(x.reshape((x.shape[0],) + known))
    ys = [y if y is None or y.dtype == np.int32 else np.asarray(y, dtype=np.float32)
          for y in data.ys]
    return xs, ys


def _output_order(model: keras.Model, values: Mapping[str, Any]) -> dict[str, float]:
    """Keras' per-output history/evaluate values in a fixed order: each output's compiled
    metrics (outputs in order), then each output's loss."""
    names = list(getattr(model, "output_names", None) or [])
    rest = {k: float(v) for k, v in values.items() if k != "loss"}
    ordered: dict[str, float] = {}
    for n in names:
        for k in list(rest):
            if k.startswith(n + "_") and k != n + "_loss":
                ordered[k] = rest.pop(k)
    for n in names:
        if n + "_loss" in rest:
            ordered[n + "_loss"] = rest.pop(n + "_loss")
    ordered.update(rest)
    return ordered


def _fit_multi(entry: CachedModel, fp: FitParams, data: MultiData, seed: int
               ) -> tuple[float, dict[str, float]]:
    """One unit's ``model.fit`` over several inputs/outputs: each epoch's row order is a
    numpy permutation seeded from ``seed`` (identity with ``shuffle=False``), batches as
    :func:`_fit` makes them; returns (total loss, per-output metrics and losses)."""
    _seed_layers(entry, seed)
    _match_steps(entry, fp)
    kwargs = fp.to_keras()
    kwargs["verbose"] = 0
    epochs = int(kwargs.pop("epochs", 1) or 1)
    shuffle = kwargs.pop("shuffle", True)
    batch_size = int(kwargs.pop("batch_size", 32) or 32)
    kwargs["shuffle"] = False
    xs, ys = _multi_xy(entry.model, data)
    rng = np.random.default_rng(seed)
    hist: dict[str, float] = {}
    for _ in range(epochs):
        order = rng.permutation(data.total_rows) if shuffle else slice(None)
        h = entry.model.fit([x[order] for x in xs], [y[order] for y in ys],
                            batch_size=batch_size, epochs=1, **kwargs).history
        hist = {k: _last(v) for k, v in h.items()}
    loss = hist.get("loss", float("nan"))
    return loss, _output_order(entry.model, hist)


def _evaluate_multi(cache: ModelCache, entry: CachedModel, data: MultiData,
                    state_bytes: BytesLike, batch_size: int,
                    weights_loaded: bool = False) -> EvalResult:
    try:
        if not weights_loaded:
            _load_any(entry, state_bytes)
        if data.total_rows == 0:
            return EvalResult(float("nan"), {}, 0)
        xs, ys = _multi_xy(entry.model, data)
        out = entry.model.evaluate(xs, ys, batch_size=batch_size, verbose=0,
                                   return_dict=True)
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001
        cache.discard(entry)
        raise _keras_failure("evaluation", exc) from None
    return EvalResult(loss=float(out.get("loss", float("nan"))),
                      metrics=_output_order(entry.model, out), rows=data.total_rows)


def predict_multi(cache: ModelCache, arch_json: Any, state_or_weights: BytesLike,
                  xs: Sequence[np.ndarray], batch_size: int = 256) -> list[np.ndarray]:
    """The outputs of a model with several inputs or outputs for the rows of ``xs`` (one
    array per input, in the model's input order): one float32 array per output."""
    entry = cache.get_for_predict(arch_json)
    _predict_guard(arch_json, entry.model, batch_size, len(xs[0]) if len(xs) else 0)
    try:
        data = MultiData([np.asarray(x, dtype=np.float32) for x in xs], [])
        shapes = keras_arch.input_shapes(entry.model)
        if len(shapes) != len(data.xs):
            raise CerebroError(f"the model has {len(shapes)} inputs, the test data "
                               f"{len(data.xs)} independent variables", DATATYPE_MISMATCH)
        no_labels: list[Any] = [None] * len(entry.model.outputs)
        inputs = _multi_xy(entry.model, MultiData(data.xs, no_labels))[0] \
            if data.total_rows else []
        _load_any(entry, state_or_weights)
        if not data.total_rows:
            return [np.zeros((0,), np.float32) for _ in entry.model.outputs]
        out = entry.model.predict(inputs if len(inputs) > 1 else inputs[0],
                                  batch_size=batch_size, verbose=0)
    except CerebroError:
        raise
    except Exception as exc:  # noqa: BLE001
        cache.discard(entry)
        raise _keras_failure("prediction", exc) from None
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [np.asarray(o, dtype=np.float32) for o in outs]
