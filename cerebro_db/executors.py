"""How units reach workers: PostgreSQL worker sessions opened with dblink.

The coordinator runs inside the user's statement. :class:`DblinkExecutor` opens one
session per worker to the same database as the calling role, keeps them for the whole fit,
sends each unit as one asynchronous statement (``dblink_send_query``) and collects
results as workers finish (``dblink_is_busy`` / ``dblink_get_result``). Each unit's
statement commits in its worker session on its own. A control session writes the fit's
catalog rows, committed at once so workers and other sessions see them.

All SQL text goes through :class:`cerebro_db.catalog.Catalog`.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .errors import CerebroError


@dataclass(frozen=True)
class WorkerResult:
    """What a worker sent back for one unit."""

    worker: int
    ok: bool
    data: dict[str, Any]


class DblinkExecutor:
    """``num_workers`` worker sessions plus one control session, over dblink."""

    def __init__(self, cat: Catalog, tag: str, num_workers: int, conninfo: str | None,
                 poll_interval: float = 0.002, max_poll_interval: float = 0.025) -> None:
        self.cat = cat
        self.tag = tag
        self.num_workers = num_workers
        self.conninfo = conninfo
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.busy: dict[int, float] = {}
        self.opened: list[str] = []

    def name(self, worker: int | str) -> str:
        return f"cerebro_{self.tag}_{worker}"

    def open(self, settings: dict[str, str] | None = None) -> None:
        for w in ["ctl"] + list(range(self.num_workers)):
            name = self.name(w)
            self._connect(name)
            self.opened.append(name)
            self.cat.dblink_exec(name, "SET application_name = "
                                 + self.cat.literal(f"cerebro_db {self.tag} worker {w}"))
            for k, v in (settings or {}).items():
                self.cat.dblink_exec(name, f"SELECT pg_catalog.set_config({self.cat.literal(k)}, "
                                           f"{self.cat.literal(v)}, false)")

    def _connect(self, name: str) -> None:
        """Open the session ``name`` as the calling role: ``dblink_connect`` with
        ``conninfo``, or, when it is None (a role that is not a superuser and has no
        password to give), the extension's SECURITY DEFINER ``__worker_connect``, which
        logs in as the session user and sets the role to ``current_user`` (see
        ``entrypoints.training._conninfo``)."""
        if self.conninfo is not None:
            self.cat.dblink_connect(name, self.conninfo)
        else:
            self.cat.query(f"SELECT {self.cat.ext('__worker_connect')}($1, current_user)",
                           [name], ["text"])

    def control(self, sql: str) -> None:
        """Run a statement in the control session (committed at once)."""
        self.cat.dblink_exec(self.name("ctl"), sql)

    def control_query(self, sql: str) -> list[tuple]:
        return self.cat.dblink_query(self.name("ctl"), sql)

    def idle(self) -> list[int]:
        return [w for w in range(self.num_workers) if w not in self.busy]

    def submit(self, worker: int, sql: str) -> None:
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", "XX000")
        self.cat.dblink_send(self.name(worker), sql)
        self.busy[worker] = time.monotonic()

    def wait(self, timeout: float | None = None) -> list[WorkerResult]:
        """Block until at least one busy worker finished (or ``timeout``); return results.

        Polling backs off from ``poll_interval`` to ``max_poll_interval`` (a tenth of the
        time waited so far), so the coordinator's own process takes little CPU from the
        workers on long units and answers quickly on short ones."""
        start = time.monotonic()
        while self.busy:
            done = [w for w in list(self.busy) if not self.cat.dblink_is_busy(self.name(w))]
            if done:
                return [self._collect(w) for w in done]
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                return []
            time.sleep(min(self.max_poll_interval, max(self.poll_interval, waited / 10)))
        return []

    def _collect(self, worker: int) -> WorkerResult:
        del self.busy[worker]
        ok, text, err = self.cat.dblink_result(self.name(worker))
        if not ok:
            return WorkerResult(worker, False, {"message": err or "worker session failed",
                                                "sqlstate": "XX000", "worker": worker})
        data = json.loads(text)
        return WorkerResult(worker, bool(data.get("ok")), data)

    def close(self) -> None:
        """Cancel what is running and close every session (safe to call twice)."""
        for w in list(self.busy):
            try:
                self.cat.dblink_cancel(self.name(w))
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.busy.clear()
        for name in self.opened:
            try:
                self.cat.dblink_disconnect(name)
            except Exception:  # noqa: BLE001
                pass
        self.opened.clear()
