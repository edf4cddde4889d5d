"""``training_preprocessor_dl`` and ``validation_preprocessor_dl``."""
from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import __version__
from ..catalog import Catalog, Column
from ..catalog import packing as stmts
from ..errors import (
    DATA_EXCEPTION,
    DATATYPE_MISMATCH,
    FEATURE_NOT_SUPPORTED,
    INVALID_NAME,
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_TABLE,
    CerebroError,
    invalid,
)
from ..names import NAMEDATALEN, TableName, split_column_list
from ..preprocess import (
    check_finite,
    decode_arrays,
    one_hot,
    plan_buffers,
    shuffle_order,
    to_le_bytes,
)
from . import entrypoint, require_output_schema

INT_TYPES = {"int2", "int4", "int8"}
FLOAT_TYPES = {"float4", "float8", "numeric"}
CLASS_TYPES = {"text", "varchar", "bpchar", "char", "name", "bool"} | INT_TYPES | FLOAT_TYPES
FEATURE_TYPES = INT_TYPES | FLOAT_TYPES
MAX_CLASSES = 10_000
MAX_PARTITIONS = 256
FETCH_ROWS = 2000
PARTITIONS_SETTING = "cerebro_db.num_partitions"


@dataclass(frozen=True)
class Dependent:
    """A dependent variable and how it is encoded."""

    column: Column
    kind: str  # 'class' (one-hot encoded here), 'one_hot' (int array as given), 'regression'


def _dependent(col: Column, regression: bool = False) -> Dependent:
    """How a dependent variable is encoded. As in MADlib, every scalar label (text, boolean,
    integer, real, double precision, numeric) is a class and is one-hot encoded, and a
    numeric array is taken as already one-hot; ``regression`` (the dependent variable is
    listed in ``regression_targets``) keeps a numeric scalar or array as float32 targets."""
    if regression:
        if col.base_type in FLOAT_TYPES | INT_TYPES:
            return Dependent(col, "regression")
        raise CerebroError(
            f'regression_targets: column "{col.name}" has type {col.type_name}, which cannot '
            "be a regression target", DATATYPE_MISMATCH,
            hint="Regression targets are real, double precision, numeric or integer "
            "(scalars or arrays).")
    if not col.is_array and col.base_type in CLASS_TYPES:
        return Dependent(col, "class")
    if col.is_array and col.base_type in INT_TYPES | FLOAT_TYPES:
        return Dependent(col, "one_hot")
    raise CerebroError(
        f'dependent_varname: column "{col.name}" has type {col.type_name}, which cannot be a label',
        DATATYPE_MISMATCH,
        hint="Use scalar class labels (text, boolean or numeric), a numeric array that is "
        "already one-hot, or list a numeric column in regression_targets.",
    )


def _independent(col: Column) -> Column:
    if col.is_array and col.base_type in FEATURE_TYPES:
        return col
    raise CerebroError(
        f'independent_varname: column "{col.name}" has type {col.type_name}, '
        "expected a numeric array",
        DATATYPE_MISMATCH,
        hint="Features must be an array of real, double precision, numeric or integer; "
        "build one with ARRAY[col1, col2, ...].",
    )


def default_partitions(cat: Catalog) -> int:
    """The setting ``cerebro_db.num_partitions`` if set, else the server's core count."""
    v = cat.setting(PARTITIONS_SETTING)
    if v is not None:
        try:
            return int(v)
        except ValueError:
            raise invalid(f"{PARTITIONS_SETTING} must be an integer, got {v!r}") from None
    return os.cpu_count() or 1


def _check_partitions(p: int) -> int:
    if p < 1 or p > MAX_PARTITIONS:
        raise invalid(f"num_partitions must be between 1 and {MAX_PARTITIONS}, got {p}")
    return p


