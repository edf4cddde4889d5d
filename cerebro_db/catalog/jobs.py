"""Scheduled model selection: the ``jobs`` and ``job_runs`` tables, pg_cron, and the
statements a run uses to pack, stage and publish its tables."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..names import TableName, quote_ident
from .sessions import purge


# -- the job's definition -----------------------------------------------------------------
def function_args(cat: Any, fn: str) -> dict[str, str]:
    """Argument name -> SQL type of the extension's function ``fn`` (the MADlib signature)."""
    rows = cat.query(
        "SELECT p.proargnames::text[] AS n, array(SELECT pg_catalog.format_type(t, NULL) "
        "FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY u(t, i) ORDER BY i) AS t "
        "FROM pg_catalog.pg_proc p WHERE p.pronamespace = $1::regnamespace "
        "AND p.proname = $2 AND p.pronargs > 1", [quote_ident(cat.schema), fn],
        ["text", "text"])
    return dict(zip(rows[0]["n"], rows[0]["t"]))


def json_as(n: int, sql_type: str) -> str:
    """The expression of parameter ``$n``, a JSON scalar or flat array (jsonb text), as
    ``sql_type`` (a type name from :func:`function_args`, as the server formats it): the
    server turns the JSON into the type's text form and casts it, so no literal is written
    here. Operators are qualified: :func:`call_function` runs under the caller's
    search_path."""
    p = f"${n}::jsonb"
    if sql_type.endswith("[]"):
        return (f"(CASE WHEN pg_catalog.jsonb_typeof({p}) OPERATOR(pg_catalog.=) 'null' "
                f"THEN NULL ELSE "
                f"ARRAY(SELECT pg_catalog.jsonb_array_elements_text({p})) END)::{sql_type}")
    return f"({p} OPERATOR(pg_catalog.#>>) '{{}}')::{sql_type}"


def cast_json(cat: Any, value: str, sql_type: str) -> None:
    """Cast a JSON value (:func:`json_as`); raises the server's error when it does not
    cast."""
    cat.query(f"SELECT {json_as(1, sql_type)} AS v", [value], ["text"])


def call_function(cat: Any, fn: str, args: Sequence[tuple[str, Any, str, str]]) -> None:
    """``SELECT fn(name => $n::type, ...)`` of the extension's function ``fn``; ``args`` are
    (name, value, parameter type, argument type from :func:`function_args`); a value of
    parameter type ``'json'`` is JSON text cast by :func:`json_as`."""
    named = ", ".join(f"{quote_ident(n)} => " +
                      (json_as(i + 1, t) if pt == "json" else f"${i + 1}::{t}")
                      for i, (n, _, pt, t) in enumerate(args))
    cat.query(f"SELECT {cat.ext(fn)}({named})", [a[1] for a in args],
              ["text" if a[2] == "json" else a[2] for a in args])


def job(cat: Any, job_name: str) -> dict[str, Any] | None:
    """The calling role's job of that name (names are unique per owner; a superuser, whom
    row-level security does not filter, gets its own too)."""
    rows = cat.query(f"SELECT * FROM {cat.ext('jobs')} WHERE job_name = $1 "
                     "AND owner = current_user", [job_name], ["text"])
    return rows[0] if rows else None


def interval_is_negative(cat: Any, text: str) -> bool:
    return bool(cat.query("SELECT $1::interval < '0' AS neg", [text], ["text"])[0]["neg"])


def own_jobs_tables(cat: Any) -> list[dict[str, Any]]:
    """The calling role's jobs with the names of the tables they write and the search_path
    those names were given under."""
    return [dict(r) for r in cat.query(
        f"SELECT job_name, method, packed_table, model_output_table, model_selection_table, "
        f"search_path FROM {cat.ext('jobs')} WHERE owner = current_user ORDER BY job_id")]


