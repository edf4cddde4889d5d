"""``madlib_keras_fit_multiple_model``, ``madlib_keras_fit`` and ``madlib_keras_fit_resume``:
model hopper training, fault tolerant and resumable.

Settings read by the coordinator: ``cerebro_db.max_unit_retries`` (default 3: how often one
unit may lose its worker session before the fit fails), ``cerebro_db.unit_timeout``
(seconds, default off: a unit running longer has its session terminated and is retried on a
fresh one), ``cerebro_db.replicas`` (default 1: with r > 1 worker w holds partitions
w .. w+r-1 mod p, so a worker lost for good leaves the fit and the others serve its
partitions) and ``cerebro_db.test_hook`` (tests; forwarded to the worker sessions).

``cerebro_db_fit_workers(fit_id, num_workers)`` asks a running fit (from another session) for
a different number of worker sessions; the coordinator reads the request between units. The
availability map (worker -> partitions, status, pid) is kept in ``cerebro_db.fit_workers``.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__, keras_arch, params
from .. import state as state_mod
from ..catalog import Catalog
from ..coordinator import ConfigResult, FitOutcome, combine, run_fit
from ..errors import (
    DATATYPE_MISMATCH,
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    UNDEFINED_TABLE,
    CerebroError,
    invalid,
)
from ..executors import DblinkExecutor, StallRule, end_sessions, is_cancel
from ..names import TableName, quote_ident
from ..scheduling import (
    EVAL,
    TRAIN,
    Assignment,
    Progress,
    RunningUnit,
    evaluation_epochs,
    get_policy,
    initial_workers,
    policy_class,
    replica_partitions,
)
from . import entrypoint, require_output_schema
from .models import require_arch_table
from .preprocessing import read_training_summary, resolve_seed
from .selection import check_fit_bounds

CHUNK_SETTING = "cerebro_db.state_chunk_size"
MAX_ITERATIONS = 100_000
"""The most iterations (epochs) one fit may ask for; checked before any work."""
MAX_UNITS = 2**31 - 1
"""The most training units of one fit (configs x iterations x partitions; the catalog's
``total_units`` is an integer)."""
CONNINFO_SETTING = "cerebro_db.worker_conninfo"
RETRIES_SETTING = "cerebro_db.max_unit_retries"
TIMEOUT_SETTING = "cerebro_db.unit_timeout"
TIMEOUT_FLOOR_SETTING = "cerebro_db.unit_timeout_floor"
TIMEOUT_FACTOR_SETTING = "cerebro_db.unit_timeout_factor"
TIMEOUT_FIRST_SETTING = "cerebro_db.unit_timeout_first"
HOOK_SETTING = "cerebro_db.test_hook"
REPLICAS_SETTING = "cerebro_db.replicas"
DEFAULT_MAX_UNIT_RETRIES = 3
MAX_WORKERS = 64
POLL_WORKERS = 0.5


@dataclass
class PackedTable:
    """A table made by the preprocessors, with what its summary says."""

    table: TableName
    qualified: str
    summary: dict[str, Any]
    x: str
    y: str
    x_size: int
    y_width: int
    partitions: int
    kind: str


def _qualified(cat: Catalog, t: TableName) -> str:
    oid = cat.relation_oid(t)
    row = cat.query("SELECT n.nspname::text AS s, c.relname::text AS r FROM pg_catalog.pg_class c "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
                    [oid], ["oid"])[0]
    return quote_ident(row["s"]) + "." + quote_ident(row["r"])


def packed_table(cat: Catalog, name: str, what: str) -> PackedTable:
    """A preprocessed table and its summary, or a clear error."""
    try:
        t, s = read_training_summary(cat, name)
    except CerebroError as e:
        raise CerebroError(e.message.replace("training_preprocessor_table", what), e.sqlstate,
                           hint=f"{what} must be made by training_preprocessor_dl or "
                           "validation_preprocessor_dl.") from None
    deps, indeps = s["dependent_varname"], s["independent_varname"]
    if len(deps) != 1 or len(indeps) != 1:
        raise CerebroError(f'{what} "{t}" has {len(indeps)} inputs and {len(deps)} outputs; '
                           "training supports one of each so far", FEATURE_NOT_SUPPORTED)
    x, y = indeps[0], deps[0]
    shape = cat.query(f"SELECT {quote_ident(x + '_shape')} AS xs, {quote_ident(y + '_shape')} "
                      f"AS ys FROM {t.sql} LIMIT 1")
    if not shape:
        raise CerebroError(f'{what} "{t}" is empty', "22000")
    parts = cat.query(f"SELECT count(DISTINCT __dist_key__) AS n, max(__dist_key__) AS m "
                      f"FROM {t.sql}")[0]
    p = int(s["num_partitions"])
    if parts["n"] != p or parts["m"] != p - 1:
        raise CerebroError(f'{what} "{t}" does not hold the {p} partitions its summary '
                           "records", "22000", hint="Preprocess the data again.")
    return PackedTable(t, _qualified(cat, t), s, x, y, int(np.prod(shape[0]["xs"][1:])),
                       int(np.prod(shape[0]["ys"][1:])), p, s["dependent_kind"][0])


@dataclass
class Config:
    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    arch: str
    weights: bytes | None
    cp: params.CompileParams
    fp: params.FitParams


def _check_config(c: Config, src: PackedTable, checked: dict[str, Any]) -> None:
    """The architecture fits the packed data (input size, output width) and the loss fits
    the labels; checked once per architecture."""
    model = checked.get(c.arch)
    if model is None:
        model = keras_arch.build_from_json(c.arch, shared=True)
        checked[c.arch] = model
    ins, outs = keras_arch.input_shapes(model), keras_arch.output_shapes(model)
    if len(ins) != 1 or len(outs) != 1:
        raise CerebroError(f"model_id {c.model_id} has {len(ins)} inputs and {len(outs)} "
                           "outputs; training supports one of each so far", FEATURE_NOT_SUPPORTED)
    in_size = int(np.prod([d for d in ins[0] if d is not None]))
    if None in ins[0] or in_size != src.x_size:
        raise CerebroError(
            f"model_id {c.model_id} expects input shape {list(ins[0])}, but the packed data has "
            f"{src.x_size} values per row", DATATYPE_MISMATCH,
            hint="The architecture's input must hold as many values as each packed row "
            "(a Reshape layer can adapt a flat row).")
    out = outs[0][-1] if outs[0] else 1
    loss = c.cp.loss if isinstance(c.cp.loss, str) else None
    sparse = loss is not None and "sparse" in loss
    want = 1 if sparse else src.y_width
    if out is not None and out != want and not (sparse and src.kind != "regression"):
        raise CerebroError(
            f"model_id {c.model_id} has {out} outputs, but the labels have {src.y_width} "
            "columns", DATATYPE_MISMATCH,
            hint="The last layer's units must equal num_classes of the training data.")
    if sparse and src.kind == "regression":
        raise invalid(f"mst_key {c.mst_key}: loss {loss!r} needs class labels, but the "
                      "training data has a regression target")


def _load_configs(cat: Catalog, mst: TableName) -> tuple[list[Config], TableName]:
    oid = cat.require_table(mst, "model_selection_table")
    cols = cat.columns(oid)
    need = {"mst_key", "model_id", "compile_params", "fit_params"}
    if not need <= set(cols):
        raise invalid(f'model_selection_table "{mst}" lacks the columns '
                      f"{', '.join(sorted(need - set(cols)))}")
    summ = mst.with_suffix("_summary", "model_selection_table")
    if cat.relation_oid(summ) is None:
        raise CerebroError(f'model_selection_table "{mst}" has no summary table "{summ}"',
                           UNDEFINED_TABLE, hint="Create it with load_model_selection_table "
                           "or generate_model_configs.")
    arch_name = cat.select(summ, ["model_arch_table"])[0]["model_arch_table"]
    arch = TableName.parse(arch_name, "model_arch_table")
    require_arch_table(cat, arch, "model_arch_table")
    rows = cat.query(f"SELECT m.mst_key, m.model_id, m.compile_params, m.fit_params, "
                     f"a.model_arch::text AS arch, a.model_weights AS w FROM {mst.sql} m "
                     f"LEFT JOIN {arch.sql} a ON a.model_id = m.model_id ORDER BY m.mst_key")
    if not rows:
        raise CerebroError(f'model_selection_table "{mst}" is empty', "22000")
    out = []
    for r in rows:
        if r["arch"] is None:
            raise CerebroError(f"mst_key {r['mst_key']}: model_id {r['model_id']} does not "
                               f'exist in "{arch}"', "42704")
        cp = params.parse_compile_params(r["compile_params"],
                                         f"compile_params of mst_key {r['mst_key']}")
        fp = check_fit_bounds(params.parse_fit_params(
            r["fit_params"], f"fit_params of mst_key {r['mst_key']}"),
            f"fit_params of mst_key {r['mst_key']}")
        out.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                          r["arch"], r["w"], cp, fp))
    return out, arch


def _conninfo(cat: Catalog) -> str | None:
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
    su = cat.query("SELECT rolsuper AS su FROM pg_catalog.pg_roles "
                   "WHERE rolname = current_user")[0]["su"]
    extra = cat.setting(CONNINFO_SETTING)
    if not su and not (extra and "password" in extra.lower()):
        return None
    row = cat.query("SELECT current_database()::text AS d, current_user::text AS u, "
                    "current_setting('port') AS p, "
                    "CASE WHEN $1 OR pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') "
                    "THEN split_part(current_setting('unix_socket_directories'), ',', 1) END "
                    "AS s", [su], ["bool"])[0]

    def q(v: str) -> str:
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"

    host = (row["s"] or "").strip() or "localhost"
    info = f"dbname={q(row['d'])} user={q(row['u'])} port={q(row['p'])} host={q(host)}"
    return info + (" " + extra if extra else "")


@dataclass
class FitRequest:
    kind: str  # 'fit_multiple' or 'fit'
    source: PackedTable
    validation: PackedTable | None
    output: TableName
    configs: list[Config]
    num_iterations: int
    frequency: int | None
    policy: str
    policy_params: dict[str, Any]
    random_state: int
    num_workers: int
    use_caching: bool
    mst_table: TableName | None
    arch_table: TableName
    warm_start: bool = False
    name: str | None = None
    description: str | None = None
    replicas: int = 1


def _bytea_literal(b: bytes | None) -> str:
    return "NULL" if b is None else "'\\x" + bytes(b).hex() + "'::bytea"


def _register(cat: Catalog, ex: DblinkExecutor, req: FitRequest, total: int) -> int:
    opts = {"x": req.source.x, "y": req.source.y, "use_caching": req.use_caching,
            "worker_threads": max(1, (os.cpu_count() or 1) // req.num_workers),
            "state_chunk_size": int(cat.setting(CHUNK_SETTING) or 0) or None,
            "policy_params": req.policy_params, "num_workers": req.num_workers,
            "replicas": req.replicas,
            "frequency": req.frequency, "arch_table": str(req.arch_table),
            "warm_start": req.warm_start, "name": req.name, "description": req.description,
            "executor_tag": ex.tag, "source_name": str(req.source.table),
            "validation_name": str(req.validation.table) if req.validation else None}
    lit = cat.literal
    sql = (f"INSERT INTO {cat.ext('fits')} (kind, source_table, validation_table, "
           "model_output_table, model_selection_table, policy, num_partitions, num_iterations, "
           "metrics_compute_frequency, random_state, options, total_units, coordinator_pid) "
           f"VALUES ({lit(req.kind)}, {lit(req.source.qualified)}, "
           f"{lit(req.validation.qualified) if req.validation else 'NULL'}, "
           f"{lit(str(req.output))}, {lit(str(req.mst_table)) if req.mst_table else 'NULL'}, "
           f"{lit(req.policy)}, {req.source.partitions}, {req.num_iterations}, "
           f"{req.frequency or req.num_iterations}, {req.random_state}, "
           f"{lit(json.dumps(opts))}::jsonb, {total}, {_my_pid(cat)}) RETURNING fit_id")
    fit_id = int(ex.control_query(sql)[0][0])
    ex.fit_id = fit_id
    for c in req.configs:
        ex.control(f"INSERT INTO {cat.ext('fit_configs')} (fit_id, mst_key, model_id, "
                   "compile_params, fit_params, model_arch, init_weights) VALUES "
                   f"({fit_id}, {int(c.mst_key)}, {int(c.model_id)}, {lit(c.compile_params)}, "
                   f"{lit(c.fit_params)}, {lit(c.arch)}::json, {_bytea_literal(c.weights)})")
    return fit_id


class _UnitExecutor:
    """Adapts :class:`DblinkExecutor` to the coordinator: assignments to unit statements."""

    def __init__(self, cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
        self.cat, self.ex, self.fit_id = cat, ex, fit_id

    def submit(self, a: Assignment, options: dict[str, Any]) -> None:
        kind = "train" if a.kind != EVAL else "eval"
        sql = (f"SELECT {self.cat.ext('__run_unit')}({self.fit_id}::bigint, {int(a.config)}, "
               f"{int(a.epoch)}, {int(a.partition)}, {int(a.worker)}, {self.cat.literal(kind)}, "
               f"{self.cat.literal(json.dumps(options))})")
        self.ex.submit(a.worker, sql, key=(a.config, kind))

    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        return [(r.worker, r.ok, r.data) for r in self.ex.wait(timeout)]

    def recover(self, worker: int) -> bool:
        return self.ex.reopen(worker)

    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None:
        """Record the failed attempt (control session: committed at once)."""
        lit = self.cat.literal
        pid = data.get("worker_pid")
        self.ex.control(
            f"INSERT INTO {self.cat.ext('unit_failures')} (fit_id, mst_key, epoch, partition, "
            f"kind, worker, worker_pid, attempt, message) VALUES ({self.fit_id}, "
            f"{int(unit.config)}, {int(unit.epoch)}, {int(unit.partition)}, {lit(unit.kind)}, "
            f"{int(unit.worker)}, {int(pid) if pid else 'NULL'}, {int(attempt)}, "
            f"{lit(str(data.get('message') or '')[:2000])})")


class _WorkerPool:
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
        self.ex.control(f"UPDATE {self.cat.ext('fits')} SET requested_workers = NULL "
                        f"WHERE fit_id = {self.fit_id}")
        self.close()
        for w, parts in workers.items():
            self.record(w, parts, "active")

    def record(self, worker: int, parts: frozenset[int] | None, status: str) -> None:
        pid = self.ex.pids.get(worker)
        arr = "ARRAY[" + ",".join(str(int(q)) for q in sorted(parts or ())) + "]::integer[]"
        upd = f"partitions = {arr}, " if parts is not None else ""
        self.ex.control(
            f"INSERT INTO {self.cat.ext('fit_workers')} AS w (fit_id, worker, partitions, "
            f"status, pid) VALUES ({self.fit_id}, {int(worker)}, {arr}, "
            f"{self.cat.literal(status)}, {int(pid) if pid else 'NULL'}) ON CONFLICT "
            f"(fit_id, worker) DO UPDATE SET {upd}status = excluded.status, pid = "
            "coalesce(excluded.pid, w.pid), updated_at = clock_timestamp()")

    def requested(self) -> int | None:
        now = time.monotonic()
        if now - self._last < self.poll_interval:
            return None
        self._last = now
        rows = self.ex.control_query(f"SELECT requested_workers FROM {self.cat.ext('fits')} "
                                     f"WHERE fit_id = {self.fit_id}")
        want = int(rows[0][0]) if rows and rows[0][0] is not None else None
        if want is None or want == self._seen:
            return None
        self._seen = want
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
        self.ex.control(f"UPDATE {self.cat.ext('fit_workers')} SET status = 'closed', "
                        f"updated_at = clock_timestamp() WHERE fit_id = {self.fit_id} AND "
                        "status IN ('active', 'joining')")


def _replicas(cat: Catalog) -> int:
    raw = cat.setting(REPLICAS_SETTING)
    try:
        r = 1 if raw is None or raw == "" else int(raw)
    except ValueError:
        r = 0
    if r < 1:
        raise invalid(f"{REPLICAS_SETTING} must be a positive integer, got {raw!r}")
    return r


def _refused_reopen(cat: Catalog) -> set[int]:
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


def _my_pid(cat: Catalog) -> int:
    return int(cat.query("SELECT pg_catalog.pg_backend_pid() AS p")[0]["p"])


def _fault_settings(cat: Catalog) -> tuple[int, float | StallRule | None, dict[str, str]]:
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


LIVE_COORDINATOR = (
    "EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = f.coordinator_pid "
    "AND a.backend_start <= coalesce(f.resumed_at, f.started_at))")


def _mark_interrupted(cat: Catalog, ex: DblinkExecutor) -> None:
    """Fits of this role still 'running' whose coordinator session is gone (or whose
    calling transaction rolled back its outputs: no coordinator recorded, see
    :func:`mark_done`) become 'interrupted' (resumable with madlib_keras_fit_resume). Rows
    locked by a calling transaction still open are skipped, not waited for."""
    ex.control(f"UPDATE {cat.ext('fits')} f SET status = 'interrupted', ended_at = "
               "clock_timestamp(), message = CASE WHEN f.coordinator_pid IS NULL THEN "
               "'the transaction that called the fit did not commit its outputs; resume it "
               "with madlib_keras_fit_resume(' || f.fit_id || ')' ELSE "
               "pg_catalog.format('the coordinator session (pid %s) ended before the fit did; "
               "resume it with madlib_keras_fit_resume(%s)', f.coordinator_pid, f.fit_id) END "
               f"WHERE f.fit_id IN (SELECT f.fit_id FROM {cat.ext('fits')} f WHERE f.status = "
               f"'running' AND f.owner = current_user AND NOT {LIVE_COORDINATOR} "
               "FOR UPDATE SKIP LOCKED)")


@dataclass
class ResumePoint:
    """What a resumed fit takes from the catalog."""

    fit_id: int
    tag: str | None


def _claim(cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
    """Make this session the fit's coordinator, if the fit is not done and no live
    coordinator has it (atomic: two resumes cannot both win)."""
    rows = ex.control_query(
        f"UPDATE {cat.ext('fits')} f SET status = 'running', coordinator_pid = {_my_pid(cat)}, "
        "message = NULL, ended_at = NULL, resumed_at = clock_timestamp(), resumes = "
        "resumes + 1, cancel_requested = NULL, options = options || jsonb_build_object("
        f"'executor_tag', {cat.literal(ex.tag)}::text) WHERE f.fit_id = {int(fit_id)} AND "
        f"(f.status IN ('interrupted', 'failed', 'cancelled') OR (f.status = 'running' AND "
        f"NOT {LIVE_COORDINATOR})) RETURNING f.fit_id")
    if not rows:
        raise CerebroError(f"fit {fit_id} is done or has a live coordinator session",
                           "55006", hint="Only an interrupted, cancelled or failed fit can be "
                           "resumed.")
    ex.fit_id = fit_id


def take_over(cat: Catalog, ex: DblinkExecutor, resume: ResumePoint) -> tuple[int, float]:
    """Claim an interrupted fit for this session, end its orphaned worker sessions; returns
    the fit_id and its original start (epoch seconds)."""
    _claim(cat, ex, resume.fit_id)
    if resume.tag:
        end_sessions(cat, f"cerebro_db {resume.tag} worker ")
    t0 = float(cat.query(f"SELECT extract(epoch FROM started_at)::float8 AS t FROM "
                         f"{cat.ext('fits')} WHERE fit_id = $1", [resume.fit_id],
                         ["int8"])[0]["t"])
    return resume.fit_id, t0


def mark_failed(cat: Catalog, ex: DblinkExecutor, fit_id: int, e: BaseException) -> None:
    """Record a fit's failure (its message), if this session still coordinates it: status
    'cancelled' for a cancel (``pg_cancel_backend``, ``statement_timeout``,
    ``cerebro_db_cancel_fit``: SQLSTATE 57014), else 'failed'; both are resumable."""
    try:
        msg = getattr(e, "message", None) or str(e)
        status = "cancelled" if is_cancel(e) else "failed"
        if status == "cancelled":
            msg = (f"{msg.strip()}; the units committed so far are kept: resume it with "
                   f"madlib_keras_fit_resume({fit_id})")
        ex.control(f"UPDATE {cat.ext('fits')} SET status = {cat.literal(status)}, message = "
                   f"{cat.literal(msg[:2000])}, ended_at = clock_timestamp() "
                   f"WHERE fit_id = {fit_id} AND coordinator_pid = {_my_pid(cat)}")
    except Exception:  # noqa: BLE001, S110 - the original error matters more
        pass


def mark_done(cat: Catalog, ex: DblinkExecutor, fit_id: int) -> None:
    """Mark the fit done in the caller's transaction, after its outputs were written there:
    the catalog then agrees with the caller's COMMIT or ROLLBACK.

    The control session first records that no coordinator runs the fit any more (committed
    at once); the caller's transaction then sets 'done'. If that transaction rolls back, the
    fit is 'running' with no coordinator, i.e. interrupted (``fit_progress`` shows it so),
    and a resume (which only writes the outputs again: every unit is in the log) waits for
    the caller's transaction to end, then finds it done or resumable. A resume that took the
    fit over in between makes this call fail (the caller's outputs roll back)."""
    ex.control(f"UPDATE {cat.ext('fits')} SET coordinator_pid = NULL WHERE fit_id = "
               f"{int(fit_id)} AND coordinator_pid = {_my_pid(cat)}")
    rows = cat.query(f"UPDATE {cat.ext('fits')} SET status = 'done', message = NULL, "
                     "ended_at = clock_timestamp() WHERE fit_id = $1 AND status = 'running' "
                     "AND coordinator_pid IS NULL RETURNING fit_id", [fit_id], ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} was taken over by another session before its "
                           "outputs were written", "55006")