def _check_distribution_rules(cat: Catalog, rules: str | None) -> str:
    """MADlib's ``distribution_rules``: on Greenplum, the segments that hold the packed data
    ('all_segments', 'gpu_segments' or a table of segment ids). A single PostgreSQL server
    has no segments, so MADlib's PostgreSQL path ignores the argument; so does this (with a
    notice), after checking that a table it names exists. Returns what is recorded in the
    summary: 'all_segments'."""
    if rules is None or rules.strip().lower() == "all_segments":
        return "all_segments"
    if rules.strip().lower() == "gpu_segments":
        what = "'gpu_segments'"
    else:
        t = cat.table(rules, "distribution_rules")
        cat.require_table(t, "distribution_rules")
        what = f'table "{t}"'
    cat.notice(f"distribution_rules {what} chooses Greenplum segments; on PostgreSQL it is "
               "ignored (as MADlib does): the partitions are 0..num_partitions-1")
    return "all_segments"


@dataclass
class _Inputs:
    source: TableName
    output: TableName
    summary: TableName
    indeps: list[Column]
    deps: list[Dependent]
    num_rows: int


def _resolve(cat: Catalog, source_table: str, output_table: str, dependent_varname: str,
             independent_varname: str, regression: set[str] | frozenset[str] = frozenset(),
             ) -> _Inputs:
    source = cat.table(source_table, "source_table")
    output = cat.output_table(output_table, "output_table")
    if output.schema is not None and (output.schema == "pg_temp"
                                      or output.schema.startswith("pg_temp_")):
        raise CerebroError(f'output_table "{output}" cannot be a temporary table: the worker '
                           "sessions that train on it could not see it", FEATURE_NOT_SUPPORTED,
                           hint="Name a table in a regular schema.")
    summary = output.with_suffix("_summary", "output_table")
    dep_names = split_column_list(dependent_varname, "dependent_varname")
    indep_names = split_column_list(independent_varname, "independent_varname")
    if regression - set(dep_names):
        raise invalid(f"regression_targets: {min(regression - set(dep_names))!r} is not "
                      "one of the dependent variables",
                      hint="List dependent_varname columns to train as regression targets.")
    both = set(dep_names) & set(indep_names)
    if both:
        raise invalid(f"column {min(both)!r} is both a dependent and an independent variable")
    out_cols = ["__dist_key__", "buffer_id"] + dep_names + indep_names
    out_cols += [n + "_shape" for n in dep_names + indep_names]
    for n in out_cols:
        if len(n.encode()) >= NAMEDATALEN:
            raise CerebroError(f"column name {n[:30]!r}... is too long for the output table",
                               INVALID_NAME)
    if len(set(out_cols)) != len(out_cols):
        raise CerebroError("the variable names collide with the output table's columns "
                           "(__dist_key__, buffer_id, <name>_shape)", INVALID_NAME)
    oid = cat.require_table(source, "source_table")
    cat.require_absent(output, "output_table")
    cat.require_absent(summary, "output summary table")
    require_output_schema(cat, output, "output_table")
    if cat.relation_oid(output) == oid:  # pragma: no cover - caught by require_absent
        raise invalid("output_table must differ from source_table")
    cols = cat.columns(oid)
    deps = [_dependent(cat.require_column(source, cols, n, "dependent_varname"), n in regression)
            for n in dep_names]
    indeps = [_independent(cat.require_column(source, cols, n, "independent_varname"))
              for n in indep_names]
    num_rows = cat.count_rows(source)
    if num_rows == 0:
        raise CerebroError(f'source_table "{source}" is empty', DATA_EXCEPTION)
    for d in deps:
        if d.kind == "one_hot" and d.column.base_type in FLOAT_TYPES:
            _check_integral(cat, source, d.column)
    return _Inputs(source, output, summary, indeps, deps, num_rows)


def _check_integral(cat: Catalog, source: TableName, col: Column) -> None:
    """A non-integer numeric array taken as one-hot (MADlib casts it to smallint) must hold
    whole numbers; anything else is refused rather than silently rounded."""
    if stmts.has_fractional(cat, source, col.name):
        raise CerebroError(
            f'dependent variable "{col.name}" is a {col.type_name} array with values that are '
            "not whole numbers, so it cannot be a one-hot label", DATATYPE_MISMATCH,
            hint=f"Pass regression_targets => '{col.name}' to train it as a regression target.")


