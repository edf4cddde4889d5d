"""Scheduled model selection: ``schedule_model_selection``, ``unschedule_model_selection``
and the steps of ``run_model_selection_job`` (a PL/pgSQL procedure that commits between them).

A run has four steps, each one transaction:

* ``begin``: locks the job's row for its transaction; when the latest ``running`` run's
  session is still alive it writes a ``skipped`` history row and leaves, else it marks runs
  left ``running`` by sessions that died failed and writes its own ``running`` row (with
  its session's pid and start);
* ``pack``: packs the source again into the job's packed table; with a key column only the
  rows whose key is above the largest key packed so far (``jobs.packed_through``), appended
  as new buffers spread over the same partitions with the same class values and normalizing
  constant; committed before training because the fit's worker sessions read it. Packing
  every row again (no key column, or new rows that cannot be appended, e.g. a new class
  value) when a packed table exists goes to a staging table that the train step publishes
  with the outputs (:data:`_PENDING`): a run whose training fails leaves the packed table
  and ``packed_through`` as they were;
* ``train``: trains into staging tables and, in the same transaction, drops the previous
  outputs and renames the staging tables to the stable names, so readers see the old tables
  until the commit and the new ones after it; records the rows trained on;
* ``end``: marks the run failed if nothing ended it, and drops a repack it left staged.

``pack`` and ``train`` catch every error (in a subtransaction, so nothing half-made stays),
record it in the history row and answer ``retry`` while the job has retries left.
"""
from __future__ import annotations

import json
import secrets
import traceback
from typing import Any

from ..catalog import Catalog, session
from ..catalog import jobs as stmts
from ..errors import (
    DATA_EXCEPTION,
    DATATYPE_MISMATCH,
    DUPLICATE_OBJECT,
    DUPLICATE_TABLE,
    FEATURE_NOT_SUPPORTED,
    INSUFFICIENT_PRIVILEGE,
    NULL_VALUE_NOT_ALLOWED,
    OBJECT_IN_USE,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    QUERY_CANCELED,
    UNDEFINED_OBJECT,
    UNDEFINED_TABLE,
    CerebroError,
    invalid,
)
from ..names import NAMEDATALEN, TableName, split_column_list
from . import entrypoint, internal, require_output_schema

METHODS = {"fit": "madlib_keras_fit_multiple_model", "automl": "madlib_keras_automl"}
# Arguments of the training function the job sets itself.
JOB_SET = {"source_table", "model_output_table", "model_selection_table", "warm_start"}
REQUIRED = {"fit": {"num_iterations"},
            "automl": {"model_arch_table", "model_id_list", "compile_params_grid",
                       "fit_params_grid"}}
MAX_JOB_NAME = 48
_PENDING: dict[tuple[int, int], tuple[TableName, str | None, int]] = {}
"""Repacks waiting for their run's train step, by (job_id, run_id): the staging table, the
key it packed through, its rows. The pack step commits a repack of an existing packed table
under a staging name (the fit's worker sessions read it) instead of publishing it: an
outside pass added a class value the architectures cannot output, the repack was published
and every later run failed, also after the rows were deleted. Kept in this backend's memory:
the procedure runs all steps of a run in one session; the end step drops what a failed run
staged, and the next pack step what a session that died left."""


def _stage(t: TableName, job: dict[str, Any], what: str) -> TableName:
    """A staging table of the job, in the schema of ``t``, named with the step's random
    token (``job["stage"]``): another role that may create tables in that schema cannot
    take the name before the step does."""
    name = f"__cerebro_job_{int(job['job_id'])}_{job['stage']}_{what}"
    return TableName(t.schema, name, TableName(t.schema, name, "").sql)


def _own_tables(cat: Catalog, job: dict[str, Any], step: str) -> None:
    """The job's tables that exist (the packed table and the outputs, with their summaries)
    must be plain tables of the job's owner: a run reads, appends to and replaces them by
    name, and another role that may create in their schema could have put a view or a
    table of its own there (a view's functions would run as the job's owner). Each is
    locked (ACCESS SHARE) until the step ends, so it is not replaced after the check; the
    steps then name them schema-qualified, as resolved here. 42501 otherwise. In the train
    step the packed table must exist (42P01 otherwise): an absent name cannot be held."""
    names = [(job["packed_table"], "packed_table", ("", "_summary")),
             (job["model_output_table"], "model_output_table", ("", "_summary", "_info"))]
    if job["method"] == "automl":
        names.append((job["model_selection_table"], "model_selection_table", ("", "_summary")))
    for text, what, suffixes in names:
        base = cat.table(text, what)
        for sfx in suffixes:
            t = base.with_suffix(sfx, what) if sfx else base
            rel = cat.relation_owner(t)
            if rel is None:
                if step == "train" and what == "packed_table":
                    # the pack step committed it: gone means another role dropped it (a
                    # schema's owner may), and a name that is absent cannot be held
                    raise CerebroError(f'packed_table "{t}" is gone since the pack step',
                                       UNDEFINED_TABLE, hint="The next attempt packs again.")
                continue
            rel = _hold_own(cat, t, rel)
            if rel is None:
                continue
            kind = "table" if rel["kind"] == "r" else "relation that is not a plain table"
            raise CerebroError(
                f'"{t}" is a {kind} of role "{rel["owner"]}", not a table this job made; '
                "the job does not read, write or drop it", INSUFFICIENT_PRIVILEGE,
                hint="Drop or rename it. Keep a job's tables in a schema where only its owner "
                "may create tables.")


