-- training_preprocessor_dl gains a trailing argument, regression_targets (the dependent
-- variables kept as float regression targets; all others are one-hot encoded as in MADlib).
-- The install script creates the new signature; the old one would make calls ambiguous.
DROP FUNCTION IF EXISTS @extschema@.training_preprocessor_dl(VARCHAR, VARCHAR, VARCHAR, VARCHAR,
    INTEGER, REAL, INTEGER[], TEXT, INTEGER, INTEGER);
DROP FUNCTION IF EXISTS @extschema@.__training_preprocessor_dl(VARCHAR, VARCHAR, VARCHAR,
    VARCHAR, INTEGER, REAL, INTEGER[], TEXT, INTEGER, INTEGER);
