"""Statements of a fit's lifecycle (:mod:`cerebro_db.fitrun`, :mod:`cerebro_db.sessions`,
:mod:`cerebro_db.automl_run`): register a fit, claim it, record a failed unit, keep the
worker map, save an AutoML step, mark the fit done or failed.

The fit's rows are written by its control session (committed at once, so workers and other
sessions see them): those statements travel as text through dblink and are composed here
with :meth:`Catalog.format_sql` (values quoted by PostgreSQL's ``format()``); the functions
returning ``str`` give such a statement for :meth:`DblinkExecutor.control`. The others run
in the calling session with bound parameters.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from . import Catalog
from .sessions import ext, purge

LIVE_COORDINATOR = (
    "EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = f.coordinator_pid "
    "AND a.backend_start <= coalesce(f.resumed_at, f.started_at))")
"""Whether the fit ``f`` has a live coordinator session (one that started before the fit
was last started or resumed: a recycled pid does not count)."""


# -- register, claim, end (control session) -----------------------------------------------
def register_fit(cat: Catalog, *, kind: str, source_table: str,
                 validation_table: str | None, model_output_table: str,
                 model_selection_table: str | None, policy: str, num_partitions: int,
                 num_iterations: int, metrics_compute_frequency: int, random_state: int,
                 options: dict[str, Any], total_units: int, coordinator_pid: int) -> str:
    """A new fit row, running, coordinated by ``coordinator_pid``; returns its fit_id."""
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'fits')} (kind, source_table, validation_table, "
        "model_output_table, model_selection_table, policy, num_partitions, num_iterations, "
        "metrics_compute_frequency, random_state, options, total_units, coordinator_pid) "
        "VALUES (%L, %L, %L, %L, %L, %L, %L::int, %L::int, %L::int, %L::bigint, %L::jsonb, "
        "%L::bigint, %L::int) RETURNING fit_id",
        [kind, source_table, validation_table, model_output_table, model_selection_table,
         policy, num_partitions, num_iterations, metrics_compute_frequency, random_state,
         json.dumps(options), total_units, coordinator_pid],
        ["text", "text", "text", "text", "text", "text", "int4", "int4", "int4", "int8",
         "text", "int8", "int4"])


def add_configs_of_new_fit(cat: Catalog, configs: Sequence[tuple[int, int, str, str, str,
                                                               bytes | None]]) -> str:
    """The configurations (mst_key, model_id, compile_params, fit_params, arch, weights) of
    the fit :func:`register_fit` just made in the same session: sent after it in one string,
    so both are one transaction (a cancel while they were sent one by one left a fit with 3
    of its 7 configurations, which a resume then finished with 3 models)."""
    seq = cat.ext("fits_fit_id_seq")
    rows = [cat.format_sql(
        "(pg_catalog.currval(%L::pg_catalog.regclass), %L::int, %L::int, %L, %L, %L::json, "
        "%L::bytea)",
        [seq, mst_key, model_id, compile_params, fit_params, arch,
         None if weights is None else bytes(weights)],
        ["text", "int4", "int4", "text", "text", "text", "bytea"])
        for mst_key, model_id, compile_params, fit_params, arch, weights in configs]
    return (f"INSERT INTO {cat.ext('fit_configs')} (fit_id, mst_key, model_id, compile_params, "
            "fit_params, model_arch, init_weights) VALUES " + ", ".join(rows))


def add_config(cat: Catalog, fit_id: int, mst_key: int, model_id: int, compile_params: str,
               fit_params: str, arch: str, weights: bytes | None) -> str:
    """A configuration of the fit (its initial weights: None for the architecture's)."""
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'fit_configs')} (fit_id, mst_key, model_id, compile_params, "
        "fit_params, model_arch, init_weights) VALUES (%L::bigint, %L::int, %L::int, %L, %L, "
        "%L::json, %L::bytea)",
        [fit_id, mst_key, model_id, compile_params, fit_params, arch,
         None if weights is None else bytes(weights)],
        ["int8", "int4", "int4", "text", "text", "text", "bytea"])


