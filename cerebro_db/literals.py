"""The literal-only parser: Python syntax read as data, nothing evaluated.

Parameter strings (:mod:`cerebro_db.params`) and custom function references
(:mod:`cerebro_db.custom_functions`) are parsed with :mod:`ast` and accepted only when every
value is a literal (number, string, True, False, None, list, tuple, dict or set) or, where the
caller allows it, a bare ``Name(key=literal, ...)`` call kept as data (:class:`Call`).
"""
from __future__ import annotations

import ast
import math
import warnings
from dataclasses import dataclass
from typing import Any

from .errors import SYNTAX_ERROR, CerebroError, invalid, syntax

__all__ = [
    "MAX_NESTING",
    "Call",
    "call_value",
    "describe",
    "literal",
    "parse_tree",
]

MAX_NESTING = 32
"""Deepest nesting of lists/tuples/dicts/sets accepted in a value."""

_LITERAL_KINDS = "number, string, True, False, None, list, tuple, dict or set"


@dataclass(frozen=True)
class Call:
    """A bare ``Name(key=literal, ...)`` call, kept as data (only for ``optimizer``)."""

    name: str
    kwargs: dict[str, Any]


def describe(node: ast.AST) -> tuple[str, str | None]:
    """A short description of a disallowed node and an optional hint."""
    if isinstance(node, ast.Name):
        return f"name {node.id!r}", f"put quotes around strings, e.g. '{node.id}'"
    if isinstance(node, ast.Call):
        return "a function call", None
    if isinstance(node, ast.Attribute):
        return "attribute access", None
    if isinstance(node, ast.Lambda):
        return "a lambda", None
    if isinstance(node, ast.JoinedStr):
        return "an f-string", "use a plain quoted string"
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return "a comprehension", "write the values out"
    if isinstance(node, ast.Starred):
        return "unpacking with *", None
    if isinstance(node, ast.Subscript):
        return "a subscript", None
    if isinstance(node, (ast.BinOp, ast.BoolOp, ast.Compare)):
        return "an expression", "write the value out as a single number"
    return "an expression", None


def not_literal(where: str, node: ast.AST) -> CerebroError:
    desc, hint = describe(node)
    return invalid(f"{where} must be a literal ({_LITERAL_KINDS}), got {desc}", hint=hint)


def check_number(where: str, value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid(f"{where} must be a finite number, got {value!r}")
    return value


def literal(node: ast.AST, where: str, depth: int = 0) -> Any:
    """Convert one syntax-tree node to a Python value, accepting literals only."""
    if depth > MAX_NESTING:
        raise invalid(f"{where} is nested too deeply (more than {MAX_NESTING} levels)")
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)):
            return check_number(where, value)
        raise invalid(
            f"{where} must be a literal ({_LITERAL_KINDS}), got a {type(value).__name__} literal"
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        number = operand.value if isinstance(operand, ast.Constant) else None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return check_number(where, -number if isinstance(node.op, ast.USub) else number)
        raise invalid(f"{where}: a sign must be followed by a number")
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [literal(elt, where, depth + 1) for elt in node.elts]
        if isinstance(node, ast.List):
            return items
        if isinstance(node, ast.Tuple):
            return tuple(items)
        try:
            return set(items)
        except TypeError:
            msg = f"{where}: set elements must be hashable (numbers, strings, tuples)"
            raise invalid(msg) from None
    if isinstance(node, ast.Dict):
        out: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values):
            if key_node is None:
                raise invalid(
                    f"{where} must be a literal ({_LITERAL_KINDS}), got unpacking with **"
                )
            key = literal(key_node, where, depth + 1)
            try:
                duplicate = key in out
            except TypeError:
                msg = f"{where}: dict keys must be hashable (numbers, strings, tuples)"
                raise invalid(msg) from None
            if duplicate:
                raise invalid(f"{where} has a duplicate dict key {key!r}")
            out[key] = literal(value_node, where, depth + 1)
        return out
    raise not_literal(where, node)


def parse_tree(source: str, what: str, hint: str | None = None) -> ast.Expression:
    """``ast.parse`` in eval mode, with every parser failure turned into a CerebroError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning/DeprecationWarning on odd literals
            return ast.parse(source, mode="eval")
    except SyntaxError as e:
        msg = e.msg if isinstance(e.msg, str) else ""
        if len(msg) > 120:
            msg = msg[:117] + "..."
        detail = "" if msg in ("", "invalid syntax") else f" ({msg})"
        raise syntax(f"{what}: invalid syntax{detail}", hint=hint) from None
    except (ValueError, TypeError) as e:  # null bytes, int digit limit on some versions
        raise syntax(f"{what}: invalid syntax ({str(e)[:120]})", hint=hint) from None
    except (RecursionError, MemoryError):
        raise syntax(f"{what}: input is too deeply nested or too complex to parse") from None


def call_value(node: ast.Call, where: str) -> Call:
    if not isinstance(node.func, ast.Name):
        raise invalid(
            f"{where}: expected a name such as Adam(...), got {describe(node.func)[0]}",
            hint="write the optimizer as 'Adam(learning_rate=0.001)'",
        )
    if node.args:
        raise invalid(
            f"{where}: {node.func.id}() takes keyword arguments only",
            hint=f"write {node.func.id}(learning_rate=0.001)",
        )
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise invalid(f"{where}: unpacking with ** is not allowed")
        if kw.arg in kwargs:
            raise CerebroError(f"{where}: duplicate argument {kw.arg!r}", SYNTAX_ERROR)
        kwargs[kw.arg] = literal(kw.value, f"{where}: {kw.arg}", 1)
    return Call(node.func.id, kwargs)
