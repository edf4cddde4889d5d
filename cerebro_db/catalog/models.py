"""The user's model tables: architecture tables (``load_keras_model``), model selection
tables (``load_model_selection_table``, ``generate_model_configs``) and custom function
tables (``load_custom_function``). Table names come in as parsed :class:`TableName`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..names import TableName


# -- architecture tables -----------------------------------------------------------------
def insert_arch(cat: Any, table: TableName, *, arch: str, weights: bytes | None,
                name: str | None, description: str | None, madlib_id: str) -> int:
    row = cat.query(
        f"INSERT INTO {table.sql} (model_arch, model_weights, name, description, "
        "__internal_madlib_id__) VALUES ($1::json, $2, $3, $4, $5) RETURNING model_id",
        [arch, weights, name, description, madlib_id],
        ["text", "bytea", "text", "text", "text"])
    return int(row[0]["model_id"])


def delete_arch(cat: Any, table: TableName, model_id: int) -> bool:
    """Delete one architecture; whether it existed."""
    return bool(cat.query(f"DELETE FROM {table.sql} WHERE model_id = $1 RETURNING model_id",
                          [model_id], ["int4"]))


def is_empty(cat: Any, table: TableName) -> bool:
    return not cat.query(f"SELECT EXISTS (SELECT 1 FROM {table.sql}) AS any")[0]["any"]


def model_ids(cat: Any, table: TableName) -> list[int]:
    """Every ``model_id`` of an architecture table, in order."""
    return [r["model_id"] for r in cat.query(f"SELECT model_id FROM {table.sql} "
                                             "ORDER BY model_id")]


def arch_and_weights(cat: Any, table: TableName, model_id: int) -> dict[str, Any] | None:
    """``{"a": architecture JSON text, "w": weights}`` of one architecture, or None."""
    rows = cat.query(f"SELECT model_arch::text AS a, model_weights AS w FROM {table.sql} "
                     "WHERE model_id = $1", [model_id], ["int4"])
    return rows[0] if rows else None


# -- model selection tables -----------------------------------------------------------------
def add_config_key(cat: Any, mst: TableName) -> None:
    """A configuration is unique in its model selection table."""
    cat.db.execute(f"ALTER TABLE {mst.sql} ADD UNIQUE (model_id, compile_params, fit_params)")


# -- custom function tables -----------------------------------------------------------------
def grant_read_to_public(cat: Any, table: TableName) -> None:
    cat.db.execute(f"GRANT SELECT ON {table.sql} TO PUBLIC")


def add_reference_column(cat: Any, table: TableName) -> None:
    """A MADlib object table gets the ``reference`` column this project stores."""
    cat.db.execute(f"ALTER TABLE {table.sql} ADD COLUMN reference text")


def custom_functions(cat: Any, table: TableName, names: Sequence[str],
                     has_reference: bool) -> list[dict[str, Any]]:
    """``name``, ``reference`` and ``pickled`` (holds pickled bytes) of the named functions
    of an object table; ``has_reference``: the table has the ``reference`` column."""
    ref = "reference" if has_reference else "NULL::text"
    return cat.query(f"SELECT name, {ref} AS reference, object IS NOT NULL AS pickled "
                     f"FROM {table.sql} WHERE name = ANY($1)", [list(names)], ["text[]"])


def custom_function_exists(cat: Any, table: TableName, name: str) -> bool:
    return bool(cat.query(f"SELECT 1 AS x FROM {table.sql} WHERE name = $1", [name],
                          ["text"]))


def insert_custom_function(cat: Any, table: TableName, *, name: str,
                           description: str | None, reference: str) -> None:
    cat.query(f"INSERT INTO {table.sql} (name, description, reference) VALUES ($1, $2, $3)",
              [name, description, reference], ["text", "text", "text"])


def delete_custom_function(cat: Any, table: TableName, *, id: int | None = None,
                           name: str | None = None) -> int | None:
    """Delete a function by id (else by name); its id, None when there was none."""
    if id is not None:
        gone = cat.query(f"DELETE FROM {table.sql} WHERE id = $1 RETURNING id", [id], ["int4"])
    else:
        gone = cat.query(f"DELETE FROM {table.sql} WHERE name = $1 RETURNING id", [name],
                         ["text"])
    return gone[0]["id"] if gone else None


def has_rows(cat: Any, table: TableName) -> bool:
    return bool(cat.query(f"SELECT 1 AS x FROM {table.sql} LIMIT 1"))
