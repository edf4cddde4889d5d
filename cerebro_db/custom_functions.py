"""Custom loss and metric functions by reference, never by unpickling.

MADlib's ``load_custom_function`` stores dill-pickled Python objects in an *object table*
and the server unpickles them: whoever can write that table runs code as the database
server. Here an object table row holds a *reference* instead, text naming a Python object
in a module installed in the server's environment::

    mypkg.losses:focal_loss                 a function (loss or metric)
    mypkg.losses:focal_loss(gamma=2.0)      the function with literal keyword arguments bound
                                            (a class is instantiated with them)
    builtin:top_k_accuracy(k=3)             what load_top_k_accuracy_function writes

References are parsed by the literal-only parser of :mod:`cerebro_db.literals` (nothing is
evaluated). Importing a module runs its code, so a module may be imported only when the
DBA allowed it: ``cerebro_db.custom_function_modules`` lists module names (a name allows
the module and its submodules) and the role each is granted to; only superusers can write
that table. The check is made when a reference is registered and again by every session
that imports one (the coordinator and each worker), so a reference written into an object
table, or into a fit's catalog row, by other means still cannot import anything else.
``builtin:`` references name objects of this package and Keras only and need no grant.

This module is pure: no ``plpy``, driver or TensorFlow at module level; it imports the
referenced module (and Keras) only in :func:`resolve` / :func:`keras_object`.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import INSUFFICIENT_PRIVILEGE, CerebroError, invalid
from .literals import Call, call_value, parse_tree

__all__ = [
    "BUILTIN",
    "OBJECT_TABLE_COLUMNS",
    "Reference",
    "keras_object",
    "module_allowed",
    "parse_reference",
    "resolve",
    "top_k_reference",
]

BUILTIN = "builtin"
"""The pseudo-module of references to this package's own functions (no grant needed)."""

OBJECT_TABLE_COLUMNS: list[tuple[str, str]] = [
    ("id", "SERIAL"),
    ("name", "TEXT PRIMARY KEY"),
    ("description", "TEXT"),
    ("object", "BYTEA"),
    ("reference", "TEXT"),
]
"""MADlib's object table columns (id, name, description, object) plus ``reference``."""

_REFERENCE_HINT = ("write module.path:function, e.g. 'mypkg.losses:focal_loss' or "
                   "'mypkg.losses:focal_loss(gamma=2.0)'")
_BUILTINS = {"top_k_accuracy": ("k",)}


@dataclass(frozen=True)
class Reference:
    """A parsed reference: module, attribute name and literal keyword arguments."""

    module: str
    attr: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        """Whether it names one of this package's own functions."""
        return self.module == BUILTIN


def parse_reference(text: Any, what: str = "reference") -> Reference:
    """Parse ``module.path:name`` or ``module.path:name(key=literal, ...)``.

    Raises :class:`CerebroError` (22023) for anything else; nothing is imported here.
    """
    if not isinstance(text, str) or not text.strip():
        raise invalid(f"{what} must be a non-empty string, got {text!r}", hint=_REFERENCE_HINT)
    module, sep, rest = text.strip().partition(":")
    parts = module.split(".")
    if not sep or not all(p.isidentifier() for p in parts):
        raise invalid(f"{what} must name a module and an object as module.path:name, got "
                      f"{text!r}", hint=_REFERENCE_HINT)
    node = parse_tree(rest.strip(), what, _REFERENCE_HINT).body if rest.strip() else None
    if isinstance(node, ast.Name):
        call = Call(node.id, {})
    elif isinstance(node, ast.Call):
        call = call_value(node, what)
    else:
        raise invalid(f"{what} must name an object after the colon, e.g. "
                      f"'{module}:my_function', got {text!r}", hint=_REFERENCE_HINT)
    if call.name.startswith("_"):
        raise invalid(f"{what}: {call.name!r} is private (starts with '_')")
    ref = Reference(module, call.name, dict(call.kwargs))
    if ref.builtin:
        allowed = _BUILTINS.get(ref.attr)
        if allowed is None or set(ref.kwargs) - set(allowed):
            raise invalid(f"{what}: unknown built-in {text!r}",
                          hint="built-in: builtin:top_k_accuracy(k=<integer>)")
    return ref


def top_k_reference(k: int) -> str:
    """The reference ``load_top_k_accuracy_function`` stores for ``k``."""
    return f"{BUILTIN}:top_k_accuracy(k={int(k)})"


def module_allowed(module: str, grants: Mapping[str, Any] | list[str]) -> bool:
    """Whether ``module`` is one of ``grants`` (module names) or a submodule of one."""
    return any(module == g or module.startswith(g + ".") for g in grants)


def require_allowed(ref: Reference, allowed_modules: list[str], name: str) -> None:
    """Raise 42501 unless ``ref`` is built in or its module is granted."""
    if ref.builtin or module_allowed(ref.module, allowed_modules):
        return
    raise CerebroError(
        f"custom function {name!r}: module {ref.module!r} is not allowed for custom functions",
        INSUFFICIENT_PRIVILEGE,
        hint="A superuser allows a module (and its submodules) with INSERT INTO "
        "<extension schema>.custom_function_modules (module, grantee) VALUES "
        f"('{ref.module.split('.')[0]}', 'public').")


@functools.lru_cache(maxsize=128)
def _import(module: str) -> Any:
    return importlib.import_module(module)


def resolve(ref: Reference, name: str) -> Any:
    """The Python object of a (checked) reference: imported, and called or bound with its
    keyword arguments (a class is instantiated, a function gets them bound). Raises
    :class:`CerebroError` (22023) when it cannot be imported or is not callable."""
    if ref.builtin:
        return _builtin(ref, name)
    try:
        mod = _import(ref.module)
    except Exception as e:  # noqa: BLE001 - any import failure is the reference's problem
        raise invalid(f"custom function {name!r}: cannot import module {ref.module!r}: "
                      f"{type(e).__name__}: {e}",
                      hint="install the module into the database server's Python "
                      "environment") from None
    obj = getattr(mod, ref.attr, None)
    if obj is None or not callable(obj):
        raise invalid(f"custom function {name!r}: {ref.module}:{ref.attr} is not a callable "
                      "object of that module")
    if inspect.isclass(obj):
        try:
            return obj(**ref.kwargs)
        except Exception as e:  # noqa: BLE001 - built from the user's literals
            raise invalid(f"custom function {name!r}: {ref.module}:{ref.attr}"
                          f"(**{ref.kwargs!r}) failed: {e}") from None
    return functools.partial(obj, **ref.kwargs) if ref.kwargs else obj


def _builtin(ref: Reference, name: str) -> Any:
    import keras

    k = ref.kwargs.get("k", 5)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise invalid(f"custom function {name!r}: k must be a positive integer, got {k!r}")
    return keras.metrics.TopKCategoricalAccuracy(k=k, name=name)


def keras_object(reference: str, name: str, kind: str) -> Any:
    """What ``model.compile`` gets for custom ``name`` used as ``kind`` ('loss' or
    'metric'). A function metric is wrapped so that Keras reports it as ``name`` (the name
    the user wrote in compile_params, as MADlib reports it)."""
    import keras

    obj = resolve(parse_reference(reference, f"reference of {name!r}"), name)
    if kind == "metric" and not isinstance(obj, keras.metrics.Metric):
        return keras.metrics.MeanMetricWrapper(obj, name=name)
    return obj