def insert_job(cat: Any, *, job_name: str, schedule: str | None, method: str,
               source_table: str, key_column: str | None, packed_table: str,
               dependent_varname: str, independent_varname: str, preprocess_options: str,
               model_output_table: str, model_selection_table: str | None,
               fit_options: str, warm_start: bool, retries: int, retry_delay: str,
               search_path: str) -> int:
    """A new job (the options as JSON text); its ``job_id``."""
    row = cat.query(
        f"INSERT INTO {cat.ext('jobs')} (job_name, schedule, method, source_table, key_column, "
        "packed_table, dependent_varname, independent_varname, preprocess_options, "
        "model_output_table, model_selection_table, fit_options, warm_start, retries, "
        "retry_delay, search_path) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, "
        "$11, $12::jsonb, $13, $14, $15::interval, $16) RETURNING job_id",
        [job_name, schedule, method, source_table, key_column, packed_table,
         dependent_varname, independent_varname, preprocess_options, model_output_table,
         model_selection_table, fit_options, warm_start, retries, retry_delay, search_path],
        ["text", "text", "text", "text", "text", "text", "text", "text", "text", "text",
         "text", "text", "bool", "int4", "text", "text"])
    return int(row[0]["job_id"])


def set_cron_job(cat: Any, job_id: int, cron_jobid: int, cron_database: str) -> None:
    cat.query(f"UPDATE {cat.ext('jobs')} SET cron_jobid = $1, cron_database = $2 "
              "WHERE job_id = $3", [cron_jobid, cron_database, job_id],
              ["int8", "text", "int8"])


def delete_job(cat: Any, job_id: int) -> None:
    cat.query(f"UPDATE {cat.ext('jobs')} SET doomed = true WHERE job_id = $1", [job_id],
              ["int8"])
    cat.query(purge(cat, "jobs"))


def set_packed_through(cat: Any, job_id: int, key: str | None, rows: int) -> None:
    """The largest key packed so far (as text) and the packed table's row count."""
    cat.query(f"UPDATE {cat.ext('jobs')} SET packed_through = $2, packed_rows = $3 "
              "WHERE job_id = $1", [job_id, key, rows], ["int8", "text", "int8"])


def run_job_command(cat: Any, job_name: str, qualified: bool = True) -> str:
    """The ``CALL run_model_selection_job('<job_name>')`` that pg_cron runs (schema-
    qualified), or that a user types (``qualified`` False)."""
    proc = cat.ext("run_model_selection_job") if qualified else "run_model_selection_job"
    return cat.format_sql("CALL %s(%L)", [proc, job_name], ["text", "text"])


# -- pg_cron --------------------------------------------------------------------------------
PG_CRON_INSTALLED = ("SELECT count(*) AS n FROM pg_catalog.pg_extension "
                     "WHERE extname = 'pg_cron'")


def pg_cron_installed(cat: Any, connection: str | None = None) -> bool:
    """Whether pg_cron's extension exists here, or in the database of a dblink
    ``connection``."""
    if connection is None:
        return int(cat.query(PG_CRON_INSTALLED)[0]["n"]) > 0
    return int(cat.dblink_query(connection, PG_CRON_INSTALLED)[0][0]) > 0


@dataclass(frozen=True)
class CronStatement:
    """One pg_cron call that returns one value ``r``: run here with bound parameters, or
    sent to pg_cron's database over dblink with the values quoted by ``format()``."""

    local: str  # with $n parameters
    remote: str  # a format() template, %L for each value (cast in the template)
    args: tuple[Any, ...]
    types: tuple[str, ...]

    def run(self, cat: Any) -> Any:
        return cat.query(self.local, list(self.args), list(self.types))[0]["r"]

    def text(self, cat: Any) -> str:
        """The statement with its values as literals, for a person to run (a hint)."""
        return cat.format_sql(self.remote.removesuffix(" AS r"), list(self.args),
                              list(self.types))

    def run_over(self, cat: Any, connection: str) -> Any:
        res = cat.dblink_query(connection, cat.format_sql(self.remote, list(self.args),
                                                          list(self.types)))
        return res[0][0] if res else None


def cron_schedule(name: str, schedule: str, command: str, database: str,
                  username: str) -> CronStatement:
    return CronStatement(
        "SELECT cron.schedule_in_database($1, $2, $3, $4, $5) AS r",
        "SELECT cron.schedule_in_database(%L, %L, %L, %L, %L) AS r",
        (name, schedule, command, database, username), ("text",) * 5)