def _from_log(cat: Catalog, fit_id: int, targets: dict[int, int], p: int,
              workers: dict[int, set[int]], eval_epochs: frozenset[int]
              ) -> tuple[Progress, dict[int, ConfigResult], int, float]:
    """Progress, per-config results, training units done and seconds spent, from the units
    committed so far (in commit order; units in flight when the fit stopped are absent)."""
    rows = cat.query(
        f"SELECT u.mst_key, u.epoch, u.partition, u.worker, u.kind, u.loss, u.rows, "
        f"u.metrics, extract(epoch FROM u.ended_at - f.started_at)::float8 AS at "
        f"FROM {cat.ext('units')} u JOIN {cat.ext('fits')} f USING (fit_id) "
        "WHERE u.fit_id = $1 ORDER BY u.unit_id", [fit_id], ["int8"])
    records, results = [], {c: ConfigResult() for c in targets}
    done, spent = 0, 0.0
    for i, r in enumerate(rows):
        spent = max(spent, float(r["at"]))
        res = results[r["mst_key"]]
        metrics = {str(k): v for k, v in enumerate(r["metrics"] or [])}
        if r["kind"] == TRAIN:
            done += 1
            res.train_loss.setdefault(r["epoch"], []).append((r["loss"], r["rows"]))
        else:
            res.evals.setdefault((r["epoch"], r["kind"]), []).append(
                {"loss": r["loss"], "rows": r["rows"], "metrics": metrics})
            if r["kind"] == "eval_train" and len(res.evals[(r["epoch"], r["kind"])]) == p:
                res.eval_done_at[r["epoch"]] = float(r["at"])
        if r["kind"] != "eval_valid":
            records.append({"config": r["mst_key"], "epoch": r["epoch"],
                            "partition": r["partition"], "worker": r["worker"],
                            "kind": TRAIN if r["kind"] == TRAIN else EVAL,
                            "start": float(i), "end": float(i), "ok": True})
    progress = Progress.from_log(records, targets, p, workers, eval_epochs)
    return progress, results, done, spent


