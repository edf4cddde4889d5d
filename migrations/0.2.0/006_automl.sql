-- AutoML runs (madlib_keras_automl): a run is a fit (kind 'automl') whose configurations
-- (trials) are launched, extended, stopped and freed by a tuning procedure while it runs.
-- Every decision is logged as it is made, each trial's status is kept current, and the
-- procedure's own state (JSON, never pickled) is saved after every step, so another session
-- can watch the run and a killed run can be resumed from the catalog.
CREATE TABLE @extschema@.automl_trials (
    fit_id     bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    mst_key    integer NOT NULL,
    parent     integer,
    tunables   jsonb NOT NULL DEFAULT '{}',
    meta       jsonb NOT NULL DEFAULT '{}',
    target     integer NOT NULL,
    status     text NOT NULL DEFAULT 'training'
               CHECK (status IN ('training', 'paused', 'stopped', 'freed')),
    last_epoch integer,
    score      double precision,
    owner      name NOT NULL DEFAULT current_user,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (fit_id, mst_key)
);

CREATE TABLE @extschema@.automl_decisions (
    decision_id bigserial PRIMARY KEY,
    fit_id      bigint NOT NULL REFERENCES @extschema@.fits ON DELETE CASCADE,
    seq         integer NOT NULL,
    decision    text NOT NULL CHECK (decision IN ('launch', 'extend', 'stop', 'free')),
    mst_key     integer NOT NULL,
    target      integer,
    reason      text,
    meta        jsonb NOT NULL DEFAULT '{}',
    at_seconds  double precision NOT NULL,
    made_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    owner       name NOT NULL DEFAULT current_user
);
CREATE INDEX automl_decisions_fit_idx ON @extschema@.automl_decisions (fit_id, seq);

CREATE TABLE @extschema@.automl_state (
    fit_id     bigint PRIMARY KEY REFERENCES @extschema@.fits ON DELETE CASCADE,
    method     text NOT NULL,
    state      jsonb NOT NULL,
    owner      name NOT NULL DEFAULT current_user,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

DO $rls$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['automl_trials', 'automl_decisions', 'automl_state'] LOOP
        EXECUTE format('ALTER TABLE @extschema@.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('CREATE POLICY own_rows ON @extschema@.%I USING (owner = current_user) '
                       'WITH CHECK (owner = current_user)', t);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON @extschema@.%I TO PUBLIC', t);
    END LOOP;
END
$rls$;
GRANT USAGE ON SEQUENCE @extschema@.automl_decisions_decision_id_seq TO PUBLIC;
