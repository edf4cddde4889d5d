"""One Python function per SQL function.

Each entry point validates its arguments before doing any work, builds the pieces, and
turns failures into PostgreSQL errors: a :class:`~cerebro_db.errors.CerebroError` becomes
``plpy.error`` with its SQLSTATE, hint and detail; an SQL error raised by the server keeps
its own SQLSTATE; anything unexpected becomes an internal error with the traceback in
DETAIL. The PL/Python bodies in ``plpython/`` are one call into this package.
"""
from __future__ import annotations

import functools
import traceback
from typing import Any, Callable

from ..catalog import Catalog
from ..errors import INTERNAL_ERROR, CerebroError


def entrypoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn(catalog, **args)`` as ``wrapper(plpy, schema, **args)`` for a PL/Python body."""

    @functools.wraps(fn)
    def wrapper(plpy: Any, schema: str, **kwargs: Any) -> Any:
        spi_errors: tuple[type[BaseException], ...] = tuple(
            e for e in (getattr(plpy, "SPIError", None), getattr(plpy, "Error", None)) if e
        )
        try:
            return fn(Catalog(plpy, schema), **kwargs)
        except CerebroError as e:
            extra = {k: v for k, v in (("detail", e.detail), ("hint", e.hint)) if v}
            plpy.error(e.message, sqlstate=e.sqlstate, **extra)
        except spi_errors:
            raise
        except Exception as e:  # an unexpected failure: say where, keep the traceback
            plpy.error(
                f"{fn.__name__} failed: {type(e).__name__}: {e}",
                detail=traceback.format_exc(),
                sqlstate=INTERNAL_ERROR,
            )

    return wrapper


def usage(function: str, message: str | None = None) -> str:
    """The short usage text of an SQL function (``fn('help')``, ``fn()``)."""
    from ..usage import USAGE

    text = USAGE.get(function)
    if text is None:
        raise CerebroError(f"no usage text for {function!r}")
    return text
