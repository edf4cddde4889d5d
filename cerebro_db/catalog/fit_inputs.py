"""Statements that read a fit's inputs (``cerebro_db.entrypoints.fit_inputs``, the fit
entry points): the packed tables, the model selection and architecture tables, the weights
of a warm start. Bound parameters; every table named qualified and quoted."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..names import TableName, quote_ident
from . import Catalog


def qualified_name(cat: Catalog, oid: int) -> str:
    """``schema.name`` of a relation, both quoted."""
    row = cat.query("SELECT n.nspname::text AS s, c.relname::text AS r FROM pg_catalog.pg_class c "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                    [oid], ["oid"])[0]
    return quote_ident(row["s"]) + "." + quote_ident(row["r"])


def is_temporary(cat: Catalog, table: TableName) -> bool:
    rows = cat.query("SELECT relpersistence::text AS p FROM pg_catalog.pg_class WHERE oid = "
                     "pg_catalog.to_regclass($1)", [table.sql], ["text"])
    return bool(rows) and rows[0]["p"] == "t"


def buffer_shapes(cat: Catalog, table: TableName, columns: Sequence[str]) -> list[Any] | None:
    """The ``<column>_shape`` of each packed column in one row of the table (None: empty)."""
    sel = ", ".join(f"{quote_ident(c + '_shape')} AS s{i}" for i, c in enumerate(columns))
    rows = cat.query(f"SELECT {sel} FROM {table.sql} LIMIT 1")
    return [rows[0][f"s{i}"] for i in range(len(columns))] if rows else None


def buffer_stats(cat: Catalog, table: TableName, xcols: Sequence[str],
                 ycols: Sequence[str]) -> list[Any]:
    """What identifies a packed table's contents without reading all its features: its row
    count; each label buffer whole (small: rows x classes x 2 bytes); each feature buffer's
    stored size and three 256-byte samples of it (its start, middle and end; the buffers are
    stored uncompressed, so ``substring`` of a TOASTed value reads only the chunks it
    needs); hashed in the order of the rows' own digests (MADlib's older packed tables may
    lack ``buffer_id``). Hashing every feature would read the whole table at each fit's start
    (188 MB for Fashion-MNIST's 60,000 rows)."""
    parts = []
    for c in xcols:
        q = quote_ident(c)
        parts.append(
            f"pg_catalog.octet_length({q})::text || ':' || pg_catalog.md5("
            f"pg_catalog.substring({q}, 1, 256) || "
            f"pg_catalog.substring({q}, GREATEST(1, pg_catalog.octet_length({q}) / 2 - 127), "
            f"256) || "
            f"pg_catalog.substring({q}, GREATEST(1, pg_catalog.octet_length({q}) - 255), 256))")
    parts += [f"pg_catalog.md5({quote_ident(c)})" for c in ycols]
    per_row = " || '|' || ".join(parts)
    row = cat.query(f"SELECT count(*)::text AS n, pg_catalog.md5(coalesce(pg_catalog.string_agg("
                    f"r, ',' ORDER BY r), '')) AS h FROM (SELECT {per_row} AS r "
                    f"FROM {table.sql}) s")[0]
    return [row["n"], row["h"]]


def partition_range(cat: Catalog, table: TableName) -> tuple[int, int]:
    """The lowest and highest ``__dist_key__`` of a packed table."""
    row = cat.query(f"SELECT min(__dist_key__) AS lo, max(__dist_key__) AS m "
                    f"FROM {table.sql}")[0]
    return row["lo"], row["m"]


def selection_rows(cat: Catalog, mst: TableName, arch: TableName) -> list[dict[str, Any]]:
    """Each configuration of a model selection table with its architecture (``arch``
    text, ``w`` the weights; NULL when its model_id is missing), by mst_key."""
    return cat.query(f"SELECT m.mst_key, m.model_id, m.compile_params, m.fit_params, "
                     f"a.model_arch::text AS arch, a.model_weights AS w FROM {mst.sql} m "
                     f"LEFT JOIN {arch.sql} a ON a.model_id = m.model_id ORDER BY m.mst_key")


def architectures(cat: Catalog, arch: TableName, model_ids: Sequence[int]
                  ) -> list[dict[str, Any]]:
    """model_id, architecture (``a``, text) and weights (``w``) of the given models."""
    return cat.query(f"SELECT model_id, model_arch::text AS a, model_weights AS w FROM "
                     f"{arch.sql} WHERE model_id = ANY($1)", [list(model_ids)], ["int4[]"])


def output_weights(cat: Catalog, out: TableName, key: str | None) -> list[dict[str, Any]]:
    """The weights (``w``) of an output table, with its column ``key`` as ``k`` (None: no
    such column)."""
    if key is None:
        return cat.query(f"SELECT model_weights AS w FROM {out.sql}")
    return cat.query(f"SELECT {quote_ident(key)} AS k, model_weights AS w FROM {out.sql}")
