-- dblink's connections are the backend's, not a role's: any code that runs in a backend can
-- use any of its named connections (dblink_get_connections() lists them). A fit's caller
-- holds its worker and control sessions that way during the fit and keeps idle worker
-- sessions open between fits, and a red-team pass ran SQL as the caller through them from
-- another role's SECURITY DEFINER function called later in the same session (and made
-- itself superuser through a maintainer's kept sessions). PUBLIC may no longer run the
-- functions that use an open connection; the extension calls them through __dblink, which
-- asks for a token that only its own Python code holds (cerebro_db/catalog/dblink_gate.py).
-- Opening a connection (dblink_connect, which asks non-superusers for a password), listing
-- them, asking whether one is busy (dblink_is_busy: it only reads what has arrived, and the
-- coordinator polls it most, about 17 times a unit) and dblink's SQL builders stay open. A DBA may GRANT the others to a role it trusts
-- with the sessions of every role whose session runs that role's code.
DO $gate$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_proc p ON p.oid = d.objid
          JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
         WHERE d.classid = 'pg_catalog.pg_proc'::regclass
           AND d.refclassid = 'pg_catalog.pg_extension'::regclass
           AND d.deptype = 'e' AND e.extname = 'dblink'
           AND p.proname NOT IN ('dblink_connect', 'dblink_connect_u', 'dblink_get_connections',
                                 'dblink_is_busy', 'dblink_get_pkey', 'dblink_build_sql_insert',
                                 'dblink_build_sql_delete', 'dblink_build_sql_update',
                                 'dblink_current_query', 'dblink_fdw_validator')
    LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$gate$;

-- A worker session logs in as the session user and, for a caller that SET ROLE, sets that
-- role (__worker_connect). Where PostgreSQL forbids changing the role (a SECURITY DEFINER
-- function, or a security-restricted operation: ANALYZE, VACUUM, CREATE INDEX, REFRESH
-- MATERIALIZED VIEW running a table owner's functions), the code running is not the
-- session's to trust with the session user: a red-team pass had a superuser SET ROLE to a
-- role and ANALYZE its table, whose index function asked for a worker session and sent
-- RESET ROLE over it, and the role became superuser. So a ticket is refused there unless
-- the caller is the session user itself. The probe sets the role to what it already is in
-- a subtransaction that is always rolled back.
CREATE FUNCTION @extschema@.__ticket_context() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $ticket_context$
BEGIN
    IF current_user <> session_user THEN
        BEGIN
            PERFORM pg_catalog.set_config('role', current_user, true);
            RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'probe';
        EXCEPTION
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role "%" may not open worker sessions here', current_user
                    USING ERRCODE = '42501', DETAIL = SQLERRM,
                    HINT = 'Worker sessions log in as the session user ("' || session_user
                           || '"); code that the server runs as another role inside a '
                           'SECURITY DEFINER function or a maintenance command gets none.';
            WHEN raise_exception THEN
                NULL;  -- the role could be set here: the session's own SET ROLE
        END;
    END IF;
    RETURN NEW;
END
$ticket_context$;
CREATE TRIGGER ticket_context BEFORE INSERT ON @extschema@.worker_tickets
    FOR EACH ROW EXECUTE FUNCTION @extschema@.__ticket_context();