def execute_fit(cat: Catalog, req: FitRequest,
                finish: Callable[[int, FitOutcome, float], None],
                resume: ResumePoint | None = None) -> tuple[int, FitOutcome]:
    """Register the fit (or, with ``resume``, take over an interrupted one and continue from
    its unit log), run it on worker sessions, then ``finish(fit_id, outcome, start)`` (which
    writes the outputs in the caller's transaction); the fit is marked done only after
    that, and failed (with the message) on any error."""
    eval_epochs = evaluation_epochs(req.num_iterations, req.frequency)
    p = req.source.partitions
    targets = {c.mst_key: req.num_iterations for c in req.configs}
    workers = initial_workers(req.num_workers, p, min(req.replicas, p))
    seeded = {"random_state": req.random_state} \
        if "random_state" in policy_class(req.policy).option_names else {}
    policy = get_policy(req.policy, **seeded, **req.policy_params)
    total = len(req.configs) * req.num_iterations * p
    if total > MAX_UNITS:
        raise invalid(f"the fit has {total} training units ({len(req.configs)} configurations "
                      f"x {req.num_iterations} iterations x {p} partitions), more than "
                      f"{MAX_UNITS}", hint="Use fewer iterations or configurations.")
    retries, timeout, forward = _fault_settings(cat)
    ex = DblinkExecutor(cat, f"{os.getpid()}_{int(time.time() * 1000) % 10**9}",
                        len(workers), _conninfo(cat), unit_timeout=timeout)
    ex.refuse_reopen = _refused_reopen(cat)
    t0 = time.time()
    fit_id = None
    try:
        ex.open(forward)
        _mark_interrupted(cat, ex)
        results, done, spent = None, 0, 0.0
        if resume is None:
            progress = Progress(targets, p, workers, eval_epochs)
            fit_id = _register(cat, ex, req, total)
        else:
            fit_id, t0 = take_over(cat, ex, resume)
            progress, results, done, spent = _from_log(cat, fit_id, targets, p, workers,
                                                       eval_epochs)
        pool = _WorkerPool(cat, ex, fit_id, p, req.replicas)
        pool.start(workers)
        what = "resumes" if resume else "starts"
        cat.notice(f"fit {fit_id} {what}: {len(req.configs)} configurations x "
                   f"{req.num_iterations} iterations on {p} partitions, {len(workers)} worker "
                   f"sessions{f' ({req.replicas} replicas)' if req.replicas > 1 else ''}, "
                   f"policy {req.policy}"
                   + (f", {done}/{total} training units already done" if resume else "")
                   + f"; watch: SELECT * FROM {cat.schema}.fit_progress WHERE fit_id = {fit_id}")
        eval_kinds = ["eval_train"] + (["eval_valid"] if req.validation else [])
        outcome = run_fit(policy, progress, _UnitExecutor(cat, ex, fit_id), eval_kinds=eval_kinds,
                          num_partitions=p, snapshot_epochs=lambda c, e: e in eval_epochs,
                          notice=cat.notice, max_unit_retries=retries, results=results,
                          done_units=done, elapsed_before=spent, pool=pool)
        pool.close()
        finish(fit_id, outcome, t0)
        mark_done(cat, ex, fit_id)
        ex.control(f"DELETE FROM {cat.ext('model_states')} WHERE fit_id = {fit_id} AND "
                   "version <> 'current'")
        return fit_id, outcome
    except BaseException as e:
        if fit_id is not None:
            mark_failed(cat, ex, fit_id, e)
        raise
    finally:
        ex.close()


