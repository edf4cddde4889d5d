-- The training catalog: every fit, its configurations, every unit as it happens, and the
-- model states that hop between workers. Worker sessions write units and states in their
-- own transactions (so a crash loses only the units in flight); rows belong to the role
-- that made them (row-level security), so one role cannot read or overwrite another's.
CREATE TABLE @extschema@.fits (
    fit_id           bigserial PRIMARY KEY,
    owner            name NOT NULL DEFAULT current_user,
    kind             text NOT NULL,
    source_table     text NOT NULL,
    validation_table text,
    model_output_table text NOT NULL,
    model_selection_table text,
    policy           text NOT NULL,
    num_partitions   integer NOT NULL,
    num_iterations   integer NOT NULL,
    metrics_compute_frequency integer NOT NULL,
    random_state     bigint NOT NULL,
    options          jsonb NOT NULL DEFAULT '{}',
    status           text NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'done', 'failed')),
    message          text,
    total_units      integer NOT NULL,
    coordinator_pid  integer,
    started_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at         timestamptz
);

CREATE TABLE @extschema@.fit_configs (
    fit_id         bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    mst_key        integer NOT NULL,
    model_id       integer,
    compile_params text NOT NULL,
    fit_params     text NOT NULL,
    model_arch     json NOT NULL,
    init_weights   bytea,
    owner          name NOT NULL DEFAULT current_user,
    PRIMARY KEY (fit_id, mst_key)
);

-- One row per unit: kind 'train' (a pass of a config over a partition), 'eval_train' or
-- 'eval_valid' (metrics of a config's epoch state on a partition of the training or
-- validation data).
CREATE TABLE @extschema@.units (
    unit_id      bigserial PRIMARY KEY,
    fit_id       bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    mst_key      integer NOT NULL,
    epoch        integer NOT NULL,
    partition    integer NOT NULL,
    worker       integer NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('train', 'eval_train', 'eval_valid')),
    started_at   timestamptz NOT NULL,
    ended_at     timestamptz NOT NULL,
    rows         bigint NOT NULL,
    loss         double precision,
    metrics      double precision[],
    seconds_load double precision,
    seconds_run  double precision,
    seconds_save double precision,
    state_bytes  bigint,
    worker_pid   integer,
    owner        name NOT NULL DEFAULT current_user
);
CREATE INDEX units_fit_idx ON @extschema@.units (fit_id, mst_key, epoch);

-- Model states: 'current' is the state after the config's last finished unit; 'epoch:N'
-- the state at the end of epoch N, kept until that epoch's evaluation is done. A state
-- larger than one chunk is stored in several rows.
CREATE TABLE @extschema@.model_states (
    fit_id   bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    mst_key  integer NOT NULL,
    version  text NOT NULL,
    chunk    integer NOT NULL,
    data     bytea NOT NULL,
    owner    name NOT NULL DEFAULT current_user,
    PRIMARY KEY (fit_id, mst_key, version, chunk)
);
ALTER TABLE @extschema@.model_states ALTER COLUMN data SET STORAGE EXTERNAL;

DO $rls$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['fits', 'fit_configs', 'units', 'model_states'] LOOP
        EXECUTE format('ALTER TABLE @extschema@.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY own_rows ON @extschema@.%I USING (owner = current_user) '
                       'WITH CHECK (owner = current_user)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.%I TO PUBLIC', t);
    END LOOP;
END
$rls$;
GRANT USAGE ON SEQUENCE @extschema@.fits_fit_id_seq, @extschema@.units_unit_id_seq TO PUBLIC;

-- Views run with their owner's rights, which would bypass row-level security; they filter
-- by owner themselves (security_invoker views need PostgreSQL 15, Greenplum 7 is 12).
-- Progress of fits, for another session to watch: units done and total, elapsed time and
-- an estimate of the time left from the mean unit rate so far.
CREATE VIEW @extschema@.fit_progress AS
SELECT f.fit_id, f.owner, f.model_output_table, f.status, f.policy, f.num_partitions,
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

-- Per configuration: epochs done, last training loss, best validation loss so far.
CREATE VIEW @extschema@.fit_config_progress AS
SELECT c.fit_id, c.mst_key, c.model_id, c.compile_params, c.fit_params,
       (SELECT count(*) FROM @extschema@.units u
         WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'train')
         / f.num_partitions AS epochs_done,
       (SELECT u.loss FROM @extschema@.units u
         WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'train'
         ORDER BY u.ended_at DESC LIMIT 1) AS last_train_loss,
       e.best_valid_loss
  FROM @extschema@.fit_configs c
  JOIN @extschema@.fits f USING (fit_id)
  LEFT JOIN LATERAL (
      SELECT min(l) AS best_valid_loss FROM (
          SELECT sum(u.loss * u.rows) / nullif(sum(u.rows), 0) AS l
            FROM @extschema@.units u
           WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'eval_valid'
           GROUP BY u.epoch HAVING count(*) = f.num_partitions) s) e ON true
 WHERE f.owner = current_user
    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
GRANT SELECT ON @extschema@.fit_progress, @extschema@.fit_config_progress TO PUBLIC;
