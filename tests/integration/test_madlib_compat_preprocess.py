"""MADlib compatibility of the preprocessor's edge cases: MADlib's buffer layout, a table
with fewer rows than partitions (empty partitions train and evaluate nothing), NULL class
first, scalar numeric labels one-hot encoded (regression only when asked for)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ..helpers import mlp_json, q
from .madlib_compat import COMPILE, FIT

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def shapes(conn, table, col):
    return q(conn, f"SELECT __dist_key__, ({col}_shape)[1] FROM {table} ORDER BY buffer_id")


@pytest.fixture
def rows17(conn, tables):
    tables += ["mc17", "mc17_p", "mc17_p3"]
    q(conn, "DROP TABLE IF EXISTS mc17")
    q(conn, "CREATE TABLE mc17 AS SELECT i AS id, ARRAY[i, i * 2]::float8[] AS x, "
            "(ARRAY['a', 'b'])[i % 2 + 1] AS y, (i % 3) * 0.5 AS d, "
            "CASE WHEN i % 5 = 0 THEN NULL ELSE (ARRAY['b', 'a'])[i % 2 + 1] END AS yn "
            "FROM generate_series(1, 17) i")
    return conn


def test_buffer_layout_as_madlib(rows17):
    conn = rows17
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_p', 'y', 'x', 5, 1.0, NULL, NULL, "
            "2, 1)")
    assert shapes(conn, "mc17_p", "x") == [(0, 5), (1, 5), (0, 5), (1, 2)]
    assert q(conn, "SELECT buffer_size FROM mc17_p_summary") == [(5,)]
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_p3', 'y', 'x', 5, 1.0, NULL, NULL, "
            "3, 1)")
    assert [n for _, n in shapes(conn, "mc17_p3", "x")] == [3, 3, 3, 3, 3, 2]


def test_distribution_rules_are_ignored_as_madlib_does_on_postgresql(rows17, tables):
    """MADlib's iris setup passes a table of segment ids (distribution_rules =>
    'segments_to_use'); MADlib's PostgreSQL path ignores it, and so does this (a notice),
    recording all_segments."""
    conn = rows17
    tables += ["mc_segs", "mc17_ps", "mc17_pg"]
    q(conn, "DROP TABLE IF EXISTS mc_segs")
    q(conn, "CREATE TABLE mc_segs (dbid integer, notes text)")
    conn.notices.clear()
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_ps', 'y', 'x', NULL, 1.0, NULL, "
            "'mc_segs', 2, 1)")
    assert any('distribution_rules table "mc_segs"' in n and "ignored" in n
               for n in conn.notices), conn.notices
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_pg', 'y', 'x', NULL, 1.0, NULL, "
            "'gpu_segments', 2, 1)")
    assert q(conn, "SELECT distribution_rules FROM mc17_ps_summary UNION "
                   "SELECT distribution_rules FROM mc17_pg_summary") == [("all_segments",)]


def test_null_class_first_and_double_labels_one_hot(rows17, tables):
    conn = rows17
    tables += ["mc17_n", "mc17_d", "mc17_r"]
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_n', 'yn', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1)")
    assert q(conn, "SELECT yn_class_values, num_classes FROM mc17_n_summary") == \
        [([None, "a", "b"], [3])]
    (raw, shape), = q(conn, "SELECT yn, yn_shape FROM mc17_n")
    y = np.frombuffer(bytes(raw), "<i2").reshape(shape)
    assert y.shape == (17, 3) and y[:, 0].sum() == 3  # ids 5, 10, 15
    # double precision / numeric labels are classes, one-hot encoded (MADlib)
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_d', 'd', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1)")
    (cv, k, vt, kind), = q(conn, "SELECT d_class_values, num_classes, dependent_vartype, "
                                 "dependent_kind FROM mc17_d_summary")
    assert [float(v) for v in cv] == [0.0, 0.5, 1.0] and k == [3]
    assert vt == ["numeric"] and kind == ["class"]
    (shape,), = q(conn, "SELECT d_shape FROM mc17_d")
    assert shape == [17, 3]
    # regression is the explicit choice
    q(conn, "SELECT training_preprocessor_dl('mc17', 'mc17_r', 'd', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1, regression_targets => 'd')")
    (kind, k), = q(conn, "SELECT dependent_kind, num_classes FROM mc17_r_summary")
    assert kind == ["regression"] and k == [None]
    (raw, shape), = q(conn, "SELECT d, d_shape FROM mc17_r")
    assert shape == [17, 1] and sorted(set(np.frombuffer(bytes(raw), "<f4"))) == [0, 0.5, 1]


def test_float_array_labels_must_be_one_hot_unless_regression(conn, tables):
    tables += ["mcf", "mcf_p", "mcf_r"]
    q(conn, "DROP TABLE IF EXISTS mcf")
    q(conn, "CREATE TABLE mcf AS SELECT ARRAY[i, 1]::real[] AS x, "
            "ARRAY[i % 2, 1 - i % 2]::float8[] AS oh, ARRAY[i * 0.1]::float8[] AS t "
            "FROM generate_series(1, 6) i")
    q(conn, "SELECT training_preprocessor_dl('mcf', 'mcf_p', 'oh', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1)")
    assert q(conn, "SELECT dependent_kind, num_classes FROM mcf_p_summary") == \
        [(["one_hot"], [2])]
    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT training_preprocessor_dl('mcf', 'mcf_r', 't', 'x', NULL, 1.0, NULL, "
                "NULL, 1, 1)")
    assert e.value.pgcode == "42804" and "regression_targets" in e.value.pgerror
    q(conn, "SELECT training_preprocessor_dl('mcf', 'mcf_r', 't', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1, regression_targets => 't')")
    assert q(conn, "SELECT dependent_kind FROM mcf_r_summary") == [(["regression"],)]


def test_one_hot_labels_predict_classes_by_index(conn, tables):
    """An outside pass: labels packed from a one-hot array (no class values, a class count)
    were predicted as a regression's outputs, every class a row with class_value NULL
    whatever pred_type. Their classes are 0 .. count-1, as in MADlib."""
    tables += ["moh", "moh_p", "moh_arch", "moh_m", "moh_m_summary", "moh_resp", "moh_top",
               "moh_prob"]
    q(conn, "DROP TABLE IF EXISTS moh, moh_p, moh_p_summary")
    q(conn, "CREATE TABLE moh AS SELECT i AS id, ARRAY[i % 3, 1]::real[] AS x, "
            "(CASE i % 3 WHEN 0 THEN '{1,0,0}' WHEN 1 THEN '{0,1,0}' ELSE '{0,0,1}' END)"
            "::int[] AS oh FROM generate_series(1, 30) i")
    q(conn, "SELECT training_preprocessor_dl('moh', 'moh_p', 'oh', 'x', NULL, 1.0, NULL, "
            "NULL, 1, 1)")
    q(conn, "SELECT load_keras_model('moh_arch', %s)", (mlp_json(inputs=2, outputs=3),))
    q(conn, "SELECT madlib_keras_fit('moh_p', 'moh_m', 'moh_arch', 1, %s, %s, 1)",
      (COMPILE, FIT))
    q(conn, "SELECT madlib_keras_predict('moh_m', 'moh', 'id', 'x', 'moh_resp', 'response')")
    rows = q(conn, "SELECT id, class_value FROM moh_resp ORDER BY id")
    assert [i for i, _ in rows] == list(range(1, 31))
    assert {c for _, c in rows} <= {"0", "1", "2"}
    q(conn, "SELECT madlib_keras_predict('moh_m', 'moh', 'id', 'x', 'moh_top', 1)")
    assert q(conn, "SELECT count(*), count(DISTINCT id), min(rank), max(rank) FROM moh_top") \
        == [(30, 30, 1, 1)]
    q(conn, "SELECT madlib_keras_predict('moh_m', 'moh', 'id', 'x', 'moh_prob', 'prob')")
    assert q(conn, "SELECT count(*), array_agg(DISTINCT class_value ORDER BY class_value) "
                   "FROM moh_prob") == [(90, ["0", "1", "2"])]


def test_fewer_rows_than_partitions_pack_train_evaluate(conn, tables):
    """A 3-row table on 4 partitions: partition 3 holds no buffer; fit, fit_multiple_model,
    evaluate and predict run, and the empty partition weighs nothing in the metrics."""
    tables += ["mc3", "mc3_p", "mc3_v", "mc3_arch", "mc3_mst", "mc3_out", "mc3_out_info",
               "mc3_m", "mc3_ev", "mc3_pred"]
    q(conn, "DROP TABLE IF EXISTS mc3, mc3_p, mc3_p_summary, mc3_v, mc3_v_summary")
    q(conn, "CREATE TABLE mc3 AS SELECT i AS id, ARRAY[i, 1, 0, 2]::real[] AS attributes, "
            "(ARRAY['x', 'y', 'z'])[i] AS class_text FROM generate_series(1, 3) i")
    q(conn, "SELECT training_preprocessor_dl('mc3', 'mc3_p', 'class_text', 'attributes', "
            "NULL, 1.0, NULL, NULL, 4, 1)")
    assert sorted(k for k, _ in shapes(conn, "mc3_p", "attributes")) == [0, 1, 2]
    q(conn, "SELECT validation_preprocessor_dl('mc3', 'mc3_v', 'class_text', 'attributes', "
            "'mc3_p')")
    q(conn, "SELECT load_keras_model('mc3_arch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('mc3_arch', 'mc3_mst', ARRAY[1], %s, %s)",
      ([COMPILE], [FIT]))
    tables += ["mc3_mst_summary", "mc3_out_summary", "mc3_m_summary"]
    q(conn, "SELECT madlib_keras_fit_multiple_model('mc3_p', 'mc3_out', 'mc3_mst', 2, FALSE, "
            "'mc3_v', 1)")
    (tl, vl, tm), = q(conn, "SELECT training_loss, validation_loss, training_metrics "
                            "FROM mc3_out_info")
    assert len(tl) == 2 and all(math.isfinite(v) for v in tl + vl + tm)
    (units,), = q(conn, "SELECT count(*) FROM units u JOIN fits f USING (fit_id) WHERE "
                        "f.model_output_table = 'mc3_out' AND u.partition = 3 AND u.rows = 0")
    assert units >= 2  # the empty partition's units ran (and trained nothing)
    q(conn, "SELECT madlib_keras_fit('mc3_p', 'mc3_m', 'mc3_arch', 1, %s, %s, 2)",
      (COMPILE, FIT))
    (loss,), = q(conn, "SELECT training_loss_final FROM mc3_m_summary")
    assert math.isfinite(loss)
    q(conn, "SELECT madlib_keras_evaluate('mc3_m', 'mc3_v', 'mc3_ev')")
    (loss,), = q(conn, "SELECT loss FROM mc3_ev")
    assert math.isfinite(loss)
    q(conn, "SELECT madlib_keras_predict('mc3_m', 'mc3', 'id', 'attributes', 'mc3_pred', "
            "'response')")
    assert q(conn, "SELECT count(*) FROM mc3_pred") == [(3,)]
