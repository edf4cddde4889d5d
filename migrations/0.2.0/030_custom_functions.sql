-- Custom loss and metric functions are references to Python objects in modules installed in
-- the server's environment (cerebro_db/custom_functions.py), never pickled bytes. Importing a
-- module runs its code, so only the modules listed here may be referenced: a row allows the
-- module and its submodules to members of grantee ('public': every role). Only superusers
-- (and the extension's owner) can change this table; every role can read it.
CREATE TABLE @extschema@.custom_function_modules (
    module     text NOT NULL CHECK (module ~ '^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$'),
    grantee    name NOT NULL DEFAULT 'public',
    granted_by name NOT NULL DEFAULT current_user,
    granted_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (module, grantee)
);
REVOKE ALL ON @extschema@.custom_function_modules FROM PUBLIC;
GRANT SELECT ON @extschema@.custom_function_modules TO PUBLIC;
