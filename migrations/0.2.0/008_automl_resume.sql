-- Resumable AutoML runs: next to the procedure's JSON state, the engine's own bookkeeping
-- at the same step (decision count, trials with their targets and statuses, and how many
-- training units and which evaluated epochs of each trial the procedure has been told of),
-- written in the same transaction. madlib_keras_fit_resume restores both and reports the
-- units committed after that step.
ALTER TABLE @extschema@.automl_state ADD COLUMN book jsonb;
