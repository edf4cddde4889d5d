"""Units on a distributed engine: :class:`RemoteExecutor`.

The coordinator stays in the calling session and keeps everything it does with worker
sessions (policy, catalog, unit log, progress, notices, outputs, resume, elasticity, and
the control session that commits the fit's catalog rows at once). Only how a unit reaches
a worker changes: each worker slot is a long-lived remote worker placed by an
:class:`~cerebro_db.remote.engine.Engine`, and a unit is a call of
:func:`cerebro_db.remote.unit.run_call` there, which runs the same
:func:`cerebro_db.worker.run_unit` as a worker session over the remote worker's own
database connection, as the calling role.

What a call carries: the database's address as cluster nodes reach it (host, port, dbname,
user = ``current_user``) and non-secret libpq options, the extension's schema, the
worker's ``application_name`` (``cerebro_db <tag> worker <w>``, as a worker session's: a
resume ends an interrupted fit's remote connections like its sessions), the settings
forwarded to worker sessions, and the unit. The password is never sent: the remote
workers take it from their own environment (PGPASSFILE, PGPASSWORD, a service file).

The address: ``cerebro_db.remote_dbhost`` (the host the cluster nodes connect to; default
this server's first ``listen_addresses`` entry, ``localhost`` for a wildcard) and
``cerebro_db.remote_conninfo`` (extra libpq options, e.g. ``sslmode=verify-full``; a
password there is refused). Both are read from the server's configuration files only
(``ALTER SYSTEM``, postgresql.conf: :meth:`~cerebro_db.catalog.Catalog.dba_setting`): a
role cannot point the remote workers, and whatever credentials they hold, at another
server.

Faults. A remote worker that dies mid-unit (or whose engine reports it unreachable) gives
a lost unit, which the coordinator re-queues as for a lost session; :meth:`reopen` asks the
engine for a replacement worker for the slot. A unit past its time limit has its database
connection terminated (``pg_terminate_backend`` of the backend with the worker's
``application_name``), its call released, and comes back lost. Closing the executor (fit
done, failed or cancelled) cancels every call in flight and closes the engine's client.
"""
from __future__ import annotations

import re
import time
import traceback
from collections.abc import Sequence
from typing import Any

from ..catalog import Catalog
from ..catalog import remote as remote_sql
from ..errors import (
    INSUFFICIENT_PRIVILEGE,
    INTERNAL_ERROR,
    INVALID_PARAMETER_VALUE,
    SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    CerebroError,
)
from ..executors import RETRYABLE, DblinkExecutor, StallRule, WorkerResult, reraise_cancel
from . import EXECUTOR_SETTING, ExecutorURL, engine_for, parse_executor, require_package
from .engine import WorkerLost

DBHOST_SETTING = "cerebro_db.remote_dbhost"
ALLOWED_SETTING = "cerebro_db.allowed_executors"
CONNINFO_SETTING = "cerebro_db.remote_conninfo"
CANNOT_CONNECT = SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION

_SET_BY_CEREBRO = frozenset({"user", "dbname", "host", "hostaddr", "port", "service"})
"""libpq keywords ``cerebro_db.remote_conninfo`` may not hold: who and where the remote
workers log in is the fit's (the calling role, its database, ``remote_dbhost``)."""
_OPTION = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+)")


def parse_conninfo(text: str | None) -> dict[str, str]:
    """libpq ``keyword=value`` pairs (values may be single-quoted); a 22023 error for a
    malformed string or one that names a password (the value is never shown)."""
    out: dict[str, str] = {}
    raw = (text or "").strip()
    at = 0
    while at < len(raw):
        m = _OPTION.match(raw, at)
        if m is None:
            raise CerebroError(f"invalid value for {CONNINFO_SETTING} at position {at + 1}",
                               INVALID_PARAMETER_VALUE,
                               hint="Use libpq keyword=value pairs, e.g. 'sslmode=verify-full'.")
        key, value = m.group(1).lower(), m.group(2)
        if key in _SET_BY_CEREBRO:
            # the workers log in as the calling role to the fit's database on
            # remote_dbhost; a user= here ran every role's units as that user (an outside
            # pass)
            raise CerebroError(f"{CONNINFO_SETTING} may not set {key}: cerebro_db sets it",
                               INVALID_PARAMETER_VALUE,
                               hint="The remote workers connect as the calling role to the "
                               f"fit's database; set the host in {DBHOST_SETTING}.")
        if key == "password" or "password" in key:
            raise CerebroError(f"{CONNINFO_SETTING} may not hold a password",
                               INVALID_PARAMETER_VALUE,
                               hint="Give the remote workers' nodes the role's password in "
                               "their own PGPASSFILE (or PGPASSWORD, a service file); the "
                               "database never sends it.")
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out[key] = value
        at = m.end()
        while at < len(raw) and raw[at].isspace():
            at += 1
    return out


