"""Out of memory is reported as SQLSTATE 53200, whatever raised it."""
from __future__ import annotations

import pytest

from cerebro_db.entrypoints import entrypoint
from cerebro_db.errors import OUT_OF_MEMORY, out_of_memory


class ResourceExhaustedError(Exception):
    """Named as TensorFlow's out-of-memory error (tensorflow.errors.ResourceExhaustedError)."""


class Raised(Exception):
    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Recorder:
    """Stands in for PL/Python's ``plpy`` in the entry point wrapper: ``error`` raises,
    as plpy.error does, with the SQLSTATE it was given."""

    def prepare(self, sql: str, types: list[str]) -> str:
        return sql

    def execute(self, sql: str, args: list | None = None) -> list[dict]:
        return [{"p": None}]

    def error(self, message: str, detail: str | None = None, hint: str | None = None,
              sqlstate: str | None = None) -> None:
        raise Raised(message, sqlstate or "")


def test_out_of_memory_is_recognised_directly_and_as_a_cause():
    assert out_of_memory(MemoryError())
    assert out_of_memory(ResourceExhaustedError("OOM when allocating tensor"))
    try:
        try:
            raise MemoryError
        except MemoryError as e:
            raise ValueError("building the model failed") from e
    except ValueError as e:
        assert out_of_memory(e)
    assert not out_of_memory(ValueError("not a model"))


@pytest.mark.parametrize("exc", [MemoryError(), ResourceExhaustedError("OOM")])
def test_entry_point_reports_53200(exc):
    @entrypoint
    def fails(cat, **kwargs):
        raise exc

    with pytest.raises(Raised) as e:
        fails(Recorder(), "cerebro_db")
    assert e.value.sqlstate == OUT_OF_MEMORY == "53200"
    assert "out of memory" in str(e.value)


def test_other_failures_stay_internal_errors():
    @entrypoint
    def fails(cat, **kwargs):
        raise KeyError("x")

    with pytest.raises(Raised) as e:
        fails(Recorder(), "cerebro_db")
    assert e.value.sqlstate == "XX000"
