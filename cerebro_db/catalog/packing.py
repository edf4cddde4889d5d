"""Packing: reading a source table for ``training_preprocessor_dl`` and reading packed
tables' summaries (ours and MADlib's)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..names import TableName, quote_ident


def has_fractional(cat: Any, source: TableName, column: str) -> bool:
    """Whether a numeric array column holds a value that is not a whole number."""
    c = quote_ident(column)
    return bool(cat.query(f"SELECT 1 AS b FROM {source.sql} WHERE EXISTS (SELECT 1 FROM "
                          f"pg_catalog.unnest({c}) v WHERE v <> pg_catalog.trunc(v::numeric)) "
                          "LIMIT 1"))


def distinct_values(cat: Any, source: TableName, column: str, limit: int) -> list[Any]:
    """At most ``limit`` distinct values of a column, NULL first, in the type's order."""
    c = quote_ident(column)
    rows = cat.query(f"SELECT {c} AS v FROM (SELECT DISTINCT {c} FROM {source.sql}) d "
                     "ORDER BY 1 NULLS FIRST LIMIT $1", [int(limit)], ["int8"])
    return [r["v"] for r in rows]


def stream_source(cat: Any, source: TableName, features: Sequence[str],
                  labels: Sequence[tuple[str, str]], batch: int
                  ) -> Iterator[list[dict[str, Any]]]:
    """Batches of the source's rows: feature ``i`` as ``x<i>`` (binary ``real[]``), label
    ``i`` as ``y<i>`` by its kind: ``'class'`` the value itself, ``'one_hot'`` a binary
    ``smallint[]``, ``'array'`` a binary ``real[]``, ``'scalar'`` a binary one-element
    ``real[]``."""
    items = [f"pg_catalog.array_send({quote_ident(c)}::real[]) AS x{i}"
             for i, c in enumerate(features)]
    for i, (col, kind) in enumerate(labels):
        c = quote_ident(col)
        if kind == "class":
            items.append(f"{c} AS y{i}")
        elif kind == "one_hot":
            items.append(f"pg_catalog.array_send({c}::smallint[]) AS y{i}")
        elif kind == "array":
            items.append(f"pg_catalog.array_send({c}::real[]) AS y{i}")
        elif kind == "scalar":
            items.append(f"pg_catalog.array_send(ARRAY[{c}]::real[]) AS y{i}")
        else:
            raise ValueError(f"unknown label kind {kind!r}")
    return cat.stream(f"SELECT {', '.join(items)} FROM {source.sql}", batch=batch)


def summary_rows(cat: Any, summary: TableName) -> list[dict[str, Any]]:
    """Every row of a summary table (callers check there is one)."""
    return cat.query(f"SELECT * FROM {summary.sql}")


def buffer_count(cat: Any, packed: TableName) -> int:
    return int(cat.query(f"SELECT count(*) AS n FROM {packed.sql}")[0]["n"])


def summary_relation(cat: Any, table: TableName, summary: dict[str, Any]) -> str:
    """The packed table's summary as a relation with our summary's columns, for a FROM
    clause: the table itself, or for a MADlib summary a subquery converting its columns."""
    summ = table.with_suffix("_summary", "source_table")
    if not summary.get("madlib"):
        return summ.sql
    scols = cat.columns(cat.require_table(summ, "source summary"))

    def arr(col: str, typ: str) -> str:
        q = "s0." + quote_ident(col)
        return f"{q}::{typ}[]" if scols[col].is_array else f"ARRAY[{q}]::{typ}[]"

    items = [f"{arr('dependent_varname', 'text')} AS dependent_varname",
             f"{arr('independent_varname', 'text')} AS independent_varname",
             f"{arr('dependent_vartype', 'text')} AS dependent_vartype",
             f"{arr('num_classes', 'integer')} AS num_classes",
             "s0.buffer_size", "s0.normalizing_const::real AS normalizing_const",
             f"{int(summary['num_partitions'])}::integer AS num_partitions",
             "s0.source_table", "s0.output_table"]
    for i, d in enumerate(summary["dependent_varname"]):
        src = d + "_class_values" if d + "_class_values" in scols else \
            "class_values" if i == 0 and "class_values" in scols else None
        if src is not None and scols[src].is_array:
            items.append(f"s0.{quote_ident(src)} AS {quote_ident(d + '_class_values')}")
        else:
            items.append(f"NULL::text[] AS {quote_ident(d + '_class_values')}")
    return f"(SELECT {', '.join(items)} FROM {summ.sql} s0)"