def _class_values(cat: Catalog, inp: _Inputs, dep: Dependent) -> list[Any]:
    values = stmts.distinct_values(cat, inp.source, dep.column.name, MAX_CLASSES + 1)
    if len(values) > MAX_CLASSES:
        raise CerebroError(
            f'dependent_varname: column "{dep.column.name}" has more than {MAX_CLASSES} '
            "distinct values",
            DATA_EXCEPTION,
            hint=f"Is it a continuous target? Pass regression_targets => '{dep.column.name}'.",
        )
    return values


def _label_kind(d: Dependent) -> str:
    """How :func:`cerebro_db.catalog.packing.stream_source` reads a dependent column."""
    if d.kind in ("class", "one_hot"):
        return d.kind
    return "array" if d.column.is_array else "scalar"


class _Grow:
    """A preallocated [n, width] array that grows if the table gained rows meanwhile."""

    def __init__(self, n: int, dtype: Any) -> None:
        self.n, self.dtype = 0, dtype
        self.arr: np.ndarray | None = None
        self.cap = n

    def add(self, block: np.ndarray) -> None:
        arr = self.arr
        if arr is None:
            arr = np.empty((self.cap,) + block.shape[1:], dtype=self.dtype)
        need = self.n + len(block)
        if need > len(arr):
            arr = np.resize(arr, (max(need, 2 * len(arr)),) + arr.shape[1:])
        arr[self.n:need] = block
        self.arr = arr
        self.n = need

    def value(self) -> np.ndarray:
        assert self.arr is not None
        return self.arr[: self.n]


def _read(cat: Catalog, inp: _Inputs, class_maps: list[dict | None]
          ) -> tuple[list[np.ndarray], list[tuple[int, ...]], list[np.ndarray], list[tuple[int, ...]]]:
    """Scan the source once; return features, their row shapes, labels, label shapes."""
    xs = [_Grow(inp.num_rows, np.float32) for _ in inp.indeps]
    ys = [_Grow(inp.num_rows, np.int16 if d.kind != "regression" else np.float32)
          for d in inp.deps]
    xdims: list[tuple[int, ...]] = [() for _ in inp.indeps]
    ydims: list[tuple[int, ...]] = [() for _ in inp.deps]
    old = cat.setting("synchronize_seqscans") or "on"
    cat.set_local("synchronize_seqscans", "off")  # a deterministic scan order, for the seed
    seen = 0
    for rows in stmts.stream_source(cat, inp.source, [c.name for c in inp.indeps],
                                    [(d.column.name, _label_kind(d)) for d in inp.deps],
                                    FETCH_ROWS):
        for i, c in enumerate(inp.indeps):
            vals, dims = decode_arrays([r[f"x{i}"] for r in rows], "float4",
                                       f'independent variable "{c.name}"')
            if seen and dims != xdims[i]:
                raise CerebroError(
                    f'independent variable "{c.name}" must have the same shape in every row, '
                    f"found {list(xdims[i])} and {list(dims)}", DATA_EXCEPTION)
            xdims[i] = dims
            check_finite(vals, f'independent variable "{c.name}"', seen)
            xs[i].add(vals)
        for i, d in enumerate(inp.deps):
            what = f'dependent variable "{d.column.name}"'
            if d.kind == "class":
                cmap = class_maps[i]
                assert cmap is not None
                try:
                    idx = np.fromiter((cmap[r[f"y{i}"]] for r in rows), dtype=np.int64,
                                      count=len(rows))
                except KeyError as e:
                    raise CerebroError(
                        f"{what} has value {e.args[0]!r}, which is not a class of the "
                        "training data", DATA_EXCEPTION,
                        hint="Validation labels must be among the training table's class values.",
                    ) from None
                ys[i].add(idx.astype(np.int16)[:, None])
                ydims[i] = ()
            else:
                vals, dims = decode_arrays([r[f"y{i}"] for r in rows],
                                           "int2" if d.kind == "one_hot" else "float4", what)
                if seen and dims != ydims[i]:
                    raise CerebroError(f"{what} must have the same shape in every row",
                                       DATA_EXCEPTION)
                ydims[i] = dims
                if d.kind == "regression":
                    check_finite(vals, what, seen)
                ys[i].add(vals)
        seen += len(rows)
    cat.set_local("synchronize_seqscans", old)
    if seen == 0:
        raise CerebroError(f'source_table "{inp.source}" is empty', DATA_EXCEPTION)
    return [g.value() for g in xs], xdims, [g.value() for g in ys], ydims


