"""Compile, fit and AutoML parameter strings -> typed, validated objects.

The strings users pass (``optimizer='Adam(lr=0.001)', loss='mse', metrics=['accuracy']``) are
read by a literal-only parser: the text is parsed with :func:`ast.parse` and the syntax tree is
walked by hand, accepting numbers, strings, ``True``/``False``/``None`` and lists, tuples, dicts
and sets of those. Nothing is ever evaluated, compiled to code or unpickled. Two narrow
exceptions to "literals only" are made, each turned into plain data rather than run: the
``optimizer`` value may be written as a bare call (``optimizer=SGD(lr=0.1)``, the same as the
quoted form) and a few keys take a bare word (``algorithm=tpe``).

Keras is imported lazily, only by the functions that check names against it.
"""
from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Union

from .errors import (
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    SYNTAX_ERROR,
    CerebroError,
    invalid,
    syntax,
)
from .literals import (
    MAX_NESTING,
    Call,
    call_value,
    literal,
    parse_tree,
)

__all__ = [
    "COMPILE_KEYS",
    "FIT_CALLBACKS",
    "FIT_KEYS",
    "MAX_INPUT_CHARS",
    "MAX_NESTING",
    "CompileParams",
    "FitParams",
    "OptimizerSpec",
    "fit_key_error",
    "optimizer_arguments",
    "optimizer_names",
    "parse_automl_params",
    "parse_compile_params",
    "parse_fit_params",
    "parse_keyword_string",
    "parse_literal",
    "parse_optimizer_spec",
    "render_literal",
    "resolve_optimizer_name",
    "validate_compile_params",
]

MAX_INPUT_CHARS = 100_000
"""Longest parameter string accepted (characters)."""

# Keys of model.compile() that are safe to take from a string (literal values only).
COMPILE_KEYS: tuple[str, ...] = (
    "optimizer",
    "loss",
    "metrics",
    "loss_weights",
    "weighted_metrics",
    "jit_compile",
    "steps_per_execution",
    "run_eagerly",
    "auto_scale_loss",
    "sample_weight_mode",
)

# Keras 2 compile() keys accepted and ignored: sample_weight_mode only shapes per-sample
# weights, and no sample weights are ever passed to fit here (MADlib passes none either).
_COMPILE_IGNORED = frozenset({"sample_weight_mode"})

FIT_KEYS: tuple[str, ...] = (
    "batch_size", "epochs", "shuffle", "class_weight", "verbose", "callbacks",
    "initial_epoch", "steps_per_epoch",
)

# Callbacks a fit_params string may name (lower-case name -> Keras class name).
FIT_CALLBACKS: dict[str, str] = {"terminateonnan": "TerminateOnNaN", "tensorboard": "TensorBoard"}

# TensorBoard's arguments a fit_params string may give (name -> accepted types). log_dir is
# confined to the directory the DBA sets in TENSORBOARD_SETTING (see confine_log_dir).
TENSORBOARD_ARGS: dict[str, tuple[type, ...]] = {
    "log_dir": (str,), "histogram_freq": (int,), "write_graph": (bool,),
    "write_images": (bool,), "write_steps_per_second": (bool,), "update_freq": (str, int),
}
TENSORBOARD_SETTING = "cerebro_db.tensorboard_log_dir"

_FIT_FORBIDDEN: dict[str, str] = {
    "x": "the training data comes from source_table",
    "y": "the training data comes from source_table",
    "sample_weight": "per-example weights are not supported; use class_weight",
    "validation_split": "pass a validation_table argument instead",
    "validation_data": "pass a validation_table argument instead",
    "validation_steps": "pass a validation_table argument instead",
    "validation_batch_size": "pass a validation_table argument instead",
    "validation_freq": "use the metrics_compute_frequency argument instead",
    "workers": "data loading is done by cerebro_db",
    "use_multiprocessing": "data loading is done by cerebro_db",
    "max_queue_size": "data loading is done by cerebro_db",
}

_COMPILE_SPECIAL_METRICS = frozenset({"accuracy", "acc", "crossentropy", "ce"})

# Optimizer classes that are not built from literal keyword arguments.
_EXCLUDED_OPTIMIZERS = frozenset({"Optimizer", "LossScaleOptimizer", "MultiOptimizer"})
# Keras 3.15"s optimizers and their constructors" keyword arguments, used when Keras is not
# imported in this process (a fit"s coordinator never imports it); a unit test keeps this equal to
# what Keras reports.
_COMMON_OPTIMIZER_ARGS = (
    "clipnorm", "clipvalue", "ema_momentum", "ema_overwrite_frequency", "global_clipnorm",
    "gradient_accumulation_steps", "learning_rate", "loss_scale_factor", "name", "use_ema",
    "weight_decay",
)
_STATIC_OPTIMIZERS: dict[str, tuple[str, ...]] = {
    "Adadelta": ("epsilon", "rho"),
    "Adafactor": ("beta_2_decay", "clip_threshold", "epsilon_1", "epsilon_2", "relative_step"),
    "Adagrad": ("epsilon", "initial_accumulator_value"),
    "Adam": ("amsgrad", "beta_1", "beta_2", "epsilon"),
    "Adamax": ("beta_1", "beta_2", "epsilon"),
    "AdamW": ("amsgrad", "beta_1", "beta_2", "epsilon"),
    "Ftrl": ("beta", "initial_accumulator_value", "l1_regularization_strength",
        "l2_regularization_strength", "l2_shrinkage_regularization_strength",
        "learning_rate_power"),
    "Lamb": ("beta_1", "beta_2", "epsilon"),
    "Lion": ("beta_1", "beta_2"),
    "Muon": ("adam_beta_1", "adam_beta_2", "adam_lr_ratio", "adam_weight_decay", "epsilon",
        "exclude_embeddings", "exclude_layers", "momentum", "muon_a", "muon_b", "muon_c",
        "nesterov", "ns_steps", "rms_rate"),
    "Nadam": ("beta_1", "beta_2", "epsilon"),
    "RMSprop": ("centered", "epsilon", "momentum", "rho"),
    "ScheduleFreeAdamW": ("beta_1", "beta_2", "epsilon", "warmup_steps"),
    "SGD": ("momentum", "nesterov"),
}


