-- 0.2.0 records itself; the function cerebro_db_version() is new in this version.
INSERT INTO @extschema@.installed_versions (version) VALUES ('0.2.0');