def mark_interrupted(cat: Catalog) -> str:
    """Fits of this role still 'running' whose coordinator is gone become 'interrupted'
    (rows locked by a calling transaction still open are skipped, not waited for)."""
    fits = cat.ext("fits")
    return (f"UPDATE {fits} f SET status = 'interrupted', ended_at = "
            "clock_timestamp(), message = CASE WHEN f.coordinator_pid IS NULL THEN "
            "'the transaction that called the fit did not commit its outputs; resume it "
            "with madlib_keras_fit_resume(' || f.fit_id || ')' ELSE "
            "pg_catalog.format('the coordinator session (pid %s) ended before the fit did; "
            "resume it with madlib_keras_fit_resume(%s)', f.coordinator_pid, f.fit_id) END "
            f"WHERE f.fit_id IN (SELECT f.fit_id FROM {fits} f WHERE f.status = "
            f"'running' AND f.owner = current_user AND NOT {LIVE_COORDINATOR} "
            "FOR UPDATE SKIP LOCKED)")


def claim(cat: Catalog, fit_id: int, coordinator_pid: int, executor_tag: str) -> str:
    """Make ``coordinator_pid`` the fit's coordinator if the fit is not done and no live
    coordinator has it (atomic: two resumes cannot both win); returns the fit_id, or no
    row."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'fits')} f SET status = 'running', coordinator_pid = %L::int, "
        "message = NULL, ended_at = NULL, resumed_at = clock_timestamp(), resumes = "
        "resumes + 1, cancel_requested = NULL, options = options OPERATOR(pg_catalog.||) "
        "pg_catalog.jsonb_build_object('executor_tag', %L::text) WHERE f.fit_id = %L::bigint "
        "AND (f.status IN ('interrupted', 'failed', 'cancelled') OR (f.status = 'running' "
        f"AND NOT {LIVE_COORDINATOR.replace('%', '%%')})) RETURNING f.fit_id",
        [coordinator_pid, executor_tag, fit_id], ["int4", "text", "int8"])


def mark_failed(cat: Catalog, fit_id: int, coordinator_pid: int, status: str,
                message: str) -> str:
    """The fit's end ('failed' or 'cancelled'), if ``coordinator_pid`` still has it."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'fits')} SET status = %L, message = %L, ended_at = "
        "clock_timestamp() WHERE fit_id = %L::bigint AND coordinator_pid = %L::int",
        [status, message, fit_id, coordinator_pid], ["text", "text", "int8", "int4"])


def release(cat: Catalog, fit_id: int, coordinator_pid: int) -> str:
    """No coordinator runs the fit any more (before its outputs are committed)."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'fits')} SET coordinator_pid = NULL WHERE fit_id = %L::bigint "
        "AND coordinator_pid = %L::int", [fit_id, coordinator_pid], ["int8", "int4"])


def purge_done_states(cat: Catalog) -> str:
    """The model states of this role's earlier fits whose done mark is committed. A done fit
    keeps its 'current' states past its end (:func:`drop_states`): its outputs and its done
    mark are written in the caller's transaction, and if that rolls back the fit is
    interrupted and a resume writes the outputs from them. Once another session (the next
    fit's control session) sees the fit done, that transaction committed and nothing reads
    them again."""
    states, fits = cat.ext("model_states"), cat.ext("fits")
    return (f"UPDATE {states} s SET doomed = true FROM {fits} f WHERE s.fit_id = f.fit_id AND "
            "f.status = 'done' AND f.owner = current_user AND s.owner = current_user; "
            + purge(cat, "model_states"))


def purge_postings(cat: Catalog) -> str:
    """The units posted in worker sessions' slots (``unit_postings``) of this role's fits
    that no coordinator runs any more (their executor closes without deleting its rows when
    it ends abnormally, e.g. terminated)."""
    postings, fits = cat.ext("unit_postings"), cat.ext("fits")
    return (f"UPDATE {postings} p SET doomed = true FROM {fits} f WHERE p.fit_id = f.fit_id "
            "AND f.status <> 'running' AND f.owner = current_user AND p.owner = current_user; "
            + purge(cat, "unit_postings"))


def drop_states(cat: Catalog, fit_id: int, mst_keys: Sequence[int] = ()) -> str:
    """Model states a done fit no longer needs: every version but 'current', and all of
    ``mst_keys`` (AutoML trials freed). 'current' goes when the role's next fit starts
    (:func:`purge_done_states`)."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'model_states')} SET doomed = true WHERE fit_id = %L::bigint AND "
        "(version <> 'current' OR mst_key = ANY(%L::int[])); " + purge(cat, "model_states"),
        [fit_id, [int(k) for k in mst_keys]], ["int8", "int4[]"])


