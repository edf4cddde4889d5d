\timing on
DROP TABLE IF EXISTS fm_train_packed, fm_train_packed_summary, fm_test_packed, fm_test_packed_summary, fm_train20k_packed, fm_train20k_packed_summary, fm_test20k_packed, fm_test20k_packed_summary;
SELECT training_preprocessor_dl('fm_train', 'fm_train_packed', 'y', 'x');
SELECT validation_preprocessor_dl('fm_test', 'fm_test_packed', 'y', 'x', 'fm_train_packed');
SELECT training_preprocessor_dl('fm_train20k', 'fm_train20k_packed', 'y', 'x');
SELECT validation_preprocessor_dl('fm_test', 'fm_test20k_packed', 'y', 'x', 'fm_train20k_packed');
\timing off
