-- Watching a running fit from another session: the progress views say which loss is the
-- best so far and where it comes from, and each configuration's own progress.
--
-- fit_progress.best_loss was the smallest loss of any unit, mixing training units with the
-- validation loss of single partitions (not the validation loss of any model). It is now the
-- best validation loss of a finished evaluation (all partitions of one configuration's epoch,
-- row-weighted, as the _info table reports it), else the best training loss of a finished
-- evaluation (without validation data: what the fit's notice and _info report; a user found
-- the smallest unit loss of one partition there before), else, before any evaluation, the
-- smallest training loss of a unit. New columns at the end: best_valid_loss,
-- best_train_loss, best_mst_key (the configuration with the best loss), last_unit_at,
-- best_eval_train_loss and best_loss_kind (which of the three best_loss is: 'validation',
-- 'training' or 'training units'; an outside pass saw best_loss rise as it turned from a
-- training to a validation loss).
CREATE OR REPLACE VIEW @extschema@.fit_progress AS
SELECT f.fit_id, f.owner, f.model_output_table,
       -- a 'running' fit whose coordinator session is gone shows as 'interrupted' (003)
       CASE WHEN f.status = 'running' AND NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_stat_activity a
                 WHERE a.pid = f.coordinator_pid
                   AND a.backend_start <= coalesce(f.resumed_at, f.started_at))
            THEN 'interrupted' ELSE f.status END AS status,
       f.policy, f.num_partitions,
       u.done AS units_done, f.total_units,
       round(100.0 * u.done / greatest(f.total_units, 1), 1) AS percent,
       coalesce(v.best_valid_loss, t.best_eval_train_loss, u.best_train_loss) AS best_loss,
       coalesce(f.ended_at, clock_timestamp()) - f.started_at AS elapsed,
       CASE WHEN f.status = 'running' AND u.done > 0
            THEN (clock_timestamp() - f.started_at) * ((f.total_units - u.done)::float8 / u.done)
       END AS eta,
       v.best_valid_loss, u.best_train_loss,
       CASE WHEN v.best_valid_loss IS NOT NULL THEN v.mst_key
            WHEN t.best_eval_train_loss IS NOT NULL THEN t.mst_key
            ELSE u.best_train_mst_key END AS best_mst_key,
       u.last_unit_at,
       t.best_eval_train_loss,
       CASE WHEN v.best_valid_loss IS NOT NULL THEN 'validation'
            WHEN t.best_eval_train_loss IS NOT NULL THEN 'training'
            WHEN u.best_train_loss IS NOT NULL THEN 'training units' END AS best_loss_kind
  FROM @extschema@.fits f
  LEFT JOIN LATERAL (
      SELECT count(*) FILTER (WHERE kind = 'train') AS done,
             min(loss) FILTER (WHERE kind = 'train') AS best_train_loss,
             (array_agg(mst_key ORDER BY loss) FILTER (WHERE kind = 'train' AND loss IS NOT NULL))[1]
               AS best_train_mst_key,
             max(ended_at) AS last_unit_at
        FROM @extschema@.units WHERE fit_id = f.fit_id) u ON true
  LEFT JOIN LATERAL (
      SELECT s.l AS best_valid_loss, s.mst_key FROM (
          SELECT x.mst_key, sum(x.loss * x.rows) / nullif(sum(x.rows), 0) AS l
            FROM @extschema@.units x
           WHERE x.fit_id = f.fit_id AND x.kind = 'eval_valid'
           GROUP BY x.mst_key, x.epoch HAVING count(*) = f.num_partitions) s
       WHERE s.l IS NOT NULL
       ORDER BY s.l LIMIT 1) v ON true
  LEFT JOIN LATERAL (
      SELECT s.l AS best_eval_train_loss, s.mst_key FROM (
          SELECT x.mst_key, sum(x.loss * x.rows) / nullif(sum(x.rows), 0) AS l
            FROM @extschema@.units x
           WHERE x.fit_id = f.fit_id AND x.kind = 'eval_train'
           GROUP BY x.mst_key, x.epoch HAVING count(*) = f.num_partitions) s
       WHERE s.l IS NOT NULL
       ORDER BY s.l LIMIT 1) t ON true
 WHERE f.owner = current_user
    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);

-- Per configuration: epochs done, last training loss, best validation loss so far; new at the
-- end: the configuration's units done and total, the epoch it is in (the epoch of its last
-- unit, NULL before the first), its smallest unit training loss and its best evaluated
-- training loss.
CREATE OR REPLACE VIEW @extschema@.fit_config_progress AS
SELECT c.fit_id, c.mst_key, c.model_id, c.compile_params, c.fit_params,
       t.done / f.num_partitions AS epochs_done,
       (SELECT u.loss FROM @extschema@.units u
         WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'train'
         ORDER BY u.ended_at DESC LIMIT 1) AS last_train_loss,
       e.best_valid_loss,
       t.done AS units_done,
       f.num_iterations * f.num_partitions AS total_units,
       t.current_epoch,
       t.best_train_loss,
       et.best_eval_train_loss
  FROM @extschema@.fit_configs c
  JOIN @extschema@.fits f USING (fit_id)
  LEFT JOIN LATERAL (
      SELECT count(*) AS done, max(u.epoch) AS current_epoch, min(u.loss) AS best_train_loss
        FROM @extschema@.units u
       WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'train') t ON true
  LEFT JOIN LATERAL (
      SELECT min(l) AS best_valid_loss FROM (
          SELECT sum(u.loss * u.rows) / nullif(sum(u.rows), 0) AS l
            FROM @extschema@.units u
           WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'eval_valid'
           GROUP BY u.epoch HAVING count(*) = f.num_partitions) s) e ON true
  LEFT JOIN LATERAL (
      SELECT min(l) AS best_eval_train_loss FROM (
          SELECT sum(u.loss * u.rows) / nullif(sum(u.rows), 0) AS l
            FROM @extschema@.units u
           WHERE u.fit_id = c.fit_id AND u.mst_key = c.mst_key AND u.kind = 'eval_train'
           GROUP BY u.epoch HAVING count(*) = f.num_partitions) s) et ON true
 WHERE f.owner = current_user
    OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user);
