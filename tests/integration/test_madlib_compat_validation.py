"""MADlib compatibility: a validation table whose columns are named differently from the
training table's (each packed table's own names come from its summary)."""
from __future__ import annotations

import math

import pytest

from ..helpers import mlp_json, q
from .madlib_compat import COMPILE, FIT, make_iris

pytestmark = pytest.mark.db


@pytest.fixture(scope="module")
def packed(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS vc_train_p, vc_train_p_summary, vc_val_p, vc_val_p_summary, "
            "vc_arch, vc_mst, vc_mst_summary")
    make_iris(conn, "vc_train")
    make_iris(conn, "vc_val", rows=30, label="species", features="measurements", offset=100)
    q(conn, "SELECT training_preprocessor_dl('vc_train', 'vc_train_p', 'class_text', "
            "'attributes', NULL, 1.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('vc_val', 'vc_val_p', 'species', "
            "'measurements', 'vc_train_p')")
    q(conn, "SELECT load_keras_model('vc_arch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('vc_arch', 'vc_mst', ARRAY[1], %s, %s)",
      ([COMPILE], [FIT]))
    return conn


def test_fit_multiple_with_differently_named_validation_columns(packed, tables):
    conn = packed
    tables += ["vc_out", "vc_out_info"]
    q(conn, "SELECT madlib_keras_fit_multiple_model('vc_train_p', 'vc_out', 'vc_mst', 2, "
            "FALSE, 'vc_val_p', 1)")
    (vl, vm, vfinal), = q(conn, "SELECT validation_loss, validation_metrics, "
                                "validation_loss_final FROM vc_out_info")
    assert len(vl) == 2 and len(vm) == 2
    assert all(math.isfinite(v) for v in vl + vm)
    assert vfinal == vl[-1]
    (vt,), = q(conn, "SELECT validation_table FROM vc_out_summary")
    assert vt == "vc_val_p"


def test_fit_with_differently_named_validation_columns(packed, tables):
    conn = packed
    tables += ["vc_model"]
    q(conn, "SELECT madlib_keras_fit('vc_train_p', 'vc_model', 'vc_arch', 1, %s, %s, 2, "
            "FALSE, 'vc_val_p', 1)", (COMPILE, FIT))
    (vl,), = q(conn, "SELECT validation_loss FROM vc_model_summary")
    assert len(vl) == 2 and all(math.isfinite(v) for v in vl)


def test_validation_shape_mismatch_refused_before_work(packed, tables):
    conn = packed
    q(conn, "DROP TABLE IF EXISTS vc_bad, vc_bad_p, vc_bad_p_summary")
    q(conn, "CREATE TABLE vc_bad AS SELECT measurements[1:3] AS m3, species FROM vc_val")
    tables += ["vc_bad", "vc_bad_p", "vc_bad_p2"]
    q(conn, "SELECT training_preprocessor_dl('vc_bad', 'vc_bad_p', 'species', 'm3', NULL, "
            "1.0, NULL, NULL, 2, 1)")
    import psycopg2

    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT madlib_keras_fit_multiple_model('vc_train_p', 'vc_out2', 'vc_mst', 2, "
                "FALSE, 'vc_bad_p', 1)")
    assert e.value.pgcode == "42804"
    assert "3 features" in e.value.pgerror
    (n,), = q(conn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'vc_out2%%'")
    assert n == 0
