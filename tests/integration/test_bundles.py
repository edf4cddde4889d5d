"""Evaluation bundles on the real server: a worker session's statement carries several
evaluation units (``cerebro_db.eval_bundle``, default 4), seen in the statements the
workers run, and the fit's models, losses and metrics equal those of one unit per
statement; a bad setting is refused before any work."""
from __future__ import annotations

import json
import threading

import pytest

from ..helpers import connect, error_of, load_mnist_rows, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILES = [
    "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']",
    "loss='categorical_crossentropy', optimizer='SGD(lr=0.1, momentum=0.9)', metrics=['accuracy']",
]
FITS = ["batch_size=32", "batch_size=64"]


@pytest.fixture(scope="module")
def eb(session_conn):
    """600 training and 200 validation rows over 2 partitions; 4 configs."""
    conn = session_conn
    load_mnist_rows(conn, ("eb_train", 0, 600), ("eb_test", 600, 800))
    q(conn, "DROP TABLE IF EXISTS eb_p, eb_p_summary, eb_v, eb_v_summary, eb_arch, eb_mst, "
            "eb_mst_summary")
    q(conn, "SELECT training_preprocessor_dl('eb_train', 'eb_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, 2, 3)")
    q(conn, "SELECT validation_preprocessor_dl('eb_test', 'eb_v', 'y', 'x', 'eb_p')")
    q(conn, "SELECT load_keras_model('eb_arch', %s)", (mlp_json(8),))
    q(conn, "SELECT load_model_selection_table('eb_arch', 'eb_mst', ARRAY[1], %s, %s)",
      (COMPILES, FITS))
    yield conn
    q(conn, "RESET cerebro_db.eval_bundle")
    q(conn, "RESET cerebro_db.test_hook")


def fit(conn, out: str) -> list[tuple]:
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('eb_p', %s, 'eb_mst', 3, FALSE, 'eb_v', 1, "
            "FALSE, NULL, NULL, TRUE, 'mop', NULL, 11)", (out,))
    return q(conn, f"SELECT mst_key, training_loss, training_metrics, validation_loss, "
                   f"validation_metrics FROM {out}_info ORDER BY mst_key")


def watch(dbname: str, stop: threading.Event, seen: list[int]) -> None:
    """Count, while a fit runs, the worker statements seen carrying a bundle."""
    c = connect(dbname, autocommit=True)
    try:
        while not stop.is_set():
            seen[0] += q(c, "SELECT count(*) FROM pg_stat_activity WHERE application_name "
                            "LIKE 'cerebro_db %% worker %%' AND query LIKE '%%\"then\": [{%%'"
                            )[0][0]
            stop.wait(0.005)
    finally:
        c.close()


def watched_fit(conn, dbname: str, out: str) -> tuple[list[tuple], int]:
    stop, seen = threading.Event(), [0]
    t = threading.Thread(target=watch, args=(dbname, stop, seen))
    t.start()
    try:
        got = fit(conn, out)
    finally:
        stop.set()
        t.join()
    return got, seen[0]


def test_bundled_evaluations_give_what_one_unit_per_statement_gives(eb, dbname):
    """Every evaluation unit sleeps 0.05 s (a test hook), so statements are seen: with the
    default some worker statements carry bundles; with ``eval_bundle = 1`` none do; the
    outputs are equal, bitwise, and every evaluation unit is logged once."""
    q(eb, "SET cerebro_db.test_hook = %s", (json.dumps({"point": "eval", "seconds": 0.05}),))
    try:
        bundled, seen = watched_fit(eb, dbname, "eb_out")
        q(eb, "SET cerebro_db.eval_bundle = 1")
        single, seen1 = watched_fit(eb, dbname, "eb_out1")
    finally:
        q(eb, "RESET cerebro_db.eval_bundle")
        q(eb, "RESET cerebro_db.test_hook")
    assert seen > 0 and seen1 == 0
    assert bundled == single and len(bundled) == 4
    fit_id = q(eb, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                   "'eb_out'")[0][0]
    assert q(eb, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                 "cerebro_db.units WHERE fit_id = %s GROUP BY kind ORDER BY kind",
             (fit_id,)) == [("eval_train", 24, 24), ("eval_valid", 24, 24), ("train", 24, 24)]


@pytest.mark.parametrize("value", ["0", "1001", "two", "1.5", "NaN", "4; DROP TABLE eb_p"])
def test_a_bad_eval_bundle_is_refused_before_any_work(eb, value):
    q(eb, "DROP TABLE IF EXISTS eb_bad, eb_bad_info, eb_bad_summary")
    q(eb, "SET cerebro_db.eval_bundle = %s", (value,))
    try:
        e = error_of(eb, "SELECT madlib_keras_fit_multiple_model('eb_p', 'eb_bad', 'eb_mst', 1)")
    finally:
        q(eb, "RESET cerebro_db.eval_bundle")
    assert e.pgcode == "22023" and "cerebro_db.eval_bundle" in e.pgerror
    assert q(eb, "SELECT to_regclass('eb_bad'), to_regclass('eb_bad_info'), "
                 "to_regclass('eb_p')")[0][:2] == (None, None)
    assert q(eb, "SELECT to_regclass('eb_p') IS NOT NULL") == [(True,)]
