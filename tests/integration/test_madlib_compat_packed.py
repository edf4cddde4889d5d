"""MADlib compatibility: tables packed by MADlib's own training_preprocessor_dl (written
here exactly as MADlib 2.x on PostgreSQL and MADlib 1.x write them) train, evaluate,
validate and predict."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ..helpers import mlp_json, q
from .madlib_compat import COMPILE, FIT, make_iris

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db
CLASSES = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]


def madlib_buffers(conn, source, buffer_size):
    """MADlib on PostgreSQL: rows shuffled, row_id / buffer_size is the buffer, features
    float32 (array_to_bytea of REAL[]), labels one-hot SMALLINT."""
    rows = q(conn, f"SELECT attributes::real[], class_text FROM {source} ORDER BY id")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(rows))
    out = []
    for b, lo in enumerate(range(0, len(rows), buffer_size)):
        idx = order[lo:lo + buffer_size]
        x = np.array([rows[i][0] for i in idx], dtype="<f4")
        y = np.zeros((len(idx), 3), dtype="<i2")
        y[np.arange(len(idx)), [CLASSES.index(rows[i][1]) for i in idx]] = 1
        out.append((b, x, y))
    return out


def write_madlib2(conn, source, name, buffer_size):
    q(conn, f"DROP TABLE IF EXISTS {name}, {name}_summary")
    q(conn, f"CREATE TABLE {name} (attributes bytea, class_text bytea, "
            "attributes_shape integer[], class_text_shape integer[], buffer_id integer)")
    for b, x, y in madlib_buffers(conn, source, buffer_size):
        q(conn, f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s)",
          (x.tobytes(), y.tobytes(), list(x.shape), list(y.shape), b))
    q(conn, f"""CREATE TABLE {name}_summary AS SELECT
        $__madlib__${source}$__madlib__$::TEXT AS source_table,
        $__madlib__${name}$__madlib__$::TEXT AS output_table,
        ARRAY['class_text'] AS dependent_varname,
        ARRAY['attributes'] AS independent_varname,
        ARRAY['character varying'] AS dependent_vartype,
        ARRAY['Iris-setosa','Iris-versicolor','Iris-virginica']::character varying[]
            AS class_text_class_values,
        {buffer_size} AS buffer_size,
        1.0::REAL AS normalizing_const,
        ARRAY[3]::INTEGER[] AS num_classes,
        $__madlib__$all_segments$__madlib__$ AS distribution_rules,
        $__madlib__$all_segments$__madlib__$ AS __internal_gpu_config__""")


def write_madlib1(conn, source, name, buffer_size):
    q(conn, f"DROP TABLE IF EXISTS {name}, {name}_summary")
    q(conn, f"CREATE TABLE {name} (independent_var bytea, dependent_var bytea, "
            "independent_var_shape smallint[], dependent_var_shape smallint[], "
            "buffer_id smallint)")
    for b, x, y in madlib_buffers(conn, source, buffer_size):
        q(conn, f"INSERT INTO {name} VALUES (%s, %s, %s, %s, %s)",
          (x.tobytes(), y.tobytes(), list(x.shape), list(y.shape), b))
    q(conn, f"""CREATE TABLE {name}_summary AS SELECT
        $__madlib__${source}$__madlib__$::TEXT AS source_table,
        $__madlib__${name}$__madlib__$::TEXT AS output_table,
        $__madlib__$class_text$__madlib__$::TEXT AS dependent_varname,
        $__madlib__$attributes$__madlib__$::TEXT AS independent_varname,
        $__madlib__$character varying$__madlib__$::TEXT AS dependent_vartype,
        ARRAY['Iris-setosa','Iris-versicolor','Iris-virginica']::character varying[]
            AS class_values,
        {buffer_size} AS buffer_size,
        1.0::REAL AS normalizing_const,
        3 AS num_classes,
        $__madlib__$all_segments$__madlib__$ AS distribution_rules,
        $__madlib__$all_segments$__madlib__$ AS __internal_gpu_config__""")


@pytest.fixture(scope="module")
def madlib_packed(session_conn):
    conn = session_conn
    make_iris(conn, "mp_iris")
    make_iris(conn, "mp_iris_val", rows=30, offset=200)
    write_madlib2(conn, "mp_iris", "mp2", 20)
    write_madlib2(conn, "mp_iris_val", "mp2_val", 10)
    write_madlib1(conn, "mp_iris", "mp1", 15)
    q(conn, "DROP TABLE IF EXISTS mp_arch, mp_mst, mp_mst_summary")
    q(conn, "SELECT load_keras_model('mp_arch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('mp_arch', 'mp_mst', ARRAY[1], %s, %s)",
      ([COMPILE], [FIT]))
    return conn


def test_fit_multiple_on_madlib2_table_with_madlib_validation(madlib_packed, tables):
    conn = madlib_packed
    tables += ["mp_out", "mp_out_info", "mp_pred", "mp_ev"]
    q(conn, "SET cerebro_db.num_partitions = 2")
    try:
        q(conn, "SELECT madlib_keras_fit_multiple_model('mp2', 'mp_out', 'mp_mst', 2, FALSE, "
                "'mp2_val', 1)")
    finally:
        q(conn, "RESET cerebro_db.num_partitions")
    (tl, vl), = q(conn, "SELECT training_loss, validation_loss FROM mp_out_info")
    assert all(math.isfinite(v) for v in tl + vl)
    (n,), = q(conn, "SELECT count(DISTINCT partition) FROM units u JOIN fits f USING (fit_id) "
                    "WHERE f.model_output_table = 'mp_out'")
    assert n == 2  # three MADlib buffers over two partitions (buffer_id % 2)
    summ = q(conn, "SELECT dependent_varname, independent_varname, class_text_class_values, "
                   "num_classes, dependent_vartype, normalizing_const, num_partitions "
                   "FROM mp_out_summary")
    assert summ == [(["class_text"], ["attributes"], CLASSES, [3], ["character varying"], 1.0,
                     2)]
    q(conn, "SELECT madlib_keras_predict('mp_out', 'mp_iris', 'id', 'attributes', 'mp_pred', "
            "'response', NULL, 1)")
    assert {r[0] for r in q(conn, "SELECT class_name FROM mp_pred")} == {"class_text"}
    assert {r[0] for r in q(conn, "SELECT class_value FROM mp_pred")} <= set(CLASSES)
    assert q(conn, "SELECT count(*) FROM mp_pred") == [(60,)]
    q(conn, "SELECT madlib_keras_evaluate('mp_out', 'mp2_val', 'mp_ev', NULL, 1)")
    (loss,), = q(conn, "SELECT loss FROM mp_ev")
    assert math.isclose(loss, vl[-1], rel_tol=1e-4)


def test_fit_on_madlib1_table_and_our_validation_of_it(madlib_packed, tables):
    conn = madlib_packed
    tables += ["mp1_model", "mp1_v", "mp_pred1"]
    q(conn, "DROP TABLE IF EXISTS mp1_v, mp1_v_summary")
    q(conn, "SELECT validation_preprocessor_dl('mp_iris_val', 'mp1_v', 'class_text', "
            "'attributes', 'mp1')")
    (cv, kind), = q(conn, "SELECT class_text_class_values, dependent_kind FROM mp1_v_summary")
    assert cv == CLASSES and kind == ["class"]
    q(conn, "SELECT madlib_keras_fit('mp1', 'mp1_model', 'mp_arch', 1, %s, %s, 2, FALSE, "
            "'mp1_v', 1)", (COMPILE, FIT))
    (vl, dv, cv), = q(conn, "SELECT validation_loss, dependent_varname, class_text_class_values "
                            "FROM mp1_model_summary")
    assert len(vl) == 2 and all(math.isfinite(v) for v in vl)
    assert dv == ["class_text"] and cv == CLASSES
    q(conn, "SELECT madlib_keras_predict('mp1_model', 'mp_iris', 'id', 'attributes', "
            "'mp_pred1', 'response')")
    assert q(conn, "SELECT count(*) FROM mp_pred1 WHERE class_value = ANY(%s)",
             (CLASSES,)) == [(60,)]


def test_madlib_array_buffers_refused(madlib_packed, tables):
    """MADlib before 1.17 packed REAL[] arrays, not BYTEA: refused with a hint."""
    conn = madlib_packed
    tables += ["mp0"]
    q(conn, "DROP TABLE IF EXISTS mp0, mp0_summary")
    q(conn, "CREATE TABLE mp0 (independent_var real[], dependent_var integer[], "
            "buffer_id smallint)")
    q(conn, "CREATE TABLE mp0_summary AS SELECT * FROM mp1_summary")
    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT madlib_keras_fit_multiple_model('mp0', 'mp0_out', 'mp_mst', 1)")
    assert e.value.pgcode == "0A000" and "1.17" in e.value.pgerror
