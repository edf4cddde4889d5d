-- Replicated partitions and elastic fits: the availability map of every fit's worker
-- sessions (which partitions each worker holds, i.e. may train and caches; its status and
-- backend pid), written by the coordinator as workers join and leave; and the number of
-- workers another session asked for (cerebro_db_fit_workers), read by the coordinator
-- between units.
ALTER TABLE @extschema@.fits ADD COLUMN requested_workers integer
    CHECK (requested_workers >= 1);

CREATE TABLE @extschema@.fit_workers (
    fit_id     bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    worker     integer NOT NULL,
    partitions integer[] NOT NULL,
    status     text NOT NULL
               CHECK (status IN ('joining', 'active', 'lost', 'removed', 'closed')),
    pid        integer,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    owner      name NOT NULL DEFAULT current_user,
    PRIMARY KEY (fit_id, worker)
);
ALTER TABLE @extschema@.fit_workers ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.fit_workers USING (owner = current_user)
    WITH CHECK (owner = current_user);
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.fit_workers TO PUBLIC;