def _write(cat: Catalog, inp: _Inputs, xs: list[np.ndarray], xdims: list[tuple[int, ...]],
           labels: list[np.ndarray], label_widths: list[int], num_partitions: int,
           buffer_size: int | None, seed: int, normalizing_const: float) -> Any:
    n = len(xs[0])
    feature_size = sum(int(np.prod(d)) for d in xdims)
    plan = plan_buffers(n, feature_size, num_partitions, buffer_size)
    order = shuffle_order(n, seed)
    dep_names = [d.column.name for d in inp.deps]
    indep_names = [c.name for c in inp.indeps]
    cols = [("__dist_key__", "integer")]
    cols += [(nm, "bytea") for nm in indep_names] + [(nm, "bytea") for nm in dep_names]
    cols += [(nm + "_shape", "integer[]") for nm in indep_names + dep_names]
    cols += [("buffer_id", "integer")]
    cat.create_table(inp.output, cols, external_storage=indep_names + dep_names)
    scale = np.float32(normalizing_const)
    names = [c for c, _ in cols]
    types = ["int4"] + ["bytea"] * (len(xs) + len(labels)) + ["int4[]"] * (len(xs) + len(labels))
    types += ["int4"]

    def rows():
        for b, (lo, hi) in enumerate(plan.bounds):
            idx = order[lo:hi]
            m = hi - lo
            xb = [to_le_bytes(x[idx] / scale if scale != 1 else x[idx]) for x in xs]
            yb = [to_le_bytes(y[idx]) for y in labels]
            shapes = [[m, *d] for d in xdims] + [[m, w] for w in label_widths]
            yield [plan.dist_key(b), *xb, *yb, *shapes, b]

    cat.insert(inp.output, names, types, rows())
    return plan


def _encode_labels(inp: _Inputs, ys: list[np.ndarray], ydims: list[tuple[int, ...]],
                   class_counts: list[int | None]) -> tuple[list[np.ndarray], list[int]]:
    out, widths = [], []
    for d, y, dims, k in zip(inp.deps, ys, ydims, class_counts):
        if d.kind == "class":
            assert k is not None
            out.append(one_hot(y[:, 0].astype(np.int64), k))
            widths.append(k)
        else:
            out.append(y)
            widths.append(int(np.prod(dims)))
    return out, widths


