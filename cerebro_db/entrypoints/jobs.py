"""Scheduled model selection: ``schedule_model_selection``, ``unschedule_model_selection``
and the steps of ``run_model_selection_job`` (a PL/pgSQL procedure that commits between them).

A run has four steps, each one transaction:

* ``begin``: takes the job's session advisory lock (a run that finds it taken writes a
  ``skipped`` history row and leaves) and writes the ``running`` history row;
* ``pack``: packs the source again into the job's packed table; with a key column only the
  rows whose key is above the largest key packed so far (``jobs.packed_through``), appended
  as new buffers spread over the same partitions with the same class values and normalizing
  constant; committed before training because the fit's worker sessions read it;
* ``train``: trains into staging tables and, in the same transaction, drops the previous
  outputs and renames the staging tables to the stable names, so readers see the old tables
  until the commit and the new ones after it;
* ``end``: releases the lock.

``pack`` and ``train`` catch every error (in a subtransaction, so nothing half-made stays),
record it in the history row and answer ``retry`` while the job has retries left.
"""
from __future__ import annotations

import json
import traceback
from typing import Any

from ..catalog import Catalog
from ..errors import (
    DATA_EXCEPTION,
    DATATYPE_MISMATCH,
    DUPLICATE_OBJECT,
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    QUERY_CANCELED,
    UNDEFINED_OBJECT,
    CerebroError,
    invalid,
)
from ..names import NAMEDATALEN, TableName, quote_ident, quote_literal, split_column_list
from . import entrypoint, require_output_schema

METHODS = {"fit": "madlib_keras_fit_multiple_model", "automl": "madlib_keras_automl"}
# Arguments of the training function the job sets itself.
JOB_SET = {"source_table", "model_output_table", "model_selection_table", "warm_start"}
REQUIRED = {"fit": {"num_iterations"},
            "automl": {"model_arch_table", "model_id_list", "compile_params_grid",
                       "fit_params_grid"}}
LOCK_CLASS = 1128416836  # the first int4 key of a job's advisory lock (the second: job_id)
MAX_JOB_NAME = 48


def _stage(t: TableName, job_id: int, what: str) -> TableName:
    """A staging table of the job, in the schema of ``t``."""
    name = f"__cerebro_job_{job_id}_{what}"
    return TableName(t.schema, name, TableName(t.schema, name, "").sql)


def _fn_args(cat: Catalog, fn: str) -> dict[str, str]:
    """Argument name -> SQL type of the extension's function ``fn`` (the MADlib signature)."""
    rows = cat.query(
        "SELECT p.proargnames::text[] AS n, array(SELECT pg_catalog.format_type(t, NULL) "
        "FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY u(t, i) ORDER BY i) AS t "
        "FROM pg_catalog.pg_proc p WHERE p.pronamespace = $1::regnamespace "
        "AND p.proname = $2 AND p.pronargs > 1", [quote_ident(cat.schema), fn],
        ["text", "text"])
    return dict(zip(rows[0]["n"], rows[0]["t"]))


def _as_text(v: Any, what: str) -> str | None:
    """A JSON value as the text of an SQL literal (arrays as '{...}')."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, str)):
        return str(v)
    if isinstance(v, list):
        items = []
        for x in v:
            if isinstance(x, (list, dict)):
                raise invalid(f"{what}: nested arrays are not supported, got {json.dumps(v)}")
            s = _as_text(x, what)
            items.append("NULL" if s is None else
                         '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"')
        return "{" + ",".join(items) + "}"
    raise invalid(f"{what}: expected a JSON scalar or array, got {json.dumps(v)}")


def _options(cat: Catalog, raw: Any, fn: str, reserved: set[str], what: str
             ) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse and check a JSONB object of named arguments of ``fn``; every value is cast to
    its argument's type here, so a job cannot fail later on a typo."""
    if raw is None:
        raw = "{}"
    try:
        opts = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as e:
        raise invalid(f"{what} is not valid JSON: {e}") from None
    if not isinstance(opts, dict):
        raise invalid(f"{what} must be a JSON object of named arguments of {fn}",
                      hint='For example \'{"num_iterations": 5}\'.')
    types = _fn_args(cat, fn)
    for k, v in opts.items():
        if k in reserved:
            raise invalid(f"{what}: {k!r} is set by the job", hint="Use the job's own argument.")
        if k not in types:
            allowed = ", ".join(sorted(set(types) - reserved))
            raise invalid(f"{what}: {fn} has no argument {k!r}", hint=f"Arguments: {allowed}.")
        text = _as_text(v, f"{what}.{k}")
        try:
            with cat.db.subtransaction():
                cat.query(f"SELECT $1::{types[k]} AS v", [text], ["text"])
        except Exception as e:  # noqa: BLE001 - the server's cast error, reported as ours
            msg = str(getattr(e, "args", [e])[0]).splitlines()[0]
            raise invalid(f"{what}: {k} = {json.dumps(v)} is not a valid {types[k]}: {msg}"
                          ) from None
    return opts, types


