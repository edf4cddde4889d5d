"""Shared set-up of the MADlib compatibility tests: a database with the extension in schema
``madlib`` (scripts call ``madlib.<function>``) and a small iris-like table packed as MADlib
users pack it."""
from __future__ import annotations

import pytest

from ..helpers import connect, create_database, drop_database, mlp_json, q

IRIS_ROWS = """INSERT INTO iris (attributes, class_text)
    SELECT ARRAY[4 + i % 3 + (i % 7) * 0.1, 3 + i % 2, 1 + i % 5, 0.2 * (i % 4)],
           (ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica'])[i % 3 + 1]
      FROM generate_series(1, 60) i"""


@pytest.fixture(scope="module")
def madlib_conn():
    """A fresh database with the extension in schema madlib and the iris tables packed over
    two partitions (``iris``, ``iris_packed``, ``iris_val``, ``model_arch_library``)."""
    db = create_database(schema="madlib")
    c = connect(db)
    c.autocommit = True
    q(c, "SET client_min_messages = warning")
    q(c, "CREATE TABLE iris (id serial, attributes numeric[], class_text varchar)")
    q(c, IRIS_ROWS)
    q(c, "SELECT madlib.training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
         "'attributes', NULL, 1.0, NULL, NULL, 2, 7)")
    q(c, "SELECT madlib.validation_preprocessor_dl('iris', 'iris_val', 'class_text', "
         "'attributes', 'iris_packed')")
    q(c, "SELECT madlib.load_keras_model('model_arch_library', %s, NULL, 'Sophie', 'MLP')",
      (mlp_json(10, inputs=4, outputs=3),))
    try:
        yield c
    finally:
        c.close()
        drop_database(db)