def _summary(cat: Catalog, inp: _Inputs, *, class_values: list[list[Any] | None],
             num_classes: list[int | None], buffer_size: int, normalizing_const: float,
             distribution_rules: str, num_partitions: int, seed: int, num_rows: int,
             extra_note: str | None = None) -> None:
    cols: list[tuple[str, str]] = [
        ("source_table", "text"), ("output_table", "text"), ("dependent_varname", "text[]"),
        ("independent_varname", "text[]"), ("dependent_vartype", "text[]"),
    ]
    values: list[Any] = [str(inp.source), str(inp.output), [d.column.name for d in inp.deps],
                         [c.name for c in inp.indeps], [d.column.type_name for d in inp.deps]]
    types = ["text", "text", "text[]", "text[]", "text[]"]
    for d, cv in zip(inp.deps, class_values):
        name = d.column.name + "_class_values"
        if len(name.encode()) >= NAMEDATALEN:
            raise CerebroError(f"dependent variable name {d.column.name!r} is too long",
                               INVALID_NAME)
        if d.kind == "class":
            t = d.column.type_name + "[]"
            ptype = {"bool": "bool[]", "int2": "int2[]", "int4": "int4[]", "int8": "int8[]",
                     "float4": "float4[]", "float8": "float8[]",
                     "numeric": "numeric[]"}.get(d.column.base_type, "text[]")
        else:
            t, ptype = ("integer[]", "int4[]") if d.kind == "one_hot" else ("double precision[]",
                                                                          "float8[]")
        cols.append((name, t))
        values.append(cv)
        types.append(ptype)
    cols += [("buffer_size", "integer"), ("normalizing_const", "real"),
             ("num_classes", "integer[]"), ("distribution_rules", "text"),
             ("__internal_gpu_config__", "text"), ("num_partitions", "integer"),
             ("random_state", "bigint"), ("num_rows", "bigint"), ("dependent_kind", "text[]"),
             ("cerebro_db_version", "text")]
    values += [buffer_size, normalizing_const, num_classes, distribution_rules, "all_segments",
               num_partitions, seed, num_rows, [d.kind for d in inp.deps], __version__]
    types += ["int4", "float4", "int4[]", "text", "text", "int4", "int8", "int8", "text[]", "text"]
    cat.create_table(inp.summary, cols)
    cat.insert(inp.summary, [c for c, _ in cols], types, [values])
    if extra_note:
        cat.comment_on_table(inp.summary, extra_note)


def resolve_seed(random_state: int | None) -> int:
    """The seed a call uses: ``random_state``, or a fresh random one (recorded by callers)."""
    if random_state is None:
        return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    if random_state < 0:
        raise invalid(f"random_state must not be negative, got {random_state}")
    return int(random_state)


def _check_packing(buffer_size: int | None, num_partitions: int | None) -> None:
    if buffer_size is not None and buffer_size < 1:
        raise invalid(f"buffer_size must be at least 1, got {buffer_size}",
                      hint="Leave it NULL for MADlib's default rule.")
    if num_partitions is not None:
        _check_partitions(num_partitions)


@entrypoint
def training_preprocessor_dl(cat: Catalog, *, source_table: str, output_table: str,
                             dependent_varname: str, independent_varname: str,
                             buffer_size: int | None = None, normalizing_const: float | None = 1.0,
                             num_classes: Sequence[int | None] | None = None,
                             distribution_rules: str | None = None,
                             num_partitions: int | None = None,
                             random_state: int | None = None,
                             regression_targets: str | None = None) -> None:
    """Pack a table of examples into shuffled training buffers over ``num_partitions``;
    the dependent variables listed in ``regression_targets`` are kept as float targets,
    the others one-hot encoded (MADlib's behaviour)."""
    t0 = time.monotonic()
    cat.warn_unknown_settings()
    _check_packing(buffer_size, num_partitions)
    if normalizing_const is None:
        normalizing_const = 1.0
    if not math.isfinite(normalizing_const) or normalizing_const <= 0:
        raise invalid(f"normalizing_const must be a positive number, got {normalizing_const}")
    rules = _check_distribution_rules(cat, distribution_rules)
    seed = resolve_seed(random_state)
    for k in num_classes or ():
        if k is not None and not 1 <= k <= MAX_CLASSES:
            raise invalid(f"num_classes must be between 1 and {MAX_CLASSES}, got {k}",
                          hint="Leave it NULL to use the number of distinct labels.")
    regression = set(split_column_list(regression_targets, "regression_targets")) \
        if regression_targets is not None and regression_targets.strip() else set()
    inp = _resolve(cat, source_table, output_table, dependent_varname, independent_varname,
                   regression)
    if num_classes is not None and len(num_classes) != len(inp.deps):
        raise invalid(f"num_classes has {len(num_classes)} entries but there are "
                      f"{len(inp.deps)} dependent variables")
    p = _check_partitions(num_partitions or default_partitions(cat))
    class_values: list[list[Any] | None] = []
    counts: list[int | None] = []
    maps: list[dict | None] = []
    for i, d in enumerate(inp.deps):
        want = num_classes[i] if num_classes is not None else None
        if d.kind != "class":
            if want is not None:
                raise invalid(f'num_classes cannot be set for dependent variable '
                              f'"{d.column.name}" of type {d.column.type_name}')
            class_values.append(None)
            counts.append(None)
            maps.append(None)
            continue
        cv = _class_values(cat, inp, d)
        if want is not None and want < len(cv):
            raise invalid(
                f'num_classes {want} is less than the {len(cv)} distinct values of '
                f'"{d.column.name}"', hint="Leave num_classes NULL to use the distinct count.")
        k = want or len(cv)
        maps.append({v: j for j, v in enumerate(cv)})
        class_values.append(cv + [None] * (k - len(cv)))
        counts.append(k)
    xs, xdims, ys, ydims = _read(cat, inp, maps)
    labels, widths = _encode_labels(inp, ys, ydims, counts)
    num_cls = [w if d.kind != "regression" else None for d, w in zip(inp.deps, widths)]
    plan = _write(cat, inp, xs, xdims, labels, widths, p, buffer_size, seed, normalizing_const)
    _summary(cat, inp, class_values=class_values, num_classes=num_cls,
             buffer_size=plan.buffer_size, normalizing_const=normalizing_const,
             distribution_rules=rules, num_partitions=p, seed=seed, num_rows=len(xs[0]))
    cat.notice(f"training_preprocessor_dl: packed {len(xs[0])} rows of {inp.source} into "
               f"{plan.num_buffers} buffers on {p} partitions in {time.monotonic() - t0:.1f} s")


