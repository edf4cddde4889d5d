"""``madlib_keras_predict``, ``madlib_keras_predict_byom`` and ``madlib_keras_evaluate``.

Prediction reads the test rows in batches (``array_send`` decoded with numpy), runs the model
on a whole batch at once and writes each batch's output rows with one INSERT over unnested
arrays: never one row at a time (MADlib predicts row by row).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import keras_arch
from ..catalog import Catalog
from ..catalog import inference as stmts
from ..catalog import models as model_stmts
from ..errors import (
    DATATYPE_MISMATCH,
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_OBJECT,
    CerebroError,
    invalid,
)
from ..names import TableName, split_column_list
from ..preprocess import check_finite, decode_arrays
from . import entrypoint, require_output_schema
from .fit_inputs import check_use_gpus
from .models import require_arch_table
from .preprocessing import FEATURE_TYPES

BATCH_ROWS = 5000


@dataclass(frozen=True)
class PredType:
    kind: str  # 'response', 'prob', 'threshold', 'topk'
    value: float = 0.0


def parse_pred_type(text: str | None) -> PredType:
    """'response', 'prob', a probability threshold in (0, 1) or a top-k integer >= 1."""
    if text is None:
        return PredType("prob")
    t = str(text).strip().lower()
    if t in ("response", "prob"):
        return PredType(t)
    try:
        v = float(t)
    except ValueError:
        raise invalid(f"pred_type must be 'response', 'prob', a number in (0, 1) or an integer "
                      f"k >= 1, got {text!r}") from None
    if not math.isfinite(v):
        raise invalid(f"pred_type must be 'response', 'prob', a number in (0, 1) or an integer "
                      f"k >= 1, got {text!r}")
    if 0 < v < 1:
        return PredType("threshold", v)
    if v >= 1 and v == int(v):
        return PredType("topk", int(v))
    raise invalid(f"pred_type must be 'response', 'prob', a number in (0, 1) or an integer "
                  f"k >= 1, got {text!r}")


def _model_row(cat: Catalog, model_table: str, mst_key: int | None
               ) -> tuple[TableName, dict[str, Any], dict[str, Any]]:
    """(table, row with model_weights/model_arch, summary row) of a trained model table."""
    t = cat.table(model_table, "model_table")
    oid = cat.require_table(t, "model_table")
    cols = cat.columns(oid)
    if not {"model_weights", "model_arch"} <= set(cols):
        raise invalid(f'model_table "{t}" has no model_weights and model_arch columns',
                      hint="Pass the output table of madlib_keras_fit or "
                      "madlib_keras_fit_multiple_model.")
    summ = t.with_suffix("_summary", "model_table")
    cat.require_table(summ, "model summary table")
    srow = stmts.one_row(cat, summ)
    if len(srow) != 1:
        raise invalid(f'"{summ}" must hold exactly one row')
    if "mst_key" in cols:
        if mst_key is None:
            keys = stmts.mst_keys(cat, t)
            if len(keys) != 1:
                raise CerebroError("mst_key must be given for a table of several models",
                                   NULL_VALUE_NOT_ALLOWED,
                                   hint=f"mst_key values in {t}: {keys[:20]}")
            mst_key = keys[0]
        rows = stmts.model_of(cat, t, mst_key)
        if not rows:
            raise CerebroError(f'mst_key {mst_key} does not exist in "{t}"', UNDEFINED_OBJECT)
    else:
        if mst_key is not None:  # MADlib refuses it too
            raise invalid(f'mst_key is given ({mst_key}), but model_table "{t}" holds one '
                          "model (it has no mst_key column)",
                          hint="Pass mst_key => NULL for the output of madlib_keras_fit.")
        rows = stmts.model_of(cat, t, None)
        if len(rows) != 1:
            raise invalid(f'model_table "{t}" must hold exactly one model')
    row = dict(rows[0])
    for col in ("model_weights", "model_arch"):
        if row.get(col) is None:  # a Python TypeError before (an outside pass)
            which = f"mst_key {mst_key}" if mst_key is not None else "its model"
            raise CerebroError(f'model_table "{t}": {col} of {which} is NULL',
                               NULL_VALUE_NOT_ALLOWED,
                               hint="Pass the output table of a fit that finished.")
    row["mst_key"] = mst_key
    return t, row, dict(srow[0])


def _test_source(cat: Catalog, test_table: str, id_col: str, independent_varname: str
                 ) -> tuple[TableName, str, str, Any]:
    """The test table, id column and type, and the feature column (a list of them for a
    model with several inputs, in the model's input order)."""
    t = cat.table(test_table, "test_table")
    oid = cat.require_table(t, "test_table")
    cols = cat.columns(oid)
    (idc,) = split_column_list(id_col, "id_col")[:1]
    xs = split_column_list(independent_varname, "independent_varname")
    idcol = cat.require_column(t, cols, idc, "id_col")
    names = []
    for x in xs:
        xcol = cat.require_column(t, cols, x, "independent_varname")
        if not (xcol.is_array and xcol.base_type in FEATURE_TYPES):
            raise CerebroError(f'independent_varname: column "{xcol.name}" has type '
                               f"{xcol.type_name}, expected a numeric array", DATATYPE_MISMATCH)
        names.append(xcol.name)
    return t, idcol.name, idcol.type_name, names[0] if len(names) == 1 else names


def _rows_for(pt: PredType, ids: list[Any], probs: np.ndarray, class_name: str,
              class_values: Sequence[Any]) -> tuple[list[Any], ...]:
    """Long-format output rows (ids, class_name, class_value, prob, rank) for one batch."""
    n, k = probs.shape
    order = np.argsort(-probs, axis=1, kind="stable")
    if pt.kind == "response":
        take = np.zeros((n, k), dtype=bool)
        take[np.arange(n), order[:, 0]] = True
    elif pt.kind == "prob":
        take = np.ones((n, k), dtype=bool)
    elif pt.kind == "topk":
        take = np.zeros((n, k), dtype=bool)
        kk = min(int(pt.value), k)
        np.put_along_axis(take, order[:, :kk], True, axis=1)
    else:
        take = probs >= pt.value
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(1, k + 1)[None, :].repeat(n, 0), axis=1)
    r, c = np.nonzero(take)
    cv = [None if class_values[j] is None else str(class_values[j]) for j in range(k)]
    return ([str(ids[i]) for i in r], [class_name] * len(r), [cv[j] for j in c],
            probs[r, c].astype(float).tolist(), rank[r, c].astype(int).tolist())


