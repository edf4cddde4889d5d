-- How the package deletes catalog rows without DELETE on the catalog (migration 095): the
-- role marks its rows `doomed` with an UPDATE, which row-level security limits to its own
-- rows as PostgreSQL itself sees the role (also in a security-restricted operation, where
-- the server runs a role's code under another session user), then calls __purge
-- (sql/cerebro_db.sql), which deletes the marked rows and nothing else. No argument says
-- whose rows they are, so no caller can name another role's.
DO $doomed$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['model_states', 'automl_trials', 'fit_configs', 'automl_decisions',
                             'unit_postings', 'jobs'] LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.%I ADD COLUMN doomed boolean '
                                  'NOT NULL DEFAULT false', t);
        EXECUTE pg_catalog.format('CREATE INDEX %I ON @extschema@.%I (doomed) WHERE doomed',
                                  t || '_doomed_idx', t);
    END LOOP;
END
$doomed$;
