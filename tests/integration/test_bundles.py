"""Evaluation bundles on the real server: a worker session's statement carries several
evaluation units (``cerebro_db.eval_bundle``, default 4), seen in the statements the
workers run, and the fit's models, losses and metrics equal those of one unit per
statement; a bad setting (this one or ``cerebro_db.pipeline_depth``) is refused before
any work."""
from __future__ import annotations

import json

import pytest

from ..helpers import error_of, q
from .test_pipeline import load_tables, watched_fit

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

BUNDLED = ("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
           "'cerebro_db %% worker %%' AND query LIKE '%%\"then\": [{%%'")
"""Worker statements running a bundle."""


@pytest.fixture(scope="module")
def eb(session_conn):
    conn = session_conn
    load_tables(conn, "eb")
    yield conn
    q(conn, "RESET cerebro_db.eval_bundle")
    q(conn, "RESET cerebro_db.test_hook")


def test_bundled_evaluations_give_what_one_unit_per_statement_gives(eb, dbname):
    """Every evaluation unit sleeps 0.05 s (a test hook), so statements are seen: with the
    default some worker statements carry bundles; with ``eval_bundle = 1`` none do; the
    outputs are equal, bitwise, and every evaluation unit is logged once."""
    q(eb, "SET cerebro_db.test_hook = %s", (json.dumps({"point": "eval", "seconds": 0.05}),))
    try:
        bundled, seen = watched_fit(eb, dbname, "eb_out", BUNDLED, "eb")
        q(eb, "SET cerebro_db.eval_bundle = 1")
        single, seen1 = watched_fit(eb, dbname, "eb_out1", BUNDLED, "eb")
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


@pytest.mark.parametrize("setting", ["cerebro_db.eval_bundle", "cerebro_db.pipeline_depth"])
@pytest.mark.parametrize("value", ["0", "1001", "two", "1.5", "NaN", "4; DROP TABLE eb_p"])
def test_a_bad_units_per_statement_setting_is_refused_before_any_work(eb, setting, value):
    q(eb, "DROP TABLE IF EXISTS eb_bad, eb_bad_info, eb_bad_summary")
    q(eb, "SELECT set_config(%s, %s, false)", (setting, value))
    try:
        e = error_of(eb, "SELECT madlib_keras_fit_multiple_model('eb_p', 'eb_bad', 'eb_mst', 1)")
    finally:
        q(eb, f"RESET {setting}")
    assert e.pgcode == "22023" and setting in e.pgerror and "from 1 to 1000" in e.pgerror
    assert q(eb, "SELECT to_regclass('eb_bad'), to_regclass('eb_bad_info'), "
                 "to_regclass('eb_p') IS NOT NULL") == [(None, None, True)]


@pytest.mark.parametrize("then", ['5', '"x"', '[1]', '[{"mst_key": 1}]',
                                  ('[{"mst_key": "a", "epoch": 1, "partition": 0, '
                                   '"kind": "eval"}]')])
def test_a_malformed_bundle_is_refused_before_any_unit_runs(eb, then):
    """``__run_unit`` (internal, callable like any function of the extension) refuses a
    ``then`` that is not a list of units with a clear error, before it runs anything."""
    e = error_of(eb, "SELECT cerebro_db.__run_unit(987654321, 1, 1, 0, 0, 'eval', %s)",
                 (f'{{"then": {then}}}',))
    assert e.pgcode == "22023" and '"then" must be a list of units' in e.pgerror
