-- The versions of cerebro_db this database has run, in order (installs and upgrades).
CREATE TABLE @extschema@.installed_versions (
    version      text PRIMARY KEY,
    installed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO @extschema@.installed_versions (version) VALUES ('0.1.0');
GRANT SELECT ON @extschema@.installed_versions TO PUBLIC;
GRANT USAGE ON SCHEMA @extschema@ TO PUBLIC;
