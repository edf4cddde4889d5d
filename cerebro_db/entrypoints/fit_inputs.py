"""The input checks every fit entry point shares (``madlib_keras_fit_multiple_model``,
``madlib_keras_fit``, ``madlib_keras_automl``, ``madlib_keras_fit_resume``): the packed
source and validation tables, the iteration arguments, the output tables, and, for a resume,
the tables the fit was started on. Each raises a PostgreSQL-style error before any work."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..catalog import Catalog
from ..catalog import fit_inputs as sql
from ..errors import (
    DATA_EXCEPTION,
    DATATYPE_MISMATCH,
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    CerebroError,
    invalid,
)
from ..fitrun import Config, PackedTable, cache_memory, data_digest
from ..names import TableName
from . import require_output_schema
from .preprocessing import read_training_summary

MAX_ITERATIONS = 100_000
"""The most iterations (epochs) one fit may ask for; checked before any work."""


def refuse_temporary(cat: Catalog, t: TableName, what: str) -> None:
    """Worker sessions cannot see another session's temporary table: refuse it up front."""
    if sql.is_temporary(cat, t):
        raise CerebroError(f'{what} "{t}" is a temporary table, which the worker sessions '
                           "cannot see", FEATURE_NOT_SUPPORTED,
                           hint="Pack the data into a regular (or UNLOGGED) table.")


def packed_table(cat: Catalog, name: str, what: str,
                 partitions: int | None = None) -> PackedTable:
    """A preprocessed table and its summary, or a clear error. A table packed by MADlib's
    own preprocessor has no partitions of ours: its buffers are spread as ``buffer_id % p``
    over ``partitions`` (a validation table: the training table's) or its summary's
    ``num_partitions`` (see :func:`preprocessing._madlib_summary`)."""
    try:
        t, s = read_training_summary(cat, name)
    except CerebroError as e:
        raise CerebroError(e.message.replace("training_preprocessor_table", what), e.sqlstate,
                           hint=f"{what} must be made by training_preprocessor_dl or "
                           "validation_preprocessor_dl.") from None
    refuse_temporary(cat, t, what)
    xcols, ycols = list(s["x_columns"]), list(s["y_columns"])
    x, y = xcols[0], ycols[0]
    shapes = sql.buffer_shapes(cat, t, xcols + ycols)
    if shapes is None:
        raise CerebroError(f'{what} "{t}" is empty', DATA_EXCEPTION)
    sizes = [int(np.prod(sh[1:])) for sh in shapes]
    multi = None if len(xcols) == len(ycols) == 1 else {
        "xs": xcols, "ys": ycols, "x_sizes": sizes[:len(xcols)],
        "y_widths": sizes[len(xcols):], "kinds": list(s["dependent_kind"])}
    x_size, y_width = int(np.prod(shapes[0][1:])), int(np.prod(shapes[len(xcols)][1:]))
    x_shapes = [[int(d) for d in sh[1:]] for sh in shapes[:len(xcols)]]
    oid = cat.relation_oid(t)
    assert oid is not None  # the caller found the table
    qualified = sql.qualified_name(cat, oid)
    if s.get("madlib"):
        p = int(partitions or s["num_partitions"])
        s = {**s, "num_partitions": p}
        return PackedTable(t, qualified, s, x, y, x_size, y_width, p, s["dependent_kind"][0],
                           p, multi, x_shapes)
    lo, hi = sql.partition_range(cat, t)
    p = int(s["num_partitions"])
    if lo < 0 or hi > p - 1:  # a partition may hold no buffer
        raise CerebroError(f'{what} "{t}" does not hold the {p} partitions its summary '
                           "records", DATA_EXCEPTION, hint="Preprocess the data again.")
    return PackedTable(t, qualified, s, x, y, x_size, y_width, p, s["dependent_kind"][0], None,
                       multi, x_shapes)


def validation_table(cat: Catalog, name: str | None, src: PackedTable) -> PackedTable | None:
    """The packed validation table (None without one): the training table's partitions and
    shapes."""
    if name is None:
        return None
    v = packed_table(cat, name, "validation_table", src.partitions)
    if v.partitions != src.partitions:
        raise invalid(f'validation_table "{v.table}" has {v.partitions} partitions, the '
                      f"training data {src.partitions}",
                      hint="Preprocess the validation data with validation_preprocessor_dl "
                      "from this training table, leaving num_partitions NULL (the training "
                      "table's).")
    if v.columns()[2:4] != src.columns()[2:4]:
        _, _, vx, vy, _ = v.columns()
        _, _, sx, sy, _ = src.columns()

        def shown(a: list[int]) -> str:
            return str(a[0]) if len(a) == 1 else str(a)

        raise CerebroError(f'validation_table "{v.table}" rows have {shown(vx)} features and '
                           f"{shown(vy)} label columns, the training data {shown(sx)} and "
                           f"{shown(sy)}", DATATYPE_MISMATCH)
    return v