def cron_unschedule(cron_jobid: int, jobname: str, username: str) -> CronStatement:
    """Remove pg_cron's entry ``cron_jobid`` if it is the job's: named ``jobname`` and run
    as ``username`` (the job's owner). A role may edit its own job rows, and a superuser's
    removal by a forged id took a DBA's own entry (a red-team pass)."""
    return CronStatement(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM cron.job WHERE jobid = $1 AND jobname = $2 "
        "AND username = $3) THEN cron.unschedule($1) END AS r",
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM cron.job WHERE jobid = %L::int8 AND "
        "jobname = %L AND username = %L) THEN cron.unschedule(%L::int8) END AS r",
        (cron_jobid, jobname, username, cron_jobid), ("int8", "text", "text", "int8"))


# -- a run's history row ----------------------------------------------------------------------
def lock_job(cat: Any, job_id: int) -> None:
    """Lock the job's row until this transaction ends: a run's ``begin`` holds it while it
    checks for a live run and writes its own, so two begins of a job go one after the
    other. Only the job's owner can lock it (row-level security), unlike an advisory lock,
    which any role can take on any key."""
    cat.query(f"SELECT 1 FROM {cat.ext('jobs')} WHERE job_id = $1 FOR UPDATE", [job_id],
              ["int8"])


def next_run(cat: Any, job_id: int) -> int:
    return int(cat.query(f"SELECT coalesce(max(run), 0) + 1 AS n FROM {cat.ext('job_runs')} "
                         "WHERE job_id = $1", [job_id], ["int8"])[0]["n"])


def live_run(cat: Any, job_id: int) -> dict[str, Any] | None:
    """``run`` and ``backend_pid`` of the job's latest run marked running whose session is
    still there (the same pid, started at the same time: a recycled pid is not it), other
    than this session (whose earlier run ended without its ``end``, e.g. cancelled). The
    statistics snapshot is dropped first (a transaction keeps the first one it read)."""
    cat.query("SELECT pg_catalog.pg_stat_clear_snapshot()")
    rows = cat.query(
        f"SELECT r.run, r.backend_pid FROM {cat.ext('job_runs')} r WHERE r.job_id = $1 "
        "AND r.status = 'running' AND r.backend_pid <> pg_catalog.pg_backend_pid() "
        "AND EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = r.backend_pid "
        "AND a.backend_start = r.backend_start) ORDER BY r.run DESC LIMIT 1", [job_id],
        ["int8"])
    return rows[0] if rows else None


def insert_skipped_run(cat: Any, job_id: int, job_name: str, run: int, message: str) -> None:
    cat.query(f"INSERT INTO {cat.ext('job_runs')} (job_id, job_name, run, status, ended_at, "
              "message) VALUES ($1, $2, $3, 'skipped', clock_timestamp(), $4)",
              [job_id, job_name, run, message], ["int8", "text", "int4", "text"])


def fail_interrupted_runs(cat: Any, job_id: int) -> None:
    """Runs left 'running' by a session that died, or by this one, become failed (call
    with the job's row locked, after :func:`live_run` found none)."""
    cat.query(f"UPDATE {cat.ext('job_runs')} SET status = 'failed', "
              "ended_at = clock_timestamp(), message = coalesce(message || '; ', '') || "
              "'interrupted: its session ended' WHERE job_id = $1 AND status = 'running'",
              [job_id], ["int8"])


def insert_run(cat: Any, job_id: int, job_name: str, run: int) -> int:
    """A new running history row; its ``run_id``."""
    return int(cat.query(
        f"INSERT INTO {cat.ext('job_runs')} (job_id, job_name, run, backend_start) "
        "VALUES ($1, $2, $3, (SELECT a.backend_start FROM pg_catalog.pg_stat_activity a "
        "WHERE a.pid = pg_catalog.pg_backend_pid())) RETURNING run_id",
        [job_id, job_name, run], ["int8", "text", "int4"])[0]["run_id"])


def fail_unfinished_run(cat: Any, run_id: int) -> None:
    cat.query(f"UPDATE {cat.ext('job_runs')} SET status = 'failed', ended_at = "
              "clock_timestamp(), message = coalesce(message, 'ended without a result') "
              "WHERE run_id = $1 AND status = 'running'", [run_id], ["int8"])


def count_attempt(cat: Any, run_id: int, step: str) -> None:
    """A ``pack`` step starts an attempt."""
    cat.query(f"UPDATE {cat.ext('job_runs')} SET attempts = attempts + (($2 = 'pack')::int) "
              "WHERE run_id = $1", [run_id, step], ["int8", "text"])


