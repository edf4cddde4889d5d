-- Isolation between roles, completed for every catalog table and view.
--
-- 1. Every table whose rows hang off a fit (fit_id) accepts a row only for a fit of the
--    writing role, the policy fit_configs, units and model_states already had: a role can
--    neither put rows under another role's fit (or the next fit id, read from the sequence)
--    nor learn which fit ids exist (both fail with the same row-level security error).
-- 2. The generated keys (fits.fit_id, units.unit_id, automl_decisions.decision_id) are
--    always drawn from their sequences and never change: a role cannot take the next id in
--    advance (an INSERT with an explicit id, or an UPDATE of its own row's id) and make
--    another role's next fit fail on the primary key. A superuser's INSERT with an explicit
--    id keeps it: that is pg_restore bringing the catalog back (097_backup.sql).
-- 3. The views run with the rights of the role that queries them (security_invoker, so the
--    tables' row-level security applies underneath) and are security barriers: a function in
--    the caller's WHERE clause never sees a row the view filters out.
DO $rls_fit_owner$
DECLARE
    t text;
    -- the extension's own tables and views, never a user's that share the schema (an
    -- install into a schema holding a user's tables put row-level security on them)
    members oid[] := ARRAY(
        SELECT d.objid FROM pg_catalog.pg_depend d
         WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'e'
           AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e
                              WHERE e.extname = 'cerebro_db'));
BEGIN
    FOR t IN
        SELECT c.relname FROM pg_catalog.pg_class c
         WHERE c.relnamespace = '@extschema@'::regnamespace AND c.relkind = 'r'
           AND c.relname <> 'fits' AND c.oid = ANY (members)
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid
                        AND a.attname = 'fit_id' AND NOT a.attisdropped)
         ORDER BY c.relname
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE pg_catalog.format('DROP POLICY IF EXISTS own_rows ON @extschema@.%I', t);
        EXECUTE pg_catalog.format(
            'CREATE POLICY own_rows ON @extschema@.%1$I USING (owner = current_user) '
            'WITH CHECK (owner = current_user AND EXISTS ('
            'SELECT 1 FROM @extschema@.fits f WHERE f.fit_id = %1$I.fit_id '
            'AND f.owner = current_user))', t);
    END LOOP;
    FOR t IN
        SELECT c.relname FROM pg_catalog.pg_class c
         WHERE c.relnamespace = '@extschema@'::regnamespace AND c.relkind = 'v'
           AND c.oid = ANY (members)
         ORDER BY c.relname
    LOOP
        EXECUTE pg_catalog.format('ALTER VIEW @extschema@.%I SET (security_barrier = true, '
                                  'security_invoker = true)', t);
    END LOOP;
END
$rls_fit_owner$;

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
    -- an INSERT's id comes from the sequence unless it names one and the current user is a
    -- superuser: that is pg_restore bringing the catalog back (097_backup.sql); the
    -- package's own INSERTs name none, so they never look the role up
    ELSIF TG_TABLE_NAME = 'fits' THEN
        IF NEW.fit_id IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                      WHERE r.rolname = current_user) THEN
            NEW.fit_id := pg_catalog.nextval('@extschema@.fits_fit_id_seq'::regclass);
        END IF;
    ELSIF TG_TABLE_NAME = 'units' THEN
        IF NEW.unit_id IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                       WHERE r.rolname = current_user) THEN
            NEW.unit_id := pg_catalog.nextval('@extschema@.units_unit_id_seq'::regclass);
        END IF;
    ELSIF TG_TABLE_NAME = 'automl_decisions' THEN
        IF NEW.decision_id IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                           WHERE r.rolname = current_user) THEN
            NEW.decision_id :=
                pg_catalog.nextval('@extschema@.automl_decisions_decision_id_seq'::regclass);
        END IF;
    -- scheduled jobs' tables (070_jobs.sql)
    ELSIF TG_TABLE_NAME = 'jobs' THEN
        IF NEW.job_id IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                      WHERE r.rolname = current_user) THEN
            NEW.job_id := pg_catalog.nextval('@extschema@.jobs_job_id_seq'::regclass);
        END IF;
    ELSIF TG_TABLE_NAME = 'job_runs' THEN
        IF NEW.run_id IS NULL OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r
                                      WHERE r.rolname = current_user) THEN
            NEW.run_id := pg_catalog.nextval('@extschema@.job_runs_run_id_seq'::regclass);
        END IF;
    END IF;
    RETURN NEW;
END
$fresh_id$;

ALTER TABLE @extschema@.fits ALTER COLUMN fit_id DROP DEFAULT;
ALTER TABLE @extschema@.units ALTER COLUMN unit_id DROP DEFAULT;
ALTER TABLE @extschema@.automl_decisions ALTER COLUMN decision_id DROP DEFAULT;
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.fits
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.units
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();
CREATE TRIGGER fresh_id BEFORE INSERT OR UPDATE ON @extschema@.automl_decisions
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__fresh_id();