def read_training_summary(cat: Catalog, training_table: str) -> tuple[TableName, dict[str, Any]]:
    """The summary row of a training table made by ``training_preprocessor_dl``."""
    tt = cat.table(training_table, "training_preprocessor_table")
    summ = tt.with_suffix("_summary", "training_preprocessor_table")
    cat.require_table(tt, "training_preprocessor_table")
    if cat.relation_oid(summ) is None:
        raise CerebroError(
            f'training_preprocessor_table "{tt}" has no summary table "{summ}"', UNDEFINED_TABLE,
            hint="Pass a table made by training_preprocessor_dl.")
    cat.require_table(summ, "training_preprocessor_table's summary")
    rows = stmts.summary_rows(cat, summ)
    need = {"dependent_varname", "independent_varname", "normalizing_const", "num_classes",
            "num_partitions", "dependent_kind", "dependent_vartype"}
    if len(rows) == 1 and need <= set(rows[0]):
        row = dict(rows[0])
        row["x_columns"], row["y_columns"] = row["independent_varname"], row["dependent_varname"]
        return tt, row
    if len(rows) == 1 and MADLIB_SUMMARY <= set(rows[0]):
        return tt, _madlib_summary(cat, tt, summ, dict(rows[0]))
    raise invalid(f'"{summ}" is not a summary made by training_preprocessor_dl',
                  hint="Pass a table made by training_preprocessor_dl (ours or MADlib's).")


MADLIB_SUMMARY = {"dependent_varname", "independent_varname", "dependent_vartype",
                  "normalizing_const", "num_classes", "buffer_size"}
