-- Scheduled model selection: a job packs its source again (only the new rows when it has a
-- key), trains (fresh or warm-started) into staging tables and publishes them under stable
-- names in one transaction. `jobs` holds the definitions, `job_runs` one row per run (kept
-- when the job is unscheduled). pg_cron, when present, only calls
-- run_model_selection_job(job_name); everything works without it.
CREATE TABLE @extschema@.jobs (
    job_id              bigserial PRIMARY KEY,
    -- unique per owner (as pg_cron's job names per user): a role can neither take a name
    -- from another nor learn from a unique violation that another role has it
    job_name            text NOT NULL,
    owner               name NOT NULL DEFAULT current_user,
    schedule            text,
    cron_database       text,
    cron_jobid          bigint,
    method              text NOT NULL CHECK (method IN ('fit', 'automl')),
    source_table        text NOT NULL,
    key_column          text,
    packed_table        text NOT NULL,
    dependent_varname   text NOT NULL,
    independent_varname text NOT NULL,
    preprocess_options  jsonb NOT NULL DEFAULT '{}',
    model_output_table  text NOT NULL,
    model_selection_table text,
    fit_options         jsonb NOT NULL DEFAULT '{}',
    warm_start          boolean NOT NULL DEFAULT false,
    retries             integer NOT NULL DEFAULT 0 CHECK (retries >= 0),
    retry_delay         interval NOT NULL DEFAULT '1 minute',
    -- the search_path the table names above were given under (the scheduling call's)
    search_path         text,
    -- the largest key packed so far (text of the key column's type) and the packed rows
    packed_through      text,
    packed_rows         bigint,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (owner, job_name)
);

CREATE TABLE @extschema@.job_runs (
    run_id        bigserial PRIMARY KEY,
    job_id        bigint NOT NULL,
    job_name      text NOT NULL,
    run           integer NOT NULL,
    fit_id        bigint,
    started_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at      timestamptz,
    status        text NOT NULL DEFAULT 'running'
                  CHECK (status IN ('running', 'succeeded', 'failed', 'skipped')),
    message       text,
    attempts      integer NOT NULL DEFAULT 0,
    new_rows      bigint,
    rows_trained  bigint,
    best_mst_key  integer,
    best_config   text,
    best_metric_name text,
    best_metric   double precision,
    backend_pid   integer DEFAULT pg_catalog.pg_backend_pid(),
    -- when the session in backend_pid started: with the pid, what tells a run whose session
    -- is alive from a recycled pid (two runs of a job never overlap: entrypoints/jobs.py)
    backend_start timestamptz,
    owner         name NOT NULL DEFAULT current_user,
    UNIQUE (job_id, run)
);

-- ids from the sequences whatever an INSERT says (__fresh_id, 010_isolation.sql), so no
-- role can claim the ids the sequences hand out next and make another role's job or run
-- fail on the primary key
ALTER TABLE @extschema@.jobs ALTER COLUMN job_id DROP DEFAULT;
ALTER TABLE @extschema@.job_runs ALTER COLUMN run_id DROP DEFAULT;
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.jobs
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.job_runs
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();

-- Row-level security: a role sees and writes its own jobs; a run row is accepted only for a
-- job of the writing role and (when it names one) a fit of the writing role, as for every
-- fit-bound catalog table (010_isolation.sql).
ALTER TABLE @extschema@.jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.jobs USING (owner = current_user)
    WITH CHECK (owner = current_user);
ALTER TABLE @extschema@.job_runs ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.job_runs USING (owner = current_user)
    WITH CHECK (owner = current_user
                AND EXISTS (SELECT 1 FROM @extschema@.jobs j
                             WHERE j.job_id = job_runs.job_id AND j.owner = current_user)
                AND (job_runs.fit_id IS NULL
                     OR EXISTS (SELECT 1 FROM @extschema@.fits f
                                 WHERE f.fit_id = job_runs.fit_id AND f.owner = current_user)));
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.jobs, @extschema@.job_runs TO PUBLIC;
GRANT USAGE ON SEQUENCE @extschema@.jobs_job_id_seq, @extschema@.job_runs_run_id_seq TO PUBLIC;

-- Every job with its last run (views filter by owner themselves, like fit_progress).
CREATE VIEW @extschema@.model_selection_jobs AS
SELECT j.job_id, j.job_name, j.owner, j.schedule, j.cron_jobid, j.method, j.source_table,
       j.key_column, j.packed_table, j.model_output_table, j.warm_start, j.retries,
       j.retry_delay, j.packed_rows, j.packed_through,
       r.run AS last_run, r.status AS last_status, r.started_at AS last_started_at,
       r.ended_at AS last_ended_at, r.message AS last_message,
       (SELECT max(s.ended_at) FROM @extschema@.job_runs s
         WHERE s.job_id = j.job_id AND s.status = 'succeeded') AS last_success_at,
       r.best_config AS last_best_config, r.best_metric AS last_best_metric
  FROM @extschema@.jobs j
  LEFT JOIN LATERAL (
      SELECT * FROM @extschema@.job_runs x WHERE x.job_id = j.job_id
       ORDER BY x.run DESC LIMIT 1) r ON true
 WHERE j.owner = current_user
    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
ALTER VIEW @extschema@.model_selection_jobs SET (security_barrier = true, security_invoker = true);
GRANT SELECT ON @extschema@.model_selection_jobs TO PUBLIC;