def _hold_own(cat: Catalog, t: TableName, rel: dict[str, Any] | None
              ) -> dict[str, Any] | None:
    """Lock ``t`` until the step ends when ``rel`` (its :meth:`Catalog.relation_owner`) says
    it is a plain table of the calling role, and check it is still that table; None when it
    is held, else what is there (``rel`` when nothing else is)."""
    if rel is not None and rel["mine"] and rel["kind"] == "r":
        cat.lock_table(t)
        again = cat.relation_owner(t)
        if again is not None and again["oid"] == rel["oid"]:
            return None
        return again or rel
    return rel


def _written(cat: Catalog, method: str, packed_table: str, model_output_table: str,
             model_selection_table: str | None) -> list[TableName]:
    """Every table a job's runs replace: the packed table and the outputs with their
    ``_summary`` / ``_info``, and for AutoML the model selection table and its summary."""
    packed = cat.table(packed_table, "packed_table")
    out = cat.table(model_output_table, "model_output_table")
    names = [packed, packed.with_suffix("_summary", "packed_table"), out,
             out.with_suffix("_summary", "model_output_table"),
             out.with_suffix("_info", "model_output_table")]
    if method == "automl" and model_selection_table is not None:
        mst = cat.table(model_selection_table, "model_selection_table")
        names += [mst, mst.with_suffix("_summary", "model_selection_table")]
    return names


def _require_own_names(cat: Catalog, method: str, packed_table: str, model_output_table: str,
                       model_selection_table: str | None) -> None:
    """A job's tables are its own: none is another of its tables (a packed table named
    like the output's ``_summary``) or a table another job of the role replaces (compared
    as each job's search_path resolves them). An outside pass scheduled a job whose packed
    table was another job's output: both runs succeeded, and the first job's models were
    replaced by packed buffers. 42P07."""
    mine = [t.sql for t in _written(cat, method, packed_table, model_output_table,
                                    model_selection_table)]
    if len(set(mine)) < len(mine):
        twice = sorted({t for t in mine if mine.count(t) > 1})
        raise CerebroError(f"the job would write {twice[0]} twice: packed_table, "
                           "model_output_table and model_selection_table and their _summary "
                           "and _info tables must be different tables", DUPLICATE_TABLE)
    path = cat.caller_path
    for job in stmts.own_jobs_tables(cat):
        cat.caller_path = job["search_path"] or None
        try:
            theirs = {t.sql for t in _written(cat, job["method"], job["packed_table"],
                                               job["model_output_table"],
                                               job["model_selection_table"])}
        except CerebroError:  # a name that no longer parses under its path: not ours
            continue
        finally:
            cat.caller_path = path
        both = sorted(theirs.intersection(mine))
        if both:
            raise CerebroError(f'model selection job "{job["job_name"]}" already writes '
                               f"{both[0]}", DUPLICATE_TABLE,
                               hint="Give each job tables of its own.")


def _fn_args(cat: Catalog, fn: str) -> dict[str, str]:
    """Argument name -> SQL type of the extension's function ``fn`` (the MADlib signature)."""
    return stmts.function_args(cat, fn)