def record_unit_failure(cat: Catalog, fit_id: int, mst_key: int, epoch: int, partition: int,
                        kind: str, worker: int, worker_pid: int | None, attempt: int,
                        message: str) -> str:
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'unit_failures')} (fit_id, mst_key, epoch, partition, kind, "
        "worker, worker_pid, attempt, message) VALUES (%L::bigint, %L::int, %L::int, "
        "%L::int, %L, %L::int, %L::int, %L::int, %L)",
        [fit_id, mst_key, epoch, partition, kind, worker, worker_pid, attempt, message],
        ["int8", "int4", "int4", "int4", "text", "int4", "int4", "int4", "text"])


# -- the worker map (control session) -----------------------------------------------------
def clear_requested_workers(cat: Catalog, fit_id: int) -> str:
    return cat.format_sql(f"UPDATE {ext(cat, 'fits')} SET requested_workers = NULL "
                          "WHERE fit_id = %L::bigint", [fit_id], ["int8"])


def requested_workers(cat: Catalog, fit_id: int) -> str:
    return cat.format_sql(f"SELECT requested_workers FROM {ext(cat, 'fits')} "
                          "WHERE fit_id = %L::bigint", [fit_id], ["int8"])


def record_worker(cat: Catalog, fit_id: int, worker: int, partitions: Iterable[int] | None,
                  status: str, pid: int | None) -> str:
    """A worker's row in ``fit_workers`` (``partitions`` None: keep the recorded ones)."""
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'fit_workers')} AS w (fit_id, worker, partitions, status, "
        "pid) VALUES (%L::bigint, %L::int, coalesce(%L::integer[], '{}'), %L, %L::int) "
        "ON CONFLICT (fit_id, worker) DO UPDATE SET partitions = CASE WHEN %L THEN "
        "excluded.partitions ELSE w.partitions END, status = excluded.status, "
        "pid = coalesce(excluded.pid, w.pid), updated_at = clock_timestamp()",
        [fit_id, worker, None if partitions is None else sorted(int(q) for q in partitions),
         status, pid, partitions is not None],
        ["int8", "int4", "int4[]", "text", "int4", "bool"])


def close_workers(cat: Catalog, fit_id: int) -> str:
    """The workers still in the fit are closed (the fit's sessions end)."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'fit_workers')} SET status = 'closed', updated_at = "
        "clock_timestamp() WHERE fit_id = %L::bigint AND status IN ('active', 'joining')",
        [fit_id], ["int8"])


# -- AutoML steps (control session) -------------------------------------------------------
def copy_parent_state(cat: Catalog, fit_id: int, mst_key: int, parent: int) -> str:
    """A branched trial starts from its parent's current state."""
    states = ext(cat, "model_states")
    return cat.format_sql(
        f"INSERT INTO {states} (fit_id, mst_key, version, chunk, data) SELECT fit_id, "
        f"%L::int, version, chunk, data FROM {states} WHERE fit_id = %L::bigint AND "
        "mst_key = %L::int AND version = 'current'", [mst_key, fit_id, parent],
        ["int4", "int8", "int4"])


def add_trial(cat: Catalog, fit_id: int, mst_key: int, parent: int | None,
              tunables: dict[str, Any], meta: dict[str, Any], target: int) -> str:
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'automl_trials')} (fit_id, mst_key, parent, tunables, meta, "
        "target) VALUES (%L::bigint, %L::int, %L::int, %L::jsonb, %L::jsonb, %L::int)",
        [fit_id, mst_key, parent, json.dumps(tunables), json.dumps(meta), target],
        ["int8", "int4", "int4", "text", "text", "int4"])


def record_decision(cat: Catalog, fit_id: int, seq: int, decision: str, mst_key: int,
                    target: int | None, reason: str | None, meta: dict[str, Any],
                    at_seconds: float) -> str:
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'automl_decisions')} (fit_id, seq, decision, mst_key, target, "
        "reason, meta, at_seconds) VALUES (%L::bigint, %L::int, %L, %L::int, %L::int, %L, "
        "%L::jsonb, %L::float8)",
        [fit_id, seq, decision, mst_key, target, reason, json.dumps(meta, default=str),
         at_seconds], ["int8", "int4", "text", "int4", "int4", "text", "text", "float8"])