def _call(cat: Catalog, fn: str, fixed: list[tuple[str, Any, str]], opts: dict[str, Any],
          types: dict[str, str]) -> None:
    """SELECT fn(name => $n::type, ...) with bound values."""
    names, vals, tys = [], [], []
    for n, v, t in fixed:
        names.append(n)
        vals.append(v)
        tys.append(t)
    for k, v in opts.items():
        names.append(k)
        vals.append(_as_text(v, k))
        tys.append("text")
    args = ", ".join(f"{quote_ident(n)} => ${i + 1}::{types[n]}" for i, n in enumerate(names))
    # the entry point's wrapper resolves the names under the job's search_path: set it for
    # this one statement (a qualified call with bound values), then pin again
    pinned = None
    if cat.caller_path is not None:
        pinned = cat.query("SELECT pg_catalog.current_setting('search_path') AS p")[0]["p"]
        cat.set_local("search_path", cat.caller_path)
    try:
        cat.query(f"SELECT {cat.ext(fn)}({args})", vals, tys)
    finally:
        if pinned is not None:
            cat.set_local("search_path", pinned)


def _job(cat: Catalog, job_name: str) -> dict[str, Any]:
    rows = cat.query(f"SELECT * FROM {cat.ext('jobs')} WHERE job_name = $1", [job_name],
                     ["text"])
    if not rows:
        raise CerebroError(f'model selection job "{job_name}" does not exist', UNDEFINED_OBJECT,
                           hint="The jobs are listed in model_selection_jobs.")
    return rows[0]


# -- pg_cron ------------------------------------------------------------------------------
UNREADABLE = "?"


def _cron_database(cat: Catalog) -> str | None:
    """``cron.database_name``: None when pg_cron is not loaded, UNREADABLE for a role that
    may not read it (the setting is superuser-only)."""
    try:
        with cat.db.subtransaction():
            return cat.setting("cron.database_name")
    except Exception:  # noqa: BLE001 - "must be superuser ... to examine"
        return UNREADABLE


def _cron(cat: Catalog, sql: str, args: list[Any], types: list[str]) -> tuple[Any, str]:
    """Run one statement on pg_cron's database: here when it is this database, else over a
    dblink session (superusers only: pg_cron lives in another database). Returns the
    statement's value and pg_cron's database."""
    db = _cron_database(cat)
    if db is None:
        raise CerebroError(
            "schedule needs pg_cron, which this server does not load",
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            hint="Add pg_cron to shared_preload_libraries and set cron.database_name (see the "
            "README), or pass schedule => NULL and CALL run_model_selection_job from your own "
            "scheduler.")
    here = cat.query("SELECT current_database()::text AS d")[0]["d"]
    check = "SELECT count(*) AS n FROM pg_catalog.pg_extension WHERE extname = 'pg_cron'"
    if db == UNREADABLE:  # pg_cron here, or somewhere this role cannot reach
        db = here if int(cat.query(check)[0]["n"]) else "(cron.database_name)"
    missing = CerebroError(
        f'pg_cron is loaded but its extension is not created in database "{db}"',
        OBJECT_NOT_IN_PREREQUISITE_STATE,
        hint=f'Run CREATE EXTENSION pg_cron in database "{db}" (cron.database_name).')
    if db == here:
        if int(cat.query(check)[0]["n"]) == 0:
            raise missing
        return cat.query(sql, args, types)[0]["r"], db
    su = cat.query("SELECT rolsuper AS s FROM pg_catalog.pg_roles "
                   "WHERE rolname = current_user")[0]["s"]
    if not su:
        raise CerebroError(
            f'pg_cron runs in database "{db}"; only a superuser can schedule from "{here}"'
            if not db.startswith("(") else
            f'pg_cron runs in another database; only a superuser can schedule from "{here}"',
            INSUFFICIENT_PRIVILEGE,
            hint=f'Pass schedule => NULL, then have a superuser run in {db}: SELECT '
            f"cron.schedule_in_database(<name>, <schedule>, 'CALL "
            f"{quote_ident(cat.schema)}.run_model_selection_job(<job_name>)', '{here}').")
    row = cat.query("SELECT current_user::text AS u, current_setting('port') AS p, "
                    "split_part(current_setting('unix_socket_directories'), ',', 1) AS s")[0]

    def q(v: str) -> str:
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"

    info = (f"dbname={q(db)} user={q(row['u'])} port={q(row['p'])} "
            f"host={q(row['s'].strip() or 'localhost')}")
    name = "cerebro_db_cron"
    cat.dblink_connect(name, info)
    try:
        if int(cat.dblink_query(name, check)[0][0]) == 0:
            raise missing
        stmt = sql
        for i, (a, t) in reversed(list(enumerate(zip(args, types)))):
            lit = "NULL" if a is None else quote_literal(str(a))
            stmt = stmt.replace(f"${i + 1}", f"{lit}::{t}")
        res = cat.dblink_query(name, stmt)
        return (res[0][0] if res else None), db
    finally:
        cat.dblink_disconnect(name)