# --------------------------------------------------------------------------------------------
# The literal-only parser
# --------------------------------------------------------------------------------------------


_KWARGS_HINT = "expected key=value pairs separated by commas, e.g. loss='mse', epochs=1"


def _check_text(text: Any, what: str) -> str | None:
    """Common checks on a parameter string; None when it is empty."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise invalid(f"{what} must be a string, got {type(text).__name__}")
    if len(text) > MAX_INPUT_CHARS:
        raise invalid(f"{what} is too long ({len(text)} characters, at most {MAX_INPUT_CHARS})")
    if not text.strip():
        return None
    return text


def parse_keyword_string(
    text: str | None,
    what: str,
    *,
    bare_name_keys: Collection[str] = (),
    call_keys: Collection[str] = (),
    call_list_keys: Collection[str] = (),
    key_normalizer: Callable[[str], str] | None = None,
    key_check: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Parse ``key=value, key=value`` into a dict, accepting literal values only.

    ``what`` names the parameter in error messages (``compile_params``). A None, empty or
    all-blank string gives ``{}``. ``bare_name_keys`` may take a bare identifier, returned as its
    string (``algorithm=tpe``); ``call_keys`` may also take a bare ``Name(k=literal, ...)`` call or
    bare name, kept as data for :func:`parse_optimizer_spec` (never called).
    ``key_normalizer`` maps each key before the bare-name/call/duplicate checks (used for
    case-insensitive keys); ``key_check`` is called with each (normalised) key before its value
    is read, to reject unknown keys first. Raises :class:`CerebroError`: 42601 for malformed
    text, duplicate keys and positional arguments; 22023 for non-literal values.
    """
    checked = _check_text(text, what)
    if checked is None:
        return {}
    tree = parse_tree("_(\n" + checked + "\n)", what, _KWARGS_HINT)
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_"):
        raise syntax(f"{what}: invalid syntax", hint=_KWARGS_HINT)
    if call.args:
        raise syntax(
            f"{what}: expected key=value, got a value without a key",
            hint="write every parameter as key=value",
        )
    out: dict[str, Any] = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise syntax(f"{what}: unpacking with ** is not allowed", hint="write key=value pairs")
        key = key_normalizer(kw.arg) if key_normalizer else kw.arg
        if key in out:
            raise CerebroError(f"{what}: duplicate key {key!r}", SYNTAX_ERROR)
        if key_check is not None:
            key_check(key)
        where = f"{what}: {key}"
        node = kw.value
        if key in bare_name_keys and isinstance(node, ast.Name):
            out[key] = node.id
        elif key in call_keys and isinstance(node, ast.Name):
            out[key] = Call(node.id, {})
        elif key in call_keys and isinstance(node, ast.Call):
            out[key] = call_value(node, where)
        elif key in call_list_keys and isinstance(node, (ast.List, ast.Tuple)):
            out[key] = [call_value(e, where) if isinstance(e, ast.Call) else
                        literal(e, where, 1) for e in node.elts]
        else:
            out[key] = literal(node, where)
    return out