def executor_url(cat: Catalog) -> ExecutorURL | None:
    """The fit's executor from ``cerebro_db.executor``: None for worker sessions; for a
    remote engine, checked before any work (the URL, the engine's package on this server,
    ``cerebro_db.remote_conninfo``)."""
    url = parse_executor(cat.setting(EXECUTOR_SETTING))
    if url is not None:
        require_allowed(url, cat.dba_setting(ALLOWED_SETTING))
        require_package(url)
        parse_conninfo(cat.dba_setting(CONNINFO_SETTING))
    return url


def require_allowed(url: ExecutorURL, allowed: str | None) -> None:
    """A remote engine's client unpickles what the cluster sends, inside this server's
    backend: a cluster can run code as the database server's OS user. So a fit may use only
    the clusters the DBA lists in ``cerebro_db.allowed_executors`` (postgresql.conf or ALTER
    SYSTEM, comma-separated ``cerebro_db.executor`` values; a value a role SETs is ignored):
    42501 for any other, before any work."""
    listed, malformed = set(), []
    for text in (allowed or "").split(","):
        if text.strip():
            try:
                u = parse_executor(text)
            except CerebroError:
                malformed.append(text.strip())  # a malformed entry allows nothing
                continue
            if u is not None:
                listed.add((u.engine, u.address))
    if (url.engine, url.address) not in listed:
        # the DBA's typo (a missing comma, a trailing '/') is said, not silently dropped
        detail = (f"{ALLOWED_SETTING} has entries that are not executor URLs and allow "
                  f"nothing: {'; '.join(repr(t[:80]) for t in malformed[:5])}"
                  if malformed else None)
        raise CerebroError(
            f'{EXECUTOR_SETTING} "{url}" is not a cluster this server may use',
            INSUFFICIENT_PRIVILEGE, detail=detail,
            hint=f"A superuser lists the clusters fits may run on in {ALLOWED_SETTING} "
            "(ALTER SYSTEM or postgresql.conf, then SELECT pg_reload_conf()); list only "
            "clusters as trusted as the database server itself: a cluster's nodes can run code "
            "in it.")


def remote_database(cat: Catalog) -> dict[str, Any]:
    """Where the remote workers connect, as whom, with which libpq options (no secret)."""
    row = remote_sql.remote_database(cat)
    host = cat.dba_setting(DBHOST_SETTING)
    if not host:
        first = (row["l"] or "").split(",")[0].strip()
        host = "localhost" if first in ("", "*", "0.0.0.0", "::") else first
    return {"host": host, "port": int(row["p"]), "dbname": row["d"], "user": row["u"],
            "options": parse_conninfo(cat.dba_setting(CONNINFO_SETTING))}


