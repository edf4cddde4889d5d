-- Limits the DBA sets on the worker sessions a role may open: a table, not settings, because
-- any role can SET a custom setting (or pass it at connection start) but only the
-- extension's owner (or whom it grants UPDATE) can change a row here. A row with role_name
-- NULL applies to every role; a row naming a role overrides it for that role. Without a
-- row the defaults of cerebro_db/entrypoints/training.py apply (see README, Security).
CREATE TABLE @extschema@.limits (
    setting   text NOT NULL CHECK (setting IN ('max_workers_per_fit', 'max_workers_per_role')),
    role_name name,
    value     integer NOT NULL CHECK (value >= 1),
    UNIQUE NULLS NOT DISTINCT (setting, role_name)
);
GRANT SELECT ON @extschema@.limits TO PUBLIC;
