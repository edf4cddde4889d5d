"""The executor of a fit and what the coordinator needs around it: how worker sessions
connect (:func:`conninfo`), how many a role may hold (:func:`check_worker_limits`), the
fault settings (:func:`fault_settings`), the one factory of executors
(:func:`make_executor`), the adapter from the coordinator's assignments to units
(:class:`UnitExecutor`) and the elastic worker pool (:class:`WorkerPool`).

Settings read here: ``cerebro_db.max_unit_retries`` (default 3: how often one unit may
lose its worker session before the fit fails), ``cerebro_db.unit_timeout`` (seconds, or
unset / ``'auto'``: a :class:`~cerebro_db.executors.StallRule` from
``cerebro_db.unit_timeout_floor``, ``_factor`` and ``_first``; ``0``: none),
``cerebro_db.replicas`` (default ``'auto'``, :func:`cerebro_db.fitrun.fit_replicas`: with
r > 1 worker w holds partitions w .. w+r-1 mod p, so a worker lost for good leaves the fit and
the others serve its partitions),
``cerebro_db.worker_conninfo``, ``cerebro_db.worker_idle_timeout``,
``cerebro_db.pipeline_depth`` (units a worker session's statement chains, see
:mod:`cerebro_db.executors`; default 1, :data:`DEFAULT_PIPELINE_DEPTH`: one unit per
statement), ``cerebro_db.eval_bundle`` (evaluation units one statement may carry; default
:data:`DEFAULT_EVAL_BUNDLE`) and ``cerebro_db.test_hook`` (tests; forwarded to the worker sessions).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

from .catalog import Catalog
from .catalog import fits as sql
from .errors import CerebroError, invalid
from .executors import DblinkExecutor, StallRule
from .scheduling import EVAL, Assignment, RunningUnit, replica_partitions

CONNINFO_SETTING = "cerebro_db.worker_conninfo"
RETRIES_SETTING = "cerebro_db.max_unit_retries"
TIMEOUT_SETTING = "cerebro_db.unit_timeout"
TIMEOUT_FLOOR_SETTING = "cerebro_db.unit_timeout_floor"
TIMEOUT_FACTOR_SETTING = "cerebro_db.unit_timeout_factor"
TIMEOUT_FIRST_SETTING = "cerebro_db.unit_timeout_first"
HOOK_SETTING = "cerebro_db.test_hook"
REPLICAS_SETTING = "cerebro_db.replicas"
IDLE_SETTING = "cerebro_db.worker_idle_timeout"
MAINTAINER_POOL_SETTING = "cerebro_db.keep_workers_as_maintainer"
"""'on': a session whose user may VACUUM and ANALYZE other roles' tables (a superuser, the
database's owner) keeps its idle worker sessions too (see ``DblinkExecutor.may_keep``)."""
PIPELINE_SETTING = "cerebro_db.pipeline_depth"
DEFAULT_PIPELINE_DEPTH = 1
"""No pipelined dispatch unless set: measured on the benchmark machine (2 cores, 2 workers,
``bench/policy_check.py WORKLOAD PAIRS '@depth=32' '@depth=1'``), chains of 32 made the
fits 0.6-3% slower (Adult 1.031x, hetero 1.020x, 60,000-row MLPs and CNNs 1.006x): they save
under a millisecond of pause a unit, and their postings, polls and commits take more than
that from the workers' cores."""
BUNDLE_SETTING = "cerebro_db.eval_bundle"
DEFAULT_EVAL_BUNDLE = 4
"""Evaluation units a worker session's statement may carry (the coordinator decides the
later ones while the first is sent, :func:`cerebro_db.coordinator.run_fit`): each unit after
the first skips the pause between two statements (the commit, the coordinator noticing the
end, deciding and sending), about 1.5 ms on the benchmark machine."""
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_UNIT_RETRIES = 3
"""Rows of the DBA's table ``limits``; defaults: :func:`default_worker_limits`."""
POLL_WORKERS = 0.5