def update_trials(cat: Catalog, fit_id: int,
                  rows: Sequence[tuple[int, str, int, int | None, float | None, str]]) -> str:
    """Trial rows (mst_key, status, target, last_epoch, score, meta as JSON text)."""
    keys, statuses, targets, epochs, scores, metas = (list(c) for c in zip(*rows))
    return cat.format_sql(
        f"UPDATE {ext(cat, 'automl_trials')} a SET status = v.s, target = v.t, "
        "last_epoch = v.e, score = v.sc, meta = v.m::jsonb, updated_at = clock_timestamp() "
        "FROM ROWS FROM (pg_catalog.unnest(%L::int[]), pg_catalog.unnest(%L::text[]), "
        "pg_catalog.unnest(%L::int[]), pg_catalog.unnest(%L::int[]), "
        "pg_catalog.unnest(%L::float8[]), pg_catalog.unnest(%L::text[])) "
        "AS v(k, s, t, e, sc, m) WHERE a.fit_id = %L::bigint AND a.mst_key = v.k",
        [keys, statuses, targets, epochs, scores, metas, fit_id],
        ["int4[]", "text[]", "int4[]", "int4[]", "float8[]", "text[]", "int8"])


def set_total_units(cat: Catalog, fit_id: int, total_units: int) -> str:
    return cat.format_sql(f"UPDATE {ext(cat, 'fits')} SET total_units = %L::bigint "
                          "WHERE fit_id = %L::bigint", [total_units, fit_id], ["int8", "int8"])


def save_automl_state(cat: Catalog, fit_id: int, method: str, state: str, book: str) -> str:
    """The procedure's and the book's JSON state after a step."""
    return cat.format_sql(
        f"INSERT INTO {ext(cat, 'automl_state')} (fit_id, method, state, book) VALUES "
        "(%L::bigint, %L, %L::jsonb, %L::jsonb) ON CONFLICT (fit_id) DO UPDATE SET "
        "state = excluded.state, book = excluded.book, updated_at = clock_timestamp()",
        [fit_id, method, state, book], ["int8", "text", "text", "text"])


def add_options(cat: Catalog, fit_id: int, options: dict[str, Any]) -> str:
    """Keys added to the fit's ``options``."""
    return cat.format_sql(
        f"UPDATE {ext(cat, 'fits')} SET options = options OPERATOR(pg_catalog.||) %L::jsonb "
        "WHERE fit_id = %L::bigint", [json.dumps(options), fit_id], ["text", "int8"])


def forget_trials(cat: Catalog, fit_id: int, keep: Iterable[int], seq: int) -> list[str]:
    """Remove what an AutoML run decided after its last saved step (step ``seq``, trials
    ``keep``): trials, their configurations and states, later decisions."""
    keys = sorted(int(k) for k in keep)
    out = [cat.format_sql(f"UPDATE {ext(cat, t)} SET doomed = true WHERE fit_id = %L::bigint "
                          "AND mst_key <> ALL(%L::int[])", [fit_id, keys], ["int8", "int4[]"])
           for t in ("model_states", "automl_trials", "fit_configs")]
    out.append(cat.format_sql(f"UPDATE {ext(cat, 'automl_decisions')} SET doomed = true "
                              "WHERE fit_id = %L::bigint AND seq > %L::int", [fit_id, seq],
                              ["int8", "int4"]))
    return out + [purge(cat, t) for t in ("model_states", "automl_trials", "fit_configs",
                                          "automl_decisions")]


# -- read and written by the calling session (bound parameters) ---------------------------
def mark_done(cat: Catalog, fit_id: int) -> bool:
    """'done' in the caller's transaction, if no coordinator took the fit over since."""
    rows = cat.query(f"UPDATE {cat.ext('fits')} SET status = 'done', message = NULL, "
                     "ended_at = clock_timestamp() WHERE fit_id = $1 AND status = 'running' "
                     "AND coordinator_pid IS NULL RETURNING fit_id", [fit_id], ["int8"])
    return bool(rows)


def started_at(cat: Catalog, fit_id: int) -> float:
    """When the fit first started (epoch seconds)."""
    return float(cat.query(f"SELECT extract(epoch FROM started_at)::float8 AS t FROM "
                           f"{cat.ext('fits')} WHERE fit_id = $1", [fit_id], ["int8"])[0]["t"])


