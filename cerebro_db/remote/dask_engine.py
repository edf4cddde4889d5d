"""The Dask engine: worker slots on the workers of a running ``distributed`` scheduler.

Each slot of the fit is pinned to one Dask worker (the least used live one when the slot
is placed), and its units are tasks restricted to that worker (``workers=[address]``,
``allow_other_workers=False``, ``pure=False``, ``retries=0``): the partitions the slot
holds are read from the database by that worker process and stay in its memory
(:mod:`cerebro_db.worker`'s cache), never scattered from the coordinator. Run the workers
with ``--nthreads 1`` (units of one process run one at a time anyway).

A Dask worker that dies while it runs a unit leaves its task waiting for a worker that is
gone (the restriction keeps the scheduler from running it elsewhere): the engine sees the
worker's address leave the scheduler and reports the unit lost (:class:`WorkerLost`);
placing the slot again picks a live worker (the nanny's restarted process, or another).

``distributed`` is imported when an engine is made, never at module import.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any

from .engine import EngineUnavailable, WorkerLost

LIVENESS_INTERVAL = 0.5
"""Seconds between two looks at the scheduler's worker list while units run."""


def _pid() -> int:
    return os.getpid()


def _run(call: dict[str, Any]) -> dict[str, Any]:
    from cerebro_db.remote.unit import run_call

    return run_call(call)


class DaskEngine:
    """An :class:`~cerebro_db.remote.engine.Engine` over a ``distributed.Client``."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        from distributed import Client

        self.address = address
        self.client = Client(address, timeout=timeout, set_as_default=False)
        self.slots: dict[int, str] = {}
        self.pids: dict[int, int | None] = {}
        self.futures: dict[int, Any] = {}
        self._keys = itertools.count()
        self._tag = f"cerebro-{os.getpid()}-{int(time.time() * 1000)}"
        self._live: set[str] = set()
        self._seen = 0.0

    def live_workers(self, fresh: bool = False) -> set[str]:
        """Addresses of the scheduler's workers (looked up at most every
        ``LIVENESS_INTERVAL`` seconds unless ``fresh``)."""
        now = time.monotonic()
        if fresh or now - self._seen >= LIVENESS_INTERVAL:
            self._live = set(self.client.scheduler_info(n_workers=-1)["workers"])
            self._seen = now
        return self._live

    def start_worker(self, worker: int) -> None:
        self.stop_worker(worker)
        live = sorted(self.live_workers(fresh=True))
        if not live:
            raise EngineUnavailable(f"the Dask scheduler {self.address} has no live worker")
        used = {a: 0 for a in live}
        for a in self.slots.values():
            if a in used:
                used[a] += 1
        why = "no answer"
        # the least used live worker that answers (one that just joined, or is leaving, may not)
        for address in sorted(live, key=lambda a: (used[a], live.index(a))):
            try:
                pid = self.client.run(_pid, workers=[address], on_error="return").get(address)
            except Exception as e:  # noqa: BLE001 - try the next one
                pid = e
            if isinstance(pid, int):
                self.slots[worker] = address
                self.pids[worker] = pid
                return
            why = f"{address}: {pid}"
        raise EngineUnavailable(f"no Dask worker of {self.address} answered ({why})")

    def submit(self, worker: int, call: dict[str, Any]) -> None:
        address = self.slots.get(worker)
        if address is None:
            raise WorkerLost(f"slot {worker} has no Dask worker")
        self.futures[worker] = self.client.submit(
            _run, call, key=f"{self._tag}-{worker}-{next(self._keys)}", workers=[address],
            allow_other_workers=False, pure=False, retries=0)

    def done(self, worker: int) -> bool:
        fut = self.futures.get(worker)
        if fut is None or fut.done():
            return True
        return self.slots.get(worker) not in self.live_workers()

    def result(self, worker: int) -> dict[str, Any]:
        fut = self.futures.pop(worker, None)
        address = self.slots.get(worker)
        if fut is None:
            raise WorkerLost(f"slot {worker} has no unit running")
        if not fut.done():
            fut.cancel()
            raise WorkerLost(f"Dask worker {address} left the cluster while it ran the unit")
        if fut.status != "finished":
            try:
                exc = fut.exception(timeout=5)
            except Exception as e:  # noqa: BLE001 - whatever it was, the unit is lost
                exc = e
            raise WorkerLost(f"Dask worker {address}: {type(exc).__name__}: {exc}")
        return fut.result(timeout=30)

    def pid(self, worker: int) -> int | None:
        return self.pids.get(worker)

    def stop_worker(self, worker: int) -> None:
        fut = self.futures.pop(worker, None)
        if fut is not None:
            fut.cancel()
        self.slots.pop(worker, None)
        self.pids.pop(worker, None)

    def close(self) -> None:
        for w in list(self.futures):
            self.stop_worker(w)
        self.slots.clear()
        self.client.close()