class RemoteExecutor(DblinkExecutor):
    """Worker slots on a remote engine, plus this server's control session (dblink).

    ``engine``: an :class:`~cerebro_db.remote.engine.Engine` to use instead of
    :func:`~cerebro_db.remote.engine_for` of ``url`` (made in :meth:`open`)."""

    def __init__(self, cat: Catalog, tag: str, num_workers: int, conninfo: str | None,
                 url: ExecutorURL | str, unit_timeout: float | StallRule | None = None,
                 engine: Any = None, **kw: Any) -> None:
        super().__init__(cat, tag, num_workers, conninfo, unit_timeout=unit_timeout, **kw)
        parsed = parse_executor(url) if isinstance(url, str) else url
        if parsed is None:
            raise CerebroError("the remote executor needs a dask:// or ray:// address",
                               INVALID_PARAMETER_VALUE)
        self.url = parsed
        self.engine = engine
        self.db: dict[str, Any] = {}

    # remote workers are not database sessions: none is kept for the next fit
    @property
    def keep_idle(self) -> float:
        return 0.0

    @keep_idle.setter
    def keep_idle(self, value: float) -> None:
        pass

    def open(self, settings: dict[str, str] | None = None) -> None:
        """Open the control session, connect the engine's client and place a remote worker
        for every slot."""
        self.settings = dict(settings or {})
        self._connect("ctl")
        self.db = remote_database(self.cat)
        if self.engine is None:
            try:
                self.engine = engine_for(self.url)
            except CerebroError:
                raise
            except Exception as e:  # noqa: BLE001 - the cluster cannot be reached
                reraise_cancel(e)
                raise CerebroError(f'could not connect to the executor "{self.url}": '
                                   f"{type(e).__name__}: {e}", CANNOT_CONNECT,
                                   hint=f"Check that the cluster runs and this server can "
                                   f"reach it, or RESET {EXECUTOR_SETTING}.") from None
        for w in self.workers:
            try:
                self._connect(w)
            except Exception as e:  # noqa: BLE001
                reraise_cancel(e)
                raise CerebroError(f'could not start remote worker {w} on "{self.url}": '
                                   f"{type(e).__name__}: {e}", CANNOT_CONNECT,
                                   hint="The cluster needs at least one live worker.") from None
        self.cat.notice(f"units of this fit run on {self.url} ({len(self.workers)} remote "
                        "workers)")

    def _connect(self, w: int | str) -> None:
        if w == "ctl":
            super()._connect(w)
            return
        self.engine.start_worker(int(w))
        pid = self.engine.pid(int(w))
        if pid is not None:
            self.pids[w] = int(pid)

    def _drop(self, worker: int | str) -> None:
        if worker == "ctl":
            super()._drop(worker)
            return
        self.pids.pop(worker, None)
        if self.engine is not None:
            try:
                self.engine.stop_worker(int(worker))
            except Exception as e:  # noqa: BLE001 - already gone
                reraise_cancel(e)

    def terminate(self, worker: int | str) -> bool:
        """End the database backend of the remote worker's connection (its unit then fails
        at its next statement); the caller's role may always end its own backends."""
        return remote_sql.terminate_application(self.cat, self.application_name(worker))

    def backend_pids(self) -> dict[int, int]:
        names = {self.application_name(w): w for w in self.busy}
        if not names:
            return {}
        pids = remote_sql.backends_of_applications(self.cat, list(names))
        return {names[a]: pid for a, pid in pids.items()}

    def _call(self, worker: int, **what: Any) -> dict[str, Any]:
        return {"db": self.db, "schema": self.cat.schema,
                "application_name": self.application_name(worker),
                "settings": dict(self.settings), "worker": int(worker), **what}

    def submit(self, worker: int, sql: str, key: tuple[Any, str] | None = None) -> None:
        raise CerebroError("a remote executor runs units, not SQL statements", INTERNAL_ERROR)

    def can_bundle(self) -> int:
        """One unit per call: a remote worker answers each call on its own."""
        return 1

    def submit_unit(self, worker: int, fit_id: int, mst_key: int, epoch: int,
                    partition: int, kind: str, options: dict[str, Any],
                    key: tuple[Any, str] | None = None,
                    then: Sequence[tuple[dict[str, Any], tuple[Any, str] | None]] = ()
                    ) -> None:
        if then:
            raise CerebroError("a remote worker takes one unit per call", INTERNAL_ERROR)
        self._send(worker, self._call(worker, fit_id=int(fit_id), mst_key=int(mst_key),
                                      epoch=int(epoch), partition=int(partition), kind=kind,
                                      options=dict(options)), key)

    def submit_check(self, worker: int, spec: dict[str, Any]) -> None:
        self._send(worker, self._call(worker, check=True, spec=spec), None)

    def _send(self, worker: int, call: dict[str, Any], key: tuple[Any, str] | None) -> None:
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", INTERNAL_ERROR)
        try:
            self.engine.submit(worker, call)
        except Exception as e:  # noqa: BLE001 - reported as a lost unit by wait()
            reraise_cancel(e)
            self._send_failed[worker] = f"remote worker {worker}: {type(e).__name__}: {e}"
        self.busy[worker] = time.monotonic()
        self.limits[worker] = self._limit(key, worker)
        if key is not None:
            self._keys[worker] = key

    def _is_busy(self, worker: int) -> bool:
        try:
            return not self.engine.done(worker)
        except Exception as e:  # noqa: BLE001 - collect says why
            reraise_cancel(e)
            return False

    def _collect(self, worker: int) -> WorkerResult:
        try:
            data = self.engine.result(worker)
        except WorkerLost as e:
            # the dead worker's database backend may still run the unit's statement (and
            # hold its locks) until it notices: end it before the unit is retried
            try:
                self.terminate(worker)
            except Exception as te:  # noqa: BLE001 - reported lost all the same
                reraise_cancel(te)
            return self._lost(worker, f"remote worker {worker} was lost: {e}")
        except Exception as e:  # noqa: BLE001 - the engine could not say: lost
            reraise_cancel(e)
            why = str(e).strip()
            if not why:  # e.g. Ray Client's bare AssertionError on a dead channel
                tb = traceback.extract_tb(e.__traceback__)
                why = (f"no message, raised in {tb[-1].filename}:{tb[-1].lineno}" if tb
                       else "no message")
            return self._lost(worker, f"remote worker {worker} failed: {type(e).__name__}: "
                                      f"{why}")
        if not isinstance(data, dict):
            return self._lost(worker, f"remote worker {worker} gave no result")
        seconds = time.monotonic() - self.busy.pop(worker)
        key = self._keys.pop(worker, None)
        self._fresh.discard(worker)
        if data.get("ok") and key is not None:
            self.unit_times.setdefault(key, []).append(seconds)
        state = str(data.get("sqlstate") or "")
        if not data.get("ok") and (state in RETRYABLE or state.startswith("08")):
            data["lost"] = True
            data.setdefault("worker_pid", self.pids.get(worker))
        return WorkerResult(worker, bool(data.get("ok")), data)

    def close(self, keep: bool = False) -> None:
        """Cancel every call in flight (its database backend is terminated, so the unit
        commits nothing more, as a cancelled statement of a worker session), close the
        engine's client, then the control session (safe to call twice)."""
        for w in list(self.busy):
            try:
                self.terminate(w)
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        engine, self.engine = self.engine, None
        self.busy.clear()
        self._keys.clear()
        if engine is not None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        super().close(keep=False)