def make_executor(cat: Catalog, num_workers: int) -> DblinkExecutor:
    """The executor of one fit, with its settings read and checked (:func:`fault_settings`,
    :func:`conninfo`, :func:`idle_timeout`, ``cerebro_db.executor``); not opened yet. The
    only place a fit gets its executor: worker sessions of this server
    (:class:`DblinkExecutor`, the default) or, when ``cerebro_db.executor`` names a Dask or
    Ray cluster, :class:`cerebro_db.remote.executor.RemoteExecutor` (a subclass that keeps
    the control session and runs units on the cluster). The remote module is imported only
    then, and the engines' packages only by it."""
    from .remote import EXECUTOR_SETTING

    _, timeout, _ = fault_settings(cat)
    tag = f"{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    ex: DblinkExecutor
    if cat.setting(EXECUTOR_SETTING) in (None, "sessions"):
        ex = DblinkExecutor(cat, tag, num_workers, conninfo(cat), unit_timeout=timeout)
    else:
        from .remote.executor import RemoteExecutor, executor_url

        url = executor_url(cat)
        ex = RemoteExecutor(cat, tag, num_workers, conninfo(cat), url, unit_timeout=timeout) \
            if url is not None else \
            DblinkExecutor(cat, tag, num_workers, conninfo(cat), unit_timeout=timeout)
    ex.refuse_reopen = refused_reopen(cat)
    ex.keep_idle = idle_timeout(cat)
    ex.maintainer_keeps = (cat.setting(MAINTAINER_POOL_SETTING) or "").lower() in ("on", "true")
    if type(ex) is DblinkExecutor:  # remote workers take one unit per call
        ex.pipeline_depth = pipeline_depth(cat)
        ex.eval_bundle = eval_bundle(cat)
    return ex


def pipeline_depth(cat: Catalog) -> int:
    """``cerebro_db.pipeline_depth``: units a worker session's statement may chain, each
    posted while the one before runs (default :data:`DEFAULT_PIPELINE_DEPTH`; 1: one unit
    per statement, each sent when the coordinator has seen the one before end)."""
    return _units_per_statement(cat, PIPELINE_SETTING, DEFAULT_PIPELINE_DEPTH,
                                "1: no pipelined dispatch")


def eval_bundle(cat: Catalog) -> int:
    """``cerebro_db.eval_bundle``: evaluation units one statement of a worker session may
    carry (default :data:`DEFAULT_EVAL_BUNDLE`; 1: one unit per statement)."""
    return _units_per_statement(cat, BUNDLE_SETTING, DEFAULT_EVAL_BUNDLE,
                                "1: one evaluation unit per statement")


def _units_per_statement(cat: Catalog, setting: str, default: int, one: str) -> int:
    """A setting of units per statement: an integer from 1 to 1000 (``one``: what 1 means),
    ``default`` when unset or empty."""
    raw = cat.setting(setting)
    try:
        n = default if raw is None or not raw.strip() else int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 1000:
        raise invalid(f"{setting} must be an integer from 1 to 1000 ({one}), got {raw!r}")
    return n


def conninfo(cat: Catalog) -> str | None:
    """How worker sessions connect: a conninfo for ``dblink_connect``, or None for the
    extension's ``__worker_connect``.

    Worker sessions always run as the calling role (``current_user``), never a more
    privileged one. dblink lets a superuser connect without a password, so a superuser
    gets a conninfo to this server's socket and port as ``current_user``, plus
    ``cerebro_db.worker_conninfo``. dblink refuses other roles a connection that did not
    use a password; two ways remain for them, and neither adds a privilege:

    * ``cerebro_db.worker_conninfo`` holds a password: plain ``dblink_connect`` with it,
      and dblink itself checks that the password was used (a wrong ``user=`` there needs
      that role's password); the host is ``localhost`` (TCP) unless the role may read
      ``unix_socket_directories`` or the setting names another;
    * otherwise None: ``__worker_connect`` (SECURITY DEFINER, owned by the extension's
      owner) builds the whole connection string itself, logs in as ``session_user`` over
      this server's socket and does ``SET ROLE current_user`` there, after checking that
      the session user may SET ROLE to it; no caller text reaches the connection string,
      so a role cannot use it to connect as someone else.
    """
    facts = sql.connection_facts(cat)
    raw = cat.setting(CONNINFO_SETTING)
    pairs = worker_conninfo_pairs(raw) if raw and raw.strip() else []
    given = dict(pairs)
    if not facts["su"] and "password" not in given:
        return None
    host = given.pop("host", None) or (facts["s"] or "").strip() or "localhost"
    # the extension's keys last: libpq takes a keyword's last value
    return sql.conninfo(cat, [*given.items(), ("dbname", facts["d"]), ("user", facts["u"]),
                              ("port", facts["p"]), ("host", host)])


WORKER_CONNINFO_KEYS = frozenset({
    "password", "host", "sslmode", "sslcompression", "connect_timeout", "keepalives",
    "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
    "channel_binding", "gssencmode", "target_session_attrs"})
