-- cerebro_db functions. Every statement here is CREATE OR REPLACE (it runs on install and on
-- every upgrade); tables belong in migrations/. Bodies come from plpython/ (see
-- scripts/build_sql.py). Names, argument order and defaults follow Apache MADlib's
-- deep-learning module; additions are trailing arguments with defaults.

-- Re-raise an error caught by an entry point's wrapper, without PL/Python's type prefix.
CREATE OR REPLACE FUNCTION @extschema@.__reraise(m TEXT, d TEXT, h TEXT, s TEXT)
RETURNS VOID LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
SET standard_conforming_strings = on AS $reraise$
BEGIN
    m := pg_catalog.regexp_replace(m, '^(plpy\.[A-Za-z]+|spiexceptions\.[A-Za-z]+): ', '');
    IF coalesce(d, '') <> '' AND coalesce(h, '') <> '' THEN
        RAISE EXCEPTION USING MESSAGE = m, DETAIL = d, HINT = h, ERRCODE = s;
    ELSIF coalesce(d, '') <> '' THEN
        RAISE EXCEPTION USING MESSAGE = m, DETAIL = d, ERRCODE = s;
    ELSIF coalesce(h, '') <> '' THEN
        RAISE EXCEPTION USING MESSAGE = m, HINT = h, ERRCODE = s;
    ELSE
        RAISE EXCEPTION USING MESSAGE = m, ERRCODE = s;
    END IF;
END
$reraise$;