def parse_literal(text: str | None, what: str) -> Any:
    """Parse one Python literal (e.g. a search-grid dict) without evaluating anything.

    ``what`` names the parameter in errors. Raises :class:`CerebroError` for None or empty text
    (22004 / 22023), malformed text (42601) or non-literal content (22023).
    """
    if text is None:
        raise CerebroError(f"{what} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    checked = _check_text(text, what)
    if checked is None:
        raise invalid(f"{what} must not be empty")
    tree = parse_tree(checked.strip(), what)
    return literal(tree.body, what)


# --------------------------------------------------------------------------------------------
# Rendering values back to parseable text
# --------------------------------------------------------------------------------------------


def render_literal(value: Any, *, inner: bool = False, sort_dicts: bool = True) -> str:
    """Render a parsed literal as compact text that :func:`parse_literal` reads back.

    ``inner`` quotes strings with double quotes (for text that itself sits inside a
    single-quoted string, like an optimizer spec). ``sort_dicts`` orders dict items and set
    elements by their rendering, for a canonical form.
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot render non-finite number {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if inner else repr(value)

    def r(v: Any) -> str:
        return render_literal(v, inner=inner, sort_dicts=sort_dicts)

    if isinstance(value, list):
        return "[" + ",".join(r(v) for v in value) + "]"
    if isinstance(value, tuple):
        body = ",".join(r(v) for v in value)
        return "(" + body + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        items = [f"{r(k)}:{r(v)}" for k, v in value.items()]
        if sort_dicts:
            items = [f"{r(k)}:{r(v)}" for k, v in sorted(value.items(), key=lambda kv: r(kv[0]))]
        return "{" + ",".join(items) + "}"
    if isinstance(value, (set, frozenset)):
        if not value:
            raise ValueError("cannot render an empty set as a literal")
        return "{" + ",".join(sorted(r(v) for v in value)) + "}"
    raise ValueError(f"cannot render {type(value).__name__} as a literal")


# --------------------------------------------------------------------------------------------
# Keras look-ups (lazy)
# --------------------------------------------------------------------------------------------


def _import_keras() -> Any:
    import keras

    return keras


def _keras_or_error(what: str) -> Any:
    try:
        return _import_keras()
    except ImportError:
        raise CerebroError(
            f"{what}: keras is not installed, cannot check names against it",
            FEATURE_NOT_SUPPORTED,
            hint="install TensorFlow in the database server's Python (cerebro_db[train])",
        ) from None


@functools.lru_cache(maxsize=1)
def _optimizer_table() -> dict[str, tuple[str, frozenset[str] | None]]:
    """lower-case name -> (Keras class name, accepted keyword arguments or None if unknown).

    Read from Keras when this process has imported it, else from ``_STATIC_OPTIMIZERS`` (so a
    fit's coordinator checks compile parameters without importing TensorFlow)."""
    if "keras" not in sys.modules:
        return _static_optimizer_table()
    return _keras_optimizer_table()


def _static_optimizer_table() -> dict[str, tuple[str, frozenset[str] | None]]:
    return {n.lower(): (n, frozenset(_COMMON_OPTIMIZER_ARGS + own))
            for n, own in _STATIC_OPTIMIZERS.items()}


def _keras_optimizer_table() -> dict[str, tuple[str, frozenset[str] | None]]:
    try:
        keras = _import_keras()
    except ImportError:
        return _static_optimizer_table()
    base = keras.optimizers.Optimizer
    table: dict[str, tuple[str, frozenset[str] | None]] = {}
    for name in dir(keras.optimizers):
        obj = getattr(keras.optimizers, name, None)
        if not (inspect.isclass(obj) and issubclass(obj, base)) or name in _EXCLUDED_OPTIMIZERS:
            continue
        if name.startswith("_"):
            continue
        try:
            sig = inspect.signature(obj.__init__)
        except (TypeError, ValueError):  # pragma: no cover - defensive
            args: frozenset[str] | None = None
        else:
            args = frozenset(
                p.name
                for p in sig.parameters.values()
                if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            )
        table[name.lower()] = (name, args)
    return table


def optimizer_names() -> list[str]:
    """The optimizer class names accepted, as Keras spells them, sorted."""
    return sorted(name for name, _ in _optimizer_table().values())


def resolve_optimizer_name(name: str, what: str = "compile_params") -> str:
    """Map an optimizer name, matched case-insensitively, to its Keras class name.

    Raises :class:`CerebroError` (22023) naming the bad value, with the valid names as hint.
    """
    entry = _optimizer_table().get(name.lower()) if isinstance(name, str) else None
    if entry is None:
        raise invalid(
            f"{what}: unknown optimizer {name!r}",
            hint="valid optimizers: " + ", ".join(optimizer_names()),
        )
    return entry[0]


KERAS2_EPSILON = 1e-7
"""Keras 2's backend epsilon (``keras.backend.epsilon()``): what ``epsilon=None`` meant."""


_STATIC_FLOAT_ARGS = frozenset({
    "adam_beta_1", "adam_beta_2", "adam_weight_decay", "beta", "beta_1", "beta_2",
    "beta_2_decay", "clip_threshold", "ema_momentum", "epsilon", "epsilon_1", "epsilon_2",
    "initial_accumulator_value", "initial_scale", "l1_regularization_strength",
    "l2_regularization_strength", "l2_shrinkage_regularization_strength", "learning_rate",
    "learning_rate_power", "momentum", "muon_a", "muon_b", "muon_c", "rho", "rms_rate",
    "weight_decay"})
"""Keras 3's optimizer arguments whose default is a float (of any optimizer), for a process
that has not imported Keras (a fit's coordinator); ``tests/unit/test_params.py`` keeps it
equal to what Keras reports."""


@functools.lru_cache(maxsize=64)
def _float_arguments(name: str) -> frozenset[str]:
    """Arguments of the named optimizer whose default is a float (an int given is converted).
    Without Keras imported: the static set, within the optimizer's known arguments."""
    if "keras" not in sys.modules:
        known = optimizer_arguments(name)
        return (_STATIC_FLOAT_ARGS & known if known else _STATIC_FLOAT_ARGS) | {"learning_rate"}
    try:
        keras = _import_keras()
    except ImportError:
        return frozenset({"learning_rate"})
    cls = getattr(keras.optimizers, name, None)
    if cls is None:
        return frozenset({"learning_rate"})
    params = inspect.signature(cls.__init__).parameters.values()
    out = {p.name for p in params if isinstance(p.default, float)}
    return frozenset(out | {"learning_rate"})


def optimizer_arguments(name: str) -> frozenset[str] | None:
    """Keyword arguments the named optimizer's constructor accepts (None when unknown)."""
    entry = _optimizer_table().get(name.lower())
    return entry[1] if entry else None


# --------------------------------------------------------------------------------------------
# Optimizer specs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer: Keras class name (canonical spelling) and literal keyword arguments.

    ``kwargs`` keeps the user's order with ``lr`` renamed to ``learning_rate``. Keras 2's
    ``decay`` (learning-rate decay, removed in Keras 3) is kept as ``decay`` and built as
    the inverse-time schedule Keras 2 applied: ``lr_t = lr / (1 + decay * iterations)``,
    with ``iterations`` the optimizer's step counter before the step (Keras 2's
    ``_decayed_lr``), i.e. ``InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)``.
    """

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def canonical(self) -> str:
        """``Name(key=value,...)`` with keys sorted and strings double-quoted."""
        args = ",".join(
            f"{k}={render_literal(v, inner=True)}" for k, v in sorted(self.kwargs.items())
        )
        return f"{self.name}({args})"

    def __eq__(self, other: object) -> bool:
        """Equal when the canonical strings are equal (so equality agrees with the hash)."""
        other_any: Any = other
        return type(other) is type(self) and self.canonical() == other_any.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())

    def to_keras(self) -> Any:
        """Build the Keras optimizer object (imports Keras)."""
        keras = _keras_or_error("compile_params")
        cls = getattr(keras.optimizers, self.name)
        kwargs = dict(self.kwargs)
        decay = kwargs.pop("decay", None) if "decay" not in (optimizer_arguments(self.name)
                                                             or ()) else None
        try:
            if decay:
                lr = kwargs.get("learning_rate", default_learning_rate(self.name))
                if lr is None:
                    raise TypeError(f"{self.name} has no default learning rate")
                kwargs["learning_rate"] = keras.optimizers.schedules.InverseTimeDecay(
                    initial_learning_rate=float(lr), decay_steps=1, decay_rate=decay)
            return cls(**kwargs)
        except Exception as e:  # noqa: BLE001 - built from the user's literals: a user error
            reason = str(e).strip().rstrip(".").replace("`", "")
            msg = f"compile_params: optimizer {self.canonical()} is invalid: {reason}"
            raise invalid(msg) from None


    @property
    def decayed(self) -> bool:
        """Whether the learning rate follows Keras 2's ``decay`` schedule (fixed at build)."""
        return bool(self.kwargs.get("decay")) and "decay" not in (
            optimizer_arguments(self.name) or ())


