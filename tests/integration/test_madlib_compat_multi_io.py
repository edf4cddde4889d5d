"""MADlib compatibility: models with several inputs and outputs (MADlib 2.x packs them as
comma lists of independent_varname / dependent_varname) train with fit_multiple_model and
fit, and evaluate; per-output metrics and losses are reported."""
from __future__ import annotations

import math

import pytest

from ..helpers import q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']"
FIT = "batch_size=8, epochs=1"


def two_io_json():
    import keras

    a = keras.Input((4,), name="a")
    b = keras.Input((2,), name="b")
    h = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    o1 = keras.layers.Dense(3, activation="softmax", name="species")(h)
    o2 = keras.layers.Dense(2, activation="softmax", name="size")(h)
    return keras.Model([a, b], [o1, o2]).to_json()


@pytest.fixture(scope="module")
def packed(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS mio, mio_val, mio_p, mio_p_summary, mio_v, mio_v_summary, "
            "mio_arch, mio_mst, mio_mst_summary")
    for t, lo, hi in (("mio", 1, 80), ("mio_val", 81, 120)):
        q(conn, f"""CREATE TABLE {t} AS SELECT i AS id,
                      ARRAY[4 + i % 3, 3 + i % 2, 1 + i % 5, 0.2 * (i % 4)]::real[] AS attrs,
                      ARRAY[i % 2, (i + 1) % 2]::real[] AS extra,
                      (ARRAY['setosa', 'versicolor', 'virginica'])[i % 3 + 1] AS species,
                      (i % 2 = 0) AS big
                    FROM generate_series({lo}, {hi}) i""")
    q(conn, "SELECT training_preprocessor_dl('mio', 'mio_p', 'species, big', 'attrs, extra', "
            "NULL, 1.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('mio_val', 'mio_v', 'species, big', "
            "'attrs, extra', 'mio_p')")
    q(conn, "SELECT load_keras_model('mio_arch', %s)", (two_io_json(),))
    q(conn, "SELECT load_model_selection_table('mio_arch', 'mio_mst', ARRAY[1], %s, %s)",
      ([COMPILE, COMPILE.replace("0.01", "0.001")], [FIT]))
    return conn


def test_fit_multiple_model_two_inputs_two_outputs(packed, tables):
    conn = packed
    tables += ["mio_out", "mio_out_info", "mio_ev"]
    q(conn, "SELECT madlib_keras_fit_multiple_model('mio_p', 'mio_out', 'mio_mst', 2, FALSE, "
            "'mio_v', 1)")
    rows = q(conn, "SELECT metrics_type, training_loss, training_metrics, validation_loss, "
                   "training_metrics_all, validation_metrics_all FROM mio_out_info "
                   "ORDER BY mst_key")
    assert len(rows) == 2
    for mt, tl, tm, vl, tall, vall in rows:
        assert mt == ["accuracy"]
        assert len(tl) == len(vl) == 2 and all(math.isfinite(v) for v in tl + tm + vl)
        # per epoch: each output's accuracy, then each output's loss
        assert [len(e) for e in tall] == [4, 4] and [len(e) for e in vall] == [4, 4]
        assert tm == [e[0] for e in tall] and all(0 <= e[0] <= 1 and 0 <= e[1] <= 1
                                                  for e in tall)
        # the total loss is the sum of the outputs' losses
        assert math.isclose(tl[-1], tall[-1][2] + tall[-1][3], rel_tol=1e-3)
    summ = q(conn, "SELECT dependent_varname, independent_varname FROM mio_out_summary")
    assert summ == [(["species", "big"], ["attrs", "extra"])]
    q(conn, "SELECT madlib_keras_evaluate('mio_out', 'mio_v', 'mio_ev', NULL, 1)")
    (loss, metric, metrics), = q(conn, "SELECT loss, metric, metrics FROM mio_ev")
    (vl, vall), = q(conn, "SELECT validation_loss, validation_metrics_all FROM mio_out_info "
                          "WHERE mst_key = 1")
    assert math.isclose(loss, vl[-1], rel_tol=1e-4) and len(metrics) == 4
    assert math.isclose(metric, vall[-1][0], rel_tol=1e-4)
    # prediction: MADlib's long format, one block of rows per output
    tables += ["mio_pred", "mio_prob"]
    q(conn, "SELECT madlib_keras_predict('mio_out', 'mio', 'id', 'attrs, extra', 'mio_pred', "
            "'response', NULL, 1)")
    got = q(conn, "SELECT class_name, count(*), count(DISTINCT id) FROM mio_pred "
                  "GROUP BY 1 ORDER BY 1")
    assert got == [("big", 80, 80), ("species", 80, 80)]
    vals = {r[0] for r in q(conn, "SELECT class_value FROM mio_pred WHERE class_name = 'big'")}
    assert vals <= {"False", "True"}
    vals = {r[0] for r in q(conn, "SELECT class_value FROM mio_pred "
                                  "WHERE class_name = 'species'")}
    assert vals <= {"setosa", "versicolor", "virginica"}
    q(conn, "SELECT madlib_keras_predict('mio_out', 'mio', 'id', 'attrs, extra', 'mio_prob', "
            "'prob', NULL, 1)")
    sums = q(conn, "SELECT class_name, count(*), round(sum(prob)::numeric, 3), max(rank) "
                   "FROM mio_prob GROUP BY 1 ORDER BY 1")
    assert sums == [("big", 160, 80, 2), ("species", 240, 80, 3)]
    # BYOM with the same weights: MADlib's dependent_count and 2-D class_values
    tables += ["mio_byom", "mio_bpred"]
    q(conn, "DROP TABLE IF EXISTS mio_byom")
    q(conn, "SELECT load_keras_model('mio_byom', (SELECT model_arch FROM mio_out WHERE "
            "mst_key = 1), (SELECT model_weights FROM mio_out WHERE mst_key = 1))")
    q(conn, "SELECT madlib_keras_predict_byom('mio_byom', 1, 'mio', 'id', 'attrs, extra', "
            "'mio_bpred', 'response', NULL, ARRAY[['setosa', 'versicolor', 'virginica'], "
            "['False', 'True', NULL]], 1.0, 2)")
    same = q(conn, "SELECT count(*) FROM mio_bpred b JOIN mio_pred p ON p.id = b.id AND "
                   "p.class_value = b.class_value AND p.class_name = CASE b.class_name WHEN "
                   "'dependent_var_0' THEN 'species' ELSE 'big' END")
    assert same == [(160,)]


