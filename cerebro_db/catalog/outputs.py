"""Statements of MADlib's output tables of a fit (:mod:`cerebro_db.outputs`): the
``_summary`` tables made from the packed table's summary, and ``madlib_keras_fit``'s
summary columns. Run by the calling session (the outputs commit with its transaction)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..names import TableName, quote_ident
from . import Catalog


def _class_values(dependent_varnames: Sequence[str]) -> str:
    return ", ".join("s." + quote_ident(d + "_class_values") for d in dependent_varnames)


FIT_SUMMARY = [
    ("source_table", "text"), ("validation_table", "text"), ("model", "text"),
    ("model_info", "text"), ("model_arch_table", "text"), ("model_selection_table", "text"),
    ("object_table", "text"), ("num_iterations", "int4"),
    ("metrics_compute_frequency", "int4"), ("warm_start", "bool"), ("name", "text"),
    ("description", "text"), ("start_training_time", "float8"), ("madlib_version", "text"),
    ("metrics_iters", "int4[]"), ("fit_id", "int8"), ("scheduling_policy", "text"),
]
"""The values of a fit's ``_summary`` (:func:`create_fit_summary`), in this order."""

AUTOML_SUMMARY = [
    ("source_table", "text"), ("validation_table", "text"), ("model", "text"),
    ("model_info", "text"), ("model_arch_table", "text"), ("model_selection_table", "text"),
    ("automl_method", "text"), ("automl_params", "text"), ("random_state", "text"),
    ("object_table", "text"), ("use_gpus", "bool"), ("metrics_compute_frequency", "int4"),
    ("name", "text"), ("description", "text"), ("start_training_time", "float8"),
    ("madlib_version", "text"),
]
"""The values of an AutoML run's ``_summary`` (:func:`create_automl_summary`)."""


def create_fit_summary(cat: Catalog, summary: TableName, source_summary: str,
                       dependent_varnames: Sequence[str], values: dict[str, Any]) -> None:
    """A fit's ``_summary``: ``values`` (:data:`FIT_SUMMARY`) and the source summary's
    columns (``source_summary``: a relation, see ``preprocessing.summary_source_sql``)."""
    m = {n: f"${i + 1}::{t}" for i, (n, t) in enumerate(FIT_SUMMARY)}
    sel = (
        f"{m['source_table']} AS source_table, {m['validation_table']} AS validation_table, "
        f"{m['model']} AS model, {m['model_info']} AS model_info, s.dependent_varname, "
        f"s.independent_varname, {m['model_arch_table']} AS model_arch_table, "
        f"{m['model_selection_table']} AS model_selection_table, "
        f"{m['object_table']} AS object_table, {m['num_iterations']} AS num_iterations, "
        f"{m['metrics_compute_frequency']} AS metrics_compute_frequency, "
        f"{m['warm_start']} AS warm_start, {m['name']} AS name, "
        f"{m['description']} AS description, "
        f"to_timestamp({m['start_training_time']})::timestamp AS start_training_time, "
        "clock_timestamp()::timestamp AS end_training_time, "
        f"{m['madlib_version']} AS madlib_version, s.num_classes, "
        f"{_class_values(dependent_varnames)}, s.dependent_vartype, s.normalizing_const, "
        f"{m['metrics_iters']} AS metrics_iters, {m['fit_id']} AS fit_id, "
        f"{m['scheduling_policy']} AS scheduling_policy, s.num_partitions")
    cat.query(f"CREATE TABLE {summary.sql} AS SELECT {sel} FROM {source_summary} s",
              [values[n] for n, _ in FIT_SUMMARY], [t for _, t in FIT_SUMMARY])


def create_automl_summary(cat: Catalog, summary: TableName, source_summary: str,
                          dependent_varnames: Sequence[str], values: dict[str, Any]) -> None:
    """An AutoML run's ``_summary``: MADlib's AutoML summary columns exactly
    (``values``: :data:`AUTOML_SUMMARY`)."""
    m = {n: f"${i + 1}::{t}" for i, (n, t) in enumerate(AUTOML_SUMMARY)}
    sel = (
        f"{m['source_table']} AS source_table, {m['validation_table']} AS validation_table, "
        f"{m['model']} AS model, {m['model_info']} AS model_info, s.dependent_varname, "
        f"s.independent_varname, {m['model_arch_table']} AS model_arch_table, "
        f"{m['model_selection_table']} AS model_selection_table, "
        f"{m['automl_method']} AS automl_method, {m['automl_params']} AS automl_params, "
        f"{m['random_state']} AS random_state, {m['object_table']} AS object_table, "
        f"{m['use_gpus']} AS use_gpus, "
        f"{m['metrics_compute_frequency']} AS metrics_compute_frequency, "
        f"{m['name']} AS name, {m['description']} AS description, "
        f"to_timestamp({m['start_training_time']})::timestamp AS start_training_time, "
        "clock_timestamp()::timestamp AS end_training_time, "
        f"{m['madlib_version']} AS madlib_version, s.num_classes, "
        f"{_class_values(dependent_varnames)}, s.dependent_vartype, s.normalizing_const")
    cat.query(f"CREATE TABLE {summary.sql} AS SELECT {sel} FROM {source_summary} s",
              [values[n] for n, _ in AUTOML_SUMMARY], [t for _, t in AUTOML_SUMMARY])


def add_summary_columns(cat: Catalog, summary: TableName, columns: Sequence[tuple[str, str]],
                        types: Sequence[str], values: Sequence[Any]) -> None:
    """Columns (name, SQL type) added to a one-row summary table and set to ``values``
    (bound as ``types``): ``madlib_keras_fit``'s configuration and metrics."""
    for col, typ in columns:
        cat.query(f"ALTER TABLE {summary.sql} ADD COLUMN {quote_ident(col)} {typ}")
    sets = ", ".join(f"{quote_ident(col)} = ${i + 1}" for i, (col, _) in enumerate(columns))
    cat.query(f"UPDATE {summary.sql} SET {sets}", list(values), list(types))
