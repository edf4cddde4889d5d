"""CREATE EXTENSION ... SCHEMA madlib: a script written for MADlib runs unchanged."""
from __future__ import annotations

import pytest

from ..helpers import connect, create_database, drop_database

pytestmark = pytest.mark.db

MADLIB_SCRIPT = [
    "CREATE TABLE iris (id serial, attributes numeric[], class_text varchar)",
    """INSERT INTO iris (attributes, class_text)
       SELECT ARRAY[4 + i % 3, 3 + i % 2, 1 + i % 5, 0.2 * (i % 4)],
              (ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica'])[i % 3 + 1]
         FROM generate_series(1, 60) i""",
    "SELECT madlib.training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes')",
    ("SELECT madlib.validation_preprocessor_dl('iris', 'iris_val', 'class_text', 'attributes',"
    " 'iris_packed')"),
    """SELECT madlib.load_keras_model('model_arch_library', %(arch)s, NULL, 'Sophie', 'MLP')""",
    """SELECT madlib.load_model_selection_table('model_arch_library', 'mst_table', ARRAY[1],
         ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']$$,
               $$loss='categorical_crossentropy', optimizer='Adam(lr=0.001)', metrics=['accuracy']$$],
         ARRAY[$$batch_size=4, epochs=1$$, $$batch_size=8, epochs=1$$])""",
    """SELECT madlib.generate_model_configs('model_arch_library', 'mst_table_auto', ARRAY[1],
         $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [
            {'optimizer': ['Adam'], 'lr': [0.0001, 0.1, 'log']}], 'metrics': ['accuracy']}$$,
         $${'batch_size': [4, 8], 'epochs': [1]}$$, 'random', 5, 42)""",
]

IRIS_ARCH = ('{"class_name": "Sequential", "keras_version": "2.1.6", "config": [{"class_name": '
             '"Dense", "config": {"kernel_initializer": {"class_name": "VarianceScaling", '
             '"config": {"distribution": "uniform", "scale": 1.0, "seed": null, "mode": '
             '"fan_avg"}}, "name": "dense_1", "kernel_constraint": null, "bias_regularizer": '
             'null, "bias_constraint": null, "dtype": "float32", "activation": "relu", '
             '"trainable": true, "kernel_regularizer": null, "bias_initializer": {"class_name": '
             '"Zeros", "config": {}}, "units": 10, "batch_input_shape": [null, 4], '
             '"use_bias": true, "activity_regularizer": null}}, {"class_name": "Dense", '
             '"config": {"kernel_initializer": {"class_name": "VarianceScaling", "config": '
             '{"distribution": "uniform", "scale": 1.0, "seed": null, "mode": "fan_avg"}}, '
             '"name": "dense_2", "kernel_constraint": null, "bias_regularizer": null, '
             '"bias_constraint": null, "activation": "softmax", "trainable": true, '
             '"kernel_regularizer": null, "bias_initializer": {"class_name": "Zeros", '
             '"config": {}}, "units": 3, "use_bias": true, "activity_regularizer": null}}], '
             '"backend": "tensorflow"}')


def test_madlib_prefixed_script_runs_unchanged():
    db = create_database(schema="madlib")
    try:
        c = connect(db)
        c.autocommit = True
        with c.cursor() as cur:
            cur.execute("SET search_path = public")  # only the madlib. prefix finds them
            for stmt in MADLIB_SCRIPT:
                cur.execute(stmt, {"arch": IRIS_ARCH} if "%(arch)s" in stmt else None)
            cur.execute("SELECT class_text_class_values, num_classes FROM iris_packed_summary")
            assert cur.fetchone() == (["Iris-setosa", "Iris-versicolor", "Iris-virginica"], [3])
            cur.execute("SELECT count(*) FROM mst_table")
            assert cur.fetchone()[0] == 4
            cur.execute("SELECT count(*) FROM mst_table_auto")
            assert cur.fetchone()[0] == 5
            cur.execute("SELECT extnamespace::regnamespace::text FROM pg_extension "
                        "WHERE extname = 'cerebro_db'")
            assert cur.fetchone()[0] == "madlib"
        c.close()
    finally:
        drop_database(db)
