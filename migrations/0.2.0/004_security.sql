-- Isolation between roles. A row of fit_configs, units or model_states may only be written
-- for a fit of the same owner: without this a role could add rows under another role's
-- fit_id (foreign keys do not see row-level security) and make that fit's own writes fail
-- on the primary key.
DO $rls_fit_owner$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['fit_configs', 'units', 'model_states'] LOOP
        EXECUTE format('ALTER POLICY own_rows ON @extschema@.%1$I USING (owner = current_user) '
                       'WITH CHECK (owner = current_user AND EXISTS ('
                       'SELECT 1 FROM @extschema@.fits f WHERE f.fit_id = %1$I.fit_id '
                       'AND f.owner = current_user))', t);
    END LOOP;
END
$rls_fit_owner$;
