"""How units reach workers: PostgreSQL worker sessions opened with dblink.

The coordinator runs inside the user's statement. :class:`DblinkExecutor` opens one
session per worker to the same database as the calling role, keeps them for the whole fit,
sends each unit as one asynchronous statement (``dblink_send_query``) and collects
results as workers finish (``dblink_is_busy`` / ``dblink_get_result``). Each unit's
statement commits in its worker session on its own. A control session writes the fit's
catalog rows, committed at once so workers and other sessions see them.

Faults. A unit whose statement does not come back with the worker's own JSON answer lost
its session (the backend was terminated, crashed or the connection broke): its result is
``lost`` and :meth:`DblinkExecutor.reopen` gives the worker a fresh session. A unit running
longer than ``unit_timeout`` seconds is ended by ``pg_terminate_backend`` of its session's
backend (pids are recorded when sessions open) and reported lost the same way.

Elasticity. Workers can be added (:meth:`DblinkExecutor.add`, a new session) and retired
(:meth:`DblinkExecutor.retire`, its session closed) while the fit runs.

All SQL text goes through :class:`cerebro_db.catalog.Catalog` or this module.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .errors import CerebroError

RETRYABLE = frozenset({"57014", "57P01", "57P02", "57P03", "40001", "40P01"})
"""SQLSTATEs of a worker's answer that say the session, not the unit, failed (query
cancelled, server shutting down, serialization failure, deadlock): the unit is retried."""


@dataclass(frozen=True)
class WorkerResult:
    """What a worker sent back for one unit (``data["lost"]``: its session was lost)."""

    worker: int
    ok: bool
    data: dict[str, Any]


class DblinkExecutor:
    """``num_workers`` worker sessions plus one control session, over dblink.

    ``unit_timeout``: seconds after which a unit's session is terminated (None: never).
    ``refuse_reopen``: workers whose session cannot be reopened after a loss (a test hook
    the coordinator sets for superusers only, to make a worker's loss permanent).
    """

    def __init__(self, cat: Catalog, tag: str, num_workers: int, conninfo: str | None,
                 poll_interval: float = 0.002, max_poll_interval: float = 0.025,
                 unit_timeout: float | None = None) -> None:
        self.cat = cat
        self.tag = tag
        self.workers: list[int] = list(range(num_workers))
        self.refuse_reopen: set[int] = set()
        self.conninfo = conninfo
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.unit_timeout = unit_timeout
        self.busy: dict[int, float] = {}
        self.opened: list[str] = []
        self.pids: dict[int | str, int] = {}
        self.settings: dict[str, str] = {}
        self._send_failed: dict[int, str] = {}

    def name(self, worker: int | str) -> str:
        return f"cerebro_{self.tag}_{worker}"

    def application_name(self, worker: int | str) -> str:
        return f"cerebro_db {self.tag} worker {worker}"

    def open(self, settings: dict[str, str] | None = None) -> None:
        """Open the control session and every worker session; ``settings`` are set in each."""
        self.settings = dict(settings or {})
        for w in ["ctl", *self.workers]:
            self._connect(w)

    def _login(self, name: str) -> None:
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

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def add(self, worker: int) -> bool:
        """Open a session for a new worker; False (and nothing kept) if that fails."""
        if worker in self.workers:
            raise CerebroError(f"worker {worker} is already open", "XX000")
        try:
            self._connect(worker)
        except Exception:  # noqa: BLE001 - the fit goes on without it
            self._drop(worker)
            return False
        self.workers.append(worker)
        return True

    def retire(self, worker: int) -> None:
        """Close an idle worker's session; it gets no more units."""
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", "XX000")
        self._send_failed.pop(worker, None)
        self._drop(worker)
        if worker in self.workers:
            self.workers.remove(worker)

    def _connect(self, w: int | str) -> None:
        name = self.name(w)
        self._login(name)
        if name not in self.opened:
            self.opened.append(name)
        self.cat.dblink_exec(name, "SET application_name = "
                             + self.cat.literal(self.application_name(w)))
        # every statement sent to the session names its tables and the extension's
        # functions qualified; pinning search_path keeps out any function or operator a
        # role could create in a schema of the database's default search_path
        self.cat.dblink_exec(name, "SET search_path = pg_catalog, pg_temp")
        # a unit reported committed must survive a crash of the server (a resume trusts the
        # catalog), whatever the server's default
        self.cat.dblink_exec(name, "SET synchronous_commit = on")
        for k, v in self.settings.items():
            self.cat.dblink_query(name, f"SELECT pg_catalog.set_config({self.cat.literal(k)}, "
                                        f"{self.cat.literal(v)}, false)")
        self.pids[w] = int(self.cat.dblink_query(name, "SELECT pg_catalog.pg_backend_pid()"
                                                       "::text")[0][0])

    def reopen(self, worker: int) -> bool:
        """Give ``worker`` a fresh session (after its old one was lost); False if that fails."""
        self.busy.pop(worker, None)
        self._send_failed.pop(worker, None)
        self._drop(worker)
        if worker in self.refuse_reopen:
            return False
        try:
            self._connect(worker)
        except Exception:  # noqa: BLE001 - the caller carries on without this worker
            self._drop(worker)
            return False
        return True

    def _drop(self, worker: int | str) -> None:
        name = self.name(worker)
        try:
            self.cat.dblink_disconnect(name)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if name in self.opened:
            self.opened.remove(name)
        self.pids.pop(worker, None)

    def terminate(self, worker: int | str) -> bool:
        """``pg_terminate_backend`` of the worker session's backend (the caller's own role
        may always end its own sessions)."""
        pid = self.pids.get(worker)
        if pid is None:
            return False
        rows = self.cat.query("SELECT pg_catalog.pg_terminate_backend($1) AS t", [pid], ["int4"])
        return bool(rows[0]["t"])

    def control(self, sql: str) -> None:
        """Run a statement in the control session (committed at once); a control session
        that was lost is opened again and the statement retried once (control statements
        are updates of the fit's rows and failure records)."""
        try:
            self.cat.dblink_exec(self.name("ctl"), sql)
        except Exception:  # noqa: BLE001 - a lost session: reconnect and retry once
            self._drop("ctl")
            self._connect("ctl")
            self.cat.dblink_exec(self.name("ctl"), sql)

    def control_query(self, sql: str) -> list[tuple]:
        return self.cat.dblink_query(self.name("ctl"), sql)

    def idle(self) -> list[int]:
        return [w for w in self.workers if w not in self.busy]

    def submit(self, worker: int, sql: str) -> None:
        """Send a unit; a session that cannot take it is reported lost by :meth:`wait`."""
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", "XX000")
        try:
            self.cat.dblink_send(self.name(worker), sql)
        except Exception as e:  # noqa: BLE001 - a lost session, reported as a lost unit
            self._send_failed[worker] = getattr(e, "message", None) or str(e)
        self.busy[worker] = time.monotonic()

    def wait(self, timeout: float | None = None) -> list[WorkerResult]:
        """Block until at least one busy worker finished (or ``timeout``); return results.

        Polling backs off from ``poll_interval`` to ``max_poll_interval`` (a tenth of the
        time waited so far), so the coordinator's own process takes little CPU from the
        workers on long units and answers quickly on short ones. A unit past
        ``unit_timeout`` has its session terminated and comes back lost."""
        start = time.monotonic()
        while self.busy:
            if self._send_failed:
                return [self._lost(w, self._send_failed.pop(w)) for w in list(self._send_failed)]
            done = [w for w in list(self.busy) if not self._is_busy(w)]
            if done:
                return [self._collect(w) for w in done]
            now = time.monotonic()
            if self.unit_timeout is not None:
                late = [w for w, t in self.busy.items() if now - t > self.unit_timeout]
                if late:
                    return [self._timed_out(w) for w in late]
            waited = now - start
            if timeout is not None and waited > timeout:
                return []
            time.sleep(min(self.max_poll_interval, max(self.poll_interval, waited / 10)))
        return []

    def _is_busy(self, worker: int) -> bool:
        try:
            return self.cat.dblink_is_busy(self.name(worker))
        except Exception:  # noqa: BLE001 - a broken connection is not busy; collect says why
            return False

    def _lost(self, worker: int, message: str, pid: int | None = None) -> WorkerResult:
        self.busy.pop(worker, None)
        return WorkerResult(worker, False, {"lost": True, "message": message,
                                            "sqlstate": "08006", "worker": worker,
                                            "worker_pid": pid or self.pids.get(worker)})

    def _timed_out(self, worker: int) -> WorkerResult:
        pid = self.pids.get(worker)
        self.terminate(worker)
        self._drop(worker)
        return self._lost(worker, f"unit exceeded cerebro_db.unit_timeout "
                                  f"({self.unit_timeout:g} s); its session (pid {pid}) was "
                                  "terminated", pid)

    def _collect(self, worker: int) -> WorkerResult:
        try:
            ok, text, err = self.cat.dblink_result(self.name(worker))
        except Exception as e:  # noqa: BLE001
            ok, text, err = False, None, getattr(e, "message", None) or str(e)
        if not ok or text is None:
            return self._lost(worker, (err or "worker session failed").strip())
        del self.busy[worker]
        data = json.loads(text)
        if not data.get("ok") and data.get("sqlstate") in RETRYABLE:
            data["lost"] = True
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


def end_sessions(cat: Catalog, application_prefix: str, wait: float = 60.0) -> int:
    """Terminate the sessions of this role whose application_name starts with
    ``application_prefix`` (an interrupted fit's orphaned workers, which may still be
    finishing a unit) and wait until they are gone; returns how many there were."""
    sql = ("SELECT pid FROM pg_catalog.pg_stat_activity WHERE usename = current_user AND "
           "left(application_name, length($1)) = $1 AND pid <> pg_catalog.pg_backend_pid()")

    def alive() -> list[int]:
        # pg_stat_activity is cached for the transaction: clear it to see sessions end
        cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")
        return [r["pid"] for r in cat.query(sql, [application_prefix], ["text"])]

    pids = alive()
    for pid in pids:
        cat.query("SELECT pg_catalog.pg_terminate_backend($1)", [pid], ["int4"])
    end = time.monotonic() + wait
    while pids and time.monotonic() < end:
        if not alive():
            break
        time.sleep(0.05)
    else:
        if pids and alive():
            raise CerebroError(f"sessions of the interrupted fit ({application_prefix}*) did "
                               f"not end within {wait:g} s", "55006",
                               hint="Wait for them to end, or pg_terminate_backend them.")
    return len(pids)
