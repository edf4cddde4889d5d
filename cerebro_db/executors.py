"""How units reach workers: PostgreSQL worker sessions opened with dblink.

The coordinator runs inside the user's statement. :class:`DblinkExecutor` opens one
session per worker to the same database as the calling role, keeps them for the whole fit,
sends each unit as one asynchronous statement (``dblink_send_query``) and collects
results as workers finish (``dblink_is_busy`` / ``dblink_get_result``; the coordinator
sleeps on a :class:`~cerebro_db.wakeup.Waker` that each unit pokes as it ends, so it neither
spins nor oversleeps). Each unit's
statement commits in its worker session on its own. A control session writes the fit's
catalog rows, committed at once so workers and other sessions see them.

Faults. A unit whose statement does not come back with the worker's own JSON answer lost
its session (the backend was terminated, crashed or the connection broke): its result is
``lost`` and :meth:`DblinkExecutor.reopen` gives the worker a fresh session. A unit running
longer than its time limit is ended by ``pg_terminate_backend`` of its session's backend
(pids are recorded when sessions open) and reported lost the same way: the limit is
``unit_timeout`` seconds when that is a number, else a :class:`StallRule` derived from the
measured times of the configuration's completed units (a stalled worker, e.g. a stopped
backend, is detected by default). A lost control session is opened again.

Interrupts. A query cancel of the coordinator (``pg_cancel_backend``, ``statement_timeout``)
surfaces as an SQL error with SQLSTATE 57014 from the next SPI call; it is never swallowed
by the handlers of worker faults (:func:`reraise_cancel`), so it ends the fit. While units
run, :meth:`DblinkExecutor.wait` also polls (every ``check_interval`` seconds) the fit's
``cancel_requested`` flag (set by ``cerebro_db_cancel_fit`` from another session), raising
:class:`FitCancelled`, and the locks its workers wait for: a worker queued behind a session
that itself waits for this fit's coordinator (DDL on the source table while the fit's
transaction holds a lock on it) is a deadlock the server cannot see, because the coordinator
waits for its workers through dblink; the fit fails at once with SQLSTATE 40P01 naming the
blocking session.

Pipelined dispatch. With ``pipeline_depth`` > 1 (``cerebro_db.pipeline_depth``) a unit
travels as a chain: its ``__run_unit`` statement and then ``pipeline_depth - 1`` slots
(``__run_slot``), each in a transaction of its own (``BEGIN``, the statement, ``COMMIT``
and a row larger than the server's output buffer, which pushes the answers out as they
come: :func:`cerebro_db.catalog.sessions.run_chain`). A statement's answer comes back
before its commit, so a unit counts as done only once its ``COMMIT``'s status has come back
too; the pad and the next slot's ``BEGIN`` may come well before that answer (seen in the
benchmark's fits), and are then read without waiting on that session for the answer
(:meth:`DblinkExecutor._collect_slot`). While a worker's unit runs, the coordinator posts
its next unit in the next slot (:meth:`DblinkExecutor.queue_unit`, a row of
``unit_postings`` written by the control session), and the worker starts it as soon as its
unit has committed, without waiting for the coordinator to notice the end, decide and send
a statement. A slot with nothing posted waits for a posting (:meth:`submit_unit` posts
there when the worker is idle) until the coordinator posts 'stop' (at the end of the fit)
or, after ``entrypoints.units.SLOT_WAIT``, abandons it; the rest of the chain then answers
at once and the next unit goes as a new statement.

Evaluation bundles. With ``eval_bundle`` > 1 (``cerebro_db.eval_bundle``, on by default)
and no chains, the coordinator may send a worker several evaluation units in one statement
(``"then"`` in the first unit's options: the worker runs them one after another and answers
all their results at once, :func:`cerebro_db.entrypoints.units.run_unit`); :meth:`wait`
hands them back as one result each, in order. A bundle's units commit together, and its
time limit is the sum of its units' limits.

Elasticity. Workers can be added (:meth:`DblinkExecutor.add`, a new session) and retired
(:meth:`DblinkExecutor.retire`, its session closed) while the fit runs.

Reuse between fits. With ``keep_idle`` > 0 (``cerebro_db.worker_idle_timeout``), a fit
that ends well leaves its idle worker sessions open in this backend's pool
(``application_name`` ``cerebro_db_pool <coordinator pid>``, ``idle_session_timeout`` set),
so the next fit of the same calling session skips TensorFlow's import. Only sessions of a
caller whose ``current_user`` is its ``session_user`` are kept: a kept dblink connection can
be used by whatever runs later in the calling session, so it must not act as a role that
session did not log in as (a fit inside a SECURITY DEFINER function, or after SET ROLE, closes
its sessions as before). A pooled session is reused only by the same role (``current_user``,
``session_user`` and connection string as when it was opened), after ``RESET ALL``; one that
died (idle timeout, terminated) is closed and a fresh one opened. The pool ends with the
calling session, after the idle timeout, or with :func:`close_pool`
(``cerebro_db_close_workers()``).

The statements are :mod:`cerebro_db.catalog.sessions`'s.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .catalog import sessions as sql
from .errors import (
    ADMIN_SHUTDOWN,
    CANNOT_CONNECT_NOW,
    CONNECTION_FAILURE,
    CRASH_SHUTDOWN,
    DEADLOCK_DETECTED,
    INTERNAL_ERROR,
    OBJECT_IN_USE,
    QUERY_CANCELED,
    SERIALIZATION_FAILURE,
    SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    CerebroError,
)
from .wakeup import Waker

RETRYABLE = frozenset({QUERY_CANCELED, ADMIN_SHUTDOWN, CRASH_SHUTDOWN, CANNOT_CONNECT_NOW, SERIALIZATION_FAILURE, DEADLOCK_DETECTED})
"""SQLSTATEs of a worker's answer that say the session, not the unit, failed (query
cancelled, server shutting down, serialization failure, deadlock): the unit is retried."""


POOL_APPLICATION = "cerebro_db_pool"

WOKEN_POLL_FOR = 1.5
"""Seconds the coordinator keeps polling after a worker's poke (:mod:`cerebro_db.wakeup`),
with :func:`_commit_nap`'s back-off, until the unit's commit is through: a few milliseconds
as a rule, but held up by the server's WAL flush for 100-1100 ms on the benchmark machine.
It was 0.05 s: a commit held up longer was then noticed only after a whole
:data:`WAKER_NAP` (seen in the benchmark: two workers' commits held up 90-100 ms together,
then both idle 0.16 s in all, in 7 of 172 fits)."""
WOKEN_POLL_INTERVAL = 0.0002
"""Seconds between two polls in that time."""
COMMIT_POLL_MAX = 0.01
"""Seconds between two polls, at most, while the coordinator waits for a statement of a
worker that has answered and is still committing or reading its chain to the end
(:func:`_commit_nap`): a commit takes a few milliseconds, but one held up by the server's WAL
flush took 100-1100 ms on the benchmark machine. Polled every :data:`WOKEN_POLL_INTERVAL`
throughout, commits held up 100 ms each (``commit_delay``) cost the coordinator 0.33 s of CPU
per Adult fit under MOP and 0.71 s under the ring, taken from the workers; 0.24 and 0.34 s
with this back-off."""
WAKER_NAP = 0.1
"""Seconds the coordinator sleeps between two polls while the workers' pokes arrive: a
worker whose session ends without a poke (it was terminated) is still noticed that soon."""
WAKER_TRUSTED_AFTER = 3
"""Units collected in a row without a poke before them (workers on another host, which
cannot reach the socket) after which the coordinator polls with its back-off again."""


def _open_error(e: BaseException, w: int | str, sessions: int) -> BaseException:
    """A session that could not be opened, with a hint where the cause is the server's
    configuration (an outside pass found these without one): the login's authentication, or
    too many connections. Other errors are returned as they are."""
    msg = (getattr(e, "message", None) or str(e)).strip()
    spidata = getattr(e, "spidata", None)  # PL/Python's SPIError: (code, detail, hint, ...)
    detail = getattr(e, "detail", None) or (
        spidata[1] if isinstance(spidata, tuple) and len(spidata) > 1 and spidata[1] else "")
    text = f"{msg} {detail}".lower()
    what = "its control session" if w == "ctl" else f"worker session {w}"
    if any(k in text for k in ("authentication failed", "no password supplied",
                               "password is required", "password was not supplied")):
        hint = ("Worker sessions log in to this server as the calling role. Let that login "
                "connect without a password from the server itself (pg_hba.conf: trust on the "
                "local socket, or peer for the server's OS user through a pg_ident map), or "
                "give the role's password: SET cerebro_db.worker_conninfo = 'password=...' "
                "(README, Security).")
    elif ("too many" in text and ("connection" in text or "client" in text)) \
            or "connection slots are reserved" in text:
        # PostgreSQL 15 tells a role without superuser (or pg_use_reserved_connections) that
        # the last slots are reserved, not that there are too many clients
        hint = (f"A fit holds {sessions} sessions of its own (a control session and one per "
                "worker) beside the caller's: raise max_connections or the role's CONNECTION "
                "LIMIT, or pack the data into fewer partitions. Each session that ran a fit "
                "keeps its idle worker sessions for the next one (cerebro_db.worker_idle_timeout"
                "); SELECT cerebro_db_close_workers() in those sessions gives them back.")
    else:
        return e
    sqlstate = getattr(e, "sqlstate", None) or SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION
    return CerebroError(f"could not open {what}: {msg}", sqlstate, detail=detail or None,
                        hint=hint)


def _commit_nap(waited: float) -> float:
    """Seconds to sleep before polling again a worker statement that has answered and
    should end soon (``waited``: seconds so far): :data:`WOKEN_POLL_INTERVAL` for the first
    two milliseconds, then a tenth of the time waited, at most :data:`COMMIT_POLL_MAX`; the
    answer comes at most that much later than it could, and a commit held up for a second
    costs about 140 polls instead of 5,000."""
    return min(COMMIT_POLL_MAX, max(WOKEN_POLL_INTERVAL, waited / 10))


@dataclass
class _Parked:
    """An idle worker session kept open between fits (see :meth:`DblinkExecutor.close`)."""

    name: str
    pid: int
    key: tuple[Any, ...]
    roles: tuple[str, str]
    since: float
    timeout: float


_pool: list[_Parked] = []
"""This backend's idle worker sessions, oldest first (a PL/Python module lives as long as
the session; so do its dblink connections)."""

_told_not_kept = False
"""Whether this backend was told why its worker sessions are not kept (once a session)."""


def close_pool(cat: Catalog) -> int:
    """Close this backend's pooled worker sessions that act as the calling role
    (``current_user``); returns how many. Another role's code running in the session (its
    SECURITY DEFINER function, a policy of its table) closes none of the session's own (a
    red-team pass closed them that way)."""
    me = sql.roles(cat)["c"]
    mine = [p for p in _pool if p.roles[0] == me]
    for p in mine:
        _pool.remove(p)
        _quiet_disconnect(cat, p.name)
    return len(mine)


def _quiet_disconnect(cat: Catalog, name: str) -> None:
    try:
        cat.dblink_disconnect(name)
    except Exception:  # noqa: BLE001, S110 - already gone
        pass




class FitCancelled(CerebroError):
    """The fit was cancelled (``cerebro_db_cancel_fit``); SQLSTATE 57014."""


def is_cancel(e: BaseException) -> bool:
    """Whether ``e`` is a query cancel of this backend (``pg_cancel_backend``,
    ``statement_timeout``: PL/Python's ``plpy.spiexceptions.QueryCanceled``) or a
    :class:`FitCancelled`: SQLSTATE 57014. Worker answers never raise (they come back as
    JSON), and the control and worker sessions run with ``statement_timeout = 0``, so an
    SQL error with 57014 in the coordinator is the coordinator's own cancel."""
    return getattr(e, "sqlstate", None) == QUERY_CANCELED


def reraise_cancel(e: BaseException) -> None:
    """Raise ``e`` again when it is a cancel (see :func:`is_cancel`); handlers of worker
    faults call this first, so a cancel is never taken for a lost session."""
    if is_cancel(e):
        raise e


@dataclass(frozen=True)
class StallRule:
    """When a unit counts as stalled (its session is then terminated and the unit retried):
    after ``max(floor, factor x the median of the completed units of its configuration and
    kind)`` seconds; before any of them completed, the median of all completed units of
    that kind; before any unit of the kind completed, and for the first unit of a session
    opened again after a loss, ``first`` seconds at least."""

    floor: float = 60.0
    factor: float = 10.0
    first: float = 600.0

    def limit(self, own: list[float], same_kind: list[float], fresh: bool = False) -> float:
        """The limit of a unit; ``fresh``: the first unit of a session opened again after a
        loss, which also pays that session's start-up (TensorFlow's import, the first read,
        the model's build and trace) that no completed unit measured, so it gets ``first``
        seconds at least (on a slow host the start-up alone outlasted a low floor, and the
        retried unit was declared stalled again at every attempt)."""
        times = own or same_kind
        limit = max(self.floor, self.factor * statistics.median(times)) if times else self.floor
        return max(limit, self.first) if fresh or not times else limit


@dataclass(frozen=True)
class WorkerResult:
    """What a worker sent back for one unit (``data["lost"]``: its session was lost)."""

    worker: int
    ok: bool
    data: dict[str, Any]


class DblinkExecutor:
    """``num_workers`` worker sessions plus one control session, over dblink.

    ``unit_timeout``: seconds after which a unit's session is terminated, a
    :class:`StallRule` (a limit per unit from the measured unit times), or None (never).
    ``fit_id``: set once the fit is registered; :meth:`wait` then polls its cancel flag.
    ``refuse_reopen``: workers whose session cannot be reopened after a loss (a test hook
    the coordinator sets for superusers only, to make a worker's loss permanent).
    """

    def __init__(self, cat: Catalog, tag: str, num_workers: int, conninfo: str | None,
                 poll_interval: float = 0.002, max_poll_interval: float = 0.025,
                 unit_timeout: float | StallRule | None = None) -> None:
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
        self.keep_idle = 0.0
        self._pool_key: tuple[Any, ...] | None = None
        self._maintainer = True  # set with the pool key
        self.maintainer_keeps = False  # cerebro_db.keep_workers_as_maintainer
        self._conn: dict[int | str, str] = {}
        self.fit_id: int | None = None
        self.check_interval = 0.5
        self._last_check = 0.0
        self.limits: dict[int, float | None] = {}
        self._keys: dict[int, tuple[Any, str]] = {}
        self.unit_times: dict[tuple[Any, str], list[float]] = {}
        self._fresh: set[int] = set()  # reopened after a loss, no unit answered since
        self._waker: Waker | None = None
        self._pokes = 0  # pokes not yet matched by a collected unit
        self._credits = 0  # units sent that may still poke (one fast-polling spell each)
        self._unpoked = 0  # units collected in a row without a poke before them
        self._will_poke: set[int] = set()  # busy workers whose statement pokes as it ends
        self._woken = float("-inf")
        self.pipeline_depth = 1  # statements per chain (1: one unit per statement)
        self.chained = False  # whether units go as chains (the coordinator queues ahead)
        self.eval_bundle = 1  # evaluation units one statement may carry (see the module)
        self._then_keys: dict[int, list[tuple[Any, str] | None]] = {}  # a bundle's others
        self._slot: dict[int, int] = {}  # worker -> the chain's slot it runs or waits on
        self._last: dict[int, int] = {}  # worker -> its chain's last slot
        self._posted: dict[int, tuple[int, tuple[Any, str] | None]] = {}  # next slot's unit
        self._waiting: set[int] = set()  # workers whose chain waits on a slot: no unit runs
        self._seqs: dict[int, int] = {}  # worker -> the next slot number to use
        self._fit: dict[int, int] = {}  # worker -> the fit of its chain

    def name(self, worker: int | str) -> str:
        return self._conn.get(worker) or f"cerebro_{self.tag}_{worker}"

    def application_name(self, worker: int | str) -> str:
        return f"cerebro_db {self.tag} worker {worker}"

    def open(self, settings: dict[str, str] | None = None) -> None:
        """Open the control session and every worker session; ``settings`` are set in each."""
        self.settings = dict(settings or {})
        if self._waker is None:
            try:
                self._waker = Waker()
            except OSError:  # no socket here: the coordinator only polls
                self._waker = None
        names: list[int | str] = ["ctl", *self.workers]
        for w in names:
            try:
                self._connect(w)
            except Exception as e:
                reraise_cancel(e)
                raise _open_error(e, w, len(names)) from e

    def _login(self, name: str) -> None:
        """Open the session ``name`` as the calling role: ``dblink_connect`` with
        ``conninfo``, or, when it is None (a role that is not a superuser and has no
        password to give), the extension's SECURITY DEFINER ``__worker_connect``, which
        logs in as the session user and sets the role to ``current_user`` (see
        :func:`cerebro_db.sessions.conninfo`)."""
        if self.conninfo is not None:
            self.cat.dblink_connect(name, self.conninfo)
        else:
            sql.worker_connect(self.cat, name)

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def add(self, worker: int) -> bool:
        """Open a session for a new worker; False (and nothing kept) if that fails."""
        if worker in self.workers:
            raise CerebroError(f"worker {worker} is already open", INTERNAL_ERROR)
        try:
            self._connect(worker)
        except Exception as e:  # noqa: BLE001 - the fit goes on without it
            reraise_cancel(e)
            self._drop(worker)
            return False
        self.workers.append(worker)
        return True

    def retire(self, worker: int) -> None:
        """Close an idle worker's session; it gets no more units."""
        if worker in self._waiting:
            self._post(worker, self._slot[worker], self._fit[worker], "stop", None)
            self._drain(worker)
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", INTERNAL_ERROR)
        self._send_failed.pop(worker, None)
        self._drop(worker)
        if worker in self.workers:
            self.workers.remove(worker)

    def _connect(self, w: int | str) -> None:
        if w == "ctl" or not self._reuse(w):
            self._login(self.name(w))
        name = self.name(w)
        if name not in self.opened:
            self.opened.append(name)
        self.cat.dblink_exec(name, sql.set_application_name(self.cat, self.application_name(w)))
        self.cat.dblink_exec(name, sql.SESSION_PINS)
        for k, v in self.settings.items():
            self.cat.dblink_query(name, sql.set_config(self.cat, k, v))
        self.pids[w] = int(self.cat.dblink_query(name, sql.BACKEND_PID)[0][0])

    def pool_key(self) -> tuple[Any, ...]:
        """Who may reuse a pooled session: this connection string and calling role."""
        if self._pool_key is None:
            row = sql.roles(self.cat)
            self._maintainer = bool(row["m"])
            self._pool_key = (self.conninfo, row["c"], row["s"], row["d"])
        return self._pool_key

    def _reuse(self, w: int | str) -> bool:
        """Give worker ``w`` an idle session from the pool (same role, alive, its settings
        reset); False when there is none to take."""
        if self.keep_idle <= 0 or not _pool or not self.may_keep():
            return False
        key, now = self.pool_key(), time.monotonic()
        for s in list(_pool):
            if now - s.since > s.timeout:  # idle_session_timeout has ended it, or will
                _pool.remove(s)
                _quiet_disconnect(self.cat, s.name)
        for s in list(_pool):
            if s.key != key:
                continue
            _pool.remove(s)
            try:
                self.cat.dblink_exec(s.name, sql.RESET_ALL)
                row = self.cat.dblink_query(s.name, sql.ROLES_AND_PID)[0][0]
            except Exception:  # noqa: BLE001 - it died while idle: open a fresh one
                _quiet_disconnect(self.cat, s.name)
                continue
            if row != f"{s.roles[0]},{s.roles[1]},{s.pid}":
                _quiet_disconnect(self.cat, s.name)
                continue
            self._conn[w] = s.name
            return True
        return False

    def may_keep(self) -> bool:
        """Whether this caller's sessions may outlive the fit: only when it acts as the role
        it logged in as (see the module), and that role cannot VACUUM or ANALYZE other
        roles' tables (a superuser, the database's owner): those commands run a table
        owner's index functions in this session, where they could use a kept connection of
        the session user (``dblink_exec`` is PUBLIC's, ``dblink_get_connections`` names it).
        Such a session keeps them only with ``cerebro_db.keep_workers_as_maintainer`` on."""
        _, current, session, _ = self.pool_key()
        return current == session and (not self._maintainer or self.maintainer_keeps)

    def _say_not_kept(self) -> None:
        """Say once per calling session why its worker sessions were closed, not kept: its
        next fit starts cold (TensorFlow's import, the first reads: 2-3 s), which an outside
        pass, logged in as the superuser the README's connection table names, saw happen
        with no word of why."""
        global _told_not_kept
        if _told_not_kept:
            return
        _told_not_kept = True
        _, current, session, _ = self.pool_key()
        why = (f'it acts as role "{current}", not as "{session}" that it logged in as'
               if current != session else
               f'role "{session}" may VACUUM and ANALYZE other roles\' tables (SET '
               "cerebro_db.keep_workers_as_maintainer = on keeps them; README, Security)")
        self.cat.notice("worker sessions closed, not kept for this session's next fit "
                        f"(which will start them again): {why}")

    def _park(self, worker: int) -> bool:
        """Keep an idle worker's session in the pool for the next fit; False if it cannot."""
        name, pid = self.name(worker), self.pids.get(worker)
        if pid is None:
            return False
        try:
            self.cat.dblink_exec(name, sql.set_application_name(
                self.cat, f"{POOL_APPLICATION} {self.pid_of_caller()}"))
            self.cat.dblink_exec(name, sql.set_idle_session_timeout(
                self.cat, max(1, int(self.keep_idle * 1000))))
            roles = self.cat.dblink_query(name, sql.ROLES)[0][0].split(",")
        except Exception:  # noqa: BLE001 - not reusable: closed with the rest
            return False
        _pool.append(_Parked(name, pid, self.pool_key(), (roles[0], roles[1]),
                             time.monotonic(), self.keep_idle))
        self.opened.remove(name)
        return True

    def pid_of_caller(self) -> int:
        return sql.backend_pid(self.cat)

    def reopen(self, worker: int) -> bool:
        """Give ``worker`` a fresh session (after its old one was lost); False if that fails."""
        self.busy.pop(worker, None)
        self._end_chain(worker)
        self._unexpect(worker)
        self._send_failed.pop(worker, None)
        self._drop(worker)
        if worker in self.refuse_reopen:
            return False
        try:
            self._connect(worker)
        except Exception as e:  # noqa: BLE001 - the caller carries on without this worker
            reraise_cancel(e)
            self._drop(worker)
            return False
        self._fresh.add(worker)
        return True

    def _drop(self, worker: int | str) -> None:
        name = self.name(worker)
        try:
            self.cat.dblink_disconnect(name)
        except Exception as e:  # noqa: BLE001 - already gone
            reraise_cancel(e)
        if name in self.opened:
            self.opened.remove(name)
        self.pids.pop(worker, None)
        self._conn.pop(worker, None)

    def terminate(self, worker: int | str) -> bool:
        """``pg_terminate_backend`` of the worker session's backend (the caller's own role
        may always end its own sessions)."""
        pid = self.pids.get(worker)
        if pid is None:
            return False
        return sql.terminate_backend(self.cat, pid)

    def control(self, sql: str) -> None:
        """Run a statement in the control session (committed at once); a control session
        that was lost is opened again and the statement retried once (control statements
        are updates of the fit's rows and failure records)."""
        self.control_query(sql)

    def control_query(self, sql: str) -> list[tuple]:
        """A statement in the control session (committed at once): its rows (one text
        column) or command status; a lost control session is opened again and the
        statement retried once. It is sent and polled, not waited for inside dblink, so
        that a lock wait of the control session behind a session that waits for this
        backend is found (:meth:`check_lock_waits`) instead of hanging the fit: a DBA's
        ``VACUUM FULL`` of a catalog table during a fit queued behind the fit's
        transaction, the control session and the workers behind it, for 12 minutes until
        it was cancelled (an outside pass)."""
        try:
            return self._control_rows(sql)
        except Exception as e:  # a lost session: reconnect and retry once
            reraise_cancel(e)
            if isinstance(e, CerebroError) and e.sqlstate == DEADLOCK_DETECTED:
                raise
            self._drop("ctl")
            self._connect("ctl")
            return self._control_rows(sql)

    def _control_rows(self, sql: str) -> list[tuple]:
        name = self.name("ctl")
        self.cat.dblink_send(name, sql)
        start = last = time.monotonic()
        while self.cat.dblink_is_busy(name):
            now = time.monotonic()
            if now - last >= self.check_interval and "ctl" in self.pids:
                last = now
                self.check_lock_waits({"ctl": self.pids["ctl"]})
            time.sleep(_commit_nap(now - start))
        return self.cat.dblink_rows(name)

    def idle(self) -> list[int]:
        return [w for w in self.workers if w not in self.busy]

    def submit(self, worker: int, sql: str, key: tuple[Any, str] | None = None) -> None:
        """Send a unit; a session that cannot take it is reported lost by :meth:`wait`.
        ``key`` (configuration, kind) groups units whose times set each other's stall
        limit (:class:`StallRule`)."""
        if worker in self.busy:
            raise CerebroError(f"worker {worker} is busy", INTERNAL_ERROR)
        try:
            self.cat.dblink_send(self.name(worker), sql)
        except Exception as e:  # noqa: BLE001 - a lost session, reported as a lost unit
            reraise_cancel(e)
            self._send_failed[worker] = getattr(e, "message", None) or str(e)
        self.busy[worker] = time.monotonic()
        self.limits[worker] = self._limit(key, worker)
        if key is not None:
            self._keys[worker] = key

    def can_bundle(self) -> int:
        """Units one statement may carry (1: no bundles; none in chains)."""
        return 1 if self.chained and self.pipeline_depth > 1 else max(1, self.eval_bundle)

    def submit_unit(self, worker: int, fit_id: int, mst_key: int, epoch: int,
                    partition: int, kind: str, options: dict[str, Any],
                    key: tuple[Any, str] | None = None,
                    then: Sequence[tuple[dict[str, Any], tuple[Any, str] | None]] = ()
                    ) -> None:
        """Send one unit of fit ``fit_id`` to ``worker``: configuration ``mst_key``'s
        ``kind`` unit (``'train'`` or ``'eval'``) of ``epoch`` on ``partition``, with the
        coordinator's ``options`` (:func:`cerebro_db.coordinator.run_fit`'s). Here it is a
        ``__run_unit`` statement on the worker's session; executors that run units
        elsewhere override this method (and keep the control session). ``key``: as in
        :meth:`submit`. ``then``: further units for the same statement, each a unit
        (``{"mst_key", "epoch", "partition", "kind", "options"}``) and its key, at most
        :meth:`can_bundle` in all (see the module: evaluation bundles)."""
        unit = {"mst_key": int(mst_key), "epoch": int(epoch), "partition": int(partition),
                "kind": kind, "options": options}
        if then:
            if len(then) >= self.can_bundle() or worker in self._waiting:
                raise CerebroError(f"worker {worker} cannot take a bundle of "
                                   f"{len(then) + 1} units", INTERNAL_ERROR)
            options = {**options, "then": [u for u, _ in then]}
        if worker in self._waiting:  # its chain waits on a slot: post the unit there
            if self._post(worker, self._slot[worker], fit_id, "unit", unit):
                self._waiting.discard(worker)
                self._started(worker, key)
                if self._waker is not None:
                    self._credits += 1
                return
            self._drain(worker)  # it abandoned the slot first: its chain has ended
        wake = self._waker.name if self._waker is not None else None
        chain = self.chained and self.pipeline_depth > 1
        # in a chain, the first slot pokes for this unit once it has committed
        statement = sql.run_unit(self.cat, fit_id, mst_key, epoch, partition, worker, kind,
                                 {**options, "wake": wake} if wake and not chain else options)
        if chain:
            first = self._seqs.get(worker, 0)
            seqs = range(first + 1, first + self.pipeline_depth)
            self._seqs[worker] = seqs[-1] + 1
            statement = sql.run_chain(self.cat, statement, self.tag, fit_id, worker, seqs,
                                      wake)
            self._slot[worker], self._last[worker] = first, seqs[-1]
            self._fit[worker] = fit_id
        self.submit(worker, statement, key=key)
        if then:
            self._then_keys[worker] = [k for _, k in then]
            limits = [self.limits.get(worker)] + [self._limit(k, worker) for _, k in then]
            self.limits[worker] = None if None in limits else sum(
                t for t in limits if t is not None)
        if self._waker is not None:
            self._will_poke.add(worker)
            self._credits += 1

    def can_queue(self, worker: int) -> bool:
        """Whether ``worker`` runs a unit of a chain with a slot left and nothing posted in
        it yet (see the module: pipelined dispatch)."""
        return (worker in self.busy and worker in self._last and worker not in self._waiting
                and worker not in self._posted and worker not in self._send_failed
                and self._slot[worker] < self._last[worker])

    def queue_unit(self, worker: int, fit_id: int, mst_key: int, epoch: int, partition: int,
                   kind: str, options: dict[str, Any], key: tuple[Any, str] | None = None
                   ) -> bool:
        """Post ``worker``'s next unit in its chain's next slot: it starts as soon as the
        worker's unit in flight has committed. False (nothing posted) when it cannot."""
        if not self.can_queue(worker):
            return False
        seq = self._slot[worker] + 1
        unit = {"mst_key": int(mst_key), "epoch": int(epoch), "partition": int(partition),
                "kind": kind, "options": options}
        if not self._post(worker, seq, fit_id, "unit", unit):
            return False
        self._posted[worker] = (seq, key)
        if self._waker is not None:
            self._credits += 1
        return True

    def _post(self, worker: int, seq: int, fit_id: int, kind: str,
              unit: dict[str, Any] | None) -> bool:
        """Post ``kind`` in ``worker``'s slot ``seq`` (control session); False when the
        worker abandoned the slot first."""
        if self.control_query(sql.post_unit(self.cat, self.tag, fit_id, worker, seq, kind,
                                            unit)):
            return True
        # a lost control session's retry finds the first try's row: ours if it is our kind
        rows = self.control_query(sql.slot_kind(self.cat, self.tag, fit_id, worker, seq))
        return bool(rows) and rows[0][0] == kind

    def _started(self, worker: int, key: tuple[Any, str] | None) -> None:
        """A unit of ``worker``'s chain started (as far as the coordinator can tell: now)."""
        self.busy[worker] = time.monotonic()
        self.limits[worker] = self._limit(key, worker)
        if key is not None:
            self._keys[worker] = key
        if self._waker is not None:
            self._will_poke.add(worker)  # its credit came when it was sent

    def _end_chain(self, worker: int) -> None:
        for d in (self._slot, self._last, self._posted, self._fit):
            d.pop(worker, None)
        self._waiting.discard(worker)

    def _drain(self, worker: int, wait: float = 30.0) -> None:
        """Read ``worker``'s statement to its end (a chain that ended: the rest of its
        slots answer at once); the session is then free."""
        name, began = self.name(worker), time.monotonic()
        try:
            while True:
                while self.cat.dblink_is_busy(name):
                    waited = time.monotonic() - began
                    if waited > wait:
                        raise CerebroError(f"worker {worker}'s statement did not end",
                                           INTERNAL_ERROR)
                    time.sleep(_commit_nap(waited))
                if self.cat.dblink_next(name) is None:
                    break
        except Exception as e:  # noqa: BLE001 - a broken session: its next unit finds out
            reraise_cancel(e)
            self._drop(worker)
        self.busy.pop(worker, None)
        self.limits.pop(worker, None)
        self._keys.pop(worker, None)
        self._end_chain(worker)
        self._unexpect(worker)

    def stop_chains(self) -> None:
        """End every chain that waits on a slot (post 'stop' there, read it to its end)."""
        for w in sorted(self._waiting):
            try:
                self._post(w, self._slot[w], self._fit[w], "stop", None)
            except Exception as e:  # noqa: BLE001 - the drain below ends it or drops it
                reraise_cancel(e)
            self._drain(w)

    def submit_check(self, worker: int, spec: dict[str, Any]) -> None:
        """Send the fit's checks (``__check_fit``; the answer is JSON like a unit's);
        executors that run units elsewhere override this method too."""
        self.submit(worker, sql.check_fit(self.cat, spec))

    def _limit(self, key: tuple[Any, str] | None, worker: int | None = None) -> float | None:
        rule = self.unit_timeout
        if not isinstance(rule, StallRule):
            return rule
        own = self.unit_times.get(key, []) if key is not None else []
        same_kind = [t for k, ts in self.unit_times.items()
                     if key is not None and k[1] == key[1] for t in ts]
        return rule.limit(own, same_kind, fresh=worker in self._fresh)

    def wait(self, timeout: float | None = None) -> list[WorkerResult]:
        """Block until at least one busy worker finished (or ``timeout``); return results.

        The coordinator sleeps on its :class:`~cerebro_db.wakeup.Waker`, which the workers
        poke as their units end; it then polls, every :data:`WOKEN_POLL_INTERVAL` at first
        and then less often (:func:`_commit_nap`), until the unit's commit is through.
        While every busy worker runs a unit that pokes, it otherwise polls only every
        :data:`WAKER_NAP` (to notice a session that ended without a poke). Else (checks,
        statements of other executors, workers whose pokes do not arrive:
        :data:`WAKER_TRUSTED_AFTER`) polling backs off from ``poll_interval`` to
        ``max_poll_interval`` (a tenth of the time waited so far), so the coordinator's own
        process takes little CPU from the workers on long units and answers quickly on short
        ones. A unit past ``unit_timeout`` has its session terminated and comes back lost."""
        start = time.monotonic()
        while self.busy:
            if self._send_failed:
                return [self._lost(w, self._send_failed.pop(w)) for w in list(self._send_failed)]
            done = [w for w in list(self.busy) if not self._is_busy(w)]
            got = [r for w in done if (r := self._collect(w)) is not None]
            if got:
                return _unbundled(got)
            now = time.monotonic()
            late = [w for w, t in self.busy.items()
                    if (limit := self.limits.get(w)) is not None and now - t > limit]
            if late:
                return [self._timed_out(w) for w in late]
            if now - self._last_check >= self.check_interval:
                self._last_check = now
                self.check_lock_waits()
                self.check_cancel()
            waited = now - start
            if timeout is not None and waited > timeout:
                return []
            if self._pokes and now - self._woken < WOKEN_POLL_FOR:
                # poked: a unit is done and its worker commits; answer as soon as it has
                # (every 0.2 ms at first, then ever less often, at most every 10 ms)
                nap = _commit_nap(now - self._woken)
                self._poked(self._waker.wait(nap) if self._waker else 0)
                continue
            nap = min(self.max_poll_interval, max(self.poll_interval, waited / 10))
            if self._unpoked < WAKER_TRUSTED_AFTER and self._will_poke.issuperset(self.busy):
                nap = WAKER_NAP
            if timeout is not None:
                nap = min(nap, timeout - waited)
            if self._waker is None:
                time.sleep(nap)
            else:
                self._poked(self._waker.wait(nap))
        return []

    def _poked(self, n: int) -> None:
        """Count ``n`` pokes; each unit sent earns one spell of fast polling, so pokes from
        elsewhere (any local process can reach the socket) cannot keep the coordinator
        polling fast."""
        n = min(n, self._credits)
        if n:
            self._credits -= n
            self._pokes += n
            self._woken = time.monotonic()

    def _unexpect(self, worker: int) -> None:
        """``worker``'s unit is over: it pokes no more. The credits left are at most what
        the other workers may still poke for: the unit each runs, and the unit posted in its
        chain's next slot."""
        self._will_poke.discard(worker)
        queued = sum(w in self._will_poke for w in self._posted)
        self._credits = min(self._credits, len(self._will_poke) + queued)

    def _is_busy(self, worker: int) -> bool:
        try:
            return self.cat.dblink_is_busy(self.name(worker))
        except Exception as e:  # noqa: BLE001 - a broken connection is not busy; collect says why
            reraise_cancel(e)
            return False

    def check_cancel(self) -> None:
        """Raise :class:`FitCancelled` when ``cerebro_db_cancel_fit`` flagged this fit."""
        if self.fit_id is None:
            return
        rows = self.control_query(sql.cancel_requested(self.cat, self.fit_id))
        if rows and rows[0][0] == "true":
            raise FitCancelled(f"canceling fit {self.fit_id} due to cerebro_db_cancel_fit",
                               QUERY_CANCELED,
                               hint=f"Resume it with madlib_keras_fit_resume({self.fit_id}).")

    def check_lock_waits(self, backends: dict[Any, int] | None = None) -> None:
        """Fail with 40P01 when a busy worker (or the sessions in ``backends``: label ->
        pid) waits for a lock that this backend (the coordinator) holds, or behind a session
        that waits for this backend: a deadlock through dblink that the server's deadlock
        detector cannot see (e.g. DROP TABLE, TRUNCATE or ALTER TABLE of the source table,
        or VACUUM FULL of a catalog table, while the fit's transaction holds its lock, or a
        table the workers read locked by the calling transaction itself)."""
        backends = self.backend_pids() if backends is None else backends
        pids = list(backends.values())
        if not pids:
            return
        row = sql.blocked_by_coordinator(self.cat, pids)
        if row is None:
            return
        wpid, bpid = row["worker_pid"], row["blocker"]
        worker = next((w for w, p in backends.items() if p == wpid), "?")
        who = "its control session" if worker == "ctl" else f"worker {worker}"
        fit = f"fit {self.fit_id}" if self.fit_id is not None else "the fit"
        resume = f"madlib_keras_fit_resume({self.fit_id})" if self.fit_id else "a resume"
        if bpid == sql.backend_pid(self.cat):
            raise CerebroError(
                f"{fit} cannot go on: {who} (pid {wpid}) waits for a lock that the "
                "transaction calling the fit holds", DEADLOCK_DETECTED,
                detail="Worker sessions read the fit's tables in their own transactions; a "
                "table the calling transaction locked (LOCK TABLE, DDL, TRUNCATE) blocks them.",
                hint="Commit that change before calling the fit, then resume it with "
                f"{resume}.")
        sql.clear_stat_snapshot(self.cat)
        act = sql.activity(self.cat, bpid)
        blocker = (f'user "{act["u"]}": {" ".join((act["query"] or "").split())[:200]}'
                   if act else "gone")
        raise CerebroError(
            f"{fit} cannot go on: {who} (pid {wpid}) waits for a lock behind "
            f"session {bpid} ({blocker}), which waits for a lock this fit's transaction holds",
            DEADLOCK_DETECTED,
            detail="The fit's coordinator waits for its worker sessions through dblink, "
            "where the server's deadlock detector cannot see it; that session's statement "
            "goes on once the fit's transaction ends.",
            hint="Run DDL on a fit's tables after the fit. To keep the fit instead, cancel "
            f"that statement (SELECT pg_cancel_backend({bpid})) and resume the fit with "
            f"{resume}.")

    def backend_pids(self) -> dict[int, int]:
        """The database backends of the busy workers (their sessions' pids)."""
        return {w: self.pids[w] for w in self.busy if w in self.pids}

    def _lost(self, worker: int, message: str, pid: int | None = None) -> WorkerResult:
        self.busy.pop(worker, None)
        self._end_chain(worker)
        self._unexpect(worker)
        self._keys.pop(worker, None)
        self._then_keys.pop(worker, None)  # a bundle's later units never answered
        return WorkerResult(worker, False, {"lost": True, "message": message,
                                            "sqlstate": CONNECTION_FAILURE, "worker": worker,
                                            "worker_pid": pid or self.pids.get(worker)})

    def _timed_out(self, worker: int) -> WorkerResult:
        pid = self.pids.get(worker)
        limit = self.limits.get(worker) or 0.0
        self.terminate(worker)
        self._drop(worker)
        if isinstance(self.unit_timeout, StallRule):
            why = (f"unit stalled: no answer after {limit:.1f} s (the stall limit derived from "
                   "its configuration's unit times; cerebro_db.unit_timeout sets a fixed one)")
        else:
            why = f"unit exceeded cerebro_db.unit_timeout ({limit:g} s)"
        return self._lost(worker, f"{why}; its session (pid {pid}) was terminated", pid)

    def _collect(self, worker: int) -> WorkerResult | None:
        """The answer of ``worker``'s unit (None: its chain answered without a unit)."""
        if worker in self._last:
            return self._collect_slot(worker)
        try:
            ok, text, err = self.cat.dblink_result(self.name(worker))
        except Exception as e:  # noqa: BLE001
            reraise_cancel(e)
            ok, text, err = False, None, getattr(e, "message", None) or str(e)
        if not ok or text is None:
            return self._lost(worker, (err or "worker session failed").strip())
        return self._answer(worker, text, free=True)

    def _collect_slot(self, worker: int) -> WorkerResult | None:
        """One answer of ``worker``'s chain, once its ``COMMIT`` is through; the worker
        then goes on to its posted unit, waits on its next slot, or its chain has ended.
        None when the chain answered without a unit, and while the unit still runs (what
        had come was the pad and ``BEGIN`` before its answer)."""
        name = self.name(worker)
        try:
            text = self._next_ready(name)
            while text is not None and not text.startswith("{"):  # BEGIN, a chain's pad
                if self.cat.dblink_is_busy(name):
                    # they came ahead of the unit's answer, which is still running: it
                    # is collected when it comes, as any unit's answer, instead of here by
                    # polling every WOKEN_POLL_INTERVAL for the unit's whole run while the
                    # other workers' answers wait
                    return None
                text = self.cat.dblink_next(name)
            status = None if text is None else self._next_ready(name)
        except Exception as e:  # noqa: BLE001
            reraise_cancel(e)
            text, status = None, None
            err = getattr(e, "message", None) or str(e)
        else:
            err = None if text is None else f"the unit's commit failed: {status}"
        if text is None or status != sql.COMMIT_STATUS:
            if err is None:
                err = self._error(name)
            if worker in self._waiting:  # no unit ran: its next unit finds the session broken
                self._end_chain(worker)
                self.busy.pop(worker, None)
                self._unexpect(worker)
                return None
            return self._lost(worker, (err or "worker session failed").strip())
        data = json.loads(text)
        if data.get("idle") or data.get("skip"):
            self._drain(worker)  # the chain ended here (stopped or abandoned)
            return None
        slot = self._slot[worker]
        if slot >= self._last[worker]:
            posted = None
            while self._next_ready(name) is not None:  # the last pad; the statement's end
                pass
        else:
            self._slot[worker] = slot + 1
            posted = self._posted.pop(worker, None)
        res = self._answer(worker, text, free=slot >= self._last[worker])
        if not res.ok and slot < self._last[worker]:
            # the unit failed: the session must not go on to a unit posted after it (the
            # coordinator retries the unit or fails the fit)
            self.terminate(worker)
            self._drop(worker)
            self.busy.pop(worker, None)
            self._end_chain(worker)
            self._unexpect(worker)
            return res
        if slot >= self._last[worker]:
            self._end_chain(worker)
        elif posted is not None:
            self._started(worker, posted[1])
        else:
            self._waiting.add(worker)
            self.busy[worker] = time.monotonic()
            self.limits[worker] = None  # a worker waiting for its next unit is not stalled
            self._will_poke.add(worker)
        return res

    def _next_ready(self, name: str) -> str | None:
        """The next result of a chain, once it has come (its statement's end; polled with
        :func:`_commit_nap`'s back-off)."""
        began = time.monotonic()
        while self.cat.dblink_is_busy(name):
            nap = _commit_nap(time.monotonic() - began)
            if self._waker is not None:
                self._poked(self._waker.wait(nap))  # others' pokes count
            else:
                time.sleep(nap)
        return self.cat.dblink_next(name)

    def _error(self, name: str) -> str | None:
        try:
            return self.cat.dblink_error(name)
        except Exception as e:  # noqa: BLE001 - no connection left to ask
            reraise_cancel(e)
            return None

    def _answer(self, worker: int, text: str, free: bool) -> WorkerResult:
        """``worker``'s unit answered ``text``; ``free``: its session has no statement left."""
        seconds = time.monotonic() - self.busy.pop(worker)
        if worker in self._will_poke:
            if self._waker is not None:  # its poke came before its answer: count it first
                self._poked(self._waker.wait(0.0))
            if self._pokes:
                self._pokes -= 1
                self._unpoked = 0
            else:
                self._unpoked += 1
            if free:
                self._unexpect(worker)
        key = self._keys.pop(worker, None)
        self._fresh.discard(worker)
        data = json.loads(text)
        then_keys = self._then_keys.pop(worker, None)
        if then_keys is None:
            parts = [(data, key, seconds)]
        else:  # a bundle: each unit's own time, as its worker measured it
            parts = [(data, key, data.get("seconds"))] + [
                (d, k, d.get("seconds")) for d, k in zip(data.get("then") or [], then_keys)]
        for d, k, t in parts:
            if d.get("ok") and k is not None and t is not None:
                self.unit_times.setdefault(k, []).append(float(t))
            if not d.get("ok") and d.get("sqlstate") in RETRYABLE:
                d["lost"] = True
        return WorkerResult(worker, bool(data.get("ok")), data)

    def close(self, keep: bool = False) -> None:
        """Cancel what is running and close every session (safe to call twice); with
        ``keep`` (a fit that ended well) and ``keep_idle`` > 0 the idle worker sessions go
        to the pool instead, for the next fit of this calling session."""
        if self._waiting:
            try:
                self.stop_chains()
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        if self._seqs and "ctl" in self.pids:
            try:
                self.control(sql.clear_postings(self.cat, self.tag))
            except Exception:  # noqa: BLE001, S110 - closing anyway (unlogged rows of ours)
                pass
        if keep and self.keep_idle > 0 and self.may_keep():
            for w in self.workers:
                if w not in self.busy and w not in self._send_failed \
                        and self.name(w) in self.opened:
                    self._park(w)
        elif keep and self.keep_idle > 0 and self.opened:
            self._say_not_kept()
        in_flight = bool(self.busy) and not keep
        for w in list(self.busy):
            try:
                self.cat.dblink_cancel(self.name(w))
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        self.busy.clear()
        self._will_poke.clear()
        self._credits = self._pokes = 0
        self._keys.clear()
        for w in list(self._last):
            self._end_chain(w)
        for name in self.opened:
            try:
                self.cat.dblink_disconnect(name)
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        self.opened.clear()
        if in_flight:
            # a worker busy in Python (TensorFlow's import) notices neither the cancel nor
            # the closed connection until its next SQL call: the fit's statement ended 1.6 s
            # before such a session did, holding its locks (an outside pass); end them first
            try:
                end_sessions(self.cat, f"cerebro_db {self.tag} worker ", wait=5.0)
            except Exception:  # noqa: BLE001, S110 - closing anyway
                pass
        if self._waker is not None:
            self._waker.close()
            self._waker = None


def _unbundled(results: list[WorkerResult]) -> list[WorkerResult]:
    """One result per unit: a bundle's answer (``"then"``) becomes its units' results, in
    the order they ran, after the first's."""
    out: list[WorkerResult] = []
    for r in results:
        then = r.data.pop("then", None) or []
        out.append(r)
        out.extend(WorkerResult(r.worker, bool(d.get("ok")), d) for d in then)
    return out


def end_sessions(cat: Catalog, application_prefix: str, wait: float = 60.0) -> int:
    """Terminate the sessions of this role whose application_name starts with
    ``application_prefix`` (an interrupted fit's orphaned workers, which may still be
    finishing a unit) and wait until they are gone; returns how many there were."""
    def alive() -> list[int]:
        # pg_stat_activity is cached for the transaction: clear it to see sessions end
        sql.clear_stat_snapshot(cat)
        return sql.sessions_named(cat, application_prefix)

    pids = alive()
    for pid in pids:
        sql.terminate_backend(cat, pid)
    end = time.monotonic() + wait
    while pids and time.monotonic() < end:
        if not alive():
            break
        time.sleep(0.05)
    else:
        if pids and alive():
            raise CerebroError(f"sessions of the interrupted fit ({application_prefix}*) did "
                               f"not end within {wait:g} s", OBJECT_IN_USE,
                               hint="Wait for them to end, or pg_terminate_backend them.")
    return len(pids)
