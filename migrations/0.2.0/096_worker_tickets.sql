-- Who asks for a worker session. __worker_connect runs as the extension's owner, so it cannot
-- see its caller's current_user; a ticket carries it: a row a role inserts holds its
-- current_user in owner, which row-level security checks (WITH CHECK), also inside a
-- security-restricted operation (autovacuum, or a DBA's ANALYZE, running a role's index
-- function as that role while session_user is the superuser or the DBA). __worker_connect
-- takes the ticket once (by its random token) and opens a session for the ticket's owner,
-- only where that owner is the session user or the role the session SET ROLE to, so a role's
-- code that the server runs under another session user never gets a session of that user
-- (a red-team pass made an index function's owner superuser through autovacuum before).
-- Tickets live for one connection; unlogged, as nothing in them outlives a crash. A role
-- may insert only the owner column (its own name, by the policy): the token and the time are
-- the defaults, so no role can choose a ticket that never expires or an oversized token.
CREATE UNLOGGED TABLE @extschema@.worker_tickets (
    token   text PRIMARY KEY DEFAULT pg_catalog.gen_random_uuid()::text,
    owner   name NOT NULL DEFAULT current_user,
    made_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
ALTER TABLE @extschema@.worker_tickets ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.worker_tickets USING (owner = current_user)
    WITH CHECK (owner = current_user);
CREATE INDEX worker_tickets_made_at_idx ON @extschema@.worker_tickets (made_at);
GRANT SELECT, INSERT (owner) ON @extschema@.worker_tickets TO PUBLIC;

-- A role holds at most 100 live tickets (a fit takes one per worker session and gives it
-- back at once): an INSERT of more fails as a whole, so no role can fill the table that every
-- role's worker connect cleans (a red-team pass inserted a million, 393 MB, which the next
-- connect after their expiry deleted in its own statement). Expired ones do not count; each
-- connect deletes at most 100 of them.
CREATE INDEX worker_tickets_owner_idx ON @extschema@.worker_tickets (owner, made_at);
CREATE FUNCTION @extschema@.__ticket_quota() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $ticket_quota$
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM @extschema@.worker_tickets
                               WHERE owner = current_user AND made_at >=
                                     pg_catalog.clock_timestamp() - interval '10 minutes'
                               LIMIT 101) s) > 100 THEN
        RAISE EXCEPTION 'role "%" holds more than 100 live worker tickets', current_user
            USING ERRCODE = '54000',
            HINT = 'A worker connect takes its ticket; expired ones go after 10 minutes.';
    END IF;
    RETURN NULL;
END
$ticket_quota$;
CREATE TRIGGER ticket_quota AFTER INSERT ON @extschema@.worker_tickets
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.__ticket_quota();
