"""use_caching FALSE: worker units read a partition one packed buffer at a time."""
from __future__ import annotations

import pytest

from .mnist_rows import load_mnist_rows

pytestmark = pytest.mark.db


def q(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


@pytest.fixture(scope="module")
def packed(session_conn):
    """1,200 MNIST rows packed twice over 2 partitions: one buffer per partition (st_p1) and
    150-row buffers (st_p4: 4 per partition); 400 validation rows; 2 configs."""
    import keras

    conn = session_conn
    load_mnist_rows(conn, *(("st_train", 0, 1200), ("st_test", 1200, 1600)))
    q(conn, "DROP TABLE IF EXISTS st_p1, st_p1_summary, st_p4, st_p4_summary, st_v1, "
            "st_v1_summary, st_v4, st_v4_summary, st_arch, st_mst, st_mst_summary")
    for suffix, size in (("1", None), ("4", 150)):
        q(conn, f"SELECT training_preprocessor_dl('st_train', 'st_p{suffix}', 'y', 'x', %s, "
                "255.0, NULL, NULL, 2, 3)", (size,))
        q(conn, f"SELECT validation_preprocessor_dl('st_test', 'st_v{suffix}', 'y', 'x', "
                f"'st_p{suffix}', %s)", (size,))
    arch = keras.Sequential([keras.Input((784,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.2),
                             keras.layers.Dense(10, activation="softmax")]).to_json()
    q(conn, "SELECT load_keras_model('st_arch', %s)", (arch,))
    q(conn, "SELECT load_model_selection_table('st_arch', 'st_mst', ARRAY[1], %s, %s)",
      ([("loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
        "metrics=['accuracy']"),
        ("loss='sparse_categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', "
        "metrics=['sparse_categorical_accuracy']")],
       ["batch_size=32, epochs=2"]))
    assert q(conn, "SELECT __dist_key__, count(*) FROM st_p4 GROUP BY 1 ORDER BY 1") == \
        [(0, 4), (1, 4)]
    return conn


def fit(conn, source, validation, out, caching, iterations=2):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model(%s, %s, 'st_mst', %s, FALSE, %s, 1, FALSE, "
            "NULL, NULL, %s, 'mop', NULL, 11)", (source, out, iterations, validation, caching))
    return q(conn, f"SELECT mst_key, training_loss, validation_loss, validation_metrics_final "
                   f"FROM {out}_info ORDER BY 1")


def test_one_buffer_per_partition_streams_to_the_same_models(packed):
    conn = packed
    cached = fit(conn, "st_p1", "st_v1", "st_c", True, iterations=1)
    streamed = fit(conn, "st_p1", "st_v1", "st_s", False, iterations=1)
    assert streamed == cached
    assert q(conn, "SELECT mst_key, model_weights FROM st_s ORDER BY 1") == \
        q(conn, "SELECT mst_key, model_weights FROM st_c ORDER BY 1")


def test_several_buffers_per_partition_train(packed):
    conn = packed
    info = fit(conn, "st_p4", "st_v4", "st_s4", False)
    for _, train_loss, valid_loss, valid_metric in info:
        assert len(train_loss) == 2 and train_loss[-1] < train_loss[0]
        assert valid_loss[-1] < valid_loss[0] and valid_metric > 0.6
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                     "'st_s4'")[0][0]
    per_partition = q(conn, "SELECT DISTINCT partition, rows FROM cerebro_db.units "
                            "WHERE fit_id = %s AND kind = 'train' ORDER BY 1", (fit_id,))
    sizes = q(conn, "SELECT __dist_key__, sum(x_shape[1])::int FROM st_p4 GROUP BY 1 ORDER BY 1")
    assert per_partition == sizes and sum(s for _, s in sizes) == 1200