def fit_row(cat: Catalog, fit_id: int) -> dict[str, Any] | None:
    """The fit's row, plus ``live``: whether a coordinator session runs it now, and
    ``mine``: whether its owner is the current user."""
    clear_stat_snapshot(cat)
    rows = cat.query(f"SELECT f.*, {LIVE_COORDINATOR} AS live, f.owner = current_user AS "
                     f"mine FROM {cat.ext('fits')} f WHERE f.fit_id = $1", [fit_id], ["int8"])
    return rows[0] if rows else None


def job_run_of_fit(cat: Catalog, fit_id: int) -> dict[str, Any] | None:
    """The job run (job_name, run) that trained the fit, if a job's run did."""
    rows = cat.query(f"SELECT job_name, run FROM {cat.ext('job_runs')} WHERE fit_id = $1 "
                     "ORDER BY run_id DESC LIMIT 1", [fit_id], ["int8"])
    return dict(rows[0]) if rows else None


def fit_status(cat: Catalog, fit_id: int) -> str | None:
    rows = cat.query(f"SELECT status FROM {cat.ext('fits')} WHERE fit_id = $1", [fit_id],
                     ["int8"])
    return rows[0]["status"] if rows else None


def coordinator_pid(cat: Catalog, fit_id: int) -> int | None:
    rows = cat.query(f"SELECT coordinator_pid FROM {cat.ext('fits')} WHERE fit_id = $1",
                     [fit_id], ["int8"])
    return rows[0]["coordinator_pid"] if rows else None


def request_workers(cat: Catalog, fit_id: int, num_workers: int) -> None:
    cat.query(f"UPDATE {cat.ext('fits')} SET requested_workers = $2 WHERE fit_id = $1",
              [fit_id, num_workers], ["int8", "int4"])


def unit_log(cat: Catalog, fit_id: int) -> list[dict[str, Any]]:
    """The fit's committed units in commit order; ``at``: seconds from the fit's start."""
    return cat.query(
        f"SELECT u.mst_key, u.epoch, u.partition, u.worker, u.kind, u.loss, u.rows, "
        f"u.metrics, u.seconds_run, "
        f"extract(epoch FROM u.ended_at - f.started_at)::float8 AS at "
        f"FROM {cat.ext('units')} u JOIN {cat.ext('fits')} f USING (fit_id) "
        "WHERE u.fit_id = $1 ORDER BY u.unit_id", [fit_id], ["int8"])


def stored_configs(cat: Catalog, fit_id: int) -> list[dict[str, Any]]:
    """The fit's configuration rows by mst_key (``arch`` as text)."""
    return cat.query(f"SELECT mst_key, model_id, compile_params, fit_params, "
                     f"model_arch::text AS arch, init_weights FROM {cat.ext('fit_configs')} "
                     "WHERE fit_id = $1 ORDER BY mst_key", [fit_id], ["int8"])


def automl_state(cat: Catalog, fit_id: int) -> dict[str, Any] | None:
    """The AutoML run's saved state and book (as JSON text), or None."""
    rows = cat.query(f"SELECT state::text AS state, book::text AS book FROM "
                     f"{cat.ext('automl_state')} WHERE fit_id = $1", [fit_id], ["int8"])
    return rows[0] if rows else None


def worker_limit_rows(cat: Catalog) -> list[dict[str, Any]]:
    """The ``limits`` rows for every role, then the calling role's (setting, value)."""
    return cat.query(f"SELECT setting, value FROM {cat.ext('limits')} WHERE role_name IS NULL "
                     "OR role_name = current_user ORDER BY role_name NULLS FIRST")


WORKER_NAME = "^cerebro_db [0-9]+_[0-9]+ worker [0-9]+$"
"""The application_name of a fit's worker session (``DblinkExecutor.application_name``:
``cerebro_db <coordinator pid>_<ms> worker <w>``), set when it joins the fit."""