@functools.lru_cache(maxsize=64)
def default_learning_rate(name: str) -> float | None:
    """The named optimizer class' default learning rate (None when it has none)."""
    try:
        keras = _import_keras()
    except ImportError:
        return None
    cls = getattr(keras.optimizers, name, None)
    if cls is None:
        return None
    param = inspect.signature(cls.__init__).parameters.get("learning_rate")
    default = None if param is None else param.default
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return float(default)
    return None


def _optimizer_from_call(call: Call, what: str) -> OptimizerSpec:
    name = resolve_optimizer_name(call.name, what)
    kwargs = dict(call.kwargs)
    if "lr" in kwargs:
        if "learning_rate" in kwargs:
            raise invalid(
                f"{what}: optimizer {name} has both lr and learning_rate",
                hint="lr is an old alias of learning_rate; give only one",
            )
        kwargs = {("learning_rate" if k == "lr" else k): v for k, v in kwargs.items()}
    accepted = optimizer_arguments(name)
    if "decay" in kwargs and (accepted is None or "decay" not in accepted):
        decay = kwargs["decay"]
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or decay < 0:
            raise invalid(
                f"{what}: optimizer {name}: decay must be a non-negative number, got {decay!r}",
                hint="decay is Keras 2's learning-rate decay: lr / (1 + decay * iterations)",
            )
        if decay == 0:  # Keras 2's default: no decay
            kwargs.pop("decay")
        else:
            kwargs["decay"] = float(decay)
    if kwargs.get("epsilon", 0) is None and (accepted is None or "epsilon" in accepted):
        kwargs["epsilon"] = KERAS2_EPSILON  # Keras 2: None meant the backend's epsilon
    floats = _float_arguments(name)
    for key in kwargs:
        if key == "decay":
            continue
        if key in floats and isinstance(kwargs[key], int) and not isinstance(kwargs[key], bool):
            kwargs[key] = float(kwargs[key])  # Keras 3 checks isinstance(..., float)
        if accepted is not None and key not in accepted:
            raise invalid(
                f"{what}: optimizer {name} has no argument {key!r}",
                hint=f"{name} accepts: " + ", ".join(sorted(accepted | {"lr"})),
            )
    if "learning_rate" in kwargs:
        lr = kwargs["learning_rate"]
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
            raise invalid(
                f"{what}: optimizer {name}: learning_rate must be a positive number, got {lr!r}"
            )
    return OptimizerSpec(name, kwargs)


def parse_optimizer_spec(value: Any, what: str = "compile_params") -> OptimizerSpec:
    """Parse an optimizer given as ``'Adam(learning_rate=0.001)'``, ``'adam'`` or a bare call.

    Names are matched case-insensitively to Keras' class names; ``lr`` is an alias of
    ``learning_rate``; keyword arguments are checked against the class constructor.
    """
    if isinstance(value, OptimizerSpec):
        return value
    if isinstance(value, Call):
        return _optimizer_from_call(value, what)
    if not isinstance(value, str):
        raise invalid(
            f"{what}: optimizer must be a string such as 'Adam(learning_rate=0.001)', "
            f"got {type(value).__name__}"
        )
    where = f"{what}: optimizer"
    checked = _check_text(value, where)
    if checked is None:
        raise invalid(f"{where} must not be empty", hint="e.g. optimizer='Adam'")
    example = "e.g. optimizer='SGD(learning_rate=0.01, momentum=0.9)'"
    tree = parse_tree(checked.strip(), where, example)
    node = tree.body
    if isinstance(node, ast.Name):
        return _optimizer_from_call(Call(node.id, {}), what)
    if isinstance(node, ast.Call):
        return _optimizer_from_call(call_value(node, where), what)
    raise invalid(
        f"{where} must be an optimizer name with optional keyword arguments, got {value!r}",
        hint="e.g. optimizer='SGD(learning_rate=0.01, momentum=0.9)'",
    )


# --------------------------------------------------------------------------------------------
# compile_params
# --------------------------------------------------------------------------------------------

Loss = Union[str, "tuple[str, ...]", "dict[str, str]"]
LossWeights = Union["tuple[float, ...]", "dict[str, float]", None]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str_list(value: Any, where: str, allow_single: bool = True) -> tuple[str, ...]:
    if allow_single and isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise invalid(f"{where} must be a list of names, got {render_literal(value)}")
    for v in value:
        if not isinstance(v, str) or not v:
            raise invalid(f"{where} must be a list of names, got element {v!r}")
    return tuple(value)