def _cron_job_name(cat: Catalog, job_name: str) -> str:
    return "cerebro_db:" + cat.query("SELECT current_database()::text AS d")[0]["d"] + ":" \
        + job_name


# -- schedule / unschedule ----------------------------------------------------------------
@entrypoint
def schedule_model_selection(
        cat: Catalog, *, job_name: str, schedule: str | None, source_table: str,
        packed_table: str, dependent_varname: str, independent_varname: str,
        model_output_table: str, model_selection_table: str | None = None,
        method: str | None = "fit", fit_options: Any = None, preprocess_options: Any = None,
        key_column: str | None = None, warm_start: bool | None = False,
        retries: int | None = 0, retry_delay: str | None = "1 minute") -> int:
    """Define a job (checked now, as far as it can be without running it) and schedule it."""
    for n, v in (("job_name", job_name), ("source_table", source_table),
                 ("packed_table", packed_table), ("dependent_varname", dependent_varname),
                 ("independent_varname", independent_varname),
                 ("model_output_table", model_output_table)):
        if v is None:
            raise CerebroError(f"{n} must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not job_name.strip() or len(job_name.encode()) > MAX_JOB_NAME \
            or any(ord(ch) < 32 for ch in job_name):
        raise invalid(f"job_name must be 1 to {MAX_JOB_NAME} bytes without control "
                      f"characters, got {job_name!r}")
    if cat.query(f"SELECT 1 FROM {cat.ext('jobs')} WHERE job_name = $1", [job_name], ["text"]):
        raise CerebroError(f'model selection job "{job_name}" already exists', DUPLICATE_OBJECT,
                           hint="Unschedule it first or choose another name.")
    m = (method or "fit").strip().lower()
    if m not in METHODS:
        raise invalid(f"method must be 'fit' or 'automl', got {method!r}",
                      hint="'fit' trains model_selection_table's configurations with "
                      "madlib_keras_fit_multiple_model; 'automl' runs madlib_keras_automl.")
    warm = bool(warm_start)
    if warm and m == "automl":
        raise CerebroError("warm_start is not supported with method 'automl'",
                           FEATURE_NOT_SUPPORTED, hint="Use method 'fit' to warm-start.")
    if retries is None:
        retries = 0
    if retries < 0 or retries > 100:
        raise invalid(f"retries must be between 0 and 100, got {retries}")
    delay = retry_delay if retry_delay is not None else "0"
    if cat.query("SELECT $1::interval < '0' AS neg", [delay], ["text"])[0]["neg"]:
        raise invalid(f"retry_delay must not be negative, got {retry_delay!r}")
    src = cat.table(source_table, "source_table")
    oid = cat.require_table(src, "source_table")
    cols = cat.columns(oid)
    for n in split_column_list(dependent_varname, "dependent_varname"):
        cat.require_column(src, cols, n, "dependent_varname")
    for n in split_column_list(independent_varname, "independent_varname"):
        cat.require_column(src, cols, n, "independent_varname")
    if key_column is not None:
        kc = cat.require_column(src, cols, key_column, "key_column")
        if kc.is_array:
            raise CerebroError(f'key_column: column "{key_column}" has type {kc.type_name}; '
                               "a key is a scalar that grows with new rows",
                               DATATYPE_MISMATCH, hint="Use a serial id or an insertion timestamp.")
    packed = cat.table(packed_table, "packed_table")
    out = cat.table(model_output_table, "model_output_table")
    for t, what in ((packed, "packed_table"), (out, "model_output_table")):
        require_output_schema(cat, t, what)
        for s in ("", "_summary") + (("_info",) if t is out else ()):
            tt = t.with_suffix(s, what)
            cat.require_absent(tt, what, hint="The job creates and owns it: choose a new name.")
    if cat.query(f"SELECT 1 FROM {cat.ext('jobs')} WHERE packed_table = $1 OR "
                 "model_output_table = $2", [packed_table, model_output_table],
                 ["text", "text"]):
        raise CerebroError("another job already writes this packed_table or "
                           "model_output_table", DUPLICATE_TABLE)
    if m == "fit":
        if model_selection_table is None:
            raise CerebroError("model_selection_table must not be NULL for method 'fit'",
                               NULL_VALUE_NOT_ALLOWED,
                               hint="Pass a table made by load_model_selection_table or "
                               "generate_model_configs.")
        cat.require_table(cat.table(model_selection_table, "model_selection_table"),
                          "model_selection_table")
    else:
        if model_selection_table is None:
            raise CerebroError("model_selection_table must not be NULL for method 'automl'",
                               NULL_VALUE_NOT_ALLOWED,
                               hint="Name the table that will hold the best configuration.")
        mst = cat.table(model_selection_table, "model_selection_table")
        for t in (mst, mst.with_suffix("_summary", "model_selection_table")):
            cat.require_absent(t, "model_selection_table",
                               hint="The job creates and owns it: choose a new name.")
    fopts, _ = _options(cat, fit_options, METHODS[m], JOB_SET, "fit_options")
    missing = sorted(REQUIRED[m] - set(fopts))
    if missing:
        raise invalid(f"fit_options must set {', '.join(missing)} for method '{m}'")
    popts, _ = _options(cat, preprocess_options, "training_preprocessor_dl",
                        {"source_table", "output_table", "dependent_varname",
                         "independent_varname"}, "preprocess_options")
    row = cat.query(
        f"INSERT INTO {cat.ext('jobs')} (job_name, schedule, method, source_table, key_column, "
        "packed_table, dependent_varname, independent_varname, preprocess_options, "
        "model_output_table, model_selection_table, fit_options, warm_start, retries, "
        "retry_delay, search_path) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, "
        "$11, $12::jsonb, $13, $14, $15::interval, $16) RETURNING job_id",
        [job_name, schedule, m, source_table, key_column, packed_table, dependent_varname,
         independent_varname, json.dumps(popts), model_output_table, model_selection_table,
         json.dumps(fopts), warm, retries, delay, _caller_path(cat)],
        ["text", "text", "text", "text", "text", "text", "text", "text", "text", "text",
         "text", "text", "bool", "int4", "text", "text"])
    job_id = int(row[0]["job_id"])
    for s in ("out", "mst", "packed", "new"):
        if len(_stage(out, job_id, s).name.encode()) + len("_summary") >= NAMEDATALEN:
            raise invalid("job id too large for staging names")  # pragma: no cover
    if schedule is not None:
        if not schedule.strip():
            raise invalid("schedule must not be empty", hint="Pass NULL for no schedule.")
        command = f"CALL {cat.ext('run_model_selection_job')}({quote_literal(job_name)})"
        db = cat.query("SELECT current_database()::text AS d")[0]["d"]
        cron_id, cron_db = _cron(
            cat, "SELECT cron.schedule_in_database($1, $2, $3, $4, $5) AS r",
            [_cron_job_name(cat, job_name), schedule, command, db,
             cat.query("SELECT current_user::text AS u")[0]["u"]],
            ["text", "text", "text", "text", "text"])
        cat.query(f"UPDATE {cat.ext('jobs')} SET cron_jobid = $1, cron_database = $2 "
                  "WHERE job_id = $3", [int(cron_id), cron_db, job_id],
                  ["int8", "text", "int8"])
        cat.notice(f'schedule_model_selection: job "{job_name}" runs on "{schedule}" '
                   f"(pg_cron job {cron_id} in database {cron_db})")
    else:
        cat.notice(f'schedule_model_selection: job "{job_name}" has no schedule; run it '
                   f"with CALL run_model_selection_job({quote_literal(job_name)})")
    return job_id


@entrypoint
def unschedule_model_selection(cat: Catalog, *, job_name: str) -> bool:
    """Remove the job and its pg_cron entry; outputs, packed table and history stay."""
    if job_name is None:
        raise CerebroError("job_name must not be NULL", NULL_VALUE_NOT_ALLOWED)
    job = _job(cat, job_name)
    if job["cron_jobid"] is not None and _cron_database(cat) is None:
        cat.notice(f'unschedule_model_selection: pg_cron is not loaded; its job '
                   f'{job["cron_jobid"]} was not removed')
    elif job["cron_jobid"] is not None:
        _cron(cat, "SELECT CASE WHEN EXISTS (SELECT 1 FROM cron.job WHERE jobid = $1) "
              "THEN cron.unschedule($1) END AS r", [job["cron_jobid"]], ["int8"])
    cat.query(f"DELETE FROM {cat.ext('jobs')} WHERE job_id = $1", [job["job_id"]], ["int8"])
    return True


# -- a run --------------------------------------------------------------------------------
def _caller_path(cat: Catalog) -> str:
    """The search_path the job's tables are named under (the scheduling call's)."""
    if cat.caller_path is not None:
        return cat.caller_path
    return str(cat.query("SELECT pg_catalog.current_setting('search_path') AS p")[0]["p"])


def job_step(plpy: Any, schema: str, *, job_name: str, run_id: int | None, step: str) -> Any:
    """One step of ``run_model_selection_job`` (see the module doc). The job's table names
    are resolved under the search_path of the call that scheduled it (:meth:`Catalog.table`),
    whatever the session that runs it (pg_cron's) has; this function itself runs pinned."""
    cat = Catalog(plpy, schema)
    job = _job(cat, job_name)
    cat.caller_path = job.get("search_path") or None
    if step == "begin":
        return _begin(cat, job)
    if step == "end":
        _end(cat, job, run_id)
        return "ok"
    if run_id is None:
        raise CerebroError(f"job step {step!r} needs a run_id", NULL_VALUE_NOT_ALLOWED)
    cat.query(f"UPDATE {cat.ext('job_runs')} SET attempts = attempts + (($2 = 'pack')::int) "
              "WHERE run_id = $1", [run_id, step], ["int8", "text"])
    errors = tuple(e for e in (getattr(plpy, "SPIError", None), getattr(plpy, "Error", None),
                               CerebroError, Exception) if e)
    fit_id = None
    try:
        with plpy.subtransaction():
            if step == "pack":
                new, total = _pack(cat, job)
                cat.query(f"UPDATE {cat.ext('job_runs')} SET new_rows = $2, rows_trained = $3 "
                          "WHERE run_id = $1", [run_id, new, total], ["int8", "int8", "int8"])
            elif step == "train":
                _train_and_publish(cat, job, run_id)
            else:
                raise invalid(f"unknown step {step!r}")
        return "ok"
    except errors as e:
        if step == "train":
            fit_id = _last_fit(cat, job, run_id)
        return _failed(cat, job, run_id, step, e, fit_id)


def _begin(cat: Catalog, job: dict[str, Any]) -> str | None:
    runs = cat.ext("job_runs")
    got = cat.query("SELECT pg_catalog.pg_try_advisory_lock($1, $2) AS g",
                    [LOCK_CLASS, int(job["job_id"])], ["int4", "int4"])[0]["g"]
    nxt = cat.query(f"SELECT coalesce(max(run), 0) + 1 AS n FROM {runs} WHERE job_id = $1",
                    [job["job_id"]], ["int8"])[0]["n"]
    if not got:
        prev = cat.query(f"SELECT run, backend_pid FROM {runs} WHERE job_id = $1 AND "
                         "status = 'running' ORDER BY run DESC LIMIT 1", [job["job_id"]],
                         ["int8"])
        what = (f"run {prev[0]['run']} (backend pid {prev[0]['backend_pid']})" if prev
                else "another run")
        cat.query(f"INSERT INTO {runs} (job_id, job_name, run, status, ended_at, message) "
                  "VALUES ($1, $2, $3, 'skipped', clock_timestamp(), $4)",
                  [job["job_id"], job["job_name"], nxt,
                   f"{what} of this job is still going; this run did nothing"],
                  ["int8", "text", "int4", "text"])
        cat.notice(f'run_model_selection_job: job "{job["job_name"]}": {what} is still going; '
                   "skipped")
        return None
    # rows left 'running' by a run whose session died (we hold the lock, so none is going)
    cat.query(f"UPDATE {runs} SET status = 'failed', ended_at = clock_timestamp(), "
              "message = coalesce(message || '; ', '') || 'interrupted: its session ended' "
              "WHERE job_id = $1 AND status = 'running'", [job["job_id"]], ["int8"])
    return str(cat.query(f"INSERT INTO {runs} (job_id, job_name, run) VALUES ($1, $2, $3) "
                         "RETURNING run_id", [job["job_id"], job["job_name"], nxt],
                         ["int8", "text", "int4"])[0]["run_id"])


def _end(cat: Catalog, job: dict[str, Any], run_id: int | None) -> None:
    if run_id is not None:
        cat.query(f"UPDATE {cat.ext('job_runs')} SET status = 'failed', ended_at = "
                  "clock_timestamp(), message = coalesce(message, 'ended without a result') "
                  "WHERE run_id = $1 AND status = 'running'", [run_id], ["int8"])
    cat.query("SELECT pg_catalog.pg_advisory_unlock($1, $2)", [LOCK_CLASS, int(job["job_id"])],
              ["int4", "int4"])


def _error_text(e: BaseException) -> str:
    msg = getattr(e, "message", None) or (str(e.args[0]) if getattr(e, "args", None) else str(e))
    state = getattr(e, "sqlstate", None)
    return f"{msg} (SQLSTATE {state})" if state else msg


def _failed(cat: Catalog, job: dict[str, Any], run_id: int, step: str, e: BaseException,
            fit_id: int | None) -> str:
    """Record a failed attempt; 'retry' while the job has retries left, else 'failed'."""
    attempts = cat.query(f"SELECT attempts FROM {cat.ext('job_runs')} WHERE run_id = $1",
                         [run_id], ["int8"])[0]["attempts"]
    cancelled = getattr(e, "sqlstate", None) == QUERY_CANCELED  # by a person: not retried
    again = attempts <= int(job["retries"]) and not cancelled
    text = f"attempt {attempts}, {step}: {_error_text(e)}" + (" (not retried)" if cancelled
                                                                 else "")
    if not isinstance(e, CerebroError) and not hasattr(e, "sqlstate"):
        text += "\n" + traceback.format_exc(limit=5)
    cat.query(
        f"UPDATE {cat.ext('job_runs')} SET message = coalesce(message || E'\\n', '') || $2, "
        "fit_id = coalesce($3, fit_id), status = CASE WHEN $4 THEN status ELSE 'failed' END, "
        "ended_at = CASE WHEN $4 THEN NULL ELSE clock_timestamp() END WHERE run_id = $1",
        [run_id, text, fit_id, again], ["int8", "text", "int8", "bool"])
    cat.notice(f'run_model_selection_job: job "{job["job_name"]}" {text.splitlines()[0]}'
               + ("; retrying" if again else ""))
    return "retry" if again else "failed"


def _last_fit(cat: Catalog, job: dict[str, Any], run_id: int) -> int | None:
    out = cat.table(job["model_output_table"], "model_output_table")
    rows = cat.query(
        f"SELECT max(f.fit_id) AS f FROM {cat.ext('fits')} f, {cat.ext('job_runs')} r "
        "WHERE r.run_id = $1 AND f.started_at >= r.started_at AND f.model_output_table = $2",
        [run_id, str(_stage(out, int(job["job_id"]), "out"))], ["int8", "text"])
    return rows[0]["f"]


def _key_type(cat: Catalog, src: TableName, key: str) -> str:
    cols = cat.columns(cat.require_table(src, "source_table"))
    return cat.require_column(src, cols, key, "key_column").type_name


def _temp_view(cat: Catalog, name: str, src: TableName, where: str) -> TableName:
    cat.query(f"CREATE TEMP VIEW {quote_ident(name)} AS SELECT * FROM {src.sql} WHERE {where}")
    return TableName("pg_temp", name, f"pg_temp.{name}")


def _pack(cat: Catalog, job: dict[str, Any]) -> tuple[int, int]:
    """Pack the source; returns (rows packed now, rows in the packed table)."""
    jid = int(job["job_id"])
    src = cat.table(job["source_table"], "source_table")
    packed = cat.table(job["packed_table"], "packed_table")
    psumm = packed.with_suffix("_summary", "packed_table")
    popts = job["preprocess_options"]
    popts = json.loads(popts) if isinstance(popts, str) else dict(popts or {})
    ptypes = _fn_args(cat, "training_preprocessor_dl")
    key = job["key_column"]
    source, hwm = src, None
    if key is not None:
        ktype = _key_type(cat, src, key)
        k = quote_ident(key)
        hwm = cat.query(f"SELECT max({k})::text AS m FROM {src.sql}")[0]["m"]
        if hwm is None:
            raise CerebroError(f'source_table "{src}" has no rows with a key', DATA_EXCEPTION)
        have = job["packed_through"]
        exists = cat.relation_oid(packed) is not None and cat.relation_oid(psumm) is not None
        if have is not None and exists:
            newer = cat.query(f"SELECT $1::{ktype} > $2::{ktype} AS g", [hwm, have],
                              ["text", "text"])[0]["g"]
            if not newer:
                return 0, int(job["packed_rows"] or 0)
            view = _temp_view(cat, f"__cerebro_job_{jid}_src", src,
                              f"{k} > {quote_literal(have)}::{ktype} AND "
                              f"{k} <= {quote_literal(hwm)}::{ktype}")
            try:
                with cat.db.subtransaction():
                    n = _append(cat, job, view, packed, psumm, popts)
            except Exception as e:  # e.g. a new class: pack everything again
                if getattr(e, "sqlstate", None) != DATA_EXCEPTION:
                    raise
                cat.notice(f'run_model_selection_job: job "{job["job_name"]}": the new rows '
                           f"cannot be appended ({_error_text(e)}); packing all rows again")
            else:
                cat.query(f"DROP VIEW {view.sql}")
                total = int(job["packed_rows"] or 0) + n
                cat.query(f"UPDATE {cat.ext('jobs')} SET packed_through = $2, packed_rows = $3 "
                          "WHERE job_id = $1", [jid, hwm, total], ["int8", "text", "int8"])
                return n, total
            cat.query(f"DROP VIEW {view.sql}")
        source = _temp_view(cat, f"__cerebro_job_{jid}_src", src,
                            f"{k} <= {quote_literal(hwm)}::{ktype}")
    stage = _stage(packed, jid, "packed")
    _call(cat, "training_preprocessor_dl",
          [("source_table", str(source), "text"), ("output_table", stage.sql, "text"),
           ("dependent_varname", job["dependent_varname"], "text"),
           ("independent_varname", job["independent_varname"], "text")], popts, ptypes)
    if source is not src:
        cat.query(f"DROP VIEW {source.sql}")
    for t in (packed, psumm):
        if cat.relation_oid(t) is not None:
            cat.drop_table(t)
    ssumm = stage.with_suffix("_summary", "packed_table")
    cat.query(f"UPDATE {ssumm.sql} SET source_table = $1, output_table = $2",
              [str(src), str(packed)], ["text", "text"])
    cat.query(f"ALTER TABLE {stage.sql} RENAME TO {quote_ident(packed.name)}")
    _rename_indexes(cat, packed, stage.name)
    cat.query(f"ALTER TABLE {ssumm.sql} RENAME TO {quote_ident(psumm.name)}")
    total = int(cat.query(f"SELECT num_rows AS n FROM {psumm.sql}")[0]["n"])
    cat.query(f"UPDATE {cat.ext('jobs')} SET packed_through = $2, packed_rows = $3 "
              "WHERE job_id = $1", [jid, hwm, total], ["int8", "text", "int8"])
    return total, total


def _append(cat: Catalog, job: dict[str, Any], view: TableName, packed: TableName,
            psumm: TableName, popts: dict[str, Any]) -> int:
    """Pack the new rows with the packed table's class values, normalizing constant and
    partitions (validation_preprocessor_dl does exactly that) and append their buffers."""
    stage = _stage(packed, int(job["job_id"]), "new")
    n_new = cat.count_rows(view)
    p = int(cat.query(f"SELECT num_partitions AS p FROM {psumm.sql}")[0]["p"])
    vtypes = _fn_args(cat, "validation_preprocessor_dl")
    fixed = [("source_table", str(view), "text"), ("output_table", stage.sql, "text"),
             ("dependent_varname", job["dependent_varname"], "text"),
             ("independent_varname", job["independent_varname"], "text"),
             ("training_preprocessor_table", packed.sql, "text"),
             ("num_partitions", min(p, n_new), "int4")]
    opts = {k: v for k, v in popts.items() if k in ("buffer_size",)}
    _call(cat, "validation_preprocessor_dl", fixed, opts, vtypes)
    cols = [c for c in cat.columns(cat.require_table(stage, "staging table"))
            if c != "buffer_id"]
    names = ", ".join(quote_ident(c) for c in cols)
    cat.query(f"INSERT INTO {packed.sql} ({names}, buffer_id) SELECT {names}, buffer_id + "
              f"(SELECT coalesce(max(buffer_id) + 1, 0) FROM {packed.sql}) FROM {stage.sql}")
    cat.query(f"UPDATE {psumm.sql} SET num_rows = num_rows + $1", [n_new], ["int8"])
    cat.drop_table(stage.with_suffix("_summary", "packed_table"))
    cat.drop_table(stage)
    return n_new


def _rename_indexes(cat: Catalog, table: TableName, old_prefix: str) -> None:
    """Indexes named after a staging table (``<stage>_pkey``) take the table's new name."""
    rows = cat.query("SELECT c.relname::text AS n, n.nspname::text AS s FROM pg_catalog.pg_index i "
                     "JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
                     "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE i.indrelid = $1", [cat.relation_oid(table)], ["oid"])
    for r in rows:
        if r["n"].startswith(old_prefix):
            new = table.name + r["n"][len(old_prefix):]
            cat.query(f"ALTER INDEX {quote_ident(r['s'])}.{quote_ident(r['n'])} "
                      f"RENAME TO {quote_ident(new[:NAMEDATALEN - 1])}")


def _train_and_publish(cat: Catalog, job: dict[str, Any], run_id: int) -> None:
    jid = int(job["job_id"])
    m = job["method"]
    fn = METHODS[m]
    types = _fn_args(cat, fn)
    out = cat.table(job["model_output_table"], "model_output_table")
    stage = _stage(out, jid, "out")
    fopts = job["fit_options"]
    fopts = json.loads(fopts) if isinstance(fopts, str) else dict(fopts or {})
    fixed: list[tuple[str, Any, str]] = [("source_table", job["packed_table"], "text"),
                                         ("model_output_table", stage.sql, "text")]
    if m == "fit":
        fixed.append(("model_selection_table", job["model_selection_table"], "text"))
        warm = bool(job["warm_start"]) and cat.relation_oid(out) is not None
        if warm:  # the previous run's weights, into the staging name the fit replaces
            cat.query(f"CREATE TABLE {stage.sql} AS SELECT * FROM {out.sql}")
        fixed.append(("warm_start", warm, "bool"))
    else:
        mst = cat.table(job["model_selection_table"], "model_selection_table")
        smst = _stage(mst, jid, "mst")
        fixed.append(("model_selection_table", smst.sql, "text"))
    _call(cat, fn, fixed, fopts, types)
    fit_id = _last_fit(cat, job, run_id)
    # publish: the previous outputs are dropped and the new renamed in this transaction
    renames = [(stage, out), (stage.with_suffix("_summary", ""), out.with_suffix("_summary", "")),
               (stage.with_suffix("_info", ""), out.with_suffix("_info", ""))]
    if m == "automl":
        renames += [(smst, mst), (smst.with_suffix("_summary", ""), mst.with_suffix("_summary", ""))]
    summ = renames[1][0]
    scols = cat.columns(cat.require_table(summ, "staging summary"))
    for col, val in (("model", str(out)), ("model_info", str(out.with_suffix("_info", ""))),
                     ("model_selection_table", job["model_selection_table"] if m == "automl"
                      else None)):
        if col in scols and val is not None:
            cat.query(f"UPDATE {summ.sql} SET {quote_ident(col)} = $1", [val], ["text"])
    for new, final in renames:
        if cat.relation_oid(new) is None:
            continue
        if cat.relation_oid(final) is not None:
            cat.drop_table(final)
        cat.query(f"ALTER TABLE {new.sql} RENAME TO {quote_ident(final.name)}")
        _rename_indexes(cat, final, new.name)
    cat.query(f"UPDATE {cat.ext('fits')} SET model_output_table = $2, model_selection_table = "
              "CASE WHEN $3 THEN $4 ELSE model_selection_table END WHERE fit_id = $1",
              [fit_id, str(out), m == "automl", job["model_selection_table"]],
              ["int8", "text", "bool", "text"])
    info = out.with_suffix("_info", "")
    best = cat.query(
        f"SELECT mst_key, model_id, compile_params, fit_params, validation_loss_final AS v, "
        f"training_loss_final AS t FROM {info.sql} ORDER BY coalesce(validation_loss_final, "
        "training_loss_final) NULLS LAST, mst_key LIMIT 1")
    b = best[0] if best else None
    metric_name = metric = config = None
    if b is not None:
        metric_name, metric = (("validation_loss", b["v"]) if b["v"] is not None
                               else ("training_loss", b["t"]))
        config = (f"mst_key={b['mst_key']}, model_id={b['model_id']}, "
                  f"compile_params={b['compile_params']}, fit_params={b['fit_params']}")
    cat.query(
        f"UPDATE {cat.ext('job_runs')} SET status = 'succeeded', ended_at = clock_timestamp(), "
        "fit_id = $2, best_mst_key = $3, best_config = $4, best_metric_name = $5, "
        "best_metric = $6 WHERE run_id = $1",
        [run_id, fit_id, b["mst_key"] if b else None, config, metric_name, metric],
        ["int8", "int8", "int4", "text", "text", "float8"])
    cat.notice(f'run_model_selection_job: job "{job["job_name"]}" published {out} '
               f"(fit {fit_id}; best {config}: {metric_name} {metric})")
