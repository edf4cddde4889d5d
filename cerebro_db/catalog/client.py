"""The statements of the Python client (``cerebro_db.client``), which runs outside the
server through SQLAlchemy: texts with ``:name`` placeholders (bound by SQLAlchemy), every
name already quoted by the caller (``rel`` is a schema-qualified, quoted relation,
``function`` a qualified, quoted function, ``names`` quoted argument names)."""
from __future__ import annotations

from collections.abc import Sequence


def _arguments(positional: int, names: Sequence[str]) -> str:
    """``:a0, ..., name => :p0, ...``: positional arguments first, as SQL wants them."""
    return ", ".join([f":a{i}" for i in range(positional)]
                     + [f"{n} => :p{i}" for i, n in enumerate(names)])


def call(function: str, names: Sequence[str], positional: int = 0) -> str:
    """``SELECT function(:a0, ..., name => :p0, ...)``."""
    return f"SELECT {function}({_arguments(positional, names)})"


def call_procedure(procedure: str, names: Sequence[str], positional: int = 0) -> str:
    """``CALL procedure(:a0, ..., name => :p0, ...)``."""
    return f"CALL {procedure}({_arguments(positional, names)})"


def fits(progress: str, fits_rel: str) -> str:
    """Every fit with its progress, newest first (``:status`` NULL for all, ``:limit``)."""
    return (f"SELECT p.fit_id, f.kind, p.status, p.model_output_table, f.source_table, "
            f"f.validation_table, p.policy, p.num_partitions, f.num_iterations, "
            f"p.units_done, p.total_units, p.percent, p.best_loss, p.best_loss_kind, "
            f"p.best_mst_key, "
            f"f.started_at, f.ended_at, p.elapsed, p.eta, f.message, p.owner "
            f"FROM {progress} p JOIN {fits_rel} f USING (fit_id) "
            "WHERE (CAST(:status AS text) IS NULL OR p.status = :status) "
            "ORDER BY p.fit_id DESC LIMIT :limit")


def fit_rows(rel: str) -> str:
    """The rows of one fit (``:f``) of a catalog table or view."""
    return f"SELECT * FROM {rel} WHERE fit_id = :f"


def fit_exists(progress: str) -> str:
    return f"SELECT 1 FROM {progress} WHERE fit_id = :f"


def units(rel: str) -> str:
    return f"SELECT * FROM {rel} WHERE fit_id = :f ORDER BY started_at, unit_id"


def by_config(rel: str) -> str:
    """The rows of one fit (``:f``), in ``mst_key`` order."""
    return f"SELECT * FROM {rel} WHERE fit_id = :f ORDER BY mst_key"


def info(table: str) -> str:
    return f"SELECT * FROM {table} ORDER BY mst_key"


def summary(table: str) -> str:
    return f"SELECT * FROM {table}"


def automl_decisions(rel: str) -> str:
    return f"SELECT * FROM {rel} WHERE fit_id = :f ORDER BY seq, decision_id"


def workers(rel: str) -> str:
    return f"SELECT * FROM {rel} WHERE fit_id = :f ORDER BY worker"


def jobs(rel: str) -> str:
    return f"SELECT * FROM {rel} ORDER BY job_id"


def job_runs(rel: str) -> str:
    """Run history, newest first (``:j`` a job name, NULL for all)."""
    return (f"SELECT * FROM {rel} WHERE (CAST(:j AS text) IS NULL OR job_name = :j) "
            "ORDER BY run_id DESC")
