-- Every function answers fn('help') and fn() with its usage.
SELECT training_preprocessor_dl('help') = training_preprocessor_dl() AS same,
       left(training_preprocessor_dl(), 60) AS head;
SELECT left(validation_preprocessor_dl('help'), 60) AS head;
SELECT left(load_keras_model('help'), 60) AS head;
SELECT left(delete_keras_model('help'), 60) AS head;
SELECT left(load_model_selection_table('help'), 60) AS head;
SELECT left(generate_model_configs('help'), 60) AS head;
SELECT cerebro_db_version() ~ '^\d+\.\d+\.\d+$' AS has_version;
-- MADlib's version(), schema-qualified as its notebooks call it; plain version() is still
-- PostgreSQL's.
SELECT cerebro_db.version() ~ '^cerebro_db version: \d+\.\d+\.\d+ .*, PostgreSQL 15' AS madlib_style,
       version() ~ '^PostgreSQL 15' AS postgres_own;
