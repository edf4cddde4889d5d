-- Scheduled jobs against other roles (found by a red-team pass as an unprivileged role):
-- * ids: `jobs.job_id` and `job_runs.run_id` come from the sequences whatever an INSERT
--   says (as `fits`, `units`, `automl_decisions` in 010_isolation.sql), so a role cannot
--   claim the ids the sequences hand out next and make another role's job or run fail on
--   the primary key;
-- * names: a job's name is unique per owner (pg_cron's own job names are unique per user
--   too), so one role cannot take a name from another or learn from a unique violation
--   that another role has a job of that name;
-- * runs: two runs of a job never overlap because `begin` locks the job's row (which only
--   its owner can lock: row-level security) and refuses while the latest `running` run's
--   session is alive (`backend_pid` and its `backend_start`), instead of an advisory lock
--   on (class, job_id) that any role could take and hold.
CREATE OR REPLACE FUNCTION @extschema@.__fresh_id() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fresh_id$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF TG_TABLE_NAME = 'fits' THEN
            NEW.fit_id := OLD.fit_id;
        ELSIF TG_TABLE_NAME = 'units' THEN
            NEW.unit_id := OLD.unit_id;
        ELSIF TG_TABLE_NAME = 'automl_decisions' THEN
            NEW.decision_id := OLD.decision_id;
        ELSIF TG_TABLE_NAME = 'jobs' THEN
            NEW.job_id := OLD.job_id;
        ELSIF TG_TABLE_NAME = 'job_runs' THEN
            NEW.run_id := OLD.run_id;
        END IF;
    ELSIF TG_TABLE_NAME = 'fits' THEN
        NEW.fit_id := pg_catalog.nextval('@extschema@.fits_fit_id_seq'::regclass);
    ELSIF TG_TABLE_NAME = 'units' THEN
        NEW.unit_id := pg_catalog.nextval('@extschema@.units_unit_id_seq'::regclass);
    ELSIF TG_TABLE_NAME = 'automl_decisions' THEN
        NEW.decision_id :=
            pg_catalog.nextval('@extschema@.automl_decisions_decision_id_seq'::regclass);
    ELSIF TG_TABLE_NAME = 'jobs' THEN
        NEW.job_id := pg_catalog.nextval('@extschema@.jobs_job_id_seq'::regclass);
    ELSIF TG_TABLE_NAME = 'job_runs' THEN
        NEW.run_id := pg_catalog.nextval('@extschema@.job_runs_run_id_seq'::regclass);
    END IF;
    RETURN NEW;
END
$fresh_id$;

ALTER TABLE @extschema@.jobs ALTER COLUMN job_id DROP DEFAULT;
ALTER TABLE @extschema@.job_runs ALTER COLUMN run_id DROP DEFAULT;
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.jobs
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.job_runs
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();

ALTER TABLE @extschema@.jobs DROP CONSTRAINT jobs_job_name_key;
ALTER TABLE @extschema@.jobs ADD CONSTRAINT jobs_owner_job_name_key UNIQUE (owner, job_name);

-- when the session in backend_pid started (with the pid, what tells a live run from a
-- recycled pid)
ALTER TABLE @extschema@.job_runs ADD COLUMN backend_start timestamptz;