def final_weights(cat: Catalog, fit_id: int, mst_key: int) -> bytes:
    from ..worker import load_state

    data = load_state(cat, fit_id, mst_key, "current")
    if data is None:
        raise CerebroError(f"no final state for mst_key {mst_key}", "XX000")
    st = state_mod.decode_state(data)
    return b"".join(np.asarray(w, dtype="<f4").tobytes() for w in st.weights)


def _series(r: ConfigResult, epochs: list[int], kind: str) -> tuple[list[float], list[list[float]]]:
    losses, metrics = [], []
    for e in epochs:
        parts = r.evals.get((e, kind))
        if not parts:
            losses.append(float("nan"))
            metrics.append([])
            continue
        loss, m = combine(parts)
        losses.append(loss)
        metrics.append(m)
    return losses, metrics


def _first(ms: list[list[float]]) -> list[float | None]:
    return [m[0] if m else None for m in ms]


INFO_COLUMNS = [
    ("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"), ("compile_params", "text"),
    ("fit_params", "text"), ("model_type", "text"), ("model_size", "double precision"),
    ("metrics_elapsed_time", "double precision[]"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "double precision"),
    ("training_loss_final", "double precision"), ("training_metrics", "double precision[]"),
    ("training_loss", "double precision[]"), ("validation_metrics_final", "double precision"),
    ("validation_loss_final", "double precision"), ("validation_metrics", "double precision[]"),
    ("validation_loss", "double precision[]"), ("metrics_iters", "integer[]"),
    ("training_metrics_all", "double precision[]"), ("validation_metrics_all",
                                                    "double precision[]"),
    ("fit_id", "bigint"),
]
INFO_TYPES = ["int4", "int4", "text", "text", "text", "float8", "float8[]", "text[]", "text",
              "float8", "float8", "float8[]", "float8[]", "float8", "float8", "float8[]",
              "float8[]", "int4[]", "float8[]", "float8[]", "int8"]