def _predict_into(cat: Catalog, *, arch: str, weights: bytes, test: TableName, id_name: str,
                  id_type: str, x_name: str, output: TableName, pt: PredType,
                  class_name: str, class_values: Sequence[Any] | None,
                  normalizing_const: float, regression: bool) -> int:
    from ..training import ModelCache, predict

    cache = ModelCache(max_models=1)
    with_rank = pt.kind != "response" and not regression
    long_out = stmts.create_long_output(cat, output, id_name, id_type, with_rank)
    scale = np.float32(normalizing_const or 1.0)
    total = 0
    for rows in stmts.stream_features(cat, test, id_name, [x_name], BATCH_ROWS):
        ids = [r["id"] for r in rows]
        if any(i is None for i in ids):
            raise CerebroError(f'id_col "{id_name}" is NULL in some rows', NULL_VALUE_NOT_ALLOWED)
        x, dims = decode_arrays([r["x0"] for r in rows], "float4", f'"{x_name}"')
        check_finite(x, f'independent variable "{x_name}"', total)
        x = x.reshape((len(rows),) + tuple(dims))  # the rows' own shape, checked by predict
        out = predict(cache, arch, weights, x / scale if scale != 1 else x)
        out = out.reshape(len(ids), -1)
        if regression:
            cols_out: tuple[list[Any], ...] = (
                [str(i) for i in ids for _ in range(out.shape[1])], [class_name] * out.size,
                [None] * out.size, out.astype(float).ravel().tolist())
        else:
            cv = list(class_values) if class_values is not None else list(range(out.shape[1]))
            if len(cv) != out.shape[1]:
                raise CerebroError(f"the model has {out.shape[1]} outputs but there are "
                                   f"{len(cv)} class values", DATATYPE_MISMATCH)
            cols_out = _rows_for(pt, ids, out, class_name, cv)
            if not with_rank:
                cols_out = cols_out[:4]
        long_out.insert(cat, cols_out)
        total += len(ids)
    return total


