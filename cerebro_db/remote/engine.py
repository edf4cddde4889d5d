"""The interface between the coordinator's :class:`~cerebro_db.remote.executor.RemoteExecutor`
and a distributed engine (Dask, Ray).

An engine places one long-lived remote worker per worker slot of the fit and runs units on
it. A unit is a JSON-able ``call`` dict that the remote worker hands to
:func:`cerebro_db.remote.unit.run_call`, which runs :func:`cerebro_db.worker.run_unit` (the
same function a worker session runs) over the worker's own database connection. At most
one unit per worker slot is in flight; the coordinator polls :meth:`Engine.done` and
collects with :meth:`Engine.result`.

An engine is made by :func:`cerebro_db.remote.engine_for` as ``EngineClass(address)``:
``DaskEngine('tcp://host:port' | 'tls://host:port')``, ``RayEngine('ray://host:port')``;
the constructor connects its client (an error there fails the fit before it starts). The
``call`` dict is described in :mod:`cerebro_db.remote.unit` (a unit, or ``"check": true``
for the fit's checks before it starts: same entry, :func:`~cerebro_db.remote.unit.run_call`).
Any exception of ``submit``/``done``/``result`` other than :class:`WorkerLost` is taken
as a lost worker too; ``start_worker`` raises :class:`EngineUnavailable` (or any error)
when it cannot place one.

Nothing here imports an engine package: each engine module imports its own lazily, so a
server without Dask or Ray still imports the package.
"""
from __future__ import annotations

from typing import Any, Protocol


class WorkerLost(Exception):
    """The remote worker died or became unreachable while it ran a unit (or before it could
    take one): the unit is lost, not failed, and the coordinator re-queues it."""


class EngineUnavailable(Exception):
    """The engine cannot place a worker for a slot (no live remote worker left, the cluster
    is unreachable); ``start_worker`` raises it."""


class Engine(Protocol):
    """What :class:`~cerebro_db.remote.executor.RemoteExecutor` needs of an engine."""

    def start_worker(self, worker: int) -> None:
        """Place a long-lived remote worker for slot ``worker`` (called again for a slot
        whose worker was lost: place a replacement, or raise :class:`EngineUnavailable`)."""

    def submit(self, worker: int, call: dict[str, Any]) -> None:
        """Run ``remote.unit.run_call(call)`` on slot ``worker``'s remote worker,
        asynchronously."""

    def done(self, worker: int) -> bool:
        """Whether the slot's call has finished: ok, failed or lost."""

    def result(self, worker: int) -> dict[str, Any]:
        """The finished call's result (``run_unit``'s dict); raises :class:`WorkerLost` when
        the remote worker died or became unreachable."""

    def pid(self, worker: int) -> int | None:
        """The remote worker's process id (for ``fit_workers``), when known."""

    def stop_worker(self, worker: int) -> None:
        """Cancel the slot's call and release that remote worker's resources."""

    def close(self) -> None:
        """Release everything, the engine's client included (safe to call twice)."""
