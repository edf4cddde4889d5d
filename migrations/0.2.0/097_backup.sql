-- pg_dump keeps the catalog. An extension's tables are left out of a dump unless marked as
-- configuration; before this, a dump and restore brought back the users' output tables but
-- no fit, unit, model state, job or limit, and the sequences started again at 1, so new fits
-- took the ids the restored outputs' _summary and _info rows carry (an outside pass).
-- Marked: every table that holds what outlives a session, and the sequences of their ids.
-- Not marked: installed_versions (each install writes its own), worker_tickets, fit_workers
-- and unit_postings (they describe live sessions). Restoring needs a superuser (the tables
-- have row-level security; the id triggers keep a superuser's explicit ids, 010_isolation).
-- (One call a statement: each call updates the extension's row.)
DO $config_dump$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['fits', 'fit_configs', 'units', 'model_states', 'unit_failures',
                             'automl_trials', 'automl_decisions', 'automl_state', 'jobs',
                             'job_runs', 'limits', 'custom_function_modules',
                             'fits_fit_id_seq', 'units_unit_id_seq',
                             'automl_decisions_decision_id_seq', 'jobs_job_id_seq',
                             'job_runs_run_id_seq'] LOOP
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('@extschema@.%I', t)::pg_catalog.regclass, '');
    END LOOP;
END
$config_dump$;

-- pg_dump reads a configuration sequence's value with SELECT: a role that is not a superuser
-- can dump the database with the catalog left out (--exclude-table-data 'cerebro_db.*') or
-- only its own catalog rows (--enable-row-security), as the README says. Every role may
-- already draw from these sequences (USAGE), which tells it as much as their values do.
GRANT SELECT ON SEQUENCE @extschema@.fits_fit_id_seq, @extschema@.units_unit_id_seq,
    @extschema@.automl_decisions_decision_id_seq, @extschema@.jobs_job_id_seq,
    @extschema@.job_runs_run_id_seq TO PUBLIC;