def _parse_loss(value: Any, what: str) -> Loss:
    where = f"{what}: loss"
    if isinstance(value, str):
        if not value:
            raise invalid(f"{where} must not be empty")
        return value
    if isinstance(value, (list, tuple)):
        if not value:
            raise invalid(f"{where} must not be an empty list")
        return _str_list(value, where, allow_single=False)
    if isinstance(value, dict):
        if not value:
            raise invalid(f"{where} must not be an empty dict")
        for k, v in value.items():
            if not isinstance(k, str) or not isinstance(v, str) or not v:
                raise invalid(f"{where} must map output names to loss names, got {k!r}: {v!r}")
        return dict(value)
    raise invalid(f"{where} must be a loss name such as 'mse', got {render_literal(value)}")


def _parse_loss_weights(value: Any, what: str) -> LossWeights:
    where = f"{what}: loss_weights"
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items = list(value)
        names: list[Any] = list(range(len(items)))
    elif isinstance(value, dict):
        items = list(value.values())
        names = list(value.keys())
        if not all(isinstance(k, str) for k in names):
            raise invalid(f"{where} keys must be output names (strings)")
    else:
        raise invalid(f"{where} must be a list or dict of numbers, got {render_literal(value)}")
    for n, v in zip(names, items):
        if not _is_number(v) or v < 0:
            raise invalid(f"{where} must hold non-negative numbers, got {v!r} for {n!r}")
    return dict(value) if isinstance(value, dict) else tuple(value)


@dataclass(frozen=True)
class CompileParams:
    """A parsed ``compile_params`` string: arguments for ``model.compile``.

    ``loss`` is a name, or a tuple/dict of names for multi-output models; ``metrics`` and
    ``weighted_metrics`` are tuples of names. Other fields are None when not given.
    """

    optimizer: OptimizerSpec
    loss: Loss
    metrics: tuple[str, ...] = ()
    loss_weights: LossWeights = None
    weighted_metrics: tuple[str, ...] | None = None
    jit_compile: bool | str | None = None
    steps_per_execution: int | None = None
    run_eagerly: bool | None = None
    auto_scale_loss: bool | None = None
    custom: tuple[tuple[str, str], ...] = ()
    """Custom function names used here and their references (from an object table)."""

    def names(self) -> list[str]:
        """Every loss and metric name used (for object-table look-ups)."""
        losses = [self.loss] if isinstance(self.loss, str) else list(
            self.loss.values() if isinstance(self.loss, dict) else self.loss)
        return losses + list(self.metrics) + list(self.weighted_metrics or ())

    def with_custom(self, references: Mapping[str, str]) -> CompileParams:
        """These parameters with the custom functions among ``references`` they use."""
        used = tuple(sorted((n, references[n]) for n in set(self.names()) if n in references))
        return replace(self, custom=used)

    def _items(self) -> list[tuple[str, Any]]:
        loss: Any = list(self.loss) if isinstance(self.loss, tuple) else self.loss
        items: list[tuple[str, Any]] = [("loss", loss), ("metrics", list(self.metrics))]
        for key in COMPILE_KEYS[3:]:
            if key in _COMPILE_IGNORED:
                continue
            v = getattr(self, key)
            if v is not None:
                items.append((key, list(v) if isinstance(v, tuple) else v))
        return items

    def canonical(self) -> str:
        """A stable normalised string; equal for strings that configure the same compile."""
        parts = [f"optimizer={render_literal(self.optimizer.canonical())}"]
        parts += [f"{k}={render_literal(v)}" for k, v in self._items()]
        if self.custom:
            parts.append(f"custom={render_literal(dict(self.custom))}")
        return ",".join(parts)

    def __eq__(self, other: object) -> bool:
        """Equal when the canonical strings are equal (so equality agrees with the hash)."""
        other_any: Any = other
        return type(other) is type(self) and self.canonical() == other_any.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())

    def metric_names(self) -> list[str]:
        """The metric names as given (for the ``metrics_type`` output column)."""
        return list(self.metrics)

    def to_keras(self) -> dict[str, Any]:
        """Keyword arguments for ``model.compile(...)``, with a real optimizer object."""
        out: dict[str, Any] = {"optimizer": self.optimizer.to_keras()}
        for k, v in self._items():
            out[k] = v
        if self.custom:
            from .custom_functions import keras_object

            refs = dict(self.custom)

            def sub(name: Any, kind: str) -> Any:
                return keras_object(refs[name], name, kind) if name in refs else name

            loss = out["loss"]
            out["loss"] = {k: sub(v, "loss") for k, v in loss.items()} if isinstance(
                loss, dict) else [sub(v, "loss") for v in loss] if isinstance(
                loss, list) else sub(loss, "loss")
            for key in ("metrics", "weighted_metrics"):
                if out.get(key):
                    out[key] = [sub(m, "metric") for m in out[key]]
        lw = out.get("loss_weights")
        if not isinstance(out.get("loss"), (list, dict)) and isinstance(lw, (list, dict)) \
                and len(lw) > 1:
            # one loss for every output, weighted per output (tf.keras 2 took it, and
            # MADlib's scripts do; Keras 3 wants as many losses as weights)
            out["loss"] = {k: out["loss"] for k in lw} if isinstance(lw, dict) \
                else [out["loss"]] * len(lw)
        sparse = isinstance(self.loss, str) and "sparse" in self.loss
        for key in ("metrics", "weighted_metrics"):
            if out.get(key):
                out[key] = [_label_metric(m, sparse) for m in out[key]]
        return out