"""What ``cerebro_db.worker_conninfo`` may set. A session's setting is also what any code
that ran earlier in the session left there (a red-team pass: another role's SECURITY
DEFINER function, called by a superuser, set ``dbname=`` to a database that role owned,
where a schema named ``cerebro_db`` of its own then ran as the superuser, and a plain
role's fits trained, architecture and all, in the attacker's database). So it never says
where or as whom workers connect: ``dbname``, ``user``, ``port``, ``hostaddr``,
``service``, ``options`` and the rest are refused; ``host`` only as a socket directory
(an absolute path) on this machine."""


def worker_conninfo_pairs(text: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of ``cerebro_db.worker_conninfo`` (libpq's syntax: values bare or
    single-quoted with backslash escapes), checked against :data:`WORKER_CONNINFO_KEYS`;
    22023 for anything else (a URI, an unknown or refused key, a relative host)."""
    def bad(why: str) -> CerebroError:
        return invalid(f"{CONNINFO_SETTING}: {why}",
                       hint="It may give the role's password, a socket directory as host, "
                            "and TLS or timeout options (" + ", ".join(
                                sorted(WORKER_CONNINFO_KEYS)) + "); workers always connect "
                            "to this server's database as the calling role.")

    s, i = text, 0
    out: list[tuple[str, str]] = []
    if s.strip().lower().startswith(("postgres://", "postgresql://")):
        raise bad("a connection URI is not accepted")
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        if i >= len(s):
            return out
        j = i
        while j < len(s) and not s[j].isspace() and s[j] != "=":
            j += 1
        key = s[i:j]
        while j < len(s) and s[j].isspace():
            j += 1
        if not key or j >= len(s) or s[j] != "=":
            raise bad(f"expected key=value at {s[i:i + 20]!r}")
        j += 1
        while j < len(s) and s[j].isspace():
            j += 1
        val: list[str] = []
        if j < len(s) and s[j] == "'":
            j += 1
            while j < len(s) and s[j] != "'":
                if s[j] == "\\" and j + 1 < len(s):
                    j += 1
                val.append(s[j])
                j += 1
            if j >= len(s):
                raise bad("unterminated quoted value")
            j += 1
        else:
            while j < len(s) and not s[j].isspace():
                if s[j] == "\\" and j + 1 < len(s):
                    j += 1
                val.append(s[j])
                j += 1
        value = "".join(val)
        if key.lower() not in WORKER_CONNINFO_KEYS:
            raise bad(f"{key!r} is not accepted")
        if key.lower() == "host" and not value.startswith("/"):
            raise bad("host must be a socket directory (an absolute path) on this machine")
        out.append((key.lower(), value))
        i = j


def default_worker_limits() -> dict[str, int]:
    """Without a row in ``limits``: a fit may use as many workers as the server has cores
    (at least 4), a role twice that over all its running fits."""
    per_fit = max(4, os.cpu_count() or 1)
    return {"max_workers_per_fit": per_fit, "max_workers_per_role": 2 * per_fit}


def worker_limits(cat: Catalog) -> dict[str, int]:
    """The calling role's worker limits: its own row, else the row for every role, else
    the default."""
    out = default_worker_limits()
    for r in sql.worker_limit_rows(cat):
        out[r["setting"]] = int(r["value"])
    return out


def check_worker_limits(cat: Catalog, want: int, fit_id: int | None = None,
                        coordinator_pid: int | None = None) -> None:
    """``want`` worker sessions for one fit (``fit_id``: a running fit asking for more,
    coordinated by ``coordinator_pid``; default: this session) within the calling role's
    limits, counting the workers of its other running fits (:func:`sql.busy_workers`). A
    running fit's coordinator checks again when it grants the workers
    (:func:`worker_allowance`)."""
    lim = worker_limits(cat)
    per_fit, per_role = lim["max_workers_per_fit"], lim["max_workers_per_role"]
    where = f"{cat.schema}.limits"
    if want > per_fit:
        raise invalid(f"the fit needs {want} worker sessions, more than this role's "
                      f"max_workers_per_fit ({per_fit})",
                      hint=f"Use fewer partitions (training_preprocessor_dl's num_partitions) "
                      f"or workers, or ask the DBA to raise max_workers_per_fit in {where}.")
    busy = sql.busy_workers(cat, fit_id, coordinator_pid)
    if busy + want > per_role:
        raise invalid(f"the fit needs {want} worker sessions and this role's other running "
                      f"fits hold {busy}, more than its max_workers_per_role ({per_role})",
                      hint=f"Wait for a fit to end, or ask the DBA to raise "
                      f"max_workers_per_role in {where}.")


def worker_allowance(cat: Catalog, fit_id: int) -> int:
    """How many worker sessions the fit that this session coordinates may hold now: its
    role's ``max_workers_per_fit``, and ``max_workers_per_role`` less the workers of the
    role's other running fits."""
    lim = worker_limits(cat)
    return max(0, min(lim["max_workers_per_fit"],
                      lim["max_workers_per_role"] - sql.busy_workers(cat, fit_id)))


def replicas(cat: Catalog) -> int | None:
    """``cerebro_db.replicas``, checked: a positive integer, or None when unset or
    ``'auto'`` (the fit decides, :func:`cerebro_db.fitrun.fit_replicas`)."""
    raw = cat.setting(REPLICAS_SETTING)
    if raw is None or raw.strip().lower() in ("", "auto"):
        return None
    try:
        r = int(raw)
    except ValueError:
        r = 0
    if r < 1:
        raise invalid(f"{REPLICAS_SETTING} must be a positive integer or 'auto', got {raw!r}")
    return r


def refused_reopen(cat: Catalog) -> set[int]:
    """Workers the test hook forbids to reconnect (superusers only)."""
    text = cat.setting(HOOK_SETTING)
    if not text or cat.setting("is_superuser") != "on":
        return set()
    try:
        spec = json.loads(text)
    except ValueError:
        return set()
    return {int(h["worker"]) for h in (spec if isinstance(spec, list) else [spec])
            if isinstance(h, dict) and h.get("point") == "recover"
            and isinstance(h.get("worker"), int)}


def idle_timeout(cat: Catalog) -> float:
    """``cerebro_db.worker_idle_timeout``: seconds a fit's idle worker sessions stay open for
    the calling session's next fit (default 300; 0: closed at the end of each fit)."""
    raw = cat.setting(IDLE_SETTING)
    try:
        t = DEFAULT_IDLE_TIMEOUT if raw is None else float(raw)
    except ValueError:
        t = -1.0
    if not 0 <= t < 2**31 / 1000:
        raise invalid(f"{IDLE_SETTING} must be a number of seconds (0: close the worker "
                      f"sessions after each fit), got {raw!r}")
    return t


def fault_settings(cat: Catalog) -> tuple[int, float | StallRule | None, dict[str, str]]:
    """max_unit_retries, unit_timeout (seconds; a :class:`StallRule` when unset or 'auto';
    None: off) and the settings forwarded to workers."""
    raw = cat.setting(RETRIES_SETTING)
    try:
        retries = DEFAULT_MAX_UNIT_RETRIES if raw is None else int(raw)
    except ValueError:
        retries = -1
    if retries < 0:
        raise invalid(f"{RETRIES_SETTING} must be a non-negative integer, got {raw!r}")
    raw = cat.setting(TIMEOUT_SETTING)
    timeout: float | StallRule | None
    if raw is None or raw.strip().lower() == "auto":
        timeout = StallRule(_seconds(cat, TIMEOUT_FLOOR_SETTING, StallRule.floor),
                            _seconds(cat, TIMEOUT_FACTOR_SETTING, StallRule.factor),
                            _seconds(cat, TIMEOUT_FIRST_SETTING, StallRule.first))
    else:
        timeout = _seconds(cat, TIMEOUT_SETTING, 0.0, "(0: no timeout, 'auto': derived "
                           "from the measured unit times)") or None
    hook = cat.setting(HOOK_SETTING)
    return retries, timeout, ({HOOK_SETTING: hook} if hook else {})


def _seconds(cat: Catalog, setting: str, default: float, what: str = "") -> float:
    """A non-negative number setting (``default`` when unset), or a 22023 error."""
    raw = cat.setting(setting)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 <= v < float("inf"):
        raise invalid(f"{setting} must be a non-negative number{' ' + what if what else ''}, "
                      f"got {raw!r}")
    return v


class UnitExecutor:
    """Adapts a :class:`DblinkExecutor` to the coordinator (:class:`coordinator.Executor`):
    assignments become units (:meth:`DblinkExecutor.submit_unit`)."""

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
        self.cat, self.ex, self.fit_id = cat, ex, fit_id

    def submit(self, a: Assignment, options: dict[str, Any],
               then: list[tuple[Assignment, dict[str, Any]]] | None = None) -> None:
        """Send ``a``; ``then``: further units (and their options) for the same statement,
        a bundle (at most :meth:`bundle` units in all)."""
        kind = "train" if a.kind != EVAL else "eval"
        more = [({"mst_key": b.config, "epoch": b.epoch, "partition": b.partition,
                  "kind": "train" if b.kind != EVAL else "eval", "options": o},
                 (b.config, "train" if b.kind != EVAL else "eval")) for b, o in then or []]
        # ``then`` only for a bundle: an executor that overrides submit_unit without it
        # takes one unit per call (its can_bundle is 1)
        extra: dict[str, Any] = {"then": more} if more else {}
        self.ex.submit_unit(a.worker, self.fit_id, a.config, a.epoch, a.partition, kind,
                            options, key=(a.config, kind), **extra)

    def bundle(self) -> int:
        """Units one statement may carry (see ``DblinkExecutor.can_bundle``)."""
        return self.ex.can_bundle()

    def pipeline(self, on: bool) -> None:
        """Whether the coordinator queues units ahead: units then go as chains."""
        self.ex.chained = on

    def can_queue(self, worker: int) -> bool:
        return self.ex.can_queue(worker)

    def queue(self, a: Assignment, options: dict[str, Any]) -> bool:
        """Post ``a`` as its busy worker's next unit (pipelined dispatch)."""
        kind = "train" if a.kind != EVAL else "eval"
        return self.ex.queue_unit(a.worker, self.fit_id, a.config, a.epoch, a.partition,
                                  kind, options, key=(a.config, kind))

    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        return [(r.worker, r.ok, r.data) for r in self.ex.wait(timeout)]

    def recover(self, worker: int) -> bool:
        return self.ex.reopen(worker)

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        """Record the failed attempt (control session: committed at once)."""
        pid = data.get("worker_pid")
        self.ex.control(sql.record_unit_failure(
            self.cat, self.fit_id, unit.config, unit.epoch, unit.partition, unit.kind,
            unit.worker, int(pid) if pid else None, attempt,
            str(data.get("message") or "")[:2000]))


class WorkerPool:
    """Worker sessions joining and leaving a running fit, and the availability map in
    ``fit_workers`` (written by the control session, committed at once)."""

    poll_interval = POLL_WORKERS

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int, num_partitions: int,
                 replicas: int) -> None:
        self.cat, self.ex, self.fit_id = cat, ex, fit_id
        self.p, self.replicas = num_partitions, replicas
        self._seen: int | None = None
        self._last = 0.0

    def start(self, workers: dict[int, frozenset[int]]) -> None:
        """Record the starting workers (and forget an earlier run's request and workers: a
        resumed fit starts with its original number of workers)."""
        self.ex.control(sql.clear_requested_workers(self.cat, self.fit_id))
        self.close()
        for w, parts in workers.items():
            self.record(w, parts, "active")

    def record(self, worker: int, parts: frozenset[int] | None, status: str) -> None:
        self.ex.control(sql.record_worker(self.cat, self.fit_id, worker, parts, status,
                                          self.ex.pids.get(worker)))

    def requested(self) -> int | None:
        now = time.monotonic()
        if now - self._last < self.poll_interval:
            return None
        self._last = now
        rows = self.ex.control_query(sql.requested_workers(self.cat, self.fit_id))
        want = int(rows[0][0]) if rows and rows[0][0] is not None else None
        if want is None or want == self._seen:
            return None
        self._seen = want
        held = sum(1 for w in self.ex.pids if isinstance(w, int))
        allowed = max(worker_allowance(self.cat, self.fit_id), held)
        if want > allowed:  # the limits bind here, whatever the request's check saw
            self.cat.notice(f"fit {self.fit_id}: asked for {want} worker sessions; this "
                            f"role's worker limits allow {allowed} now (ask again later)")
            return allowed
        return want

    def holds(self, worker: int) -> frozenset[int]:
        return replica_partitions(worker, self.p, self.replicas)

    def join(self, worker: int, partitions: frozenset[int]) -> bool:
        self.record(worker, partitions, "joining")
        if not self.ex.add(worker):
            self.record(worker, None, "lost")
            return False
        self.record(worker, None, "active")
        return True

    def leave(self, worker: int, status: str) -> None:
        self.ex.retire(worker)
        self.record(worker, None, status)

    def granted(self, worker: int, partitions: frozenset[int]) -> None:
        self.record(worker, partitions, "active")

    def close(self) -> None:
        """Mark the workers still in the fit closed (the fit's sessions end)."""
        self.ex.control(sql.close_workers(self.cat, self.fit_id))