@entrypoint
def madlib_keras_predict(cat: Catalog, *, model_table: str, test_table: str, id_col: str,
                         independent_varname: str, output_table: str,
                         pred_type: str | None = "prob", use_gpus: bool | None = False,
                         mst_key: int | None = None) -> None:
    """Predict every row of ``test_table`` with a trained model, in batches."""
    t0 = time.monotonic()
    pt = parse_pred_type(pred_type)
    check_use_gpus(use_gpus)
    out = cat.output_table(output_table, "output_table")
    _, row, summ = _model_row(cat, model_table, mst_key)
    test, idn, idt, xn = _test_source(cat, test_table, id_col, independent_varname)
    cat.require_absent(out, "output_table")
    require_output_schema(cat, out, "output_table")
    deps = list(summ["dependent_varname"])
    if len(deps) > 1 or isinstance(xn, list):
        n = _predict_multi_into(
            cat, arch=row["model_arch"], weights=bytes(row["model_weights"]), test=test,
            id_name=idn, id_type=idt, x_names=xn if isinstance(xn, list) else [xn],
            output=out, pt=pt, class_names=deps,
            class_values=[summ.get(d + "_class_values") for d in deps],
            normalizing_const=float(summ.get("normalizing_const") or 1.0),
            regression=[_is_regression(summ, i, d) for i, d in enumerate(deps)])
        cat.notice(f"madlib_keras_predict: {n} rows predicted into {out} in "
                   f"{time.monotonic() - t0:.1f} s")
        return
    dep = deps[0]
    regression = _is_regression(summ, 0, dep)
    n = _predict_into(cat, arch=row["model_arch"], weights=bytes(row["model_weights"]),
                      test=test, id_name=idn, id_type=idt, x_name=xn, output=out, pt=pt,
                      class_name=dep, class_values=summ.get(dep + "_class_values"),
                      normalizing_const=float(summ.get("normalizing_const") or 1.0),
                      regression=regression)
    cat.notice(f"madlib_keras_predict: {n} rows predicted into {out} in "
               f"{time.monotonic() - t0:.1f} s")


def _is_regression(summ: dict[str, Any], i: int, dep: str) -> bool:
    """Whether output ``i`` of a model is a regression target: no class count recorded. A
    one-hot array's labels record their count and no class values; its classes are
    0 .. count-1, as in MADlib (an outside pass found them predicted as a regression's
    values, every class a row, ``class_value`` NULL, whatever ``pred_type``)."""
    nc = summ.get("num_classes")
    if not isinstance(nc, (list, tuple)):
        nc = [nc]
    return i >= len(nc) or nc[i] is None