def attempts(cat: Any, run_id: int) -> int:
    return int(cat.query(f"SELECT attempts FROM {cat.ext('job_runs')} WHERE run_id = $1",
                         [run_id], ["int8"])[0]["attempts"])


def record_rows(cat: Any, run_id: int, new_rows: int, every_row: bool) -> None:
    """The rows the run packed: every row when it packed them all, else the rows appended
    over its attempts (an attempt after one whose training failed finds nothing new to
    append). ``rows_trained`` is the train step's, once it ends."""
    cat.query(f"UPDATE {cat.ext('job_runs')} SET new_rows = CASE WHEN $3 THEN $2 ELSE "
              "coalesce(new_rows, 0) + $2 END WHERE run_id = $1",
              [run_id, new_rows, every_row], ["int8", "int8", "bool"])


def run_outcome(cat: Any, run_id: int) -> dict[str, Any] | None:
    """``status`` and ``message`` of a run."""
    rows = cat.query(f"SELECT status, message FROM {cat.ext('job_runs')} WHERE run_id = $1",
                     [run_id], ["int8"])
    return rows[0] if rows else None


def record_failure(cat: Any, run_id: int, message: str, fit_id: int | None,
                   retry: bool) -> None:
    """Append ``message``; the run stays running when it will be retried."""
    cat.query(
        f"UPDATE {cat.ext('job_runs')} SET message = coalesce(message || E'\\n', '') || $2, "
        "fit_id = coalesce($3, fit_id), status = CASE WHEN $4 THEN status ELSE 'failed' END, "
        "ended_at = CASE WHEN $4 THEN NULL ELSE clock_timestamp() END WHERE run_id = $1",
        [run_id, message, fit_id, retry], ["int8", "text", "int8", "bool"])


def record_success(cat: Any, run_id: int, *, fit_id: int | None, rows: int,
                   best_mst_key: int | None, best_config: str | None,
                   best_metric_name: str | None, best_metric: float | None) -> None:
    cat.query(
        f"UPDATE {cat.ext('job_runs')} SET status = 'succeeded', ended_at = clock_timestamp(), "
        "fit_id = $2, best_mst_key = $3, best_config = $4, best_metric_name = $5, "
        "best_metric = $6, rows_trained = $7 WHERE run_id = $1",
        [run_id, fit_id, best_mst_key, best_config, best_metric_name, best_metric, rows],
        ["int8", "int8", "int4", "text", "text", "float8", "int8"])


def last_fit(cat: Any, run_id: int, model_output_table: str) -> int | None:
    """The latest fit into ``model_output_table`` started since the run began."""
    return cat.query(
        f"SELECT max(f.fit_id) AS f FROM {cat.ext('fits')} f, {cat.ext('job_runs')} r "
        "WHERE r.run_id = $1 AND f.started_at >= r.started_at AND f.model_output_table = $2",
        [run_id, model_output_table], ["int8", "text"])[0]["f"]


def publish_fit(cat: Any, fit_id: int | None, model_output_table: str,
                model_selection_table: str | None, source_table: str) -> None:
    """The fit's outputs and data are now under the job's stable names (the model selection
    table too when given, for AutoML)."""
    cat.query(f"UPDATE {cat.ext('fits')} SET model_output_table = $2, model_selection_table = "
              "CASE WHEN $3 THEN $4 ELSE model_selection_table END, source_table = $5 "
              "WHERE fit_id = $1",
              [fit_id, model_output_table, model_selection_table is not None,
               model_selection_table, source_table], ["int8", "text", "bool", "text", "text"])


# -- packing and publishing tables ------------------------------------------------------------
def max_key(cat: Any, table: TableName, key: str) -> str | None:
    """The largest value of column ``key``, as text."""
    return cat.query(f"SELECT max({quote_ident(key)})::text AS m FROM {table.sql}")[0]["m"]


def key_greater(cat: Any, a: str, b: str, key_type: str) -> bool:
    """``a > b`` as values of ``key_type`` (the key column's type as the catalog formats
    it)."""
    return bool(cat.query(f"SELECT $1::{key_type} > $2::{key_type} AS g", [a, b],
                          ["text", "text"])[0]["g"])


