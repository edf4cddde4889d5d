"""Errors that cross into SQL as PostgreSQL-style errors.

Messages follow the PostgreSQL style: lower case, no trailing period, name the parameter
and the bad value. Each error carries a deliberate SQLSTATE and, where there is a fix, a
hint. Entry points turn a :class:`CerebroError` into ``plpy.error(...)``.
"""
from __future__ import annotations

# SQLSTATE codes used by the project, named as PostgreSQL's condition names (Appendix A).
# The package writes SQLSTATEs only through these names (tests/unit/test_errors.py).
INVALID_PARAMETER_VALUE = "22023"
NULL_VALUE_NOT_ALLOWED = "22004"
INVALID_TEXT_REPRESENTATION = "22P02"
CHARACTER_NOT_IN_REPERTOIRE = "22021"
DATA_EXCEPTION = "22000"
FLOATING_POINT_EXCEPTION = "22P01"
NUMERIC_VALUE_OUT_OF_RANGE = "22003"
SYNTAX_ERROR = "42601"
UNDEFINED_TABLE = "42P01"
UNDEFINED_COLUMN = "42703"
UNDEFINED_OBJECT = "42704"
DUPLICATE_TABLE = "42P07"
DEPENDENT_OBJECTS_STILL_EXIST = "2BP01"
DATATYPE_MISMATCH = "42804"
INVALID_NAME = "42602"
FEATURE_NOT_SUPPORTED = "0A000"
INSUFFICIENT_PRIVILEGE = "42501"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
INTERNAL_ERROR = "XX000"
OUT_OF_MEMORY = "53200"
PROGRAM_LIMIT_EXCEEDED = "54000"
CONNECTION_EXCEPTION = "08000"
CONNECTION_FAILURE = "08006"
SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION = "08001"
INVALID_AUTHORIZATION_SPECIFICATION = "28000"
UNDEFINED_PARAMETER = "42P02"
INVALID_SCHEMA_NAME = "3F000"
WRONG_OBJECT_TYPE = "42809"
DUPLICATE_OBJECT = "42710"
OBJECT_IN_USE = "55006"
QUERY_CANCELED = "57014"
ADMIN_SHUTDOWN = "57P01"
CRASH_SHUTDOWN = "57P02"
CANNOT_CONNECT_NOW = "57P03"
SERIALIZATION_FAILURE = "40001"
UNIQUE_VIOLATION = "23505"
READ_ONLY_SQL_TRANSACTION = "25006"
DEADLOCK_DETECTED = "40P01"
SYSTEM_ERROR = "58000"


class CerebroError(Exception):
    """An error meant for the SQL user.

    ``message`` is PostgreSQL-style (lower case, no period); ``sqlstate`` is a five-character
    code; ``hint`` and ``detail`` are optional extra lines.
    """

    def __init__(
        self,
        message: str,
        sqlstate: str = INVALID_PARAMETER_VALUE,
        *,
        hint: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint
        self.detail = detail

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


def invalid(message: str, *, hint: str | None = None) -> CerebroError:
    """A bad parameter value (SQLSTATE 22023)."""
    return CerebroError(message, INVALID_PARAMETER_VALUE, hint=hint)


def syntax(message: str, *, hint: str | None = None) -> CerebroError:
    """A malformed parameter string (SQLSTATE 42601)."""
    return CerebroError(message, SYNTAX_ERROR, hint=hint)


def out_of_memory(exc: BaseException) -> bool:
    """MemoryError or TensorFlow's ResourceExhaustedError, itself or as a cause."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        if isinstance(e, MemoryError) or type(e).__name__ == "ResourceExhaustedError":
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False
