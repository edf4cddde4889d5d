"""Letting a cancel through long pure-Python loops.

PostgreSQL acts on a query cancel (``pg_cancel_backend``, ``statement_timeout``) or a
terminate (``pg_terminate_backend``) only where the server checks for interrupts, which
Python code running inside PL/Python never does: a loop of minutes ignores all three. A
statement run through SPI does check (``SELECT 1`` is enough): the pending cancel becomes
the statement's error, which PL/Python raises in Python, and the entry point lets it
through, so the call ends with 57014 as any other statement would.

The pure core cannot call the server. Its long loops call :func:`poll`, which runs the
check an entry point installed (:func:`installed`), at most every :data:`INTERVAL`
seconds; without one it does nothing (unit tests, a plain Python process).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

INTERVAL = 0.1
"""Seconds between two checks."""

_check: Callable[[], object] | None = None
_last = 0.0


def poll() -> None:
    """Run the installed check if the last one is older than :data:`INTERVAL`."""
    global _last
    if _check is None:
        return
    now = time.monotonic()
    if now - _last >= INTERVAL:
        _last = now
        _check()


@contextlib.contextmanager
def installed(check: Callable[[], object]) -> Iterator[None]:
    """Make ``check`` the interrupt check while the block runs."""
    global _check
    previous = _check
    _check = check
    try:
        yield
    finally:
        _check = previous