def _check_value(v: Any, what: str) -> None:
    """A job option is a JSON scalar or a flat array (the server casts it to the argument's
    type: :func:`cerebro_db.catalog.jobs.json_as`)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return
    if isinstance(v, list):
        if any(isinstance(x, (list, dict)) for x in v):
            raise invalid(f"{what}: nested arrays are not supported, got {json.dumps(v)}")
        return
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
        _check_value(v, f"{what}.{k}")
        try:
            with cat.db.subtransaction():
                stmts.cast_json(cat, json.dumps(v), types[k])
        except Exception as e:  # noqa: BLE001 - the server's cast error, reported as ours
            msg = str(getattr(e, "args", [e])[0]).splitlines()[0]
            raise invalid(f"{what}: {k} = {json.dumps(v)} is not a valid {types[k]}: {msg}"
                          ) from None
    return opts, types


def _check_option_values(cat: Catalog, method: str, fopts: dict[str, Any],
                         popts: dict[str, Any]) -> None:
    """The option values the functions check before any work, checked when the job is
    defined (an outside pass defined jobs with 0 iterations, a missing validation table or a
    misspelt policy, which failed only at their first run, perhaps at 03:00)."""
    import os

    from ..automl.registry import get_tuner
    from .fit_inputs import check_fit_args
    from .models import require_arch_table
    from .preprocessing import _check_partitions
    from .training import _policy

    p = popts.get("num_partitions")
    if p is not None:
        _check_partitions(int(p))
    b = popts.get("buffer_size")
    if b is not None and int(b) < 1:
        raise invalid(f"preprocess_options: buffer_size must be at least 1, got {b}")
    v = fopts.get("validation_table")
    if v is not None:
        cat.require_table(cat.table(str(v), "validation_table"), "validation_table")
    if method == "fit":
        check_fit_args(cat, int(fopts["num_iterations"]), fopts.get("metrics_compute_frequency"),
                       fopts.get("use_gpus"))
        _policy(fopts.get("scheduling_policy"), fopts.get("policy_params"),
                fopts.get("random_state"))
        return
    require_arch_table(cat, cat.table(str(fopts["model_arch_table"]), "model_arch_table"),
                       "model_arch_table")
    get_tuner(fopts.get("automl_method") or "hyperband", fopts.get("automl_params"),
              model_ids=[int(i) for i in fopts["model_id_list"]],
              compile_grid=str(fopts["compile_params_grid"]),
              fit_grid=str(fopts["fit_params_grid"]),
              num_workers=int(p) if p is not None else (os.cpu_count() or 1),
              random_state=fopts.get("random_state"))


def _call(cat: Catalog, fn: str, fixed: list[tuple[str, Any, str]], opts: dict[str, Any],
          types: dict[str, str]) -> None:
    """Call the extension's function ``fn`` by named arguments, the values bound."""
    args = [(n, v, t, types[n]) for n, v, t in fixed]
    args += [(k, json.dumps(v), "json", types[k]) for k, v in opts.items()]
    # the entry point's wrapper resolves the names under the job's search_path: set it for
    # this one statement (a qualified call with bound values), then pin again
    pinned = None
    if cat.caller_path is not None:
        pinned = session.search_path(cat)
        cat.set_local("search_path", cat.caller_path)
    try:
        stmts.call_function(cat, fn, args)
    finally:
        if pinned is not None:
            cat.set_local("search_path", pinned)


def _job(cat: Catalog, job_name: str) -> dict[str, Any]:
    row = stmts.job(cat, job_name)
    if row is None:
        raise CerebroError(f'model selection job "{job_name}" does not exist', UNDEFINED_OBJECT,
                           hint="The jobs are listed in model_selection_jobs.")
    return row


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


def _cron(cat: Catalog, stmt: stmts.CronStatement, job_name: str | None = None
          ) -> tuple[Any, str]:
    """Run one statement on pg_cron's database: here when it is this database, else over a
    dblink session (superusers only: pg_cron lives in another database). Returns the
    statement's value and pg_cron's database. ``job_name``: the job a schedule is for (the
    hint of a role that may not schedule there says how to remove the entry)."""
    db = _cron_database(cat)
    if db is None:
        raise CerebroError(
            "schedule needs pg_cron, which this server does not load",
            OBJECT_NOT_IN_PREREQUISITE_STATE,
            hint="Add pg_cron to shared_preload_libraries and set cron.database_name (see the "
            "README), or pass schedule => NULL and CALL run_model_selection_job from your own "
            "scheduler.")
    here = session.current_database(cat)
    if db == UNREADABLE:  # pg_cron here, or somewhere this role cannot reach
        db = here if stmts.pg_cron_installed(cat) else "(pg_cron's database, cron.database_name)"
    missing = CerebroError(
        f'pg_cron is loaded but its extension is not created in database "{db}"',
        OBJECT_NOT_IN_PREREQUISITE_STATE,
        hint=f'Run CREATE EXTENSION pg_cron in database "{db}" (cron.database_name).')
    if db == here:
        if not stmts.pg_cron_installed(cat):
            raise missing
        return stmt.run(cat), db
    if not session.is_superuser(cat):
        raise CerebroError(
            f'pg_cron runs in database "{db}"; only a superuser can schedule from "{here}"'
            if not db.startswith("(") else
            f'pg_cron runs in another database; only a superuser can schedule from "{here}"',
            INSUFFICIENT_PRIVILEGE,
            hint=f"Pass schedule => NULL (nothing was made now), then have a superuser run "
            f"in {db if db.startswith('(') else repr(db)}: {stmt.text(cat)}; (to remove that "
            "entry later, a superuser runs there: SELECT cron.unschedule(jobid) FROM cron.job "
            f"WHERE jobname = {_cron_job_name(cat, job_name)!r})" if job_name else
            f"Have a superuser run in {db}: {stmt.text(cat)};")
    row = session.socket_login(cat)
    info = session.conninfo(dbname=db, user=row["u"], port=row["p"],
                            host=row["s"].strip() or "localhost")
    # a name no other code in the session can take first (dblink_connect is PUBLIC's: a
    # red-team pass held the fixed name "cerebro_db_cron", and scheduling failed)
    name = "cerebro_db_cron_" + secrets.token_hex(8)
    cat.dblink_connect(name, info)
    try:
        if not stmts.pg_cron_installed(cat, name):
            raise missing
        return stmt.run_over(cat, name), db
    finally:
        cat.dblink_disconnect(name)


