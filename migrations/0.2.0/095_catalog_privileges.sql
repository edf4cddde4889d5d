-- No role but the extension's owner may lock a catalog table against the others. PostgreSQL
-- allows LOCK TABLE ... IN ACCESS EXCLUSIVE (or EXCLUSIVE, SHARE) MODE to whoever holds
-- UPDATE, DELETE or TRUNCATE on the table, and row-level security does not limit it: with
-- the grants of 002-080, any role could hold such a lock and make every role's fits and
-- catalog reads wait (found by a red-team pass). PUBLIC keeps SELECT and INSERT (a
-- ROW EXCLUSIVE lock at most, which blocks no fit), gets UPDATE on each column instead of
-- the table (enough for UPDATE and SELECT ... FOR UPDATE, not for LOCK TABLE), and no
-- DELETE: a role marks its rows `doomed` (migration 094; its own only, by row-level
-- security) and __purge (sql/cerebro_db.sql) deletes the marked rows. A column added to one
-- of these tables later needs its own GRANT UPDATE (col).
DO $catalog_privileges$
DECLARE
    t text;
    cols text;
BEGIN
    FOREACH t IN ARRAY ARRAY['fits', 'fit_configs', 'units', 'model_states', 'unit_failures',
                             'fit_workers', 'automl_trials', 'automl_decisions', 'automl_state',
                             'jobs', 'job_runs', 'unit_postings'] LOOP
        SELECT string_agg(pg_catalog.quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO cols
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = pg_catalog.format('@extschema@.%I', t)::regclass
           AND a.attnum > 0 AND NOT a.attisdropped;
        EXECUTE pg_catalog.format('REVOKE UPDATE, DELETE, TRUNCATE ON @extschema@.%I FROM PUBLIC', t);
        EXECUTE pg_catalog.format('GRANT UPDATE (%s) ON @extschema@.%I TO PUBLIC', cols, t);
    END LOOP;
END
$catalog_privileges$;