def busy_workers(cat: Catalog, fit_id: int | None, coordinator_pid: int | None = None) -> int:
    """Worker sessions held by the calling role's other running fits: the larger of what
    the catalog says (``fit_workers`` of its running fits other than ``fit_id``) and the
    role's live worker sessions (``pg_stat_activity``) other than those of the coordinator
    ``coordinator_pid`` (default: this session). The role can edit its own catalog rows
    (mark a running fit's workers closed), not what the server says its sessions are. A
    worker session logs in as the session user and SETs ROLE to the fit's role, and
    ``pg_stat_activity`` names the login: the workers of both count (after SET ROLE to a
    group role, the login's own fits' workers count against the group's limit too; the
    group's fits run from other members' logins count by the catalog only).
    The statistics snapshot is dropped first: a transaction keeps the first one it read
    (a fit's coordinator runs in one transaction)."""
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")
    return int(cat.query(
        f"SELECT greatest((SELECT count(*) FROM {cat.ext('fit_workers')} w "
        f"JOIN {cat.ext('fits')} f USING (fit_id) WHERE w.status IN ('active', 'joining') "
        f"AND f.status = 'running' AND f.owner = current_user AND {LIVE_COORDINATOR} "
        "AND f.fit_id IS DISTINCT FROM $1), (SELECT count(*) FROM pg_catalog.pg_stat_activity a "
        "WHERE a.usename IN (current_user, session_user) "
        "AND a.application_name OPERATOR(pg_catalog.~) $2 "
        "AND pg_catalog.split_part(pg_catalog.split_part(a.application_name, ' ', 2), '_', 1) "
        "<> coalesce($3, pg_catalog.pg_backend_pid())::text)) AS n",
        [fit_id, WORKER_NAME, coordinator_pid], ["int8", "text", "int4"])[0]["n"])


def connection_facts(cat: Catalog) -> dict[str, Any]:
    """For a worker's conninfo: whether the caller is a superuser (su), the database (d),
    current_user (u), port (p) and, when the caller may read it, the socket directory (s)."""
    su = cat.query("SELECT rolsuper AS su FROM pg_catalog.pg_roles "
                   "WHERE rolname = current_user")[0]["su"]
    row = cat.query("SELECT current_database()::text AS d, current_user::text AS u, "
                    "current_setting('port') AS p, "
                    "CASE WHEN $1 OR pg_catalog.pg_has_role('pg_read_all_settings', 'USAGE') "
                    "THEN split_part(current_setting('unix_socket_directories'), ',', 1) END "
                    "AS s", [su], ["bool"])[0]
    return {"su": su, **row}


def conninfo(cat: Catalog, params: Sequence[tuple[str, str]]) -> str:
    """A libpq connection string of ``key=value`` pairs, each value quoted by PostgreSQL the
    way libpq reads it: in single quotes, a backslash or quote inside escaped by a
    backslash."""
    return cat.query(
        "SELECT pg_catalog.string_agg(pg_catalog.format($q$%s='%s'$q$, k, "
        r"pg_catalog.replace(pg_catalog.replace(v, E'\\', E'\\\\'), E'\'', E'\\\'')), "
        "' ' ORDER BY i) AS c FROM ROWS FROM (pg_catalog.unnest($1::text[]), "
        "pg_catalog.unnest($2::text[])) WITH ORDINALITY AS t(k, v, i)",
        [[k for k, _ in params], [str(v) for _, v in params]], ["text[]", "text[]"])[0]["c"]


def clear_stat_snapshot(cat: Catalog) -> None:
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")


# -- a dropped role's rows (cerebro_db_forget_role) -----------------------------------------
OWNED_TABLES = ("job_runs", "jobs", "unit_postings", "worker_tickets", "fit_workers", "units",
                "unit_failures", "model_states", "automl_decisions", "automl_trials",
                "automl_state", "fit_configs", "fits")
"""The catalog tables with an ``owner`` column, children before their parents."""


def role_exists(cat: Catalog, role: str) -> bool:
    return bool(cat.query("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname "
                          "OPERATOR(pg_catalog.=) $1::name) AS e", [role], ["text"])[0]["e"])


def role_jobs(cat: Catalog, role: str) -> list[dict[str, Any]]:
    """The jobs ``role`` owns: job_id, job_name, cron_jobid."""
    return [dict(r) for r in cat.query(
        f"SELECT job_id, job_name, cron_jobid FROM {cat.ext('jobs')} WHERE owner "
        "OPERATOR(pg_catalog.=) $1::name ORDER BY job_id", [role], ["text"])]


def forget_role(cat: Catalog, role: str) -> dict[str, int]:
    """Delete every catalog row ``role`` owns (a superuser's call: it bypasses row-level
    security); the rows deleted per table."""
    out = {}
    for t in OWNED_TABLES:
        out[t] = int(cat.query(
            f"WITH d AS (DELETE FROM {cat.ext(t)} WHERE owner OPERATOR(pg_catalog.=) "
            "$1::name RETURNING 1) SELECT pg_catalog.count(*) AS n FROM d", [role],
            ["text"])[0]["n"])
    return out
