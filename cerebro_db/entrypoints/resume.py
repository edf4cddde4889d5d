"""``madlib_keras_fit_resume``: continue an interrupted, cancelled or failed fit of any kind.

The one resume entry point: it checks the fit and its data, then dispatches on the fit's
kind to the entry point that made it (:func:`.training.resume_fit` for
``madlib_keras_fit_multiple_model`` and ``madlib_keras_fit``, :func:`.automl.resume_automl`
for ``madlib_keras_automl``); both run the fit service with a
:class:`~cerebro_db.fitrun.ResumePoint`.
"""
from __future__ import annotations

import json

from ..catalog import Catalog
from ..catalog import fits as sql
from ..errors import (
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_IN_USE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_OBJECT,
    CerebroError,
)
from ..names import display_name, quote_ident
from . import entrypoint, fit_inputs
from .automl import resume_automl
from .training import resume_fit


@entrypoint
def madlib_keras_fit_resume(cat: Catalog, *, fit_id: int) -> None:
    """Continue an interrupted (or failed) fit from the catalog: the units it committed are
    kept, each configuration continues from its last committed state, and the outputs are
    written as the original call would have. With a fixed random_state the result equals an
    uninterrupted run (the visit orders and unit seeds depend on the seed only)."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    f = sql.fit_row(cat, fit_id)
    if f is None:
        raise CerebroError(f"fit {fit_id} does not exist", UNDEFINED_OBJECT,
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    if not f["mine"]:
        # a superuser sees every role's fits; a resume runs the fit as the caller, on the
        # tables its row names, and a role writes its own rows (a red-team pass: a row a role
        # made, or one restored from a dump, would run with a superuser's rights)
        raise CerebroError(f'fit {fit_id} belongs to role "{f["owner"]}"',
                           INSUFFICIENT_PRIVILEGE,
                           hint=f"A fit is resumed by its owner: SET ROLE "
                                f"{quote_ident(f['owner'])} first.")
    if f["status"] == "done":
        raise CerebroError(f"fit {fit_id} is already done", OBJECT_NOT_IN_PREREQUISITE_STATE)
    if f["status"] == "running" and f["live"]:
        raise CerebroError(f"fit {fit_id} is still running (coordinator pid "
                           f"{f['coordinator_pid']})", OBJECT_IN_USE,
                           hint="Only an interrupted, cancelled or failed fit can be resumed.")
    opts = f["options"] if isinstance(f["options"], dict) else json.loads(f["options"])
    if "executor_tag" not in opts:
        raise CerebroError(f"fit {fit_id} was made by an older version and cannot be resumed",
                           FEATURE_NOT_SUPPORTED)
    src = fit_inputs.packed_table(cat, display_name(f["source_table"], "source_table"),
                                  "source_table")
    vname = f["validation_table"] and display_name(f["validation_table"], "validation_table")
    val = fit_inputs.validation_table(cat, vname, src) if vname else None
    fit_inputs.same_data(cat, opts, fit_id, src, val)
    if src.partitions != f["num_partitions"]:
        raise CerebroError(f'source_table "{src.table}" now has {src.partitions} partitions, '
                           f"fit {fit_id} was started on {f['num_partitions']}",
                           OBJECT_NOT_IN_PREREQUISITE_STATE)
    out = fit_inputs.stored_table(cat, opts, "output", f["model_output_table"],
                                  "model_output_table")
    assert out is not None
    resume = resume_automl if f["kind"] == "automl" else resume_fit
    resume(cat, f, opts, src, val, out)
