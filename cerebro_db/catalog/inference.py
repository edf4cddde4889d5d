"""Prediction and evaluation: reading trained model tables, streaming raw rows to predict,
and MADlib's long prediction table."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..names import TableName, quote_ident


def one_row(cat: Any, table: TableName) -> list[dict[str, Any]]:
    """Every row of a (summary) table; callers check there is exactly one."""
    return cat.query(f"SELECT * FROM {table.sql}")


def mst_keys(cat: Any, table: TableName) -> list[int]:
    return [r["mst_key"] for r in cat.query(f"SELECT mst_key FROM {table.sql} ORDER BY 1")]


def model_of(cat: Any, table: TableName, mst_key: int | None) -> list[dict[str, Any]]:
    """``model_weights`` and ``model_arch`` (text) of the model ``mst_key`` of a table of
    several models, or of every row of a one-model table (``mst_key`` None)."""
    if mst_key is None:
        return cat.query(f"SELECT model_weights, model_arch::text AS model_arch FROM {table.sql}")
    return cat.query(f"SELECT model_weights, model_arch::text AS model_arch FROM {table.sql} "
                     "WHERE mst_key = $1", [mst_key], ["int4"])


def compile_params_of(cat: Any, info: TableName, mst_key: int) -> dict[str, Any]:
    """``{"compile_params": ...}`` of one model of an ``_info`` table."""
    return cat.query(f"SELECT compile_params FROM {info.sql} WHERE mst_key = $1", [mst_key],
                     ["int4"])[0]


def stream_features(cat: Any, table: TableName, id_name: str, x_names: Sequence[str],
                    batch: int) -> Iterator[list[dict[str, Any]]]:
    """Batches of ``{"id": ..., "x0": ..., "x1": ...}``: each feature column as the binary
    form of a ``real[]`` (``array_send``)."""
    xsel = ", ".join(f"pg_catalog.array_send({quote_ident(x)}::real[]) AS x{i}"
                     for i, x in enumerate(x_names))
    return cat.stream(f"SELECT {quote_ident(id_name)} AS id, {xsel} FROM {table.sql}",
                      batch=batch)


@dataclass(frozen=True)
class LongOutput:
    """MADlib's long prediction table (id, class_name, class_value, prob[, rank])."""

    table: TableName
    sql: str
    types: tuple[str, ...]

    def insert(self, cat: Any, columns: Sequence[Sequence[Any]]) -> None:
        """One batch, one array per column (bound parameters)."""
        cat.query(self.sql, list(columns), list(self.types))


def create_long_output(cat: Any, output: TableName, id_name: str, id_type: str,
                       with_rank: bool) -> LongOutput:
    """Create the long prediction table; ``id_type`` is the id column's type as the catalog
    formats it (``format_type``), never user text."""
    cols = [(id_name, id_type), ("class_name", "text"), ("class_value", "text"),
            ("prob", "double precision")] + ([("rank", "integer")] if with_rank else [])
    cat.create_table(output, cols)
    names = ", ".join(quote_ident(c) for c, _ in cols)
    arrays = ["$1::text[]", "$2::text[]", "$3::text[]", "$4::float8[]"] + \
        (["$5::int[]"] if with_rank else [])
    sel = f"u.c0::{id_type}, u.c1, u.c2, u.c3" + (", u.c4" if with_rank else "")
    sql = (f"INSERT INTO {output.sql} ({names}) SELECT {sel} FROM unnest({', '.join(arrays)}) "
           f"AS u({', '.join(f'c{i}' for i in range(len(arrays)))})")
    types = ["text[]", "text[]", "text[]", "float8[]"] + (["int4[]"] if with_rank else [])
    return LongOutput(output, sql, tuple(types))