_LABEL_TWINS = {"categorical_accuracy": "SparseCategoricalAccuracy",
                "top_k_categorical_accuracy": "SparseTopKCategoricalAccuracy",
                "sparse_categorical_accuracy": "CategoricalAccuracy",
                "sparse_top_k_categorical_accuracy": "TopKCategoricalAccuracy"}


def _label_metric(name: Any, sparse_labels: bool) -> Any:
    """The metric ``name`` for the labels a unit gives the model: class indices with a sparse
    loss (the worker's argmax of the one-hot rows), else the one-hot rows. A categorical
    metric under a sparse loss, or a sparse one under a categorical loss, becomes its twin
    for the other label form, under the name given, so that it measures what its name says
    (an outside pass: categorical_accuracy read 0 beside accuracy 0.48 under
    sparse_categorical_crossentropy, and the other mixes failed inside the workers)."""
    if not isinstance(name, str) or name not in _LABEL_TWINS \
            or name.startswith("sparse_") == sparse_labels:
        return name
    import keras

    return getattr(keras.metrics, _LABEL_TWINS[name])(name=name)


def _check_compile_key(key: str, what: str) -> None:
    if key not in COMPILE_KEYS:
        raise invalid(
            f"{what}: unknown key {key!r}", hint="allowed keys: " + ", ".join(COMPILE_KEYS)
        )


def parse_compile_params(text: str | None, what: str = "compile_params") -> CompileParams:
    """Parse and check a ``compile_params`` string (``optimizer`` and ``loss`` are required).

    Optimizer names and arguments are checked against Keras (imported lazily); loss and metric
    names are checked by :func:`validate_compile_params`. Raises :class:`CerebroError`.
    """
    d = parse_keyword_string(
        text, what, call_keys=("optimizer",), key_check=lambda k: _check_compile_key(k, what)
    )
    for key in ("optimizer", "loss"):
        if key not in d or d[key] is None:
            raise invalid(
                f"{what}: {key} is required",
                hint="e.g. optimizer='Adam(learning_rate=0.001)', loss='categorical_crossentropy'",
            )
    metrics = d.get("metrics")
    weighted = d.get("weighted_metrics")
    jit = d.get("jit_compile")
    if jit is not None and not isinstance(jit, bool) and jit != "auto":
        raise invalid(f"{what}: jit_compile must be True, False or 'auto', got {jit!r}")
    spe = d.get("steps_per_execution")
    if spe is not None and (not isinstance(spe, int) or isinstance(spe, bool) or spe < 1):
        raise invalid(f"{what}: steps_per_execution must be an integer at least 1, got {spe!r}")
    for key in ("run_eagerly", "auto_scale_loss"):
        v = d.get(key)
        if v is not None and not isinstance(v, bool):
            raise invalid(f"{what}: {key} must be True or False, got {v!r}")
    swm = d.get("sample_weight_mode")
    swm_items = list(swm.values()) if isinstance(swm, dict) else (
        list(swm) if isinstance(swm, (list, tuple)) else [swm])
    if any(v is not None and v != "temporal" for v in swm_items):
        raise invalid(f"{what}: sample_weight_mode must be None or 'temporal' (per output in a "
                      f"list or dict), got {render_literal(swm)}")
    return CompileParams(
        optimizer=parse_optimizer_spec(d["optimizer"], what),
        loss=_parse_loss(d["loss"], what),
        metrics=() if metrics is None else _str_list(metrics, f"{what}: metrics"),
        loss_weights=_parse_loss_weights(d.get("loss_weights"), what),
        weighted_metrics=None
        if weighted is None
        else _str_list(weighted, f"{what}: weighted_metrics"),
        jit_compile=jit,
        steps_per_execution=spe,
        run_eagerly=d.get("run_eagerly"),
        auto_scale_loss=d.get("auto_scale_loss"),
    )


def validate_compile_params(
    cp: CompileParams,
    what: str = "compile_params",
    *,
    custom_functions: Collection[str] = (),
) -> None:
    """Check loss and metric names against Keras and build the optimizer once.

    ``custom_functions`` are extra accepted names (from an object table). Imports Keras.
    Raises :class:`CerebroError` (22023) naming the first bad name.
    """
    keras = _keras_or_error(what)
    custom = set(custom_functions)
    losses = [cp.loss] if isinstance(cp.loss, str) else list(
        cp.loss.values() if isinstance(cp.loss, dict) else cp.loss
    )
    for name in losses:
        if name in custom:
            continue
        try:
            keras.losses.get(name)
        except (ValueError, TypeError, AttributeError):
            raise invalid(
                f"{what}: unknown loss {name!r}",
                hint="use a Keras loss name such as 'categorical_crossentropy', "
                "'sparse_categorical_crossentropy', 'binary_crossentropy' or 'mse'",
            ) from None
    for key, names in (("metrics", cp.metrics), ("weighted_metrics", cp.weighted_metrics or ())):
        for name in names:
            if name in custom or name in _COMPILE_SPECIAL_METRICS:
                continue
            try:
                keras.metrics.get(name)
            except (ValueError, TypeError, AttributeError):
                raise invalid(
                    f"{what}: unknown metric {name!r} in {key}",
                    hint="use a Keras metric name such as 'accuracy', 'top_k_categorical_accuracy'"
                    " or 'mae'",
                ) from None
    cp.optimizer.to_keras()


