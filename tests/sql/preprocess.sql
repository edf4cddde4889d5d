-- Data preparation: outputs and pinned errors.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
CREATE TABLE iris_like (id int, features real[], species text, petals int);
INSERT INTO iris_like
SELECT i, ARRAY[i % 7, i % 5, i % 3, 1]::real[],
       (ARRAY['setosa', 'versicolor', 'virginica'])[i % 3 + 1], i % 2
  FROM generate_series(1, 30) i;

SELECT training_preprocessor_dl('iris_like', 'iris_packed', 'species', 'features',
                                NULL, 7.0, NULL, NULL, 2, 1);
SELECT __dist_key__, length(features) AS x_bytes, length(species) AS y_bytes,
       features_shape, species_shape, buffer_id
  FROM iris_packed ORDER BY buffer_id;
SELECT * FROM iris_packed_summary;

-- explicit buffer size: 4 buffers of at most 8 rows over 2 partitions
SELECT training_preprocessor_dl('iris_like', 'iris_b8', 'petals', 'features', 8,
                                1.0, ARRAY[3], 'all_segments', 2, 1);
SELECT __dist_key__, features_shape, petals_shape, buffer_id FROM iris_b8 ORDER BY buffer_id;
SELECT petals_class_values, num_classes, buffer_size FROM iris_b8_summary;

SELECT validation_preprocessor_dl('iris_like', 'iris_val', 'species', 'features',
                                  'iris_packed');
SELECT species_class_values, normalizing_const, num_partitions FROM iris_val_summary;

-- errors: each names the problem, has a SQLSTATE, and leaves nothing behind
SELECT training_preprocessor_dl('no_such_table', 'out1', 'species', 'features');
SELECT training_preprocessor_dl('iris_like', 'out1', 'species', 'no_such_column');
SELECT training_preprocessor_dl('iris_like', 'out1', 'species', 'id');
SELECT training_preprocessor_dl('iris_like', 'iris_packed', 'species', 'features');
SELECT training_preprocessor_dl('iris_like', 'out1; DROP TABLE iris_like', 'species',
                                'features');
SELECT training_preprocessor_dl('iris_like', 'out1', 'species', 'features', -5);
SELECT training_preprocessor_dl('iris_like', 'out1', 'species', 'features', NULL, 1.0,
                                ARRAY[2]);
UPDATE iris_like SET features[2] = 'NaN' WHERE id = 4;
SELECT training_preprocessor_dl('iris_like', 'out1', 'species', 'features');
SELECT validation_preprocessor_dl('iris_like', 'out1', 'species', 'features', 'iris_like');
SELECT count(*) AS leftover_tables FROM pg_class WHERE relname LIKE 'out1%';
SELECT count(*) AS rows_still_there FROM iris_like;
