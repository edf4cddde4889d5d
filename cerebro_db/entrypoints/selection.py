"""``load_model_selection_table`` and ``generate_model_configs``."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import configs, params
from ..catalog import Catalog
from ..catalog import models as stmts
from ..errors import (
    NULL_VALUE_NOT_ALLOWED,
    UNDEFINED_OBJECT,
    CerebroError,
    invalid,
)
from ..names import TableName
from . import entrypoint
from .models import require_arch_table

MST_COLUMNS = [
    ("mst_key", "SERIAL PRIMARY KEY"),
    ("model_id", "integer"),
    ("compile_params", "varchar"),
    ("fit_params", "varchar"),
]


def checked_compiles(cat: Catalog, strings: Sequence[str], object_table: str | None,
                     what: str = "compile_params") -> tuple[TableName | None, dict[str, str]]:
    """Check compile_params strings (names against Keras and the object table's custom
    functions); returns the object table and the references the strings use."""
    from .compat import custom_references

    cps = [params.parse_compile_params(s, what) for s in dict.fromkeys(strings)]
    table, refs = custom_references(cat, object_table, cps)
    for cp in cps:
        params.validate_compile_params(cp, what, custom_functions=refs)
    return table, refs


def _check_model_ids(cat: Catalog, arch: TableName, ids: Sequence[int] | None) -> list[int]:
    if ids is None:
        raise CerebroError("model_id_list must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if len(ids) == 0:
        raise invalid("model_id_list must not be empty")
    if any(i is None for i in ids):
        raise CerebroError("model_id_list must not contain NULL", NULL_VALUE_NOT_ALLOWED)
    have = stmts.model_ids(cat, arch)
    missing = [i for i in ids if i not in set(have)]
    if missing:
        shown = ", ".join(map(str, have[:20])) + (" ..." if len(have) > 20 else "")
        raise CerebroError(
            f'model_id {missing[0]} does not exist in "{arch}"', UNDEFINED_OBJECT,
            hint=f"Existing model ids: {shown}." if have else
            "Load architectures with load_keras_model first.")
    return list(dict.fromkeys(ids))


MAX_FIT_EPOCHS = 10_000
"""The most epochs one fit_params string may ask for (each unit runs them all)."""
MAX_BATCH_SIZE = 2**31 - 1


def check_fit_bounds(fp: params.FitParams, what: str = "fit_params") -> params.FitParams:
    """Reject fit_params whose epochs or batch_size are beyond any sensible run, before
    any work (a unit would otherwise train for ever or overflow)."""
    if fp.epochs > MAX_FIT_EPOCHS:
        raise invalid(f"{what}: epochs must be at most {MAX_FIT_EPOCHS}, got {fp.epochs}",
                      hint="Use num_iterations for longer training.")
    if fp.batch_size > MAX_BATCH_SIZE:
        raise invalid(f"{what}: batch_size must be at most {MAX_BATCH_SIZE}, got "
                      f"{fp.batch_size}")
    return fp


def _validate_fits(strings: Sequence[str]) -> None:
    for s in dict.fromkeys(strings):
        check_fit_bounds(params.parse_fit_params(s), "fit_params")


def _key(model_id: int, compile_params: str, fit_params: str) -> tuple[int, str, str]:
    return (int(model_id), params.parse_compile_params(compile_params).canonical(),
            params.parse_fit_params(fit_params).canonical())


def _create_mst(cat: Catalog, mst: TableName, summary: TableName, arch: TableName,
                obj: TableName | None, exists_ok: bool = False) -> bool:
    """Make the selection table and its summary; False (nothing made) when, with
    ``exists_ok``, another session made the table just now."""
    if not cat.create_table(mst, MST_COLUMNS, exists_ok=exists_ok):
        return False
    stmts.add_config_key(cat, mst)
    _create_summary(cat, summary, arch, obj)
    return True


def _create_summary(cat: Catalog, summary: TableName, arch: TableName,
                    obj: TableName | None) -> None:
    cat.create_table(summary, [("model_arch_table", "varchar"), ("object_table", "varchar")])
    cat.insert(summary, ["model_arch_table", "object_table"], ["text", "text"],
               [[str(arch), str(obj) if obj else None]])


def _insert(cat: Catalog, mst: TableName, rows: list[tuple[int, str, str]]) -> None:
    cat.insert(mst, ["model_id", "compile_params", "fit_params"], ["int4", "text", "text"], rows)


@entrypoint
def load_model_selection_table(cat: Catalog, *, model_arch_table: str, model_selection_table: str,
                               model_id_list: Sequence[int] | None,
                               compile_params_list: Sequence[str] | None,
                               fit_params_list: Sequence[str] | None,
                               object_table: str | None = None) -> None:
    """model ids x compile strings x fit strings, deduplicated by content, into a new table."""
    arch = cat.table(model_arch_table, "model_arch_table")
    mst = cat.output_table(model_selection_table, "model_selection_table")
    summary = mst.with_suffix("_summary", "model_selection_table")
    require_arch_table(cat, arch, "model_arch_table")
    cat.require_absent(mst, "model_selection_table",
                       hint="Drop it first, or use generate_model_configs to append to it.")
    cat.require_absent(summary, "model selection summary table")
    ids = _check_model_ids(cat, arch, model_id_list)
    rows = configs.product_configs(ids, compile_params_list, fit_params_list)  # type: ignore[arg-type]
    obj, _ = checked_compiles(cat, [c for _, c, _ in rows], object_table)
    _validate_fits([f for _, _, f in rows])
    _create_mst(cat, mst, summary, arch, obj)
    _insert(cat, mst, rows)
    cat.notice(f"load_model_selection_table: {len(rows)} configurations in {mst}")


def _existing(cat: Catalog, mst: TableName, summary: TableName, arch: TableName
              ) -> list[tuple[int, str, str]] | None:
    """Rows of an existing model selection table made for the same architecture table;
    None when its summary table is missing (it is then re-created for ``arch``, as MADlib
    does)."""
    oid = cat.require_table(mst, "model_selection_table")
    cols = cat.columns(oid)
    if not {"mst_key", "model_id", "compile_params", "fit_params"} <= set(cols):
        raise invalid(f'model_selection_table "{mst}" is not a model selection table')
    if cat.relation_oid(summary) is None:
        return None
    cat.require_table(summary, "model_selection_table's summary")
    srow = cat.select(summary, ["model_arch_table"])
    their = srow[0]["model_arch_table"] if srow else None
    same = their is not None and cat.relation_oid(
        cat.table(their, "model_arch_table")) == cat.relation_oid(arch)
    if not same:
        raise invalid(
            f'model_selection_table "{mst}" was made for model_arch_table "{their}", not "{arch}"',
            hint="Use another model_selection_table, or the same model_arch_table.")
    rows = cat.select(mst, ["model_id", "compile_params", "fit_params"], order_by=["mst_key"])
    return [(r["model_id"], r["compile_params"], r["fit_params"]) for r in rows]


@entrypoint
def generate_model_configs(cat: Catalog, *, model_arch_table: str, model_selection_table: str,
                           model_id_list: Sequence[int] | None, compile_params_grid: str | None,
                           fit_params_grid: str | None, search_type: str | None = "grid",
                           num_configs: int | None = None, random_state: int | None = None,
                           object_table: str | None = None) -> None:
    """Grid or random search configurations, appended to the model selection table."""
    arch = cat.table(model_arch_table, "model_arch_table")
    mst = cat.table(model_selection_table, "model_selection_table")
    summary = mst.with_suffix("_summary", "model_selection_table")
    for name, v in (("compile_params_grid", compile_params_grid),
                    ("fit_params_grid", fit_params_grid), ("search_type", search_type)):
        if v is None:
            raise CerebroError(f"{name} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    require_arch_table(cat, arch, "model_arch_table")
    ids = _check_model_ids(cat, arch, model_id_list)
    assert compile_params_grid is not None and fit_params_grid is not None \
        and search_type is not None  # checked above
    pairs = configs.generate_model_configs(compile_params_grid, fit_params_grid,
                                           search_type, num_configs, random_state)
    if search_type.strip().lower().startswith("r"):
        rng = np.random.default_rng(random_state)
        rows = [(int(ids[int(rng.integers(len(ids)))]), c, f) for c, f in pairs]
    else:
        rows = [(m, c, f) for m in ids for c, f in pairs]
    obj, _ = checked_compiles(cat, [c for _, c, _ in rows], object_table)
    _validate_fits([f for _, _, f in rows])
    existing: list[tuple[int, str, str]] = []
    if cat.relation_oid(mst) is None and _create_mst(cat, mst, summary, arch, obj,
                                                     exists_ok=True):
        pass
    else:  # there, or made by another session just now: append
        cat.require_own_table(mst, "model_selection_table")
        cat.require_own_table(summary, "model_selection_table's summary")
        found = _existing(cat, mst, summary, arch)
        if found is not None:
            existing = found
        else:
            existing = [(r["model_id"], r["compile_params"], r["fit_params"]) for r in
                        cat.select(mst, ["model_id", "compile_params", "fit_params"],
                                   order_by=["mst_key"])]
            _create_summary(cat, summary, arch, obj)
            cat.notice(f'generate_model_configs: "{summary}" was missing and was re-created '
                       f'for model_arch_table "{arch}"')
    seen = {_key(*r) for r in existing}
    new: list[tuple[int, str, str]] = []
    for r in rows:
        k = _key(*r)
        if k not in seen:
            seen.add(k)
            new.append(r)
    _insert(cat, mst, new)
    skipped = len(rows) - len(new)
    cat.notice(f"generate_model_configs: {len(new)} new configurations in {mst}"
               + (f" ({skipped} already present)" if skipped else ""))