# --------------------------------------------------------------------------------------------
# fit_params
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitParams:
    """A parsed ``fit_params`` string: arguments for ``model.fit`` (Keras' defaults filled)."""

    batch_size: int = 32
    epochs: int = 1
    shuffle: bool | None = None
    class_weight: dict[int, float] | None = None
    verbose: int | str | None = None
    callbacks: tuple[str, ...] = ()
    tensorboard: tuple[tuple[str, Any], ...] | None = None
    """TensorBoard's arguments when the TensorBoard callback is asked for."""
    initial_epoch: int | None = None
    steps_per_epoch: int | None = None

    def with_log_dir(self, path: str) -> FitParams:
        """These parameters with TensorBoard writing to ``path`` (an already confined one)."""
        tb = dict(self.tensorboard or ())
        tb["log_dir"] = path
        return replace(self, tensorboard=tuple(sorted(tb.items())))

    @property
    def passes(self) -> int:
        """Passes over the data one unit makes: ``epochs - initial_epoch`` (Keras' meaning)."""
        return self.epochs - (self.initial_epoch or 0)

    def canonical(self) -> str:
        """A stable normalised string: batch_size and epochs always, other keys when given."""
        parts = [f"batch_size={self.batch_size}", f"epochs={self.epochs}"]
        for key in ("shuffle", "class_weight", "verbose", "initial_epoch", "steps_per_epoch"):
            v = getattr(self, key)
            if v is not None:
                parts.append(f"{key}={render_literal(v)}")
        if self.callbacks:
            items = [render_literal(c) if c != "TensorBoard" else "TensorBoard(" + ",".join(
                f"{k}={render_literal(v)}" for k, v in self.tensorboard or ()) + ")"
                for c in self.callbacks]
            parts.append("callbacks=[" + ",".join(items) + "]")
        return ",".join(parts)

    def __eq__(self, other: object) -> bool:
        """Equal when the canonical strings are equal (so equality agrees with the hash)."""
        other_any: Any = other
        return type(other) is type(self) and self.canonical() == other_any.canonical()

    def __hash__(self) -> int:
        return hash(self.canonical())

    def to_keras(self) -> dict[str, Any]:
        """Keyword arguments for ``model.fit(...)``; callbacks are built (imports Keras then)."""
        out: dict[str, Any] = {"batch_size": self.batch_size, "epochs": self.epochs}
        for key in ("shuffle", "class_weight", "verbose", "initial_epoch", "steps_per_epoch"):
            v = getattr(self, key)
            if v is not None:
                out[key] = dict(v) if isinstance(v, dict) else v
        if self.callbacks:
            keras = _keras_or_error("fit_params")
            out["callbacks"] = [
                getattr(keras.callbacks, name)(**dict(self.tensorboard or ()))
                if name == "TensorBoard" else getattr(keras.callbacks, name)()
                for name in self.callbacks]
        return out


def fit_key_error(key: str, what: str) -> CerebroError:
    """The error for a key that ``fit_params`` does not take (with a specific hint if known)."""
    reason = _FIT_FORBIDDEN.get(key)
    if reason is not None:
        return invalid(f"{what}: {key} is not allowed", hint=reason)
    return invalid(f"{what}: unknown key {key!r}", hint="allowed keys: " + ", ".join(FIT_KEYS))


def _check_fit_key(key: str, what: str) -> None:
    if key not in FIT_KEYS:
        raise fit_key_error(key, what)


def _int_at_least(value: Any, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"{where} must be an integer, got {render_literal(value)}")
    if value < low:
        raise invalid(f"{where} must be at least {low}, got {value}")
    return value


def _tensorboard_args(given: Mapping[str, Any], what: str) -> tuple[tuple[str, Any], ...]:
    for key, value in given.items():
        types = TENSORBOARD_ARGS.get(key)
        if types is None:
            raise invalid(f"{what}: TensorBoard has no argument {key!r} here",
                          hint="allowed: " + ", ".join(TENSORBOARD_ARGS))
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise invalid(f"{what}: TensorBoard {key} must be a "
                          f"{' or '.join(t.__name__ for t in types)}, got {render_literal(value)}")
    return tuple(sorted({"log_dir": "logs", **given}.items()))  # Keras' default: 'logs'



def confine_log_dir(log_dir: str, base: str | None, what: str = "fit_params") -> str:
    """``log_dir`` (relative to ``base``, or absolute) as an absolute path inside ``base``,
    after normalisation and resolving symbolic links; raises 42501 when it falls outside (or
    no base directory is configured)."""
    import os

    if not base or not os.path.isabs(base):
        raise CerebroError(
            f"{what}: the TensorBoard callback needs a log directory configured by the DBA",
            INSUFFICIENT_PRIVILEGE,
            hint=f"A superuser sets {TENSORBOARD_SETTING} = '/absolute/dir' in "
            "postgresql.conf (or with ALTER SYSTEM) and reloads; log_dir is then a directory "
            "inside it.")
    root = os.path.realpath(base)
    path = os.path.realpath(os.path.join(root, log_dir))
    if os.path.commonpath([root, path]) != root:
        raise CerebroError(
            f"{what}: TensorBoard log_dir {log_dir!r} is outside the configured log "
            f"directory {base!r}", INSUFFICIENT_PRIVILEGE,
            hint=f"Give a directory inside {base} (relative paths are taken from there).")
    return path