def _cron_job_name(cat: Catalog, job_name: str) -> str:
    return "cerebro_db:" + session.current_database(cat) + ":" + job_name


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
    if stmts.job(cat, job_name) is not None:
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
    if stmts.interval_is_negative(cat, delay):
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
    _require_own_names(cat, m, packed_table, model_output_table, model_selection_table)
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
    _check_option_values(cat, m, fopts, popts)
    if "random_state" not in popts:
        # one packing seed for every run, drawn now and recorded with the job: a seed drawn
        # per run packed unchanged data differently, so a fixed fit random_state gave a
        # different model every run (an outside pass)
        popts["random_state"] = secrets.randbelow(2**31 - 1) + 1
    job_id = stmts.insert_job(
        cat, job_name=job_name, schedule=schedule, method=m, source_table=source_table,
        key_column=key_column, packed_table=packed_table, dependent_varname=dependent_varname,
        independent_varname=independent_varname, preprocess_options=json.dumps(popts),
        model_output_table=model_output_table, model_selection_table=model_selection_table,
        fit_options=json.dumps(fopts), warm_start=warm, retries=retries, retry_delay=delay,
        search_path=_caller_path(cat))
    for s in ("out", "mst", "packed", "new"):
        probe = {"job_id": job_id, "stage": "0" * 12}
        if len(_stage(out, probe, s).name.encode()) + len("_summary") >= NAMEDATALEN:
            raise invalid("job id too large for staging names")  # pragma: no cover
    if schedule is not None:
        if not schedule.strip():
            raise invalid("schedule must not be empty", hint="Pass NULL for no schedule.")
        cron_id, cron_db = _cron(cat, stmts.cron_schedule(
            _cron_job_name(cat, job_name), schedule, stmts.run_job_command(cat, job_name),
            session.current_database(cat), session.current_user(cat)), job_name)
        stmts.set_cron_job(cat, job_id, int(cron_id), cron_db)
        cat.notice(f'schedule_model_selection: job "{job_name}" runs on "{schedule}" '
                   f"(pg_cron job {cron_id} in database {cron_db})")
    else:
        cat.notice(f'schedule_model_selection: job "{job_name}" has no schedule; run it '
                   f"with {stmts.run_job_command(cat, job_name, qualified=False)}")
    return job_id


@entrypoint
def unschedule_model_selection(cat: Catalog, *, job_name: str) -> bool:
    """Remove the job and its pg_cron entry; outputs, packed table and history stay."""
    if job_name is None:
        raise CerebroError("job_name must not be NULL", NULL_VALUE_NOT_ALLOWED)
    job = _job(cat, job_name)
    live = stmts.live_run(cat, int(job["job_id"]))
    if live is not None:
        # a run going on would fail at its end, its history row left 'running' (an outside
        # pass): the job is removed once no run of it is going
        raise CerebroError(
            f'model selection job "{job_name}" is running (run {live["run"]}, backend pid '
            f'{live["backend_pid"]})', OBJECT_IN_USE,
            hint=f"Wait for the run to end, or cancel it (SELECT pg_cancel_backend("
                 f"{live['backend_pid']})), then unschedule the job.")
    if job["cron_jobid"] is None:
        # defined with schedule => NULL: a superuser may have scheduled its CALL with the
        # statement the definition printed; that entry is not the job's to remove (an outside
        # pass saw it fail every minute after the job was gone)
        # by id: pg_cron's unschedule by name matches only the caller's own entries, and the
        # entry runs as the job's owner (an outside pass got "could not find valid entry")
        cat.notice(f'unschedule_model_selection: job "{job_name}" has no pg_cron entry of '
                   "its own; if a superuser scheduled its CALL, have a superuser remove that "
                   "entry too, in pg_cron's database: SELECT cron.unschedule(jobid) FROM "
                   f"cron.job WHERE jobname = {_cron_job_name(cat, job_name)!r}")
    elif _cron_database(cat) is None:
        cat.notice(f'unschedule_model_selection: pg_cron is not loaded; its job '
                   f'{job["cron_jobid"]} was not removed')
    elif job["cron_jobid"] is not None:
        _cron(cat, stmts.cron_unschedule(int(job["cron_jobid"]),
                                         _cron_job_name(cat, job_name), str(job["owner"])))
    stmts.delete_job(cat, job["job_id"])
    return True


