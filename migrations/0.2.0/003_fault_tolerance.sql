-- Fault tolerance of fits: a fit whose coordinator session died is 'interrupted' (and can
-- be resumed with madlib_keras_fit_resume); a unit is logged at most once (a worker session
-- that comes back from the dead cannot commit a unit its replacement already did); every
-- failed unit attempt (a worker session lost, killed or past cerebro_db.unit_timeout) is
-- recorded in unit_failures.
ALTER TABLE @extschema@.fits DROP CONSTRAINT fits_status_check;
ALTER TABLE @extschema@.fits ADD CONSTRAINT fits_status_check
    CHECK (status IN ('running', 'done', 'failed', 'interrupted'));
ALTER TABLE @extschema@.fits ADD COLUMN resumed_at timestamptz;
ALTER TABLE @extschema@.fits ADD COLUMN resumes integer NOT NULL DEFAULT 0;

CREATE UNIQUE INDEX units_once_idx ON @extschema@.units (fit_id, mst_key, epoch, partition, kind);

CREATE TABLE @extschema@.unit_failures (
    fit_id     bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    mst_key    integer NOT NULL,
    epoch      integer NOT NULL,
    partition  integer NOT NULL,
    kind       text NOT NULL,
    worker     integer NOT NULL,
    worker_pid integer,
    attempt    integer NOT NULL,
    message    text,
    failed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    owner      name NOT NULL DEFAULT current_user
);
CREATE INDEX unit_failures_fit_idx ON @extschema@.unit_failures (fit_id);
ALTER TABLE @extschema@.unit_failures ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON @extschema@.unit_failures USING (owner = current_user)
    WITH CHECK (owner = current_user);
GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.unit_failures TO PUBLIC;

-- fit_progress shows a 'running' fit whose coordinator session is gone as 'interrupted'
-- (the fits row itself is marked when the next fit or resume starts).
CREATE OR REPLACE VIEW @extschema@.fit_progress AS
SELECT f.fit_id, f.owner, f.model_output_table,
       CASE WHEN f.status = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_stat_activity a
                 WHERE a.pid = f.coordinator_pid
                   AND a.backend_start <= coalesce(f.resumed_at, f.started_at))
            THEN 'interrupted' ELSE f.status END AS status,
       f.policy, f.num_partitions,
       u.done AS units_done, f.total_units,
       round(100.0 * u.done / greatest(f.total_units, 1), 1) AS percent,
       u.best_loss,
       coalesce(f.ended_at, clock_timestamp()) - f.started_at AS elapsed,
       CASE WHEN f.status = 'running' AND u.done > 0
            THEN (clock_timestamp() - f.started_at) * ((f.total_units - u.done)::float8 / u.done)
       END AS eta
  FROM @extschema@.fits f
  LEFT JOIN LATERAL (
      SELECT count(*) FILTER (WHERE kind = 'train') AS done,
             min(loss) FILTER (WHERE kind = 'eval_valid' OR kind = 'train') AS best_loss
        FROM @extschema@.units WHERE fit_id = f.fit_id) u ON true
 WHERE f.owner = current_user
    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
