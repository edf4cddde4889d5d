-- Pipelined dispatch: the next unit of a busy worker session, posted by the coordinator's
-- control session while the worker's current unit runs. The worker's statement is a chain
-- of slots (__run_slot); as its unit ends it claims the slot's posting itself, with no round
-- trip through the coordinator. A slot holds a unit, 'stop' (the coordinator ends the
-- chain) or 'abandoned' (the worker waited too long and left; the primary key arbitrates a
-- late posting; a role writes only under its own fits, so no other role's row can take a
-- slot's key). Rows live as long as the fit's executor (deleted when it closes) and
-- carry nothing a resume needs, so the table is unlogged.
CREATE UNLOGGED TABLE @extschema@.unit_postings (
    tag        text NOT NULL,
    worker     integer NOT NULL,
    seq        integer NOT NULL,
    fit_id     bigint NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('unit', 'stop', 'abandoned')),
    unit       jsonb,
    owner      name NOT NULL DEFAULT current_user,
    posted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (fit_id, tag, worker, seq)
);
ALTER TABLE @extschema@.unit_postings ENABLE ROW LEVEL SECURITY;
-- a row only under a fit of the writing role, as every table of a fit's rows (010_isolation)
CREATE POLICY own_rows ON @extschema@.unit_postings USING (owner = current_user)
    WITH CHECK (owner = current_user AND EXISTS (
        SELECT 1 FROM @extschema@.fits f WHERE f.fit_id = unit_postings.fit_id
           AND f.owner = current_user));
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.unit_postings TO PUBLIC;