@entrypoint
def cerebro_db_forget_role(cat: Catalog, *, role_name: str) -> int:
    """Delete every catalog row of a dropped role (superusers only): its fits with their
    configurations, unit log, model states and AutoML state, its jobs (their pg_cron
    entries too) and run history, its worker tickets. Catalog rows name their owner (so a
    dump restores into another server's roles); ``DROP OWNED BY`` leaves them, and a role
    created later under the same name would see and write them as its own. Returns the
    number of fits deleted."""
    from ..catalog import fits as fits_sql

    if role_name is None:
        raise CerebroError("role_name must not be NULL", NULL_VALUE_NOT_ALLOWED)
    if not session.is_superuser(cat):
        raise CerebroError("cerebro_db_forget_role is for superusers", INSUFFICIENT_PRIVILEGE)
    if fits_sql.role_exists(cat, role_name):
        raise CerebroError(f'role "{role_name}" still exists', OBJECT_NOT_IN_PREREQUISITE_STATE,
                           hint="Drop the role first (DROP OWNED BY ...; DROP ROLE ...): its "
                           "rows are its own while it exists.")
    for job in fits_sql.role_jobs(cat, role_name):
        if job["cron_jobid"] is not None and _cron_database(cat) is not None:
            _cron(cat, stmts.cron_unschedule(int(job["cron_jobid"]),
                                             _cron_job_name(cat, job["job_name"]), role_name))
    gone = fits_sql.forget_role(cat, role_name)
    shown = ", ".join(f"{n} {t}" for t, n in gone.items() if n)
    cat.notice(f'cerebro_db_forget_role: role "{role_name}": '
               + (f"deleted {shown}" if shown else "no catalog rows"))
    return gone["fits"]


# -- a run --------------------------------------------------------------------------------
def _caller_path(cat: Catalog) -> str:
    """The search_path the job's tables are named under (the scheduling call's)."""
    if cat.caller_path is not None:
        return cat.caller_path
    return session.search_path(cat)


@internal("run_id")
def job_step(plpy: Any, schema: str, *, job_name: str, run_id: int | None, step: str) -> Any:
    """One step of ``run_model_selection_job`` (see the module doc). The job's table names
    are resolved under the search_path of the call that scheduled it (:meth:`Catalog.table`),
    whatever the session that runs it (pg_cron's) has; this function itself runs pinned."""
    cat = Catalog(plpy, schema)
    job = _job(cat, job_name)
    cat.caller_path = job.get("search_path") or None
    job["stage"] = secrets.token_hex(6)
    if step == "begin":
        return _begin(cat, job)
    if step == "end":
        return _end(cat, job, run_id)
    if run_id is None:
        raise CerebroError(f"job step {step!r} needs a run_id", NULL_VALUE_NOT_ALLOWED)
    stmts.count_attempt(cat, run_id, step)
    errors = tuple(e for e in (getattr(plpy, "SPIError", None), getattr(plpy, "Error", None),
                               CerebroError, Exception) if e)
    fit_id = None
    try:
        with plpy.subtransaction():
            _own_tables(cat, job, step)
            if step == "pack":
                stmts.record_rows(cat, run_id, *_pack(cat, job, run_id))
            elif step == "train":
                _train_and_publish(cat, job, run_id)
            else:
                raise invalid(f"unknown step {step!r}")
        if step == "train":
            _PENDING.pop((int(job["job_id"]), run_id), None)
        return "ok"
    except errors as e:
        if step == "train":
            fit_id = _last_fit(cat, job, run_id)
        return _failed(cat, job, run_id, step, e, fit_id)


def _begin(cat: Catalog, job: dict[str, Any]) -> str | None:
    jid = int(job["job_id"])
    stmts.lock_job(cat, jid)
    nxt = stmts.next_run(cat, jid)
    prev = stmts.live_run(cat, jid)
    if prev is not None:
        what = f"run {prev['run']} (backend pid {prev['backend_pid']})"
        stmts.insert_skipped_run(cat, jid, job["job_name"], nxt,
                                 f"{what} of this job is still going; this run did nothing")
        cat.notice(f'run_model_selection_job: job "{job["job_name"]}": {what} is still going; '
                   "skipped")
        return None
    # rows left 'running' by a run whose session died (or by this session): none is going
    stmts.fail_interrupted_runs(cat, jid)
    return str(stmts.insert_run(cat, jid, job["job_name"], nxt))