"""The summary columns every MADlib ``training_preprocessor_dl`` (1.x and 2.x) writes."""


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _madlib_summary(cat: Catalog, tt: TableName, summ: TableName, s: dict[str, Any]
                    ) -> dict[str, Any]:
    """A summary written by MADlib's own preprocessor, in the form of ours.

    MADlib 2.x (PostgreSQL) writes ``<x> BYTEA`` (float32) and ``<y> BYTEA`` (int16 one-hot)
    named after the source columns, ``<x>_shape``/``<y>_shape`` and ``buffer_id``, and a
    summary with TEXT[] ``dependent_varname``/``independent_varname``/``dependent_vartype``,
    ``<y>_class_values``, ``buffer_size``, ``normalizing_const``, INTEGER[] ``num_classes``,
    ``distribution_rules`` and ``__internal_gpu_config__``; MADlib 1.x (one input and output)
    names the buffers ``independent_var``/``dependent_var`` and writes TEXT names,
    ``class_values`` and an INTEGER ``num_classes``. Neither has partitions on PostgreSQL
    (Greenplum's ``__dist_key__`` are segment ids), so buffer ``b`` is given to partition
    ``b % p`` with ``p`` the smaller of the buffer count and the default partition count
    (``num_partitions``). Every label is a class (one-hot), as MADlib has no regression.
    """
    deps, indeps = _as_list(s["dependent_varname"]), _as_list(s["independent_varname"])
    vartypes = _as_list(s["dependent_vartype"])
    cols = cat.columns(cat.require_table(tt, "training_preprocessor_table"))
    if all(n in cols for n in deps + indeps):
        ycols, xcols = deps, indeps
    elif len(deps) == len(indeps) == 1 and {"dependent_var", "independent_var"} <= set(cols):
        ycols, xcols = ["dependent_var"], ["independent_var"]
    else:
        raise invalid(f'"{tt}" does not have the buffer columns its summary "{summ}" names',
                      hint="Pass the output table of training_preprocessor_dl.")
    for c in xcols + ycols:
        if cols[c].type_name != "bytea" or c + "_shape" not in cols:
            raise CerebroError(
                f'"{tt}" holds column "{c}" as {cols[c].type_name}: packed by a MADlib version '
                "before 1.17 (arrays, not BYTEA buffers), which cerebro_db does not read",
                FEATURE_NOT_SUPPORTED,
                hint="Pack the source table again with training_preprocessor_dl.")
    if "buffer_id" not in cols:
        raise invalid(f'"{tt}" has no buffer_id column', hint="Pack the source table again.")
    out: dict[str, Any] = {k: v for k, v in s.items() if not k.endswith("class_values")}
    out.update(dependent_varname=deps, independent_varname=indeps, dependent_vartype=vartypes,
               x_columns=xcols, y_columns=ycols, madlib=True)
    kinds = []
    for i, d in enumerate(deps):
        cv = s.get(d + "_class_values", s.get("class_values") if i == 0 else None)
        cv = None if cv is None or (isinstance(cv, str)) else list(cv)
        out[d + "_class_values"] = cv
        kinds.append("class" if cv is not None else "one_hot")
    nc = s["num_classes"]
    out["num_classes"] = None if nc is None else _as_list(nc)
    out["dependent_kind"] = kinds
    buffers = stmts.buffer_count(cat, tt)
    out["num_buffers"] = buffers
    out["num_partitions"] = max(1, min(int(buffers), default_partitions(cat)))
    return out


def summary_source_sql(cat: Catalog, table: TableName, summary: dict[str, Any]) -> str:
    """The packed table's summary as a relation with our summary's columns (see
    :func:`cerebro_db.catalog.packing.summary_relation`)."""
    return stmts.summary_relation(cat, table, summary)


