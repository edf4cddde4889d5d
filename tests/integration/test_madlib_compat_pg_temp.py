"""MADlib compatibility: outputs in ``pg_temp`` for fit, fit_multiple_model, evaluate and
predict (the calling session writes the outputs; they vanish with it)."""
from __future__ import annotations

import math

import pytest

from ..helpers import mlp_json, q
from .madlib_compat import COMPILE, FIT, make_iris

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


@pytest.fixture(scope="module")
def packed(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS pt_train_p, pt_train_p_summary, pt_arch, pt_mst, "
            "pt_mst_summary")
    make_iris(conn, "pt_train")
    q(conn, "SELECT training_preprocessor_dl('pt_train', 'pt_train_p', 'class_text', "
            "'attributes', NULL, 1.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT load_keras_model('pt_arch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('pt_arch', 'pt_mst', ARRAY[1], %s, %s)",
      ([COMPILE], [FIT]))
    yield conn
    for t in ("pt_multi", "pt_multi_summary", "pt_multi_info", "pt_model", "pt_model_summary",
              "pt_eval", "pt_pred", "pt_pred2"):
        q(conn, f"DROP TABLE IF EXISTS pg_temp.{t}")


def temp_schema(conn, name):
    (ns,), = q(conn, "SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n "
                     "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
               (f"pg_temp.{name}",))
    return ns


def test_fit_multiple_model_into_pg_temp(packed):
    conn = packed
    q(conn, "SELECT madlib_keras_fit_multiple_model('pt_train_p', 'pg_temp.pt_multi', "
            "'pt_mst', 1)")
    for t in ("pt_multi", "pt_multi_summary", "pt_multi_info"):
        assert temp_schema(conn, t).startswith("pg_temp_")
    (loss,), = q(conn, "SELECT training_loss_final FROM pg_temp.pt_multi_info")
    assert math.isfinite(loss)
    (model,), = q(conn, "SELECT model FROM pg_temp.pt_multi_summary")
    assert model == "pg_temp.pt_multi"


def test_fit_evaluate_predict_into_pg_temp(packed):
    conn = packed
    q(conn, "SELECT madlib_keras_fit('pt_train_p', 'pg_temp.pt_model', 'pt_arch', 1, %s, %s, "
            "1)", (COMPILE, FIT))
    assert temp_schema(conn, "pt_model").startswith("pg_temp_")
    assert temp_schema(conn, "pt_model_summary").startswith("pg_temp_")
    q(conn, "SELECT madlib_keras_evaluate('pg_temp.pt_model', 'pt_train_p', 'pg_temp.pt_eval')")
    (loss, metrics_type), = q(conn, "SELECT loss, metrics_type FROM pg_temp.pt_eval")
    assert math.isfinite(loss) and metrics_type == ["accuracy"]
    q(conn, "SELECT madlib_keras_predict('pg_temp.pt_model', 'pt_train', 'id', 'attributes', "
            "'pg_temp.pt_pred', 'response')")
    (n, k), = q(conn, "SELECT count(*), count(DISTINCT id) FROM pg_temp.pt_pred")
    assert n == k == 60
    q(conn, "SELECT madlib_keras_predict('pg_temp.pt_multi', 'pt_train', 'id', 'attributes', "
            "'pg_temp.pt_pred2', 'response', NULL, 1)")
    (n,), = q(conn, "SELECT count(*) FROM pg_temp.pt_pred2")
    assert n == 60


def test_pg_temp_output_needs_temporary_privilege(packed):
    conn = packed
    q(conn, "DROP ROLE IF EXISTS pt_no_temp")
    q(conn, "CREATE ROLE pt_no_temp")
    db = conn.get_dsn_parameters()["dbname"]
    q(conn, f'REVOKE TEMPORARY ON DATABASE "{db}" FROM PUBLIC')
    try:
        q(conn, "GRANT SELECT ON pt_train, pg_temp.pt_model, pg_temp.pt_model_summary "
                "TO pt_no_temp")
        q(conn, "SET ROLE pt_no_temp")
        with pytest.raises(psycopg2.Error) as e:
            q(conn, "SELECT madlib_keras_predict('pg_temp.pt_model', 'pt_train', 'id', "
                    "'attributes', 'pg_temp.pt_pred3', 'response')")
        assert e.value.pgcode == "42501"
        assert "temporary" in e.value.pgerror
    finally:
        q(conn, "RESET ROLE")
        q(conn, f'GRANT TEMPORARY ON DATABASE "{db}" TO PUBLIC')
        q(conn, "DROP OWNED BY pt_no_temp")
        q(conn, "DROP ROLE pt_no_temp")


def test_temporary_packed_source_refused_before_work(packed):
    conn = packed
    q(conn, "DROP TABLE IF EXISTS pg_temp.pt_tmp_p, pg_temp.pt_tmp_p_summary")
    q(conn, "CREATE TEMP TABLE pt_tmp_p AS SELECT * FROM pt_train_p")
    q(conn, "CREATE TEMP TABLE pt_tmp_p_summary AS SELECT * FROM pt_train_p_summary")
    try:
        with pytest.raises(psycopg2.Error) as e:
            q(conn, "SELECT madlib_keras_fit_multiple_model('pg_temp.pt_tmp_p', "
                    "'pg_temp.pt_out9', 'pt_mst', 1)")
        assert e.value.pgcode == "0A000" and "temporary" in e.value.pgerror
        with pytest.raises(psycopg2.Error) as e:
            q(conn, "SELECT madlib_keras_fit('pt_train_p', 'pt_m9', 'pt_arch', 1, %s, %s, 1, "
                    "FALSE, 'pt_tmp_p')", (COMPILE, FIT))
        assert e.value.pgcode == "0A000" and "validation_table" in e.value.pgerror
        (n,), = q(conn, "SELECT count(*) FROM pg_class WHERE relname IN ('pt_out9', 'pt_m9')")
        assert n == 0
    finally:
        q(conn, "DROP TABLE IF EXISTS pg_temp.pt_tmp_p, pg_temp.pt_tmp_p_summary")