def _predict_multi_into(cat: Catalog, *, arch: str, weights: bytes, test: TableName,
                        id_name: str, id_type: str, x_names: list[str], output: TableName,
                        pt: PredType, class_names: list[str],
                        class_values: Sequence[Sequence[Any] | None], normalizing_const: float,
                        regression: list[bool]) -> int:
    """Prediction for a model with several inputs or outputs, in MADlib's long format: the
    rows of every output, ``class_name`` naming the output's dependent variable, ``rank``
    within (id, output)."""
    from ..training import ModelCache, predict_multi

    model = keras_arch.build_from_json(arch, shared=True)
    ins, out_shapes = keras_arch.input_shapes(model), keras_arch.output_shapes(model)
    if len(ins) != len(x_names) or len(out_shapes) != len(class_names):
        raise CerebroError(
            f"the model has {len(ins)} inputs and {len(out_shapes)} outputs, but there are "
            f"{len(x_names)} independent variables and {len(class_names)} dependent ones "
            "(dependent_count)", DATATYPE_MISMATCH,
            hint="List one independent_varname column per model input, in order.")
    cache = ModelCache(max_models=1)
    with_rank = pt.kind != "response" and not all(regression)
    long_out = stmts.create_long_output(cat, output, id_name, id_type, with_rank)
    scale = np.float32(normalizing_const or 1.0)
    total = 0
    for rows in stmts.stream_features(cat, test, id_name, x_names, BATCH_ROWS):
        ids = [r["id"] for r in rows]
        if any(i is None for i in ids):
            raise CerebroError(f'id_col "{id_name}" is NULL in some rows', NULL_VALUE_NOT_ALLOWED)
        xs = []
        for i, x_name in enumerate(x_names):
            x, dims = decode_arrays([r[f"x{i}"] for r in rows], "float4", f'"{x_name}"')
            check_finite(x, f'independent variable "{x_name}"', total)
            x = x.reshape((len(rows),) + tuple(dims))
            xs.append(x / scale if scale != 1 else x)
        outs = predict_multi(cache, arch, weights, xs)
        if len(outs) != len(class_names):
            raise CerebroError(f"the model has {len(outs)} outputs but there are "
                               f"{len(class_names)} dependent variables", DATATYPE_MISMATCH)
        acc: list[list[Any]] = [[] for _ in range(5 if with_rank else 4)]
        for out, name, cv, reg in zip(outs, class_names, class_values, regression):
            out = out.reshape(len(ids), -1)
            if reg:
                part: tuple[list[Any], ...] = (
                    [str(i) for i in ids for _ in range(out.shape[1])], [name] * out.size,
                    [None] * out.size, out.astype(float).ravel().tolist(), [None] * out.size)
            else:
                vals = list(cv) if cv is not None else list(range(out.shape[1]))
                if len(vals) != out.shape[1]:
                    raise CerebroError(f'output "{name}" has {out.shape[1]} values but there '
                                       f"are {len(vals)} class values", DATATYPE_MISMATCH)
                part = _rows_for(pt, ids, out, name, vals)
            for a, b in zip(acc, part):
                a.extend(b)
        long_out.insert(cat, acc)
        total += len(ids)
    return total


def _byom_class_values(class_values: Any, dependent_count: int | None
                       ) -> list[list[Any] | None]:
    """One list of class values (or None: 0..k-1) per output. MADlib 2.x passes a 2-D
    array, one row per output (rows padded with trailing NULLs, dropped here when there are
    several outputs); a 1-D array is the one output's."""
    k = 1 if dependent_count is None else dependent_count
    if k < 1:
        raise invalid(f"dependent_count must be at least 1, got {dependent_count}")
    if class_values is None:
        return [None] * k
    vals = list(class_values)
    rows = [list(v) for v in vals] if vals and isinstance(vals[0], (list, tuple)) else [vals]
    if len(rows) != k:
        raise invalid(f"class_values has {len(rows)} rows but dependent_count is {k}",
                      hint="Give one row of class values per output (a 2-D array).")
    if k > 1:
        for r in rows:
            while r and r[-1] is None:
                r.pop()
    return list(rows)


@entrypoint
def madlib_keras_predict_byom(cat: Catalog, *, model_arch_table: str, model_id: int,
                              test_table: str, id_col: str, independent_varname: str,
                              output_table: str, pred_type: str | None = "prob",
                              use_gpus: bool | None = None, class_values: Any = None,
                              normalizing_const: float | None = None,
                              dependent_count: int | None = 1) -> None:
    """Predict with an architecture and weights from an architecture table ("bring your own
    model"): no training summary, so class values and the normalizing constant are given."""
    t0 = time.monotonic()
    pt = parse_pred_type(pred_type)
    check_use_gpus(use_gpus)
    arch_t = cat.table(model_arch_table, "model_arch_table")
    out = cat.output_table(output_table, "output_table")
    if model_id is None:
        raise CerebroError("model_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if normalizing_const is not None and (not math.isfinite(normalizing_const)
                                          or normalizing_const <= 0):
        raise invalid(f"normalizing_const must be a positive number, got {normalizing_const}")
    cvs = _byom_class_values(class_values, dependent_count)
    require_arch_table(cat, arch_t, "model_arch_table")
    found = model_stmts.arch_and_weights(cat, arch_t, model_id)
    if found is None:
        raise CerebroError(f'model_id {model_id} does not exist in "{arch_t}"', UNDEFINED_OBJECT)
    if found["w"] is None:
        raise invalid(f"model_id {model_id} has no weights",
                      hint="Load weights with load_keras_model(..., model_weights => ...).")
    test, idn, idt, xn = _test_source(cat, test_table, id_col, independent_varname)
    cat.require_absent(out, "output_table")
    require_output_schema(cat, out, "output_table")
    model = keras_arch.build_from_json(found["a"], shared=True)
    keras_arch.check_weights(model, found["w"])
    if len(cvs) > 1 or isinstance(xn, list):
        names = ["dependent_var"] if len(cvs) == 1 else \
            [f"dependent_var_{i}" for i in range(len(cvs))]
        n = _predict_multi_into(
            cat, arch=found["a"], weights=bytes(found["w"]), test=test, id_name=idn,
            id_type=idt, x_names=xn if isinstance(xn, list) else [xn], output=out, pt=pt,
            class_names=names, class_values=cvs, normalizing_const=normalizing_const or 1.0,
            regression=[False] * len(cvs))
    else:
        n = _predict_into(cat, arch=found["a"], weights=bytes(found["w"]), test=test,
                          id_name=idn, id_type=idt, x_name=xn, output=out, pt=pt,
                          class_name="dependent_var", class_values=cvs[0],
                          normalizing_const=normalizing_const or 1.0, regression=False)
    cat.notice(f"madlib_keras_predict_byom: {n} rows predicted into {out} in "
               f"{time.monotonic() - t0:.1f} s")