def parse_fit_params(text: str | None, what: str = "fit_params") -> FitParams:
    """Parse and check a ``fit_params`` string; None or empty gives Keras' defaults.

    Allowed keys: batch_size (>= 1, default 32), epochs (>= 1, default 1), shuffle,
    class_weight (dict int -> non-negative number), verbose (0, 1, 2 or 'auto') and callbacks
    (names from :data:`FIT_CALLBACKS`). Raises :class:`CerebroError`.
    """
    d = parse_keyword_string(text, what, key_check=lambda k: _check_fit_key(k, what),
                             call_list_keys=("callbacks",))
    kwargs: dict[str, Any] = {}
    if "batch_size" in d:
        kwargs["batch_size"] = _int_at_least(d["batch_size"], f"{what}: batch_size", 1)
    if "epochs" in d:
        kwargs["epochs"] = _int_at_least(d["epochs"], f"{what}: epochs", 1)
    if d.get("steps_per_epoch") is not None:
        kwargs["steps_per_epoch"] = _int_at_least(
            d["steps_per_epoch"], f"{what}: steps_per_epoch", 1)
    if d.get("initial_epoch") is not None:
        first = _int_at_least(d["initial_epoch"], f"{what}: initial_epoch", 0)
        epochs = kwargs.get("epochs", 1)
        if first >= epochs:
            raise invalid(
                f"{what}: initial_epoch must be less than epochs ({epochs}), got {first}",
                hint="Keras trains epochs - initial_epoch passes per call: this would train "
                "nothing",
            )
        if first:
            kwargs["initial_epoch"] = first
    if d.get("shuffle") is not None:
        if not isinstance(d["shuffle"], bool):
            raise invalid(f"{what}: shuffle must be True or False, got {d['shuffle']!r}")
        kwargs["shuffle"] = d["shuffle"]
    if d.get("class_weight") is not None:
        cw = d["class_weight"]
        if not isinstance(cw, dict):
            raise invalid(
                f"{what}: class_weight must be a dict of class index to weight, "
                f"got {render_literal(cw)}",
                hint="e.g. class_weight={0: 1.0, 1: 5.0}",
            )
        for k, v in cw.items():
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise invalid(
                    f"{what}: class_weight keys must be class indexes (0, 1, ...), got {k!r}"
                )
            if not _is_number(v) or v < 0:
                raise invalid(
                    f"{what}: class_weight values must be non-negative numbers, got {v!r}"
                )
        kwargs["class_weight"] = dict(cw)
    if d.get("verbose") is not None:
        v = d["verbose"]
        if isinstance(v, bool) or v not in (0, 1, 2, "auto"):
            raise invalid(f"{what}: verbose must be 0, 1, 2 or 'auto', got {v!r}")
        kwargs["verbose"] = v
    if d.get("callbacks") is not None:
        names = []
        raw = d["callbacks"]
        if isinstance(raw, str) and raw.strip().startswith("["):
            # a grid's value as MADlib writes it ('callbacks': ['[TensorBoard(...)]']): the
            # string is the list itself
            raw = parse_keyword_string(f"callbacks={raw.strip()}", what,
                                       call_list_keys=("callbacks",))["callbacks"]
        given = raw if isinstance(raw, list) else [raw]
        for item in given:
            if isinstance(item, Call) and item.name.lower() == "terminateonnan":
                if item.kwargs:  # Keras' TerminateOnNaN() takes no arguments
                    raise invalid(f"{what}: TerminateOnNaN takes no arguments")
                name = "TerminateOnNaN"
            elif isinstance(item, Call):
                if item.name.lower() != "tensorboard":
                    raise invalid(f"{what}: callback {item.name!r} is not allowed",
                                  hint="allowed callbacks: " + ", ".join(
                                      sorted(FIT_CALLBACKS.values())))
                kwargs["tensorboard"] = _tensorboard_args(item.kwargs, what)
                name = "TensorBoard"
            else:
                name = _str_list([item], f"{what}: callbacks")[0]
            canonical = FIT_CALLBACKS.get(name.lower())
            if canonical is None:
                raise invalid(
                    f"{what}: callback {name!r} is not allowed",
                    hint="allowed callbacks: " + ", ".join(sorted(FIT_CALLBACKS.values())),
                )
            if canonical not in names:
                names.append(canonical)
        kwargs["callbacks"] = tuple(names)
    return FitParams(**kwargs)


# --------------------------------------------------------------------------------------------
# automl_params
# --------------------------------------------------------------------------------------------

def _automl_value(value: Any, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise invalid(f"{where} must be True or False, got {value!r}")
    elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise invalid(f"{where} must be an integer, got {render_literal(value)}")
    elif isinstance(default, float):
        if not _is_number(value):
            raise invalid(f"{where} must be a number, got {render_literal(value)}")
        return float(value)
    elif isinstance(default, str) and not isinstance(value, str):
        raise invalid(f"{where} must be a string, got {render_literal(value)}")
    return value


def parse_automl_params(
    text: str | None,
    method: str,
    defaults: Mapping[str, Any],
    *,
    bare_name_keys: Collection[str] = (),
    what: str = "automl_params",
) -> dict[str, Any]:
    """Parse ``automl_params`` into a dict with every key of ``defaults`` (defaults filled).

    ``defaults`` are the accepted keys (matched case-insensitively) and their defaults, whose
    types the values must match (int, float, bool or str; None allows any literal); keys in
    ``bare_name_keys`` may take a bare word (hyperopt's ``algorithm=tpe``). ``method`` names
    the procedure in messages. Ranges are the procedure's own checks (its constructor).
    Raises :class:`CerebroError`.
    """
    m = method.strip().lower()
    by_lower = {k.lower(): k for k in defaults}

    def norm(key: str) -> str:
        return by_lower.get(key.lower(), key)

    def check(key: str) -> None:
        if key not in by_lower.values():
            raise invalid(
                f"{what}: unknown key {key!r} for {m}", hint="allowed keys: " + ", ".join(defaults)
            )

    given = parse_keyword_string(
        text, what, bare_name_keys=bare_name_keys, key_normalizer=norm, key_check=check
    )
    out = dict(defaults)
    for key, value in given.items():
        out[key] = _automl_value(value, defaults[key], f"{what}: {key}")
    return out