def info_rows(req: FitRequest, fit_id: int, outcome: FitOutcome,
              sizes: dict[int, int]) -> list[list[Any]]:
    epochs = sorted(evaluation_epochs(req.num_iterations, req.frequency))
    rows = []
    for c in req.configs:
        r = outcome.results[c.mst_key]
        tl, tm = _series(r, epochs, "eval_train")
        vl, vm = _series(r, epochs, "eval_valid") if req.validation else ([], [])
        loss = c.cp.loss if isinstance(c.cp.loss, str) else json.dumps(c.cp.loss)
        elapsed = [r.eval_done_at.get(e) for e in epochs]
        rows.append([
            c.mst_key, c.model_id, c.compile_params, c.fit_params, "madlib_keras",
            sizes[c.mst_key] / 1024.0, elapsed, c.cp.metric_names(), loss,
            tm[-1][0] if tm and tm[-1] else None, tl[-1] if tl else None, _first(tm), tl,
            (vm[-1][0] if vm and vm[-1] else None) if req.validation else None,
            vl[-1] if vl else None, _first(vm) if req.validation else None,
            vl if req.validation else None, epochs,
            tm if all(tm) and tm and tm[0] else None,
            vm if req.validation and vm and all(vm) and vm[0] else None, fit_id,
        ])
    return rows


def summary_select(req: FitRequest) -> str:
    """A SELECT list over the source summary (alias s) for the output's _summary table."""
    dep = req.source.y
    cv = quote_ident(dep + "_class_values")
    sel = (
        "$1::text AS source_table, $2::text AS validation_table, $3::text AS model, "
        "$4::text AS model_info, s.dependent_varname, s.independent_varname, "
        "$5::text AS model_arch_table, $6::text AS model_selection_table, "
        "NULL::text AS object_table, $7::int AS num_iterations, "
        "$8::int AS metrics_compute_frequency, $9::boolean AS warm_start, $10::text AS name, "
        "$11::text AS description, to_timestamp($12)::timestamp AS start_training_time, "
        "clock_timestamp()::timestamp AS end_training_time, $13::text AS madlib_version, "
        f"s.num_classes, s.{cv}, s.dependent_vartype, s.normalizing_const, "
        "$14::int[] AS metrics_iters, $15::bigint AS fit_id, $16::text AS scheduling_policy, "
        "s.num_partitions"
    )
    return sel


