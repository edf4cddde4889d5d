"""``load_keras_model`` and ``delete_keras_model``."""
from __future__ import annotations

import uuid

from .. import keras_arch
from ..catalog import Catalog
from ..catalog import models as stmts
from ..errors import NULL_VALUE_NOT_ALLOWED, UNDEFINED_OBJECT, WRONG_OBJECT_TYPE, CerebroError
from ..names import TableName
from . import entrypoint

ARCH_COLUMNS = [
    ("model_id", "SERIAL PRIMARY KEY"),
    ("model_arch", "json"),
    ("model_weights", "bytea"),
    ("name", "text"),
    ("description", "text"),
    ("__internal_madlib_id__", "text"),
]


def require_arch_table(cat: Catalog, table: TableName, what: str) -> None:
    """An existing table with the architecture table's columns, or a clear error."""
    oid = cat.require_table(table, what)
    cols = cat.columns(oid)
    missing = [c for c, _ in ARCH_COLUMNS[:3] if c not in cols]
    if missing:
        raise CerebroError(
            f'{what} "{table}" is not a model architecture table (no column {missing[0]})',
            WRONG_OBJECT_TYPE,
            hint="Architecture tables are created by load_keras_model.",
        )


@entrypoint
def load_keras_model(cat: Catalog, *, keras_model_arch_table: str, model_arch: str,
                     model_weights: bytes | None = None, name: str | None = None,
                     description: str | None = None) -> None:
    """Check the architecture (and weights) and append it to the architecture table."""
    table = cat.table(keras_model_arch_table, "keras_model_arch_table")
    if model_arch is None:
        raise CerebroError("model_arch must not be NULL", NULL_VALUE_NOT_ALLOWED)
    text, model = keras_arch.normalize_arch(model_arch)
    if model_weights is not None:
        keras_arch.check_weights(model, model_weights)
    if cat.relation_oid(table) is None and cat.create_table(table, ARCH_COLUMNS,
                                                            exists_ok=True):
        pass
    else:  # there, or made by another session just now
        require_arch_table(cat, table, "keras_model_arch_table")
        cat.require_own_table(table, "keras_model_arch_table")
    model_id = stmts.insert_arch(cat, table, arch=text, weights=model_weights, name=name,
                                 description=description,
                                 madlib_id="__cerebro_db_" + uuid.uuid4().hex)
    cat.notice(
        f"load_keras_model: model_id {model_id} in {table}: "
        f"{keras_arch.model_type_name(model)}, {keras_arch.count_params(model)} parameters"
        + (", with weights" if model_weights is not None else "")
    )


@entrypoint
def delete_keras_model(cat: Catalog, *, keras_model_arch_table: str, model_id: int) -> None:
    """Delete one architecture; drop the table once it is empty."""
    table = cat.table(keras_model_arch_table, "keras_model_arch_table")
    if model_id is None:
        raise CerebroError("model_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    require_arch_table(cat, table, "keras_model_arch_table")
    cat.require_own_table(table, "keras_model_arch_table")
    if not stmts.delete_arch(cat, table, model_id):
        raise CerebroError(f'model_id {model_id} does not exist in "{table}"', UNDEFINED_OBJECT)
    if stmts.is_empty(cat, table):
        cat.drop_table(table)
        cat.notice(f'delete_keras_model: "{table}" is empty and was dropped')
