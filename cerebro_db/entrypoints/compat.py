"""MADlib functions with no training logic of their own: ``gpu_configuration`` and the
custom-function object tables (``load_custom_function``, ``load_top_k_accuracy_function``,
``delete_custom_function``; see :mod:`cerebro_db.custom_functions`)."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from .. import custom_functions as cf
from .. import params
from ..catalog import Catalog
from ..catalog import models as stmts
from ..errors import (
    DUPLICATE_OBJECT,
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_OBJECT,
    WRONG_OBJECT_TYPE,
    CerebroError,
    invalid,
)
from ..names import TableName
from . import entrypoint, require_output_schema

GPU_SOURCES = ("tensorflow", "nvidia")


def gpus_from_tensorflow() -> list[str]:
    """One description per GPU TensorFlow sees in this server process (as MADlib's
    ``physical_device_desc``: device number, name, compute capability)."""
    import tensorflow as tf  # type: ignore[import-untyped]

    out = []
    for i, dev in enumerate(tf.config.list_physical_devices("GPU")):
        details: dict[str, Any] = {}
        try:
            details = dict(tf.config.experimental.get_device_details(dev))
        except Exception:  # noqa: BLE001, S110 - details are optional
            pass
        desc = f"device: {i}, name: {details.get('device_name', dev.name)}"
        cc = details.get("compute_capability")
        if cc:
            desc += f", compute capability: {cc[0]}.{cc[1]}"
        out.append(desc)
    return out


def gpus_from_nvidia() -> list[str]:
    """The lines of ``nvidia-smi -L`` (none when it is missing or fails, as in MADlib)."""
    try:
        text = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]


@entrypoint
def version(cat: Catalog) -> str:
    """MADlib's ``version()``: this package's version and the server's (MADlib's notebooks
    call ``madlib.version()`` first)."""
    from .. import __version__
    from ..catalog import session

    return (f"cerebro_db version: {__version__} (Apache MADlib's deep-learning interface), "
            f"{session.server_version(cat)}")


@entrypoint
def gpu_configuration(cat: Catalog, *, output_table: str, source: str | None = None) -> None:
    """Write the GPUs the server sees to ``output_table`` (hostname, gpu_descr)."""
    out = cat.output_table(output_table, "output_table")
    src = (source or "tensorflow").strip().lower()
    if src not in GPU_SOURCES:
        raise invalid(f"source must be 'tensorflow' or 'nvidia', got {source!r}",
                      hint="DL: source has to be one of tensorflow or nvidia")
    cat.require_absent(out, "output_table")
    require_output_schema(cat, out, "output_table")
    gpus = gpus_from_tensorflow() if src == "tensorflow" else gpus_from_nvidia()
    cat.create_table(out, [("hostname", "text"), ("gpu_descr", "text")])
    if gpus:
        cat.insert(out, ["hostname", "gpu_descr"], ["text", "text"],
                   [["localhost", g] for g in gpus])
    cat.notice(f"gpu_configuration: {len(gpus)} GPU(s) seen through {src}; listed in {out}")


# ------------------------------------------------------------------ custom functions

CUSTOM_FN = "Keras Custom Function"  # MADlib's module name, kept in messages scripts match


def object_table_name(cat: Catalog, text: str | None, what: str = "object_table"
                      ) -> TableName | None:
    """The object table: an unqualified name lives in the extension's schema, as in MADlib."""
    if text is None:
        return None
    t = TableName.parse(text, what)
    if t.schema is not None:
        return t
    return TableName(cat.schema, t.name, f"{cat.schema}.{t.given.strip()}")


def _require_object_table(cat: Catalog, table: TableName, what: str) -> set[str]:
    oid = cat.require_table(table, what)
    cols = set(cat.columns(oid))
    missing = [c for c in ("id", "name", "description", "object") if c not in cols]
    if missing:
        raise CerebroError(
            f'{CUSTOM_FN}: Invalid custom function table {table}, missing columns: '
            f'{", ".join(missing)}', WRONG_OBJECT_TYPE,
            hint="Object tables are created by load_custom_function or "
            "load_top_k_accuracy_function.")
    return cols


def _pickled_error(name: str, table: TableName) -> CerebroError:
    return CerebroError(
        f"custom function {name!r} in {table} is a pickled Python object: cerebro_db never "
        "unpickles user-supplied bytes", FEATURE_NOT_SUPPORTED,
        hint="Install the function's module into the database server's Python environment, "
        "have a superuser allow it in custom_function_modules, and register it by reference: "
        f"SELECT load_custom_function('{table.name}', 'mypkg.module:function', '{name}'). "
        "For top-k accuracy use load_top_k_accuracy_function.")


def check_reference(cat: Catalog, reference: str, name: str, resolve: bool = True
                    ) -> cf.Reference:
    """Parse a reference, check the current role may use its module, and (``resolve``)
    import it. A fit's coordinator passes ``resolve=False``: it never imports TensorFlow, so
    the import is checked by the worker sessions' checks (``check_configs``)."""
    ref = cf.parse_reference(reference, f"reference of custom function {name!r}")
    cf.require_allowed(ref, cat.custom_function_modules(), name)
    if resolve:
        cf.resolve(ref, name)
    return ref