def test_fit_two_inputs_two_outputs(packed, tables):
    conn = packed
    tables += ["mio_m"]
    q(conn, "SELECT madlib_keras_fit('mio_p', 'mio_m', 'mio_arch', 1, %s, %s, 2)",
      (COMPILE, FIT))
    (tl, tm, mt), = q(conn, "SELECT training_loss, training_metrics, metrics_type "
                            "FROM mio_m_summary")
    assert len(tl) == 1 and math.isfinite(tl[0]) and 0 <= tm[0] <= 1 and mt == ["accuracy"]


def test_a_metric_object_applies_to_every_output(packed, tables):
    """A flat metrics list naming a function of the object table (here MADlib's top k
    accuracy) applies to every output, as a named one does: each output gets its own
    metric object (they keep state), where Keras 3 refused one list for two outputs."""
    conn = packed
    tables += ["mio_cf", "mio_mk"]
    q(conn, "DROP TABLE IF EXISTS mio_cf")
    q(conn, "SELECT load_top_k_accuracy_function('mio_cf', 2)")
    q(conn, "SELECT madlib_keras_fit('mio_p', 'mio_mk', 'mio_arch', 1, %s, %s, 1, "
            "object_table => 'mio_cf')",
      (COMPILE.replace("'accuracy'", "'top_2_accuracy'"), FIT))
    (tl, tm, mt), = q(conn, "SELECT training_loss, training_metrics, metrics_type "
                            "FROM mio_mk_summary")
    assert mt == ["top_2_accuracy"] and len(tm) == 1 and 0 <= tm[0] <= 1, (tm, mt)
    assert math.isfinite(tl[0])


def test_model_and_data_must_agree_before_work(packed, tables):
    conn = packed
    import keras

    one = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    q(conn, "DROP TABLE IF EXISTS mio_arch1, mio_mst1, mio_mst1_summary")
    tables += ["mio_arch1", "mio_mst1"]
    q(conn, "SELECT load_keras_model('mio_arch1', %s)", (one.to_json(),))
    q(conn, "SELECT load_model_selection_table('mio_arch1', 'mio_mst1', ARRAY[1], %s, %s)",
      ([COMPILE], [FIT]))
    with pytest.raises(psycopg2.Error) as e:
        q(conn, "SELECT madlib_keras_fit_multiple_model('mio_p', 'mio_bad', 'mio_mst1', 1)")
    assert e.value.pgcode == "42804" and "2 independent" in e.value.pgerror
    assert q(conn, "SELECT to_regclass('mio_bad')") == [(None,)]