@entrypoint
def madlib_keras_evaluate(cat: Catalog, *, model_table: str, test_table: str, output_table: str,
                          use_gpus: bool | None = False, mst_key: int | None = None) -> None:
    """Loss and metrics of a trained model over a packed (validation-format) table."""
    from ..training import ModelCache, evaluate
    from ..worker import labels_for, partition_data
    from .fit_inputs import packed_table

    check_use_gpus(use_gpus)
    out = cat.output_table(output_table, "output_table")
    t, row, summ = _model_row(cat, model_table, mst_key)
    test = packed_table(cat, test_table, "test_table")
    cat.require_absent(out, "output_table")
    require_output_schema(cat, out, "output_table")
    info_t = t.with_suffix("_info", "model_table")
    if row["mst_key"] is not None and cat.relation_oid(info_t) is not None:
        cat.require_table(info_t, "model_table's _info")
        cfg = stmts.compile_params_of(cat, info_t, row["mst_key"])
    elif "compile_params" in summ:
        cfg = {"compile_params": summ["compile_params"]}
    else:
        raise invalid(f'cannot find the compile parameters of "{t}"')
    from ..params import parse_compile_params
    from .compat import custom_references

    cp = parse_compile_params(cfg["compile_params"])
    _, refs = custom_references(cat, summ.get("object_table"), [cp])  # MADlib: from the summary
    cp = cp.with_custom(refs)
    cache = ModelCache(max_models=1)
    parts = []
    for p in range(test.partitions):
        if test.multi is not None:  # several inputs/outputs
            from ..worker import partition_multi

            multi = partition_multi(cat, test.qualified, test.multi["xs"], test.multi["ys"], p,
                                    cfg["compile_params"], test.partition_mod)
            if multi.total_rows:
                parts.append(evaluate(cache, row["model_arch"], cp,
                                      bytes(row["model_weights"]), multi, None,
                                      batch_size=1024))
            continue
        xy = partition_data(cat, test.qualified, test.x, test.y, p, use_caching=False,
                            partition_mod=test.partition_mod)
        assert xy is not None  # without a budget the partition is always read
        x, y = xy
        if len(x) == 0:  # a partition with no buffer
            continue
        y = labels_for(cfg["compile_params"], y)
        parts.append(evaluate(cache, row["model_arch"], cp, bytes(row["model_weights"]), x, y,
                              batch_size=1024))
    from ..training import combine_results

    res = combine_results(parts)
    metrics = list(res.metrics.values())
    cat.create_table(out, [("loss", "double precision"), ("metric", "double precision"),
                           ("metrics_type", "text[]"), ("loss_type", "text"),
                           ("metrics", "double precision[]")])
    # as the fit's summary and info write it: a list of losses as JSON (it was Python's repr)
    loss_type = cp.loss if isinstance(cp.loss, str) else json.dumps(cp.loss)
    cat.insert(out, ["loss", "metric", "metrics_type", "loss_type", "metrics"],
               ["float8", "float8", "text[]", "text", "float8[]"],
               [[res.loss, metrics[0] if metrics else None, cp.metric_names() or None,
                 loss_type, metrics or None]])