def grid_names(grid: Any) -> list[str]:
    """The loss and metric names a compile_params grid (parsed) can produce."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    for key in ("loss", "metrics", "weighted_metrics"):
        walk(grid.get(key) if isinstance(grid, dict) else None)
    return out


def custom_references(cat: Catalog, object_table: str | None,
                      cps: Sequence[params.CompileParams] | Sequence[str],
                      resolve: bool = True) -> tuple[TableName | None, dict[str, str]]:
    """The object table and ``{name: reference}`` of the custom functions ``cps`` use
    (compile parameters, or the loss and metric names themselves).

    A name used in a compile_params that has a row in the object table is that row's
    function; every reference is checked (the role may use its module, it imports and is
    callable). A row holding only pickled bytes is refused.
    """
    table = object_table_name(cat, object_table)
    if table is None:
        return None, {}
    cols = _require_object_table(cat, table, "object_table")
    names = sorted({n for cp in cps for n in ([cp] if isinstance(cp, str) else cp.names())})
    rows = stmts.custom_functions(cat, table, names, "reference" in cols)
    out: dict[str, str] = {}
    for r in rows:
        if r["reference"] is None:
            if r["pickled"]:
                raise _pickled_error(r["name"], table)
            raise invalid(f"custom function {r['name']!r} in {table} has no reference")
        check_reference(cat, r["reference"], r["name"], resolve)
        out[r["name"]] = r["reference"]
    return table, out


def _add_function(cat: Catalog, table: TableName, name: str, description: str | None,
                  reference: str) -> None:
    if cat.relation_oid(table) is None:
        require_output_schema(cat, table, "object_table")
        cat.create_table(table, cf.OBJECT_TABLE_COLUMNS)
        stmts.grant_read_to_public(cat, table)
        cat.notice(f"{CUSTOM_FN}: Created new custom function table {table}.")
    else:
        cols = _require_object_table(cat, table, "object_table")
        cat.require_own_table(table, "object_table")
        if "reference" not in cols:
            stmts.add_reference_column(cat, table)
    if stmts.custom_function_exists(cat, table, name):
        raise CerebroError(f"Function '{name}' already exists in {table}", DUPLICATE_OBJECT,
                           hint="Delete it first with delete_custom_function, or use another "
                           "name.")
    stmts.insert_custom_function(cat, table, name=name, description=description,
                                 reference=reference)
    cat.notice(f"{CUSTOM_FN}: Added function {name} to {table} table")


@entrypoint
def load_custom_function(cat: Catalog, *, object_table: str, reference: str, name: str,
                         description: str | None = None) -> None:
    """Register a reference to an installed Python function under ``name``."""
    table = object_table_name(cat, object_table)
    if table is None:
        raise CerebroError("object_table must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if reference is None:
        raise CerebroError("reference must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if name is None or not name.strip():
        raise CerebroError(f"{CUSTOM_FN}: function name cannot be NULL!",
                           NULL_VALUE_NOT_ALLOWED)
    check_reference(cat, reference, name)
    _add_function(cat, table, name, description, reference)


@entrypoint
def load_custom_function_pickled(cat: Catalog, *, object_table: str, object: bytes | None,
                                 name: str, description: str | None = None) -> None:
    """MADlib's form with dill-pickled bytes: always refused, with what to do instead."""
    raise CerebroError(
        "load_custom_function: pickled function objects are not supported: cerebro_db never "
        "unpickles user-supplied bytes", FEATURE_NOT_SUPPORTED,
        hint="Install the function's module into the database server's Python environment, "
        "have a superuser allow it (INSERT INTO custom_function_modules), and register it by "
        f"reference: SELECT load_custom_function('{object_table}', 'mypkg.module:function', "
        f"'{name}'). For top-k accuracy: SELECT load_top_k_accuracy_function("
        f"'{object_table}', k).")


@entrypoint
def load_top_k_accuracy_function(cat: Catalog, *, object_table: str, k: int) -> None:
    """MADlib's ``top_{k}_accuracy`` metric, natively (Keras' TopKCategoricalAccuracy)."""
    table = object_table_name(cat, object_table)
    if table is None:
        raise CerebroError("object_table must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if k is None or k <= 0:
        raise invalid(f"{CUSTOM_FN}: For top k accuracy functions k has to be a positive "
                      f"integer, got k = {k}")
    name = f"top_{k}_accuracy"
    _add_function(cat, table, name, f"returns {name}", cf.top_k_reference(k))


@entrypoint
def delete_custom_function(cat: Catalog, *, object_table: str, id: int | None = None,
                           name: str | None = None) -> None:
    """Delete one function by id or name; drop the object table once it is empty."""
    table = object_table_name(cat, object_table)
    if table is None:
        raise CerebroError("object_table must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if id is None and name is None:
        raise CerebroError(f"{CUSTOM_FN}: function id/name cannot be NULL!",
                           NULL_VALUE_NOT_ALLOWED)
    _require_object_table(cat, table, "object_table")
    cat.require_own_table(table, "object_table")
    gone = stmts.delete_custom_function(cat, table, id=id, name=name)
    if gone is None:
        raise CerebroError(f"{CUSTOM_FN}: Object id {id if id is not None else name} not "
                           "found", UNDEFINED_OBJECT)
    cat.notice(f"{CUSTOM_FN}: Object id {gone} has been deleted from {table}.")
    if not stmts.has_rows(cat, table):
        if cat.drop_table_unless_used(table):
            cat.notice(f"{CUSTOM_FN}: Dropping empty custom keras function table {table}")
        else:  # another role's view on it (its SELECT is PUBLIC's) made the call fail
            cat.notice(f"{CUSTOM_FN}: the empty custom keras function table {table} is kept: "
                       "other objects depend on it")
