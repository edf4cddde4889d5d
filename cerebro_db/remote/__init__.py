"""Running a fit's units on a distributed engine (Dask, Ray) instead of worker sessions.

The setting ``cerebro_db.executor`` chooses where units run: ``''`` or ``'sessions'``
(the default: worker sessions of this server, :class:`cerebro_db.executors.DblinkExecutor`),
``'dask://host:port'`` (a running ``distributed`` scheduler; ``'dask+tls://host:port'``
with the TLS settings of Dask's configuration) or ``'ray://host:port'`` (the Ray Client
address of a running cluster). The coordinator stays in the calling session
(:class:`cerebro_db.remote.executor.RemoteExecutor`); the remote workers run the same
unit function as worker sessions (:mod:`cerebro_db.remote.unit`).

No engine package is imported here; :func:`engine_for` imports the engine's module when it
is asked for one.
"""
from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Any

from ..errors import INVALID_PARAMETER_VALUE, SYSTEM_ERROR, CerebroError

EXECUTOR_SETTING = "cerebro_db.executor"

SCHEMES = {
    "dask": ("tcp", "distributed", "dask"),
    "dask+tls": ("tls", "distributed", "dask"),
    "ray": ("ray", "ray", "ray"),
}
"""URL scheme -> (the engine's own scheme, the package it needs, the extra that installs it)."""

_ADDRESS = re.compile(r"^(?P<scheme>[a-z+]+)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
                      r":(?P<port>[0-9]{1,5})$")


@dataclass(frozen=True)
class ExecutorURL:
    """A parsed ``cerebro_db.executor`` naming a remote engine."""

    engine: str  # 'dask' or 'ray'
    address: str  # what the engine's client connects to: 'tcp://h:p', 'tls://h:p', 'ray://h:p'
    text: str  # the setting as given

    def __str__(self) -> str:
        return self.text


def _bad(text: str, why: str) -> CerebroError:
    shown = re.sub(r"//[^/]*@", "//***@", text)  # never repeat credentials
    return CerebroError(
        f'invalid value for {EXECUTOR_SETTING}: "{shown}" ({why})', INVALID_PARAMETER_VALUE,
        hint="Use 'sessions' (the default), 'dask://host:port' (a Dask scheduler), "
        "'dask+tls://host:port' or 'ray://host:port' (a Ray cluster's client address).")


def parse_executor(text: str | None) -> ExecutorURL | None:
    """``cerebro_db.executor`` checked: None for the sessions executor, else the engine and
    address; a 22023 error for an unknown scheme or a malformed address (credentials in the
    address are refused: nodes have their own)."""
    raw = (text or "").strip()
    if raw.lower() in ("", "sessions"):
        return None
    if "://" not in raw:
        raise _bad(raw, "not a URL")
    scheme = raw.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise _bad(raw, f'unknown executor "{scheme}"')
    if "@" in raw:
        raise _bad(raw, "an executor address may not hold credentials")
    m = _ADDRESS.match(scheme + raw[len(scheme):])
    if m is None or not 0 < int(m.group("port")) < 65536:
        raise _bad(raw, "expected scheme://host:port")
    own, _, _ = SCHEMES[scheme]
    engine = scheme.split("+", 1)[0]
    # host names are case-insensitive: 'LOCALHOST' in the DBA's list allows 'localhost'
    host = m.group("host").lower()
    return ExecutorURL(engine, f"{own}://{host}:{int(m.group('port'))}", raw)


def require_package(url: ExecutorURL) -> None:
    """A 58000 error with the fix when this server's Python lacks the engine's package."""
    _, package, extra = SCHEMES[url.text.split("://", 1)[0].lower()]
    if importlib.util.find_spec(package) is None:
        raise CerebroError(
            f'{EXECUTOR_SETTING} is "{url}" but the Python package "{package}" is not '
            "installed on the database server", SYSTEM_ERROR,
            hint=f"Install it into the server's Python environment (pip install "
            f"'cerebro_db[{extra}]'), restart the server, or RESET {EXECUTOR_SETTING} to run "
            "on worker sessions.")


def engine_for(url: str | ExecutorURL, **kw: Any) -> Any:
    """The :class:`~cerebro_db.remote.engine.Engine` for a ``cerebro_db.executor`` value
    (imports that engine's module only)."""
    parsed = url if isinstance(url, ExecutorURL) else parse_executor(url)
    if parsed is None:
        raise _bad(str(url), "the sessions executor has no remote engine")
    require_package(parsed)
    if parsed.engine == "dask":
        from .dask_engine import DaskEngine

        return DaskEngine(parsed.address, **kw)
    from .ray_engine import RayEngine  # type: ignore[import-not-found]

    return RayEngine(parsed.address, **kw)