def _end(cat: Catalog, job: dict[str, Any], run_id: int | None) -> str:
    """The run's outcome as ``run_model_selection_job`` takes it: 'ok', or 'failed' and the
    run's message on the next lines (the procedure then fails, after committing the record,
    so that pg_cron's ``job_run_details`` says failed too)."""
    if run_id is None:
        return "ok"
    _PENDING.pop((int(job["job_id"]), run_id), None)
    # a repack the run did not publish (a pack attempt that failed after dropping an earlier
    # attempt's repack rolled the drop back); runs of a job do not overlap
    _drop_leftovers(cat, job, [cat.table(job["packed_table"], "packed_table")], ("_repack",))
    stmts.fail_unfinished_run(cat, run_id)
    out = stmts.run_outcome(cat, run_id)
    if out is not None and out["status"] == "failed":
        return "failed\n" + (out["message"] or "")
    return "ok"


def _error_text(e: BaseException) -> str:
    msg = getattr(e, "message", None) or (str(e.args[0]) if getattr(e, "args", None) else str(e))
    state = getattr(e, "sqlstate", None)
    return f"{msg} (SQLSTATE {state})" if state else msg


def _failed(cat: Catalog, job: dict[str, Any], run_id: int, step: str, e: BaseException,
            fit_id: int | None) -> str:
    """Record a failed attempt; 'retry' while the job has retries left, else 'failed'."""
    attempts = stmts.attempts(cat, run_id)
    cancelled = getattr(e, "sqlstate", None) == QUERY_CANCELED  # by a person: not retried
    again = attempts <= int(job["retries"]) and not cancelled
    text = f"attempt {attempts}, {step}: {_error_text(e)}" + (" (not retried)" if cancelled
                                                                 else "")
    if not isinstance(e, CerebroError) and not hasattr(e, "sqlstate"):
        text += "\n" + traceback.format_exc(limit=5)
    stmts.record_failure(cat, run_id, text, fit_id, again)
    cat.notice(f'run_model_selection_job: job "{job["job_name"]}" {text.splitlines()[0]}'
               + ("; retrying" if again else ""))
    return "retry" if again else "failed"


def _last_fit(cat: Catalog, job: dict[str, Any], run_id: int) -> int | None:
    out = cat.table(job["model_output_table"], "model_output_table")
    return stmts.last_fit(cat, run_id, str(_stage(out, job, "out")))


def _key_type(cat: Catalog, src: TableName, key: str) -> str:
    cols = cat.columns(cat.require_table(src, "source_table"))
    return cat.require_column(src, cols, key, "key_column").type_name


def _pack(cat: Catalog, job: dict[str, Any], run_id: int) -> tuple[int, bool]:
    """Pack the source; returns the rows packed now and whether that was every row (else
    they were appended). A repack of an existing packed table waits in :data:`_PENDING`
    for the train step."""
    jid = int(job["job_id"])
    src = cat.table(job["source_table"], "source_table")
    packed = cat.table(job["packed_table"], "packed_table")
    psumm = packed.with_suffix("_summary", "packed_table")
    # what an earlier attempt of this run or a run whose session died staged
    _drop_leftovers(cat, job, [packed], ("_repack",))
    _PENDING.pop((jid, run_id), None)
    # a packed table to keep while this run trains: with one of the two gone (dropped by
    # hand), the run packs into the missing name as the first run did
    had = cat.relation_oid(packed) is not None and cat.relation_oid(psumm) is not None
    popts = job["preprocess_options"]
    popts = json.loads(popts) if isinstance(popts, str) else dict(popts or {})
    ptypes = _fn_args(cat, "training_preprocessor_dl")
    key = job["key_column"]
    source, hwm = src, None
    if key is not None:
        ktype = _key_type(cat, src, key)
        hwm = stmts.max_key(cat, src, key)
        if hwm is None:
            raise CerebroError(f'source_table "{src}" has no rows with a key', DATA_EXCEPTION)
        have = job["packed_through"]
        exists = cat.relation_oid(packed) is not None and cat.relation_oid(psumm) is not None
        if have is not None and exists:
            if stmts.key_greater(cat, have, hwm, ktype):
                # the rows at the top were deleted (say ones of a class the architectures
                # cannot output, which failed the run): their buffers go only by a repack
                cat.notice(f'run_model_selection_job: job "{job["job_name"]}": the largest '
                           f"key of the source ({hwm}) is below the last packed key ({have}); "
                           "packing all rows again")
            elif not stmts.key_greater(cat, hwm, have, ktype):
                return 0, False
            else:
                n = _append_new(cat, job, src, key, ktype, have, hwm, packed, popts)
                if n is not None:
                    return n, False
        source = stmts.create_key_view(cat, f"__cerebro_job_{jid}_src", src, key, ktype,
                                       None, hwm)
    stage = _stage(packed, job, "repack" if had else "packed")
    _call(cat, "training_preprocessor_dl",
          [("source_table", str(source), "text"), ("output_table", stage.sql, "text"),
           ("dependent_varname", job["dependent_varname"], "text"),
           ("independent_varname", job["independent_varname"], "text")], popts, ptypes)
    if source is not src:
        stmts.drop_view(cat, source)
    ssumm = stage.with_suffix("_summary", "packed_table")
    stmts.set_summary_column(cat, ssumm, "source_table", str(src))
    stmts.set_summary_column(cat, ssumm, "output_table", str(packed))
    total = stmts.summary_num_rows(cat, ssumm)
    if had:
        _PENDING[(jid, run_id)] = (stage, hwm, total)
        return total, True
    _drop_leftovers(cat, job, [packed])
    _publish(cat, job, [(stage, packed), (ssumm, psumm)])
    stmts.set_packed_through(cat, jid, hwm, total)
    return total, True