def create_key_view(cat: Any, name: str, source: TableName, key: str, key_type: str,
                    above: str | None, through: str) -> TableName:
    """A temporary view of the source rows with ``above < key <= through`` (no lower bound
    when ``above`` is None); a view takes no parameters, so PostgreSQL quotes the values."""
    cond = "%I <= %L::%s" if above is None else "%I > %L::%s AND %I <= %L::%s"
    args = [name, source.sql] + ([] if above is None else [key, above, key_type]) + \
        [key, through, key_type]
    cat.query(cat.format_sql("CREATE TEMP VIEW %I AS SELECT * FROM %s WHERE " + cond, args,
                             ["text"] * len(args)))
    return TableName("pg_temp", name, f"pg_temp.{name}")


def drop_view(cat: Any, view: TableName) -> None:
    cat.query(f"DROP VIEW {view.sql}")


def rename_table(cat: Any, table: TableName, new_name: str) -> None:
    cat.query(f"ALTER TABLE {table.sql} RENAME TO {quote_ident(new_name)}")


def indexes(cat: Any, table: TableName) -> list[dict[str, Any]]:
    """``n`` (name) and ``s`` (schema) of the indexes of ``table``."""
    return cat.query("SELECT c.relname::text AS n, n.nspname::text AS s "
                     "FROM pg_catalog.pg_index i "
                     "JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
                     "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE i.indrelid = $1", [cat.relation_oid(table)], ["oid"])


def rename_index(cat: Any, schema: str, name: str, new_name: str) -> None:
    cat.query(f"ALTER INDEX {quote_ident(schema)}.{quote_ident(name)} "
              f"RENAME TO {quote_ident(new_name)}")


def set_summary_column(cat: Any, summary: TableName, column: str, value: str) -> None:
    """One text column of a (one-row) summary table."""
    cat.query(f"UPDATE {summary.sql} SET {quote_ident(column)} = $1", [value], ["text"])


def summary_num_partitions(cat: Any, summary: TableName) -> int:
    return int(cat.query(f"SELECT num_partitions AS p FROM {summary.sql}")[0]["p"])


def summary_num_rows(cat: Any, summary: TableName) -> int:
    return int(cat.query(f"SELECT num_rows AS n FROM {summary.sql}")[0]["n"])


def add_summary_rows(cat: Any, summary: TableName, n: int) -> None:
    cat.query(f"UPDATE {summary.sql} SET num_rows = num_rows + $1", [n], ["int8"])


def append_buffers(cat: Any, packed: TableName, stage: TableName,
                   columns: Sequence[str]) -> None:
    """Append the staging table's buffers after the packed table's last ``buffer_id``."""
    names = ", ".join(quote_ident(c) for c in columns)
    cat.query(f"INSERT INTO {packed.sql} ({names}, buffer_id) SELECT {names}, buffer_id + "
              f"(SELECT coalesce(max(buffer_id) + 1, 0) FROM {packed.sql}) FROM {stage.sql}")


def job_leftovers(cat: Any, schema: str, prefix: str) -> list[TableName]:
    """Tables of the calling role in ``schema`` whose names start with ``prefix`` (a job's
    replaced tables that could not be dropped when it published)."""
    rows = cat.query(
        "SELECT c.relname::text AS n FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace s ON s.oid OPERATOR(pg_catalog.=) c.relnamespace "
        "WHERE s.nspname OPERATOR(pg_catalog.=) $1 AND c.relkind OPERATOR(pg_catalog.=) 'r' "
        "AND pg_catalog.starts_with(c.relname::text, $2) "
        "AND c.relowner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r "
        "WHERE r.rolname OPERATOR(pg_catalog.=) current_user)", [schema, prefix],
        ["text", "text"])
    return [TableName(schema, r["n"], TableName(schema, r["n"], "").sql) for r in rows]


def copy_table(cat: Any, new: TableName, source: TableName) -> None:
    cat.query(f"CREATE TABLE {new.sql} AS SELECT * FROM {source.sql}")


def best_model(cat: Any, info: TableName) -> dict[str, Any] | None:
    """The ``_info`` row with the lowest final validation loss (else training loss):
    ``mst_key``, ``model_id``, ``compile_params``, ``fit_params``, ``v``, ``t``."""
    rows = cat.query(
        f"SELECT mst_key, model_id, compile_params, fit_params, validation_loss_final AS v, "
        f"training_loss_final AS t FROM {info.sql} ORDER BY coalesce(validation_loss_final, "
        "training_loss_final) NULLS LAST, mst_key LIMIT 1")
    return rows[0] if rows else None
