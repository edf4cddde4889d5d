\set ON_ERROR_STOP on
DROP TABLE IF EXISTS fm_arch, mst_mlp, mst_mlp_summary, mst_cnn, mst_cnn_summary;
\set mlp1 `"$OUTSIDE_PY" "$OUTSIDE_DIR"/archs.py mlp1 2>/dev/null`
\set mlp2 `"$OUTSIDE_PY" "$OUTSIDE_DIR"/archs.py mlp2 2>/dev/null`
\set cnn `"$OUTSIDE_PY" "$OUTSIDE_DIR"/archs.py cnn 2>/dev/null`
SELECT load_keras_model('fm_arch', :'mlp1', NULL, 'mlp1', '784-128-10');
SELECT load_keras_model('fm_arch', :'mlp2', NULL, 'mlp2', '784-256-128-10');
SELECT load_keras_model('fm_arch', :'cnn', NULL, 'cnn', 'conv16-pool-conv32-pool-d64-d10');
SELECT model_id, name FROM fm_arch ORDER BY 1;
SELECT load_model_selection_table('fm_arch', 'mst_mlp', ARRAY[1,2],
  ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', metrics=['accuracy']$$,
        $$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.0001)', metrics=['accuracy']$$],
  ARRAY[$$batch_size=64, epochs=1$$, $$batch_size=256, epochs=1$$]);
SELECT load_model_selection_table('fm_arch', 'mst_cnn', ARRAY[3],
  ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', metrics=['accuracy']$$,
        $$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.0001)', metrics=['accuracy']$$],
  ARRAY[$$batch_size=64, epochs=1$$, $$batch_size=256, epochs=1$$]);
SELECT * FROM mst_mlp ORDER BY 1;
SELECT * FROM mst_cnn ORDER BY 1;