def create_summary(cat: Catalog, req: FitRequest, summ: TableName, info: TableName | None,
                   fit_id: int, t0: float, warm: bool, name: str | None,
                   description: str | None) -> None:
    """The output's ``_summary`` table: this fit's facts plus the source summary's."""
    epochs = sorted(evaluation_epochs(req.num_iterations, req.frequency))
    src_summary = req.source.table.with_suffix("_summary", "source_table")
    cat.query(
        f"CREATE TABLE {summ.sql} AS SELECT {summary_select(req)} FROM {src_summary.sql} s",
        [str(req.source.table), str(req.validation.table) if req.validation else None,
         str(req.output), str(info) if info else None, str(req.arch_table),
         str(req.mst_table) if req.mst_table else None, req.num_iterations, req.frequency,
         warm, name, description, t0, __version__, epochs, fit_id, req.policy],
        ["text", "text", "text", "text", "text", "text", "int4", "int4", "bool", "text", "text",
         "float8", "text", "int4[]", "int8", "text"])


def write_outputs(cat: Catalog, req: FitRequest, fit_id: int, outcome: FitOutcome, t0: float,
                  warm_start: bool, name: str | None, description: str | None) -> None:
    sizes: dict[int, int] = {}
    weights: dict[int, bytes] = {}
    for c in req.configs:
        weights[c.mst_key] = final_weights(cat, fit_id, c.mst_key)
        sizes[c.mst_key] = len(weights[c.mst_key])
    out = req.output
    info = out.with_suffix("_info", "model_output_table")
    summ = out.with_suffix("_summary", "model_output_table")
    cat.create_table(out, [("mst_key", "integer PRIMARY KEY"), ("model_weights", "bytea"),
                           ("model_arch", "json")], external_storage=["model_weights"])
    cat.insert(out, ["mst_key", "model_weights", "model_arch"], ["int4", "bytea", "json"],
               ([c.mst_key, weights[c.mst_key], c.arch] for c in req.configs))
    cat.create_table(info, INFO_COLUMNS)
    cat.insert(info, [n for n, _ in INFO_COLUMNS], INFO_TYPES,
               info_rows(req, fit_id, outcome, sizes))
    create_summary(cat, req, summ, info, fit_id, t0, warm_start, name, description)


def _bool(v: bool | None, default: bool) -> bool:
    return default if v is None else bool(v)