def _append_new(cat: Catalog, job: dict[str, Any], src: TableName, key: str, ktype: str,
                have: str, hwm: str, packed: TableName, popts: dict[str, Any]) -> int | None:
    """Append the rows with ``have < key <= hwm`` (:func:`_append`) and record the new
    high-water mark; returns their count, or None when they cannot be appended (a class
    value the packed table lacks: the caller packs every row again)."""
    jid = int(job["job_id"])
    psumm = packed.with_suffix("_summary", "packed_table")
    view = stmts.create_key_view(cat, f"__cerebro_job_{jid}_src", src, key, ktype, have, hwm)
    try:
        with cat.db.subtransaction():
            n = _append(cat, job, view, packed, psumm, popts)
    except Exception as e:  # e.g. a new class: pack everything again
        if getattr(e, "sqlstate", None) != DATA_EXCEPTION:
            raise
        cat.notice(f'run_model_selection_job: job "{job["job_name"]}": the new rows '
                   f"cannot be appended ({_error_text(e)}); packing all rows again")
        stmts.drop_view(cat, view)
        return None
    stmts.drop_view(cat, view)
    stmts.set_packed_through(cat, jid, hwm, int(job["packed_rows"] or 0) + n)
    return n


def _append(cat: Catalog, job: dict[str, Any], view: TableName, packed: TableName,
            psumm: TableName, popts: dict[str, Any]) -> int:
    """Pack the new rows with the packed table's class values, normalizing constant and
    partitions (validation_preprocessor_dl does exactly that) and append their buffers."""
    stage = _stage(packed, job, "new")
    n_new = cat.count_rows(view)
    p = stmts.summary_num_partitions(cat, psumm)
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
    stmts.append_buffers(cat, packed, stage, cols)
    stmts.add_summary_rows(cat, psumm, n_new)
    cat.drop_table(stage.with_suffix("_summary", "packed_table"))
    cat.drop_table(stage)
    return n_new


def _publish(cat: Catalog, job: dict[str, Any], pairs: list[tuple[TableName, TableName]]
             ) -> None:
    """Put each staging table in its final table's place, in this transaction: a final
    table that exists is first renamed out of the way (not dropped: another role's view on
    it would make DROP fail, 2BP01, and every run with it), then dropped if nothing depends
    on it; one that cannot be dropped stays under its staging name until a later run can
    (:func:`_drop_leftovers`)."""
    old: list[TableName] = []
    for i, (new, final) in enumerate(pairs):
        if cat.relation_oid(new) is None:
            continue
        if cat.relation_oid(final) is not None:
            gone = _stage(final, job, f"old{i}")
            stmts.rename_table(cat, final, gone.name)
            _rename_indexes(cat, gone, final.name)
            old.append(gone)
        stmts.rename_table(cat, new, final.name)
        _rename_indexes(cat, final, new.name)
    for t in old:
        _try_drop(cat, job, t)


def _try_drop(cat: Catalog, job: dict[str, Any], t: TableName) -> None:
    try:
        with cat.db.subtransaction():
            cat.drop_table(t)
    except Exception as e:  # noqa: BLE001 - another role's object depends on it
        cat.notice(f'run_model_selection_job: job "{job["job_name"]}": kept the replaced '
                   f"table {t.sql} ({_error_text(e)}); a later run drops it")


def _drop_leftovers(cat: Catalog, job: dict[str, Any], tables: list[TableName],
                    marks: tuple[str, ...] = ("_old",)) -> None:
    """Drop what earlier runs replaced but could not drop (see :func:`_publish`), or with
    ``marks`` ``("_repack",)`` the repacks that runs whose session died left staged."""
    prefix = f"__cerebro_job_{int(job['job_id'])}_"
    for schema in sorted({t.schema for t in tables if t.schema}):
        for t in stmts.job_leftovers(cat, schema, prefix):
            if any(m in t.name[len(prefix):] for m in marks):
                _try_drop(cat, job, t)