def check_fit_args(cat: Catalog, num_iterations: int | None,
                   metrics_compute_frequency: int | None, use_gpus: bool | None) -> None:
    """num_iterations, metrics_compute_frequency, use_gpus and the cache setting."""
    if num_iterations is None:
        raise CerebroError("num_iterations must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not 1 <= num_iterations <= MAX_ITERATIONS:
        raise invalid(f"num_iterations must be between 1 and {MAX_ITERATIONS}, got "
                      f"{num_iterations}")
    if metrics_compute_frequency is not None and not (
            1 <= metrics_compute_frequency <= num_iterations):
        raise invalid(f"metrics_compute_frequency must be between 1 and num_iterations "
                      f"({num_iterations}), got {metrics_compute_frequency}")
    check_use_gpus(use_gpus)
    cache_memory(cat, 1)


def check_use_gpus(use_gpus: bool | None) -> None:
    """``use_gpus => TRUE`` on a server without a GPU is refused, by the fits as by
    evaluation and prediction (MADlib's rule)."""
    if use_gpus and not os.path.exists("/dev/nvidiactl"):
        raise CerebroError("use_gpus is TRUE but this server has no GPU", FEATURE_NOT_SUPPORTED,
                           hint="Call with use_gpus => FALSE.")


def outputs_absent(cat: Catalog, out: TableName, suffixes: Sequence[str], warm: bool,
                   resume: bool = False, can_warm: bool = True) -> None:
    """The output tables (``out`` with each suffix) can be created: their schema allows it
    and, unless ``warm`` (they are replaced), none exists. ``can_warm``: the call has a
    ``warm_start`` to suggest (AutoML has none)."""
    require_output_schema(cat, out, "model_output_table" if "_info" in suffixes else "model")
    for s in suffixes:
        t = out.with_suffix(s, "model_output_table") if s else out
        if cat.relation_oid(t) is not None and not warm:
            raise CerebroError(f'output table "{t}" already exists', DUPLICATE_TABLE,
                               hint=("The resumed fit writes its outputs under the name it "
                                     "was started with: drop or rename that table first."
                                     if resume else
                                     "Drop it, choose another name, or pass warm_start => "
                                     "TRUE to continue from its weights." if can_warm else
                                     "Drop it or choose another name."))


def check_item(c: Config, what: str = "compile_params") -> dict[str, Any]:
    """One configuration as the worker-side checks (``fit_checks.check_configs``) take it."""
    return {"mst_key": c.mst_key, "model_id": c.model_id, "compile_params": c.compile_params,
            "fit_params": c.fit_params, "arch": c.arch, "what": what}


def stored_table(cat: Catalog, opts: dict[str, Any], key: str, text: str | None,
                 what: str) -> TableName | None:
    """A table of a fit as its original call resolved it, else (a fit recorded without it)
    ``text`` as this session's search_path finds it."""
    rec = (opts.get("tables") or {}).get(key)
    if rec:
        return TableName(rec[0], rec[1], rec[2])
    return cat.table(text, what) if text else None


def same_data(cat: Catalog, opts: dict[str, Any], fit_id: int, src: PackedTable,
              val: PackedTable | None) -> None:
    """A resumed fit's source and validation tables are the ones it was started on (same
    oid), not tables made again under the same names."""
    tables = opts.get("tables") or {}
    for key, t, what in (("source_oid", src, "source_table"),
                         ("validation_oid", val, "validation_table")):
        if t is None or tables.get(key) is None:
            continue
        digest = tables.get(key.replace("_oid", "_digest"))
        if cat.relation_oid(t.table) != int(tables[key]) and (
                digest is None or data_digest(cat, t) != digest):
            raise CerebroError(
                f'{what} "{t.table}" is not the table fit {fit_id} was started on (it was '
                "dropped and made again since, with other contents)",
                OBJECT_NOT_IN_PREREQUISITE_STATE,
                hint="A resume continues on the fit's own data; start a new fit instead.")
    for t, key in ((src, "source_name"), (val, "validation_name")):
        if t is not None and opts.get(key):
            t.table = TableName(t.table.schema, t.table.name, opts[key])