def _check_common(num_iterations: int | None, metrics_compute_frequency: int | None,
                  use_gpus: bool | None) -> None:
    if num_iterations is None:
        raise CerebroError("num_iterations must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not 1 <= num_iterations <= MAX_ITERATIONS:
        raise invalid(f"num_iterations must be between 1 and {MAX_ITERATIONS}, got "
                      f"{num_iterations}")
    if metrics_compute_frequency is not None and not (
            1 <= metrics_compute_frequency <= num_iterations):
        raise invalid(f"metrics_compute_frequency must be between 1 and num_iterations "
                      f"({num_iterations}), got {metrics_compute_frequency}")
    if use_gpus and not os.path.exists("/dev/nvidiactl"):
        raise CerebroError("use_gpus is TRUE but this server has no GPU", FEATURE_NOT_SUPPORTED,
                           hint="Call with use_gpus => FALSE.")


def _outputs_absent(cat: Catalog, out: TableName, suffixes: Sequence[str], warm: bool) -> None:
    require_output_schema(cat, out, "model_output_table" if "_info" in suffixes else "model")
    for s in suffixes:
        t = out.with_suffix(s, "model_output_table") if s else out
        if cat.relation_oid(t) is not None and not warm:
            raise CerebroError(f'output table "{t}" already exists', DUPLICATE_TABLE,
                               hint="Drop it, choose another name, or pass warm_start => TRUE "
                               "to continue from its weights.")


def _warm_weights(cat: Catalog, out: TableName, configs: list[Config], key: str) -> None:
    """warm_start: take each config's weights from the existing output table, then drop the
    old outputs (in this transaction: a failure keeps them)."""
    oid = cat.relation_oid(out)
    if oid is None:
        raise CerebroError(f'warm_start needs the output table "{out}", which does not exist',
                           UNDEFINED_TABLE, hint="Run once without warm_start first.")
    cols = cat.columns(oid)
    if "model_weights" not in cols:
        raise invalid(f'"{out}" has no model_weights column')
    if key in cols:
        rows = cat.query(f"SELECT {quote_ident(key)} AS k, model_weights AS w FROM {out.sql}")
        have = {r["k"]: r["w"] for r in rows}
    else:
        rows = cat.query(f"SELECT model_weights AS w FROM {out.sql}")
        have = {configs[0].mst_key: rows[0]["w"]} if rows else {}
    for c in configs:
        if have.get(c.mst_key) is not None:
            c.weights = bytes(have[c.mst_key])
    for s in ("", "_summary", "_info"):
        t = out.with_suffix(s, "model_output_table") if s else out  # (no _info after fit)
        if cat.relation_oid(t) is not None:
            cat.drop_table(t)


def _policy(scheduling_policy: str | None, policy_params: str | None,
            random_state: int | None) -> tuple[str, dict[str, Any]]:
    """The policy name and options. For MOP the defaults are ``prefer_lagging`` (a shorter
    tail) and, when the caller fixed ``random_state``, ``seeded_order`` (each config's visit
    order depends on the seed only, so two runs give the same models)."""
    name = (scheduling_policy or "mop").strip().lower()
    opts = params.parse_keyword_string(policy_params, "policy_params")
    if "random_state" in opts:
        raise invalid("policy_params cannot set random_state; use the random_state argument")
    if name in ("mop", "random"):
        opts.setdefault("prefer_lagging", True)
        opts.setdefault("seeded_order", random_state is not None)
    get_policy(name, **opts)  # validates the name and options before any work
    return name, opts


def _validation(cat: Catalog, validation_table: str | None, src: PackedTable
                ) -> PackedTable | None:
    if validation_table is None:
        return None
    v = packed_table(cat, validation_table, "validation_table")
    if v.partitions != src.partitions:
        raise invalid(f'validation_table "{v.table}" has {v.partitions} partitions, the '
                      f"training data {src.partitions}",
                      hint="Preprocess the validation data with validation_preprocessor_dl "
                      "from this training table.")
    if (v.x_size, v.y_width) != (src.x_size, src.y_width):
        raise CerebroError(f'validation_table "{v.table}" rows have {v.x_size} features and '
                           f"{v.y_width} label columns, the training data {src.x_size} and "
                           f"{src.y_width}", DATATYPE_MISMATCH)
    return v


@entrypoint
def madlib_keras_fit_multiple_model(
        cat: Catalog, *, source_table: str, model_output_table: str, model_selection_table: str,
        num_iterations: int, use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool | None = False,
        name: str | None = None, description: str | None = None,
        use_caching: bool | None = False, scheduling_policy: str | None = "mop",
        policy_params: str | None = None, random_state: int | None = None) -> None:
    """Train every configuration of the model selection table by model hopper parallelism."""
    _check_common(num_iterations, metrics_compute_frequency, use_gpus)
    out = TableName.parse(model_output_table, "model_output_table")
    mst = TableName.parse(model_selection_table, "model_selection_table")
    warm = _bool(warm_start, False)
    pname, popts = _policy(scheduling_policy, policy_params, random_state)
    seed = resolve_seed(random_state)
    src = packed_table(cat, source_table, "source_table")
    val = _validation(cat, validation_table, src)
    _outputs_absent(cat, out, ("", "_summary", "_info"), warm)
    configs, arch = _load_configs(cat, mst)
    checked: dict[str, Any] = {}
    for c in configs:
        _check_config(c, src, checked)
    if warm:
        _warm_weights(cat, out, configs, "mst_key")
    req = FitRequest("fit_multiple", src, val, out, configs, num_iterations,
                     metrics_compute_frequency, pname, popts, seed, src.partitions,
                     _bool(use_caching, False), mst, arch, warm, name, description,
                     _replicas(cat))
    fit_id, outcome = execute_fit(
        cat, req, lambda f, o, t0: write_outputs(cat, req, f, o, t0, warm, name, description))
    cat.notice(f"madlib_keras_fit_multiple_model: fit {fit_id} trained {len(configs)} "
               f"configurations in {outcome.seconds:.1f} s; results in {out} and "
               f"{out.with_suffix('_info', 'model_output_table')}")


def _write_fit_outputs(cat: Catalog, req: FitRequest, fit_id: int, outcome: FitOutcome,
                       t0: float, warm: bool, name: str | None, description: str | None) -> None:
    """madlib_keras_fit's outputs: <model> (weights, arch) and <model>_summary with the
    summary columns plus the configuration and its metrics."""
    c = req.configs[0]
    w = final_weights(cat, fit_id, c.mst_key)
    out = req.output
    summ = out.with_suffix("_summary", "model")
    cat.create_table(out, [("model_weights", "bytea"), ("model_arch", "json")],
                     external_storage=["model_weights"])
    cat.insert(out, ["model_weights", "model_arch"], ["bytea", "json"], [[w, c.arch]])
    create_summary(cat, req, summ, None, fit_id, t0, warm, name, description)
    info = info_rows(req, fit_id, outcome, {c.mst_key: len(w)})[0]
    extra = INFO_COLUMNS[1:17]  # model_id .. validation_loss
    for col, typ in extra:
        cat.db.execute(f"ALTER TABLE {summ.sql} ADD COLUMN {quote_ident(col)} "
                       f"{typ.replace(' PRIMARY KEY', '')}")
    sets = ", ".join(f"{quote_ident(col)} = ${i + 1}" for i, (col, _) in enumerate(extra))
    cat.query(f"UPDATE {summ.sql} SET {sets}", info[1:17], INFO_TYPES[1:17])


@entrypoint
def madlib_keras_fit(
        cat: Catalog, *, source_table: str, model: str, model_arch_table: str, model_id: int,
        compile_params: str, fit_params: str, num_iterations: int,
        use_gpus: bool | None = False, validation_table: str | None = None,
        metrics_compute_frequency: int | None = None, warm_start: bool | None = None,
        name: str | None = None, description: str | None = None,
        object_table: str | None = None, random_state: int | None = None) -> None:
    """Train one configuration: sequential SGD over the partitions, one worker session that
    holds them all (MADlib averages models across segments instead)."""
    from .selection import _no_object_table

    _check_common(num_iterations, metrics_compute_frequency, use_gpus)
    _no_object_table(object_table)
    out = TableName.parse(model, "model")
    arch_t = TableName.parse(model_arch_table, "model_arch_table")
    if model_id is None:
        raise CerebroError("model_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    for label, v in (("compile_params", compile_params), ("fit_params", fit_params)):
        if v is None:
            raise CerebroError(f"{label} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    cp = params.parse_compile_params(compile_params)
    params.validate_compile_params(cp)
    fp = check_fit_bounds(params.parse_fit_params(fit_params))
    warm = _bool(warm_start, False)
    seed = resolve_seed(random_state)
    pname, popts = _policy("mop", None, random_state)
    src = packed_table(cat, source_table, "source_table")
    val = _validation(cat, validation_table, src)
    _outputs_absent(cat, out, ("", "_summary"), warm)
    require_arch_table(cat, arch_t, "model_arch_table")
    rows = cat.query(f"SELECT model_arch::text AS a, model_weights AS w FROM {arch_t.sql} "
                     "WHERE model_id = $1", [model_id], ["int4"])
    if not rows:
        raise CerebroError(f'model_id {model_id} does not exist in "{arch_t}"', "42704")
    cfg = Config(1, model_id, compile_params, fit_params, rows[0]["a"],
                 bytes(rows[0]["w"]) if rows[0]["w"] is not None else None, cp, fp)
    _check_config(cfg, src, {})
    if warm:
        _warm_weights(cat, out, [cfg], "mst_key")
    req = FitRequest("fit", src, val, out, [cfg], num_iterations, metrics_compute_frequency,
                     pname, popts, seed, 1, True, None, arch_t, warm, name, description,
                     _replicas(cat))
    fit_id, outcome = execute_fit(
        cat, req, lambda f, o, t0: _write_fit_outputs(cat, req, f, o, t0, warm, name,
                                                      description))
    cat.notice(f"madlib_keras_fit: fit {fit_id} trained model_id {model_id} in "
               f"{outcome.seconds:.1f} s; weights in {out}")


def stored_configs(cat: Catalog, fit_id: int) -> list[Config]:
    """A fit's configurations as its catalog rows hold them, by mst_key."""
    configs = []
    for r in cat.query(f"SELECT mst_key, model_id, compile_params, fit_params, "
                       f"model_arch::text AS arch, init_weights FROM {cat.ext('fit_configs')} "
                       "WHERE fit_id = $1 ORDER BY mst_key", [fit_id], ["int8"]):
        w = bytes(r["init_weights"]) if r["init_weights"] is not None else None
        configs.append(Config(r["mst_key"], r["model_id"], r["compile_params"], r["fit_params"],
                              r["arch"], w, params.parse_compile_params(r["compile_params"]),
                              params.parse_fit_params(r["fit_params"])))
    return configs


@entrypoint
def madlib_keras_fit_resume(cat: Catalog, *, fit_id: int) -> None:
    """Continue an interrupted (or failed) fit from the catalog: the units it committed are
    kept, each configuration continues from its last committed state, and the outputs are
    written as the original call would have. With a fixed random_state the result equals an
    uninterrupted run (the visit orders and unit seeds depend on the seed only)."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")
    rows = cat.query(f"SELECT f.*, {LIVE_COORDINATOR} AS live FROM {cat.ext('fits')} f "
                     "WHERE f.fit_id = $1", [fit_id], ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} does not exist", "42704",
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    f = rows[0]
    if f["status"] == "done":
        raise CerebroError(f"fit {fit_id} is already done", OBJECT_NOT_IN_PREREQUISITE_STATE)
    if f["status"] == "running" and f["live"]:
        raise CerebroError(f"fit {fit_id} is still running (coordinator pid "
                           f"{f['coordinator_pid']})", "55006",
                           hint="Only an interrupted or failed fit can be resumed.")
    opts = f["options"] if isinstance(f["options"], dict) else json.loads(f["options"])
    if "executor_tag" not in opts:
        raise CerebroError(f"fit {fit_id} was made by an older version and cannot be resumed",
                           FEATURE_NOT_SUPPORTED)
    src = packed_table(cat, opts.get("source_name") or f["source_table"], "source_table")
    if src.partitions != f["num_partitions"]:
        raise CerebroError(f'source_table "{src.table}" now has {src.partitions} partitions, '
                           f"fit {fit_id} was started on {f['num_partitions']}",
                           OBJECT_NOT_IN_PREREQUISITE_STATE)
    vname = opts.get("validation_name") or f["validation_table"]
    val = _validation(cat, vname, src) if vname else None
    out = TableName.parse(f["model_output_table"], "model_output_table")
    if f["kind"] == "automl":
        from .automl import resume_automl

        resume_automl(cat, f, opts, src, val, out)
        return
    warm = bool(opts.get("warm_start"))
    suffixes = ("", "_summary", "_info") if f["kind"] == "fit_multiple" else ("", "_summary")
    if warm:  # the interrupted call had not replaced them yet
        for sfx in suffixes:
            t = out.with_suffix(sfx, "model_output_table") if sfx else out
            if cat.relation_oid(t) is not None:
                cat.drop_table(t)
    else:
        _outputs_absent(cat, out, suffixes, False)
    configs = stored_configs(cat, fit_id)
    mst = TableName.parse(f["model_selection_table"], "model_selection_table") \
        if f["model_selection_table"] else None
    req = FitRequest(f["kind"], src, val, out, configs, f["num_iterations"],
                     opts.get("frequency"), f["policy"], dict(opts.get("policy_params") or {}),
                     int(f["random_state"]), int(opts["num_workers"]),
                     bool(opts.get("use_caching")), mst,
                     TableName.parse(opts["arch_table"], "model_arch_table"), warm,
                     opts.get("name"), opts.get("description"),
                     int(opts.get("replicas") or 1))
    if req.kind == "fit":
        def finish(fid: int, o: FitOutcome, t0: float) -> None:
            _write_fit_outputs(cat, req, fid, o, t0, warm, req.name, req.description)
    else:
        def finish(fid: int, o: FitOutcome, t0: float) -> None:
            write_outputs(cat, req, fid, o, t0, warm, req.name, req.description)
    _, outcome = execute_fit(cat, req, finish, ResumePoint(fit_id, opts.get("executor_tag")))
    cat.notice(f"madlib_keras_fit_resume: fit {fit_id} done in {outcome.seconds:.1f} s "
               f"({outcome.retried} unit attempts retried); results in {out}")


@entrypoint
def cerebro_db_fit_workers(cat: Catalog, *, fit_id: int, num_workers: int) -> None:
    """Ask a running fit for ``num_workers`` worker sessions: its coordinator opens new
    sessions or retires surplus workers (after their unit in flight) between units. Only the
    fit's owner (or a superuser) sees, hence changes, the fit."""
    if fit_id is None:
        raise CerebroError("fit_id must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if num_workers is None:
        raise CerebroError("num_workers must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not 1 <= num_workers <= MAX_WORKERS:
        raise invalid(f"num_workers must be between 1 and {MAX_WORKERS}, got {num_workers}")
    rows = cat.query(f"SELECT status FROM {cat.ext('fits')} WHERE fit_id = $1", [fit_id],
                     ["int8"])
    if not rows:
        raise CerebroError(f"fit {fit_id} does not exist", "42704",
                           hint=f"SELECT fit_id, status FROM {cat.schema}.fits lists your fits.")
    if rows[0]["status"] != "running":
        raise CerebroError(f"fit {fit_id} is not running (status {rows[0]['status']})",
                           OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Workers can only be changed while the fit runs.")
    cat.query(f"UPDATE {cat.ext('fits')} SET requested_workers = $2 WHERE fit_id = $1",
              [fit_id, num_workers], ["int8", "int4"])
    cat.notice(f"fit {fit_id}: asked for {num_workers} worker sessions; the coordinator "
               "applies it between units")