def _rename_indexes(cat: Catalog, table: TableName, old_prefix: str) -> None:
    """Indexes named after a staging table (``<stage>_pkey``) take the table's new name."""
    for r in stmts.indexes(cat, table):
        if r["n"].startswith(old_prefix):
            new = table.name + r["n"][len(old_prefix):]
            stmts.rename_index(cat, r["s"], r["n"], new[:NAMEDATALEN - 1])


def _own_staged(cat: Catalog, t: TableName) -> None:
    """A repack the pack step staged is still this role's plain table; locked until the
    step ends (the owner of its schema may drop it and put a relation of its own there)."""
    rel = cat.relation_owner(t)
    if rel is not None and _hold_own(cat, t, rel) is None:
        return
    raise CerebroError(f'the repack "{t}" that the pack step staged is gone or replaced',
                       UNDEFINED_TABLE, hint="The next run packs again.")


def _train_and_publish(cat: Catalog, job: dict[str, Any], run_id: int) -> None:
    m = job["method"]
    fn = METHODS[m]
    types = _fn_args(cat, fn)
    out = cat.table(job["model_output_table"], "model_output_table")
    stage = _stage(out, job, "out")
    fopts = job["fit_options"]
    fopts = json.loads(fopts) if isinstance(fopts, str) else dict(fopts or {})
    packed = cat.table(job["packed_table"], "packed_table")  # as _own_tables held it
    pending = _PENDING.get((int(job["job_id"]), run_id))
    data = packed
    if pending is not None:  # this run's repack, published below with the outputs
        data = pending[0]
        _own_staged(cat, data)
        _own_staged(cat, data.with_suffix("_summary", "packed_table"))
    fixed: list[tuple[str, Any, str]] = [("source_table", data.sql, "text"),
                                         ("model_output_table", stage.sql, "text")]
    if m == "fit":
        fixed.append(("model_selection_table", job["model_selection_table"], "text"))
        warm = bool(job["warm_start"]) and cat.relation_oid(out) is not None
        if warm:  # the previous run's weights, into the staging name the fit replaces
            stmts.copy_table(cat, stage, out)
        fixed.append(("warm_start", warm, "bool"))
    else:
        mst = cat.table(job["model_selection_table"], "model_selection_table")
        smst = _stage(mst, job, "mst")
        fixed.append(("model_selection_table", smst.sql, "text"))
    _call(cat, fn, fixed, fopts, types)
    fit_id = _last_fit(cat, job, run_id)
    # publish: the new outputs take the previous ones' names in this transaction
    renames = [(stage, out), (stage.with_suffix("_summary", ""), out.with_suffix("_summary", "")),
               (stage.with_suffix("_info", ""), out.with_suffix("_info", ""))]
    if m == "automl":
        renames += [(smst, mst), (smst.with_suffix("_summary", ""), mst.with_suffix("_summary", ""))]
    summ = renames[1][0]
    scols = cat.columns(cat.require_table(summ, "staging summary"))
    for col, val in (("source_table", job["packed_table"]), ("model", str(out)),
                     ("model_info", str(out.with_suffix("_info", ""))),
                     ("model_selection_table", job["model_selection_table"] if m == "automl"
                      else None)):
        if col in scols and val is not None:
            stmts.set_summary_column(cat, summ, col, val)
    psumm = packed.with_suffix("_summary", "packed_table")
    if pending is not None:
        renames += [(data, packed), (data.with_suffix("_summary", "packed_table"), psumm)]
    _drop_leftovers(cat, job, [final for _, final in renames])
    _publish(cat, job, renames)
    if pending is not None:
        stmts.set_packed_through(cat, int(job["job_id"]), pending[1], pending[2])
    stmts.publish_fit(cat, fit_id, str(out),
                      job["model_selection_table"] if m == "automl" else None, str(packed))
    b = stmts.best_model(cat, out.with_suffix("_info", ""))
    metric_name = metric = config = None
    if b is not None:
        metric_name, metric = (("validation_loss", b["v"]) if b["v"] is not None
                               else ("training_loss", b["t"]))
        config = (f"mst_key={b['mst_key']}, model_id={b['model_id']}, "
                  f"compile_params={b['compile_params']}, fit_params={b['fit_params']}")
    stmts.record_success(cat, run_id, fit_id=fit_id, rows=stmts.summary_num_rows(cat, psumm),
                         best_mst_key=b["mst_key"] if b else None,
                         best_config=config, best_metric_name=metric_name, best_metric=metric)
    cat.notice(f'run_model_selection_job: job "{job["job_name"]}" published {out} '
               f"(fit {fit_id}; best {config}: {metric_name} {metric})")