------------------------------------------------------------------------------------------
-- Data preparation
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.training_preprocessor_dl(
    source_table        VARCHAR,
    output_table        VARCHAR,
    dependent_varname   VARCHAR,
    independent_varname VARCHAR,
    buffer_size         INTEGER   DEFAULT NULL,
    normalizing_const   REAL      DEFAULT 1.0,
    num_classes         INTEGER[] DEFAULT NULL,
    distribution_rules  TEXT      DEFAULT NULL,
    num_partitions      INTEGER   DEFAULT NULL,
    random_state        INTEGER   DEFAULT NULL,
    regression_targets  VARCHAR   DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython training_preprocessor_dl@
$python$;
COMMENT ON FUNCTION @extschema@.training_preprocessor_dl(VARCHAR, VARCHAR, VARCHAR, VARCHAR,
    INTEGER, REAL, INTEGER[], TEXT, INTEGER, INTEGER, VARCHAR) IS
'Pack rows into shuffled float32/int16 training buffers spread over num_partitions partitions (__dist_key__); labels one-hot encoded except the regression_targets; writes <output_table> and <output_table>_summary';

CREATE OR REPLACE FUNCTION @extschema@.training_preprocessor_dl(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage training_preprocessor_dl@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.validation_preprocessor_dl(
    source_table                VARCHAR,
    output_table                VARCHAR,
    dependent_varname           VARCHAR,
    independent_varname         VARCHAR,
    training_preprocessor_table VARCHAR,
    buffer_size                 INTEGER DEFAULT NULL,
    distribution_rules          TEXT    DEFAULT NULL,
    num_partitions              INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython validation_preprocessor_dl@
$python$;
COMMENT ON FUNCTION @extschema@.validation_preprocessor_dl(VARCHAR, VARCHAR, VARCHAR, VARCHAR,
    VARCHAR, INTEGER, TEXT, INTEGER) IS
'Pack validation rows with the class values and normalizing constant of a training table made by training_preprocessor_dl';

CREATE OR REPLACE FUNCTION @extschema@.validation_preprocessor_dl(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage validation_preprocessor_dl@
$python$;

------------------------------------------------------------------------------------------
-- Model architectures
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.load_keras_model(
    keras_model_arch_table VARCHAR,
    model_arch             JSON,
    model_weights          BYTEA DEFAULT NULL,
    name                   TEXT  DEFAULT NULL,
    description            TEXT  DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython load_keras_model@
$python$;
COMMENT ON FUNCTION @extschema@.load_keras_model(VARCHAR, JSON, BYTEA, TEXT, TEXT) IS
'Check a Keras model architecture (Keras 3 or tf.keras 2.x JSON) and optional flat float32 weights, and append it to an architecture table';

CREATE OR REPLACE FUNCTION @extschema@.load_keras_model(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage load_keras_model@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.delete_keras_model(
    keras_model_arch_table VARCHAR,
    model_id               INTEGER
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython delete_keras_model@
$python$;
COMMENT ON FUNCTION @extschema@.delete_keras_model(VARCHAR, INTEGER) IS
'Delete one architecture from an architecture table; drops the table once it is empty';

CREATE OR REPLACE FUNCTION @extschema@.delete_keras_model(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage delete_keras_model@
$python$;

------------------------------------------------------------------------------------------
-- Model configurations
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.load_model_selection_table(
    model_arch_table      VARCHAR,
    model_selection_table VARCHAR,
    model_id_list         INTEGER[],
    compile_params_list   VARCHAR[],
    fit_params_list       VARCHAR[],
    object_table          VARCHAR DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython load_model_selection_table@
$python$;
COMMENT ON FUNCTION @extschema@.load_model_selection_table(VARCHAR, VARCHAR, INTEGER[],
    VARCHAR[], VARCHAR[], VARCHAR) IS
'Write the cartesian product of model ids, compile_params and fit_params strings (deduplicated by content) to a model selection table';

CREATE OR REPLACE FUNCTION @extschema@.load_model_selection_table(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage load_model_selection_table@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.generate_model_configs(
    model_arch_table      VARCHAR,
    model_selection_table VARCHAR,
    model_id_list         INTEGER[],
    compile_params_grid   VARCHAR,
    fit_params_grid       VARCHAR,
    search_type           VARCHAR DEFAULT 'grid',
    num_configs           INTEGER DEFAULT NULL,
    random_state          INTEGER DEFAULT NULL,
    object_table          VARCHAR DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython generate_model_configs@
$python$;
COMMENT ON FUNCTION @extschema@.generate_model_configs(VARCHAR, VARCHAR, INTEGER[], VARCHAR,
    VARCHAR, VARCHAR, INTEGER, INTEGER, VARCHAR) IS
'Generate model configurations by grid or random search over compile and fit parameter grids, appending to a model selection table';

CREATE OR REPLACE FUNCTION @extschema@.generate_model_configs(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage generate_model_configs@
$python$;

------------------------------------------------------------------------------------------
-- Other (since 0.2.0)
------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_version()
RETURNS TEXT LANGUAGE plpython3u STABLE AS $python$
@plpython cerebro_db_version@
$python$;
COMMENT ON FUNCTION @extschema@.cerebro_db_version() IS
'The version of the cerebro_db Python package the server imports';

-- MADlib's version(): its notebooks start with SELECT madlib.version(). An unqualified
-- version() still finds pg_catalog.version() first.
CREATE OR REPLACE FUNCTION @extschema@.version()
RETURNS TEXT LANGUAGE plpython3u STABLE AS $python$
@plpython version@
$python$;
COMMENT ON FUNCTION @extschema@.version() IS
'MADlib''s version(): the cerebro_db version and the server''s';

------------------------------------------------------------------------------------------
-- Training (since 0.2.0)
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit_multiple_model(
    source_table              VARCHAR,
    model_output_table        VARCHAR,
    model_selection_table     VARCHAR,
    num_iterations            INTEGER,
    use_gpus                  BOOLEAN DEFAULT FALSE,
    validation_table          VARCHAR DEFAULT NULL,
    metrics_compute_frequency INTEGER DEFAULT NULL,
    warm_start                BOOLEAN DEFAULT FALSE,
    name                      VARCHAR DEFAULT NULL,
    description               VARCHAR DEFAULT NULL,
    use_caching               BOOLEAN DEFAULT NULL,
    scheduling_policy         VARCHAR DEFAULT 'mop',
    policy_params             VARCHAR DEFAULT NULL,
    random_state              INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_fit_multiple_model@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_fit_multiple_model(VARCHAR, VARCHAR, VARCHAR,
    INTEGER, BOOLEAN, VARCHAR, INTEGER, BOOLEAN, VARCHAR, VARCHAR, BOOLEAN, VARCHAR, VARCHAR,
    INTEGER) IS
'Train every configuration of a model selection table by model hopper parallelism over parallel worker sessions; writes <model_output_table>, _summary and _info';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit_multiple_model(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_fit_multiple_model@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit_resume(
    fit_id BIGINT
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_fit_resume@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_fit_resume(BIGINT) IS
'Continue an interrupted or failed fit (madlib_keras_fit_multiple_model or madlib_keras_fit) from its catalog: committed units are kept, each configuration continues from its last committed state; writes the outputs the original call would have';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit_resume(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_fit_resume@
$python$;

-- Open one worker session for a role that is not a superuser (internal; see
-- cerebro_db/executors.py). dblink refuses non-superusers a connection that did not use a
-- password, because the connection is made by the server's OS user and trust or peer
-- authentication would otherwise let any role log in as any other. This function runs as
-- the extension's owner and calls dblink_connect_u, but it decides every part of the
-- connection itself: this server's own socket and port, the current database, login as
-- session_user (the role that authenticated this session), then SET ROLE to the caller in
-- the new session. The caller is the owner of the ticket (worker_tickets, migration 096)
-- it inserted just before: row-level security makes that its current_user, which this
-- function, running as the owner, could not see otherwise. That role must be the session
-- user or the role the session SET ROLE to: the server also runs a role's code with
-- another session user (autovacuum and a DBA's ANALYZE run an index's functions as the
-- table's owner, session_user being the superuser or the DBA), and such code must not get
-- a session of that session user. PostgreSQL checks the SET ROLE again in the new session.
-- No caller text reaches the connection string.
CREATE OR REPLACE FUNCTION @extschema@.__worker_connect(conn_name TEXT, ticket TEXT)
RETURNS VOID LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $worker_connect$
DECLARE
    dl        text;
    info      text;
    role_name name;
BEGIN
    IF conn_name IS NULL OR ticket IS NULL THEN
        RAISE EXCEPTION 'conn_name and ticket must not be NULL' USING ERRCODE = '22004';
    END IF;
    -- expired tickets go, but none that another transaction holds (nobody waits on them)
    -- and at most 100 a call (no role's pile of tickets makes another's connect slow)
    DELETE FROM @extschema@.worker_tickets WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM @extschema@.worker_tickets
         WHERE made_at < pg_catalog.clock_timestamp() - interval '10 minutes'
         ORDER BY made_at LIMIT 100
           FOR UPDATE SKIP LOCKED));
    DELETE FROM @extschema@.worker_tickets t WHERE t.token = ticket
    RETURNING t.owner INTO role_name;
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'no worker ticket %', pg_catalog.quote_literal(ticket)
            USING ERRCODE = '42501',
            HINT = 'INSERT INTO worker_tickets DEFAULT VALUES RETURNING token gives one.';
    END IF;
    IF role_name <> session_user
       AND role_name IS DISTINCT FROM pg_catalog.current_setting('role', true)::name THEN
        RAISE EXCEPTION 'role "%" may not open worker sessions in a session of role "%"',
            role_name, session_user USING ERRCODE = '42501',
            HINT = 'Worker sessions are opened for the session user or the role it SET ROLE '
                   'to, not for code the server runs as another role.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
        RAISE EXCEPTION 'role "%" does not exist', role_name USING ERRCODE = '42704';
    END IF;
    IF NOT pg_catalog.pg_has_role(session_user, role_name, 'MEMBER') THEN
        RAISE EXCEPTION 'role "%" may not open worker sessions as role "%"',
            session_user, role_name USING ERRCODE = '42501',
            HINT = 'Worker sessions run as the calling role (current_user).';
    END IF;
    SELECT pg_catalog.quote_ident(n.nspname) INTO dl
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'dblink';
    IF dl IS NULL THEN
        RAISE EXCEPTION 'the dblink extension is not installed' USING ERRCODE = '55000';
    END IF;
    SELECT string_agg(k || '=''' || replace(replace(v, '\', '\\'), '''', '\''') || '''', ' ')
      INTO info
      FROM (VALUES ('dbname', pg_catalog.current_database()::text),
                   ('user', session_user::text),
                   ('port', pg_catalog.current_setting('port')),
                   ('host', coalesce(nullif(btrim(split_part(
                        pg_catalog.current_setting('unix_socket_directories'), ',', 1)), ''),
                        'localhost'))) AS kv(k, v);
    EXECUTE format('SELECT %s.dblink_connect_u($1, $2)', dl) USING conn_name, info;
    IF role_name <> session_user THEN
        BEGIN
            EXECUTE format('SELECT %s.dblink_exec($1, $2)', dl)
                USING conn_name, format('SET ROLE %I', role_name);
        EXCEPTION WHEN OTHERS THEN
            EXECUTE format('SELECT %s.dblink_disconnect($1)', dl) USING conn_name;
            RAISE;
        END;
    END IF;
END
$worker_connect$;

-- The extension's dblink calls on its open connections (internal; the key is explained in
-- cerebro_db/catalog/dblink_gate.py). PUBLIC may not run dblink's functions that use an open
-- connection (migration 098): any code running in a backend could use that backend's
-- connections by name, the worker sessions of a fit's caller included. This function runs
-- them for a caller that presents the backend's token, which only the extension's Python
-- code holds. No caller text names dblink's schema, and dblink_exec and dblink take only a
-- connection that is open: they read an unknown name as a connection string, which, run as
-- this function's owner, would skip dblink's password check.
CREATE OR REPLACE FUNCTION @extschema@.__dblink_gate(token TEXT)
RETURNS BOOLEAN LANGUAGE plpython3u VOLATILE AS $python$
@plpython __dblink_gate@
$python$;

CREATE OR REPLACE FUNCTION @extschema@.__dblink(token TEXT, fn TEXT, conn TEXT, arg TEXT)
RETURNS SETOF TEXT LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $dblink$
BEGIN
    IF NOT coalesce(@extschema@.__dblink_gate(token), false) THEN
        RAISE EXCEPTION 'permission denied for the extension''s dblink connections'
            USING ERRCODE = '42501',
            HINT = 'Only cerebro_db''s own code uses them.';
    END IF;
    CASE fn
    WHEN 'result' THEN
        RETURN QUERY SELECT r FROM dblink_get_result(conn, arg::boolean) AS t(r text);
    WHEN 'send' THEN
        RETURN NEXT dblink_send_query(conn, arg)::text;
    WHEN 'exec', 'query' THEN
        IF NOT conn = ANY(coalesce(dblink_get_connections(), '{}'::text[])) THEN
            RAISE EXCEPTION 'connection % not available', pg_catalog.quote_nullable(conn)
                USING ERRCODE = '08003';
        END IF;
        IF fn = 'exec' THEN
            RETURN NEXT dblink_exec(conn, arg);
        ELSE
            RETURN QUERY SELECT r FROM dblink(conn, arg) AS t(r text);
        END IF;
    WHEN 'error' THEN
        RETURN NEXT dblink_error_message(conn);
    WHEN 'cancel' THEN
        RETURN NEXT dblink_cancel_query(conn);
    WHEN 'disconnect' THEN
        RETURN NEXT dblink_disconnect(conn);
    ELSE
        RAISE EXCEPTION 'no dblink call %', pg_catalog.quote_nullable(fn)
            USING ERRCODE = '22023';
    END CASE;
END
$dblink$;
-- dblink's functions are found in dblink's schema, fixed here (the body names them
-- unqualified so that its plans are kept: about 0.1 ms a call less). After moving dblink
-- (ALTER EXTENSION dblink SET SCHEMA), run this ALTER FUNCTION again with the new schema.
DO $dblink_path$
DECLARE
    dl name;
BEGIN
    SELECT n.nspname INTO dl
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'dblink';
    EXECUTE pg_catalog.format('ALTER FUNCTION @extschema@.__dblink(text, text, text, text) '
                              'SET search_path = pg_catalog, %I, pg_temp', dl);
END
$dblink_path$;

-- Delete the catalog rows of `_table` that their owners marked `doomed` (internal;
-- cerebro_db/catalog/*.py, migration 094). PUBLIC has neither DELETE nor table-level UPDATE
-- on the catalog tables (migration 095): with either, PostgreSQL lets a role LOCK TABLE one
-- IN ACCESS EXCLUSIVE MODE, which row-level security does not limit, and every role's fits
-- and catalog reads would wait on it. A role marks its rows with an UPDATE (row-level
-- security: its own only, as the server sees the role) and calls this procedure, which
-- deletes marked rows only (committed ones and the caller's own), skipping rows another
-- transaction has locked. A procedure, so that the
-- control session can run it with dblink_exec (a statement without rows).
CREATE OR REPLACE PROCEDURE @extschema@.__purge(_table TEXT)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $purge$
BEGIN
    IF _table IS NULL OR _table NOT IN ('model_states', 'automl_trials', 'fit_configs',
                                        'automl_decisions', 'unit_postings', 'jobs') THEN
        RAISE EXCEPTION 'no catalog table % to purge', pg_catalog.quote_nullable(_table)
            USING ERRCODE = '22023';
    END IF;
    -- rows another transaction holds (a role may lock its own marked rows) are left for a
    -- later purge: nobody waits on another role's locks
    EXECUTE pg_catalog.format('DELETE FROM @extschema@.%1$I WHERE ctid = ANY(ARRAY('
                              'SELECT ctid FROM @extschema@.%1$I WHERE doomed '
                              'FOR UPDATE SKIP LOCKED))', _table);
END
$purge$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_fit_workers(
    fit_id      BIGINT,
    num_workers INTEGER
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython cerebro_db_fit_workers@
$python$;
COMMENT ON FUNCTION @extschema@.cerebro_db_fit_workers(BIGINT, INTEGER) IS
'Ask a running fit (from another session) for num_workers worker sessions: its coordinator opens new ones or retires surplus workers after their unit in flight, between units; the workers are listed in cerebro_db.fit_workers';

CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_fit_workers(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage cerebro_db_fit_workers@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_forget_role(
    role_name TEXT
) RETURNS BIGINT LANGUAGE plpython3u VOLATILE AS $python$
@plpython cerebro_db_forget_role@
$python$;
COMMENT ON FUNCTION @extschema@.cerebro_db_forget_role(TEXT) IS
'Superusers: delete every catalog row of a dropped role (fits, states, jobs and their pg_cron entries, run history), which a role created later under its name would otherwise see as its own; returns the number of fits deleted';

CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_close_workers()
RETURNS INTEGER LANGUAGE plpython3u VOLATILE AS $python$
@plpython cerebro_db_close_workers@
$python$;
COMMENT ON FUNCTION @extschema@.cerebro_db_close_workers() IS
'Close the worker sessions this session keeps open between fits (cerebro_db.worker_idle_timeout); returns how many were closed';

-- The checks of a fit that need Keras, run by a worker session before the fit writes anything
-- (the coordinator never imports TensorFlow); returns JSON (internal).
CREATE OR REPLACE FUNCTION @extschema@.__check_fit(spec TEXT)
RETURNS TEXT LANGUAGE plpython3u VOLATILE AS $python$
@plpython __check_fit@
$python$;

-- Cancel a running fit from another session: sets the fit's cancel_requested flag, which
-- its coordinator polls (at most every 0.5 s while units run). The coordinator then cancels
-- the units in flight on their workers, closes every worker session, marks the fit
-- 'cancelled' (resumable with madlib_keras_fit_resume; committed units are kept) and fails
-- its statement with SQLSTATE 57014. Returns true when a running fit was flagged, false when
-- the fit is not running. Runs with the caller's rights: row-level security lets only the
-- fit's owner (or a superuser) see, hence cancel, it. The flag takes effect once the
-- calling transaction commits.
CREATE OR REPLACE FUNCTION @extschema@.cerebro_db_cancel_fit(fit_id BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $cancel_fit$
DECLARE
    st text;
BEGIN
    IF cerebro_db_cancel_fit.fit_id IS NULL THEN
        RAISE EXCEPTION 'fit_id must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT f.status INTO st FROM @extschema@.fits f WHERE f.fit_id = cerebro_db_cancel_fit.fit_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fit % does not exist', cerebro_db_cancel_fit.fit_id
            USING ERRCODE = '42704',
            HINT = 'SELECT fit_id, status FROM @extschema@.fits lists your fits.';
    END IF;
    UPDATE @extschema@.fits f SET cancel_requested = pg_catalog.clock_timestamp()
     WHERE f.fit_id = cerebro_db_cancel_fit.fit_id AND f.status = 'running';
    RETURN FOUND;
END
$cancel_fit$;
COMMENT ON FUNCTION @extschema@.cerebro_db_cancel_fit(BIGINT) IS
'Cancel a running fit (its owner or a superuser): the coordinator stops between units, cancels the units in flight, closes its worker sessions and marks the fit cancelled (resumable with madlib_keras_fit_resume); true if a running fit was flagged';

-- One unit of a fit, run by a worker session the coordinator opened (internal).
CREATE OR REPLACE FUNCTION @extschema@.__run_unit(
    fit_id BIGINT, mst_key INTEGER, epoch INTEGER, part INTEGER, worker INTEGER, kind TEXT,
    options TEXT
) RETURNS TEXT LANGUAGE plpython3u VOLATILE AS $python$
@plpython __run_unit@
$python$;

-- One slot of a worker session's chain of units (internal, see unit_postings): waits for
-- the unit the coordinator posts for it and runs it like __run_unit.
CREATE OR REPLACE FUNCTION @extschema@.__run_slot(
    tag TEXT, fit_id BIGINT, worker INTEGER, seq INTEGER, last INTEGER, wake TEXT
) RETURNS TEXT LANGUAGE plpython3u VOLATILE AS $python$
@plpython __run_slot@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit(
    source_table              VARCHAR,
    model                     VARCHAR,
    model_arch_table          VARCHAR,
    model_id                  INTEGER,
    compile_params            VARCHAR,
    fit_params                VARCHAR,
    num_iterations            INTEGER,
    use_gpus                  BOOLEAN DEFAULT FALSE,
    validation_table          VARCHAR DEFAULT NULL,
    metrics_compute_frequency INTEGER DEFAULT NULL,
    warm_start                BOOLEAN DEFAULT NULL,
    name                      VARCHAR DEFAULT NULL,
    description               VARCHAR DEFAULT NULL,
    object_table              VARCHAR DEFAULT NULL,
    random_state              INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_fit@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_fit(VARCHAR, VARCHAR, VARCHAR, INTEGER, VARCHAR,
    VARCHAR, INTEGER, BOOLEAN, VARCHAR, INTEGER, BOOLEAN, VARCHAR, VARCHAR, VARCHAR, INTEGER) IS
'Train one model configuration (sequential SGD over the partitions); writes <model> and <model>_summary';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_fit(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_fit@
$python$;

------------------------------------------------------------------------------------------
-- Evaluation and prediction (since 0.2.0)
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_evaluate(
    model_table  VARCHAR,
    test_table   VARCHAR,
    output_table VARCHAR,
    use_gpus     BOOLEAN DEFAULT FALSE,
    mst_key      INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_evaluate@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_evaluate(VARCHAR, VARCHAR, VARCHAR, BOOLEAN,
    INTEGER) IS
'Loss and metrics of a trained model over a packed test table; writes output_table (loss, metric, metrics_type, loss_type, metrics)';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_evaluate(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_evaluate@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict(
    model_table         VARCHAR,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           VARCHAR DEFAULT 'prob',
    use_gpus            BOOLEAN DEFAULT FALSE,
    mst_key             INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_predict@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_predict(VARCHAR, VARCHAR, VARCHAR, VARCHAR,
    VARCHAR, VARCHAR, BOOLEAN, INTEGER) IS
'Predict raw rows with a trained model, in batches; output: id, class_name, class_value, prob, rank';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_predict@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict_byom(
    model_arch_table    VARCHAR,
    model_id            INTEGER,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           VARCHAR DEFAULT 'prob',
    use_gpus            BOOLEAN DEFAULT NULL,
    class_values        TEXT[] DEFAULT NULL,
    normalizing_const   DOUBLE PRECISION DEFAULT NULL,
    dependent_count     INTEGER DEFAULT 1
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_predict_byom@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_predict_byom(VARCHAR, INTEGER, VARCHAR, VARCHAR,
    VARCHAR, VARCHAR, VARCHAR, BOOLEAN, TEXT[], DOUBLE PRECISION, INTEGER) IS
'Predict with an architecture and weights from an architecture table (bring your own model)';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict_byom(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_predict_byom@
$python$;

------------------------------------------------------------------------------------------
-- AutoML (since 0.2.0)
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_automl(
    source_table              VARCHAR,
    model_output_table        VARCHAR,
    model_arch_table          VARCHAR,
    model_selection_table     VARCHAR,
    model_id_list             INTEGER[],
    compile_params_grid       VARCHAR,
    fit_params_grid           VARCHAR,
    automl_method             VARCHAR DEFAULT 'hyperband',
    automl_params             VARCHAR DEFAULT NULL,
    random_state              INTEGER DEFAULT NULL,
    object_table              VARCHAR DEFAULT NULL,
    use_gpus                  BOOLEAN DEFAULT FALSE,
    validation_table          VARCHAR DEFAULT NULL,
    metrics_compute_frequency INTEGER DEFAULT NULL,
    name                      VARCHAR DEFAULT NULL,
    description               VARCHAR DEFAULT NULL,
    use_caching               BOOLEAN DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython madlib_keras_automl@
$python$;
COMMENT ON FUNCTION @extschema@.madlib_keras_automl(VARCHAR, VARCHAR, VARCHAR, VARCHAR,
    INTEGER[], VARCHAR, VARCHAR, VARCHAR, VARCHAR, INTEGER, VARCHAR, BOOLEAN, VARCHAR, INTEGER,
    VARCHAR, VARCHAR, BOOLEAN) IS
'AutoML over a search space (hyperband, hyperopt, asha, mltuner, grid, random) on model hopper parallelism; writes <model_output_table>, _summary, _info and the model selection table holding the best configuration';

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_automl(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage madlib_keras_automl@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.hyperband_schedule(
    schedule_table VARCHAR,
    r              INTEGER,
    eta            INTEGER DEFAULT 3,
    skip_last      INTEGER DEFAULT 0
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython hyperband_schedule@
$python$;
COMMENT ON FUNCTION @extschema@.hyperband_schedule(VARCHAR, INTEGER, INTEGER, INTEGER) IS
'Hyperband brackets for R, eta and skip_last as a table of (s, i, n_i, r_i)';

CREATE OR REPLACE FUNCTION @extschema@.hyperband_schedule(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage hyperband_schedule@
$python$;

------------------------------------------------------------------------------------------
-- Scheduled model selection (since 0.2.0; pg_cron optional)
------------------------------------------------------------------------------------------
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.schedule_model_selection(
    job_name              TEXT,
    schedule              TEXT,
    source_table          VARCHAR,
    packed_table          VARCHAR,
    dependent_varname     VARCHAR,
    independent_varname   VARCHAR,
    model_output_table    VARCHAR,
    model_selection_table VARCHAR DEFAULT NULL,
    method                TEXT    DEFAULT 'fit',
    fit_options           JSONB   DEFAULT '{}',
    preprocess_options    JSONB   DEFAULT '{}',
    key_column            VARCHAR DEFAULT NULL,
    warm_start            BOOLEAN DEFAULT FALSE,
    retries               INTEGER DEFAULT 0,
    retry_delay           INTERVAL DEFAULT '1 minute'
) RETURNS BIGINT LANGUAGE plpython3u VOLATILE AS $python$
@plpython schedule_model_selection@
$python$;
COMMENT ON FUNCTION @extschema@.schedule_model_selection(TEXT, TEXT, VARCHAR, VARCHAR, VARCHAR,
    VARCHAR, VARCHAR, VARCHAR, TEXT, JSONB, JSONB, VARCHAR, BOOLEAN, INTEGER, INTERVAL) IS
'Define a model selection job (pack, train, publish under stable names) and, with a schedule, run it by pg_cron; returns the job id';

CREATE OR REPLACE FUNCTION @extschema@.schedule_model_selection(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage schedule_model_selection@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.unschedule_model_selection(
    job_name TEXT
) RETURNS BOOLEAN LANGUAGE plpython3u VOLATILE AS $python$
@plpython unschedule_model_selection@
$python$;
COMMENT ON FUNCTION @extschema@.unschedule_model_selection(TEXT) IS
'Remove a model selection job and its pg_cron entry; its outputs and run history stay';

-- One step of a job's run (internal): 'begin' (lock, history row; NULL when the previous run
-- still holds the lock), 'pack', 'train' (train into staging tables and publish them), 'end'.
-- Each step is its own transaction; 'pack' and 'train' catch their errors and record them.
CREATE OR REPLACE FUNCTION @extschema@.__job_step(job_name TEXT, run_id BIGINT, step TEXT)
RETURNS TEXT LANGUAGE plpython3u VOLATILE AS $python$
@plpython __job_step@
$python$;

-- What pg_cron calls (CALL, not SELECT: the steps commit on their own so that the worker
-- sessions of the fit read the packed data).
CREATE OR REPLACE PROCEDURE @extschema@.run_model_selection_job(job_name TEXT)
LANGUAGE plpgsql AS $run_job$
DECLARE
    run   bigint;
    st    text;
    delay interval;
BEGIN
    -- a procedure that commits cannot have a SET clause: it pins search_path itself in each
    -- of its transactions (SET LOCAL), so nothing a role creates on the caller's path runs
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF job_name IS NULL THEN
        RAISE EXCEPTION 'job_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    SELECT j.retry_delay INTO delay FROM @extschema@.jobs j WHERE j.job_name = $1
        AND j.owner OPERATOR(pg_catalog.=) current_user;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'model selection job "%" does not exist', job_name
            USING ERRCODE = '42704', HINT = 'The jobs are listed in model_selection_jobs.';
    END IF;
    run := @extschema@.__job_step(job_name, NULL, 'begin')::bigint;
    COMMIT;
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF run IS NULL THEN
        RETURN;
    END IF;
    LOOP
        st := @extschema@.__job_step(job_name, run, 'pack');
        COMMIT;
        PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        IF st = 'ok' THEN
            st := @extschema@.__job_step(job_name, run, 'train');
            COMMIT;
            PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
        END IF;
        EXIT WHEN st <> 'retry';
        PERFORM pg_catalog.pg_sleep(extract(epoch FROM delay));
    END LOOP;
    st := @extschema@.__job_step(job_name, run, 'end');
    COMMIT;
    IF pg_catalog.split_part(st, E'\n', 1) = 'failed' THEN
        -- recorded and committed above; failing the call tells pg_cron (job_run_details)
        -- and a caller of CALL that the run failed
        RAISE EXCEPTION 'model selection job "%" failed', job_name
            USING ERRCODE = 'P0001',
            DETAIL = pg_catalog.substr(st, pg_catalog.strpos(st, E'\n') + 1),
            HINT = 'Its history is in job_runs (model_selection_jobs for the latest run).';
    END IF;
END
$run_job$;
COMMENT ON PROCEDURE @extschema@.run_model_selection_job(TEXT) IS
'Run a model selection job now (what pg_cron calls): pack new rows, train, publish atomically, record the run in job_runs';

-- MADlib compatibility (since 0.2.0)
------------------------------------------------------------------------------------------
-- MADlib's numeric pred_type overloads: an INTEGER is top k, a DOUBLE PRECISION a
-- probability threshold; both are passed on as their text to the VARCHAR form.
CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict(
    model_table         VARCHAR,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           INTEGER,
    use_gpus            BOOLEAN DEFAULT FALSE,
    mst_key             INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE sql VOLATILE AS $sql$
    SELECT @extschema@.madlib_keras_predict($1, $2, $3, $4, $5, $6::varchar, $7, $8)
$sql$;

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict(
    model_table         VARCHAR,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           DOUBLE PRECISION,
    use_gpus            BOOLEAN DEFAULT FALSE,
    mst_key             INTEGER DEFAULT NULL
) RETURNS VOID LANGUAGE sql VOLATILE AS $sql$
    SELECT @extschema@.madlib_keras_predict($1, $2, $3, $4, $5, $6::varchar, $7, $8)
$sql$;

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict_byom(
    model_arch_table    VARCHAR,
    model_id            INTEGER,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           INTEGER,
    use_gpus            BOOLEAN DEFAULT NULL,
    class_values        TEXT[] DEFAULT NULL,
    normalizing_const   DOUBLE PRECISION DEFAULT NULL,
    dependent_count     INTEGER DEFAULT 1
) RETURNS VOID LANGUAGE sql VOLATILE AS $sql$
    SELECT @extschema@.madlib_keras_predict_byom($1, $2, $3, $4, $5, $6, $7::varchar, $8, $9,
                                                 $10, $11)
$sql$;

CREATE OR REPLACE FUNCTION @extschema@.madlib_keras_predict_byom(
    model_arch_table    VARCHAR,
    model_id            INTEGER,
    test_table          VARCHAR,
    id_col              VARCHAR,
    independent_varname VARCHAR,
    output_table        VARCHAR,
    pred_type           DOUBLE PRECISION,
    use_gpus            BOOLEAN DEFAULT NULL,
    class_values        TEXT[] DEFAULT NULL,
    normalizing_const   DOUBLE PRECISION DEFAULT NULL,
    dependent_count     INTEGER DEFAULT 1
) RETURNS VOID LANGUAGE sql VOLATILE AS $sql$
    SELECT @extschema@.madlib_keras_predict_byom($1, $2, $3, $4, $5, $6, $7::varchar, $8, $9,
                                                 $10, $11)
$sql$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.gpu_configuration(
    output_table VARCHAR,
    source       VARCHAR
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython gpu_configuration@
$python$;
COMMENT ON FUNCTION @extschema@.gpu_configuration(VARCHAR, VARCHAR) IS
'The GPUs the database server sees (source ''tensorflow'' (NULL) or ''nvidia''): writes output_table (hostname, gpu_descr), one row per GPU';

CREATE OR REPLACE FUNCTION @extschema@.gpu_configuration(output_table VARCHAR)
RETURNS VOID LANGUAGE sql VOLATILE AS $sql$
    SELECT @extschema@.gpu_configuration($1, NULL)
$sql$;

CREATE OR REPLACE FUNCTION @extschema@.gpu_configuration()
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
from cerebro_db.entrypoints import usage
return usage("gpu_configuration")
$python$;

-- Custom loss and metric functions: references to installed Python objects, never pickled
-- bytes (cerebro_db/custom_functions.py). MADlib's BYTEA form is declared so that its scripts
-- get a clear refusal saying what to do instead.
-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.load_custom_function(
    object_table VARCHAR,
    reference    TEXT,
    name         TEXT,
    description  TEXT DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython load_custom_function@
$python$;
COMMENT ON FUNCTION @extschema@.load_custom_function(VARCHAR, TEXT, TEXT, TEXT) IS
'Register a custom loss or metric as a reference to a Python object in an installed module the DBA allowed (''mypkg.losses:focal_loss''), under name, in an object table';

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.load_custom_function(
    object_table VARCHAR,
    object       BYTEA,
    name         TEXT,
    description  TEXT DEFAULT NULL
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython load_custom_function_pickled@
$python$;
COMMENT ON FUNCTION @extschema@.load_custom_function(VARCHAR, BYTEA, TEXT, TEXT) IS
'MADlib''s pickled form: refused (user bytes are never unpickled); the error says how to register a reference instead';

CREATE OR REPLACE FUNCTION @extschema@.load_custom_function(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage load_custom_function@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.load_top_k_accuracy_function(
    object_table VARCHAR,
    k            INTEGER
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython load_top_k_accuracy_function@
$python$;
COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(VARCHAR, INTEGER) IS
'Add the metric top_<k>_accuracy (Keras'' top-k categorical accuracy) to an object table';

CREATE OR REPLACE FUNCTION @extschema@.load_top_k_accuracy_function(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage load_top_k_accuracy_function@
$python$;

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.delete_custom_function(
    object_table VARCHAR,
    id           INTEGER
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython delete_custom_function@
$python$;
COMMENT ON FUNCTION @extschema@.delete_custom_function(VARCHAR, INTEGER) IS
'Delete a custom function by id from an object table; drops the table once it is empty';

-- @entrypoint
CREATE OR REPLACE FUNCTION @extschema@.delete_custom_function(
    object_table VARCHAR,
    name         TEXT
) RETURNS VOID LANGUAGE plpython3u VOLATILE AS $python$
@plpython delete_custom_function_by_name@
$python$;
COMMENT ON FUNCTION @extschema@.delete_custom_function(VARCHAR, TEXT) IS
'Delete a custom function by name from an object table; drops the table once it is empty';

CREATE OR REPLACE FUNCTION @extschema@.delete_custom_function(message VARCHAR DEFAULT NULL)
RETURNS TEXT LANGUAGE plpython3u IMMUTABLE AS $python$
@usage delete_custom_function@
$python$;

-- A cerebro_db.* setting as the DBA wrote it in postgresql.conf (or with ALTER SYSTEM),
-- ignoring values SET in a session or for a role: any role can SET a custom setting, so a
-- setting that confines what the server writes (cerebro_db.tensorboard_log_dir) is read from
-- the configuration files only. Runs as the extension's owner (pg_file_settings is readable
-- by superusers only) and answers for cerebro_db.* names only.
CREATE OR REPLACE FUNCTION @extschema@.__dba_setting(setting_name TEXT)
RETURNS TEXT LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $dba_setting$
    SELECT f.setting FROM pg_catalog.pg_file_settings f
     WHERE f.name = setting_name AND f.error IS NULL
       AND starts_with(setting_name, 'cerebro_db.')
     ORDER BY f.seqno DESC LIMIT 1
$dba_setting$;