@entrypoint
def validation_preprocessor_dl(cat: Catalog, *, source_table: str, output_table: str,
                               dependent_varname: str, independent_varname: str,
                               training_preprocessor_table: str, buffer_size: int | None = None,
                               distribution_rules: str | None = None,
                               num_partitions: int | None = None) -> None:
    """Pack validation rows with the training table's classes and normalizing constant."""
    t0 = time.monotonic()
    cat.warn_unknown_settings()
    _check_packing(buffer_size, num_partitions)
    rules = _check_distribution_rules(cat, distribution_rules)
    if training_preprocessor_table is None:
        raise CerebroError("training_preprocessor_table must not be NULL", NULL_VALUE_NOT_ALLOWED)
    tt, ts = read_training_summary(cat, training_preprocessor_table)
    dep_names = split_column_list(dependent_varname, "dependent_varname")
    regression = {n for n, k in zip(dep_names, ts["dependent_kind"]) if k == "regression"}
    inp = _resolve(cat, source_table, output_table, dependent_varname, independent_varname,
                   regression)
    tdeps, tindeps = ts["dependent_varname"], ts["independent_varname"]
    if len(inp.deps) != len(tdeps) or len(inp.indeps) != len(tindeps):
        raise invalid(
            f"the validation data has {len(inp.deps)} dependent and {len(inp.indeps)} "
            f"independent variables, the training data {len(tdeps)} and {len(tindeps)}")
    p = _check_partitions(num_partitions or int(ts["num_partitions"]))
    class_values: list[list[Any] | None] = []
    counts: list[int | None] = []
    maps: list[dict | None] = []
    for i, (d, tname) in enumerate(zip(inp.deps, tdeps)):
        tkind = ts["dependent_kind"][i]
        if d.kind != tkind:
            raise CerebroError(
                f'dependent variable "{d.column.name}" is {d.kind.replace("_", "-")} here but '
                f"{tkind.replace('_', '-')} in the training data", DATATYPE_MISMATCH)
        if d.kind == "class":
            cv = list(ts[tname + "_class_values"])
            tbase = _base_of(ts["dependent_vartype"][i])
            if _family(d.column.base_type) != _family(tbase):
                raise CerebroError(
                    f'dependent variable "{d.column.name}" has type {d.column.type_name}, the '
                    f"training labels {ts['dependent_vartype'][i]}", DATATYPE_MISMATCH)
            cmap: dict[Any, int] = {}
            for j, v in enumerate(cv):
                cmap.setdefault(v, j)  # the first NULL is the NULL class, later ones padding
            maps.append(cmap)
            class_values.append(cv)
            counts.append(len(cv))
        else:
            class_values.append(None)
            counts.append(None)
            maps.append(None)
    xs, xdims, ys, ydims = _read(cat, inp, maps)
    _check_shapes_match(cat, tt, ts["x_columns"], tdeps, xdims, inp)
    labels, widths = _encode_labels(inp, ys, ydims, counts)
    for d, w, tw in zip(inp.deps, widths, ts["num_classes"] or [None] * len(widths)):
        if d.kind == "one_hot" and tw is not None and w != tw:
            raise CerebroError(f'dependent variable "{d.column.name}" has {w} classes, the '
                               f"training data {tw}", DATA_EXCEPTION)
    num_cls = [w if d.kind != "regression" else None for d, w in zip(inp.deps, widths)]
    const = float(ts["normalizing_const"])
    plan = _write(cat, inp, xs, xdims, labels, widths, p, buffer_size, 0, const)
    _summary(cat, inp, class_values=class_values, num_classes=num_cls,
             buffer_size=plan.buffer_size, normalizing_const=const, distribution_rules=rules,
             num_partitions=p, seed=0, num_rows=len(xs[0]),
             extra_note=f"validation data for {tt}")
    cat.notice(f"validation_preprocessor_dl: packed {len(xs[0])} rows of {inp.source} into "
               f"{plan.num_buffers} buffers on {p} partitions in {time.monotonic() - t0:.1f} s")


_TYPE_BASE = {"text": "text", "character varying": "varchar", "character": "bpchar",
              "integer": "int4", "smallint": "int2", "bigint": "int8", "boolean": "bool",
              "name": "name", '"char"': "char", "real": "float4", "double precision": "float8",
              "numeric": "numeric"}


def _family(base: str) -> str:
    if base in INT_TYPES | FLOAT_TYPES:
        return "number"
    return "bool" if base == "bool" else "text"


def _base_of(type_name: str) -> str:
    return _TYPE_BASE.get(type_name.split("(")[0].strip(), type_name)


def _check_shapes_match(cat: Catalog, tt: TableName, tindeps: list[str], tdeps: list[str],
                        xdims: list[tuple[int, ...]], inp: _Inputs) -> None:
    names = [n + "_shape" for n in tindeps]
    row = cat.select(tt, names)
    if not row:
        return
    for i, (n, dims) in enumerate(zip(tindeps, xdims)):
        tshape = tuple(row[0][n + "_shape"][1:])
        if tshape != tuple(dims):
            raise CerebroError(
                f'independent variable "{inp.indeps[i].name}" has shape {list(dims)} per row, '
                f"the training data {list(tshape)}", DATA_EXCEPTION)
