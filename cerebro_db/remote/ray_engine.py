"""The Ray engine: one long-lived Ray actor per worker slot, reached as a Ray Client.

The coordinator (a PostgreSQL backend) connects to a running cluster through its Ray Client
server (``ray.init("ray://host:port", allow_multiple=True)``: a client context of this
engine's own, so nothing of Ray's global state is used, and no local cluster is ever
started). The client needs no Ray processes on the database host; the connection is a gRPC
channel and a few threads in the backend, closed by :meth:`RayEngine.close`. Ray Client
logs through Python's logging (to the server's log, never stdout); workers' output is not
streamed back (``log_to_driver=False``).

Each slot gets an actor of :class:`UnitActor` (``num_cpus=1``, ``max_restarts=0``,
``max_task_retries=0``, spread over the cluster's nodes). Ray gives every actor a process of
its own, so the actor's module state is the worker's: :func:`cerebro_db.remote.unit.run_call`
keeps its database connection, decoded partitions and compiled models there across units,
as a worker session does. A unit is one actor call; :meth:`RayEngine.done` asks
``ray.wait(timeout=0)``. An actor that dies (its process killed, its node lost) fails the
call with a ``RayActorError``, which :meth:`RayEngine.result` raises as
:class:`~cerebro_db.remote.engine.WorkerLost`; ``start_worker`` for that slot then places a
new actor. :meth:`RayEngine.stop_worker` and :meth:`RayEngine.close` kill the actors
(``ray.kill``); actors are not detached, so a client that disappears without closing (its
backend was killed) has its actors ended by the cluster once the client's reconnect grace
period passes.

The actor processes need this package, TensorFlow and the database's credentials for the
calling role (PGPASSFILE, PGPASSWORD or a service file in the environment of the nodes'
``ray start``); nothing secret goes through Ray.

This module imports ``ray`` only when an engine is made.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import time
import traceback
from typing import Any

from ..errors import (
    INTERNAL_ERROR,
    SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    SYSTEM_ERROR,
    CerebroError,
)
from .engine import EngineUnavailable, WorkerLost

ENTRY = "cerebro_db.remote.unit:run_call"
NAMESPACE = "cerebro_db"


class UnitActor:
    """The body of a worker slot's Ray actor: calls ``entry`` (``module:function``, by
    default :func:`cerebro_db.remote.unit.run_call`) with each unit's call dict."""

    def __init__(self, slot: int, entry: str = ENTRY) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.slot = slot
        module, _, name = entry.partition(":")
        self._fn = getattr(importlib.import_module(module), name)

    def pid(self) -> int:
        return os.getpid()

    def run(self, call: dict[str, Any]) -> dict[str, Any]:
        return self._fn(call)


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's exceptions that say the actor (or the way to it) is gone, not that the unit
    failed."""
    ex = ray.exceptions
    names = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
             "ObjectLostError", "OwnerDiedError", "NodeDiedError", "LocalRayletDiedError",
             "RaySystemError")
    found = tuple(getattr(ex, n) for n in names if isinstance(getattr(ex, n, None), type))
    return (*found, ConnectionError)


def import_ray() -> Any:
    """``ray``, with its "auto-init" off: a Ray call that finds no connection starts a local
    cluster, and one made after the cluster went away (``ray stop`` mid-fit) started it
    inside the database backend, as the server's OS user, with an auth token written to its
    home (an outside pass). The flag is read at Ray's import; it is set on the module too,
    in case something in this process imported Ray before."""
    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"
    import ray

    with contextlib.suppress(ImportError, AttributeError):
        from ray._private import auto_init_hook

        auto_init_hook.enable_auto_connect = False  # type: ignore[attr-defined]
    return ray


class RayEngine:
    """The :class:`~cerebro_db.remote.engine.Engine` on a Ray cluster (see the module).

    ``address``: the Ray Client address, ``ray://host:port``. ``entry``: what the actors run
    per call (``module:function``; the tests give a function of their own).
    ``actor_options``: more options for the actors (e.g. ``resources``, ``memory``).
    ``place_wait``: seconds to wait for a free CPU before a slot is refused (a killed
    actor's CPU comes back within a moment; a full cluster does not).
    ``start_timeout``: seconds to wait for a new actor to be placed and answer."""

    def __init__(self, address: str, *, entry: str = ENTRY, namespace: str = NAMESPACE,
                 actor_options: dict[str, Any] | None = None,
                 place_wait: float = 10.0, start_timeout: float = 120.0) -> None:
        try:
            ray = import_ray()
        except ImportError as e:
            raise CerebroError(
                f'the Ray executor needs the Python package "ray" on the database server '
                f"({e})", SYSTEM_ERROR,
                hint="Install it into the server's Python environment (pip install "
                "'cerebro_db[ray]', the same Ray version as the cluster's) and restart the "
                "server.") from None
        self._ray = ray
        self.address = address
        self.entry = entry
        self.place_wait = place_wait
        self.start_timeout = start_timeout
        self._actors: dict[int, Any] = {}
        self._pids: dict[int, int] = {}
        self._calls: dict[int, Any] = {}
        try:
            self._ctx = self._connect(namespace)
        except Exception as e:  # noqa: BLE001 - the cluster is unreachable or refuses us
            why = " ".join(str(e).split())
            raise CerebroError(
                f"could not connect to the Ray cluster at {address}: "
                f"{type(e).__name__}{': ' + why if why else ''}", SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                hint="Check that the cluster runs with its Ray Client server on that port "
                "(ray start --head --ray-client-server-port ...), is reachable from the "
                "database server, and runs the same Ray and Python versions.") from None
        opts = {"num_cpus": 1, "max_restarts": 0, "max_task_retries": 0,
                "scheduling_strategy": "SPREAD", **(actor_options or {})}
        self._cpus = float(opts.get("num_cpus") or 0)
        with self._ctx:
            self._actor_class = ray.remote(**opts)(UnitActor)
        self._lost = _lost_errors(ray)

    def _connect(self, namespace: str, attempts: int = 3) -> Any:
        """The client context. The cluster's client server starts a driver process per
        client, whose own ``ray.init`` can fail on a busy head (``ConnectionAbortedError``,
        "Initialization failure from server"): that is tried again; an unreachable address
        fails after Ray Client's own timeout (about 30 s)."""
        for attempt in range(attempts):
            try:
                # Ray Client reports through logging; anything printed goes to stderr (the
                # server's log), never to the backend's stdout
                with contextlib.redirect_stdout(sys.stderr):
                    return self._ray.init(address=self.address, allow_multiple=True,
                                          namespace=namespace, logging_level=logging.WARNING,
                                          log_to_driver=False)
            except ConnectionAbortedError:
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0 + attempt)
        raise AssertionError("unreachable")

    def start_worker(self, worker: int) -> None:
        """Place the slot's actor and wait until it runs (its pid known); a previous actor of
        the slot is killed first. :class:`EngineUnavailable` when none can be placed
        within ``start_timeout`` seconds."""
        self.stop_worker(worker)
        ray = self._ray
        self._wait_for_cpu(worker)
        try:
            with self._ctx:
                actor = self._actor_class.remote(worker, self.entry)
                self._actors[worker] = actor
                self._pids[worker] = int(ray.get(actor.pid.remote(),  # type: ignore[attr-defined]
                                                  timeout=self.start_timeout))
        except Exception as e:  # noqa: BLE001 - the slot stays empty
            self.stop_worker(worker)
            raise EngineUnavailable(f"no Ray actor for worker {worker}: "
                                    f"{type(e).__name__}: {e}") from None

    def _wait_for_cpu(self, worker: int) -> None:
        """:class:`EngineUnavailable` unless the cluster has the CPUs an actor needs free
        within ``place_wait`` seconds (an actor that cannot be placed would stay pending)."""
        end = time.monotonic() + self.place_wait
        while True:
            try:
                with self._ctx:
                    free = float(self._ray.available_resources().get("CPU", 0.0))
            except Exception as e:  # noqa: BLE001 - the cluster is gone
                raise EngineUnavailable(f"no Ray actor for worker {worker}: "
                                        f"{type(e).__name__}: {e}") from None
            if free >= self._cpus:
                return
            if time.monotonic() >= end:
                raise EngineUnavailable(
                    f"the Ray cluster has no free CPU for worker {worker} ({free:g} free, "
                    f"{self._cpus:g} needed)")
            time.sleep(0.2)

    def submit(self, worker: int, call: dict[str, Any]) -> None:
        actor = self._actors.get(worker)
        if actor is None:
            raise WorkerLost(f"worker {worker} has no Ray actor")
        if worker in self._calls:
            raise RuntimeError(f"worker {worker} already runs a unit")
        with self._ctx:
            self._calls[worker] = actor.run.remote(call)

    def done(self, worker: int) -> bool:
        ref = self._calls.get(worker)
        if ref is None:
            return True
        try:
            with self._ctx:
                ready, _ = self._ray.wait([ref], timeout=0)
        except self._lost:
            return True  # result() says it was lost
        return bool(ready)

    def result(self, worker: int) -> dict[str, Any]:
        """The call's result dict; :class:`WorkerLost` when the actor died or the cluster is
        gone. An exception raised by the call itself (``run_call`` returns its failures,
        so this is e.g. the package missing on the node) comes back as a failed result."""
        ref = self._calls.pop(worker, None)
        if ref is None:
            raise WorkerLost(f"worker {worker} runs no unit")
        ray = self._ray
        try:
            with self._ctx:
                return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None) or e
            return {"ok": False, "worker": worker,
                    "message": f"the Ray actor of worker {worker} failed: "
                               f"{type(cause).__name__}: {cause}".splitlines()[0],
                    "sqlstate": getattr(cause, "sqlstate", None) or INTERNAL_ERROR,
                    "detail": str(e)}
        except self._lost as e:
            raise WorkerLost(f"the Ray actor of worker {worker} (pid "
                             f"{self._pids.get(worker)}) was lost: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None

    def pid(self, worker: int) -> int | None:
        return self._pids.get(worker)

    def stop_worker(self, worker: int) -> None:
        """Kill the slot's actor (its call, if any, is abandoned)."""
        self._calls.pop(worker, None)
        self._pids.pop(worker, None)
        actor = self._actors.pop(worker, None)
        if actor is None:
            return
        try:
            with self._ctx:
                self._ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001, S110 - already gone, or the cluster is
            pass

    def close(self) -> None:
        """Kill every actor and disconnect the client (safe to call twice)."""
        for w in list(self._actors):
            self.stop_worker(w)
        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx is not None:
            try:
                ctx.disconnect()
            except Exception:  # noqa: BLE001 - closing anyway
                print(f"cerebro_db: closing the Ray client failed: "
                      f"{traceback.format_exc(limit=1)}", file=sys.stderr)
