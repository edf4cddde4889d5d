"""Work is bounded before it starts, and inputs that would fail only after the fit row is
written are refused up front (no fit row, no output, no worker session left).

Also: the worker limits the DBA sets in cerebro_db.limits, which a role cannot raise.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ..helpers import mlp_json, q, worker_sessions_gone
from .conftest import Roles, catalog_counts, connect_as, load_mnist, relations

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', " \
          "metrics=['accuracy']"
CGRID = ("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], "
         "'metrics': ['accuracy']}")


@pytest.fixture(scope="module")
def lim(admin):
    """Packed data (2 partitions), an architecture and a model selection table, in schema
    lim_s of the superuser."""
    q(admin, "SET client_min_messages = warning")
    q(admin, "DROP SCHEMA IF EXISTS lim_s CASCADE")
    q(admin, "CREATE SCHEMA lim_s")
    load_mnist(admin, "lim_s.raw", 0, 120)
    q(admin, "SELECT training_preprocessor_dl('lim_s.raw', 'lim_s.p', 'y', 'x', NULL, 255.0, NULL, "
             "NULL, 2, 1)")
    q(admin, "SELECT load_keras_model('lim_s.arch', %s)", (mlp_json(),))
    q(admin, "SELECT load_model_selection_table('lim_s.arch', 'lim_s.mst', ARRAY[1], ARRAY[%s], "
             "ARRAY['batch_size=32'])", (COMPILE,))
    yield admin
    q(admin, "DELETE FROM cerebro_db.limits")
    q(admin, "DROP SCHEMA lim_s CASCADE")


def refused(conn, sql, args, sqlstate, fragment, seconds: float = 10.0) -> None:
    """``sql`` fails with ``sqlstate`` and ``fragment`` within ``seconds`` and leaves no
    relation, catalog row or worker session behind."""
    before_rel, before_cat = relations(conn), catalog_counts(conn)
    t0 = time.monotonic()
    with pytest.raises(psycopg2.Error) as e:
        q(conn, sql, args)
    took = time.monotonic() - t0
    assert e.value.pgcode == sqlstate, e.value.pgerror
    assert fragment in e.value.pgerror, e.value.pgerror
    assert took < seconds, took
    assert relations(conn) == before_rel
    assert catalog_counts(conn) == before_cat
    assert worker_sessions_gone(conn)


def automl(method: str, params: str) -> tuple[str, tuple]:
    return (("SELECT madlib_keras_automl('lim_s.p', 'lim_s.am', 'lim_s.arch', 'lim_s.am_mst', "
            "ARRAY[1], %s, $${'batch_size': [32, 64]}$$, %s, %s, 1)"), (CGRID, method, params))


@pytest.mark.parametrize(("method", "params", "fragment"), [
    ("hyperband", "R=1000000000", "R must be at most 100000"),
    ("hyperband", "R=100000, eta=2", "configurations, more than 10000"),
    ("hyperband", "R=27, eta=1000000", "eta must be at most 1000"),
    ("asha", "min_r=1, max_r=9, eta=3, brackets=1000000000", "brackets must be at most 64"),
    ("asha", "max_configs=1000000000", "max_configs must be at most 10000"),
    ("hyperopt", "num_configs=1000000000", "num_configs must be at most 10000"),
    ("hyperopt", "num_iterations=1000000000", "num_iterations must be at most 100000"),
    ("mltuner", "num_branches=100000", "num_branches must be at most 256"),
    ("mltuner", "max_trial_epochs=1000000000", "max_trial_epochs must be at most 100000"),
    ("random", "num_configs=1000000000", "num_configs must be at most 10000"),
    ("grid", "num_iterations=1000000000", "num_iterations must be at most 100000"),
])
def test_automl_sizes_are_bounded_before_any_work(lim, method, params, fragment):
    sql, args = automl(method, params)
    refused(lim, sql, args, "22023", fragment, seconds=5.0)


def test_hyperband_schedule_is_bounded(lim):
    refused(lim, "SELECT hyperband_schedule('lim_s.hb', 1000000000, 3, 0)", None, "22023",
            "R must be at most 100000", seconds=5.0)


def test_model_selection_keys_are_checked(lim):
    q(lim, "CREATE TABLE lim_s.dup AS SELECT * FROM lim_s.mst")
    q(lim, "CREATE TABLE lim_s.dup_summary AS SELECT * FROM lim_s.mst_summary")
    try:
        q(lim, "INSERT INTO lim_s.dup SELECT * FROM lim_s.mst")
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', 'lim_s.dup', 1)",
                None, "22023", "has mst_key 1 more than once")
        q(lim, "UPDATE lim_s.dup SET mst_key = NULL WHERE ctid = (SELECT min(ctid) FROM lim_s.dup)")
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', 'lim_s.dup', 1)",
                None, "22004", "has a NULL mst_key")
    finally:
        q(lim, "DROP TABLE lim_s.dup, lim_s.dup_summary")


@pytest.mark.parametrize("value", ["abc", "-1", "0", "10"])
def test_state_chunk_size_is_checked(lim, value):
    q(lim, "SELECT set_config('cerebro_db.state_chunk_size', %s, false)", (value,))
    try:
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', 'lim_s.mst', 1)",
                None, "22023", "cerebro_db.state_chunk_size must be a number of bytes")
    finally:
        q(lim, "RESET cerebro_db.state_chunk_size")


def test_warm_start_from_weights_of_the_wrong_size(lim):
    q(lim, "CREATE TABLE lim_s.w (mst_key integer PRIMARY KEY, model_weights bytea, "
           "model_arch json)")
    try:
        q(lim, "INSERT INTO lim_s.w VALUES (1, '\\x0000803f', NULL)")
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.w', 'lim_s.mst', 1, "
                     "FALSE, NULL, NULL, TRUE)", None, "22023",
                "warm_start: the weights of mst_key 1")
    finally:
        q(lim, "DROP TABLE lim_s.w")


def test_temporary_packed_table_is_refused(lim):
    q(lim, "CREATE TEMP TABLE tp AS SELECT * FROM lim_s.p")
    q(lim, "CREATE TEMP TABLE tp_summary AS SELECT * FROM lim_s.p_summary")
    try:
        refused(lim, "SELECT madlib_keras_fit_multiple_model('tp', 'lim_s.o', 'lim_s.mst', 1)", None,
                "0A000", "is a temporary table, which the worker sessions cannot see")
    finally:
        q(lim, "DROP TABLE tp, tp_summary")


def test_temporary_preprocessor_output_is_refused(lim):
    refused(lim, "SELECT training_preprocessor_dl('lim_s.raw', 'pg_temp.tp2', 'y', 'x')", None,
            "0A000", "cannot be a temporary table")


def test_packed_table_of_the_open_transaction_is_refused(lim, rel_db):
    from ..helpers import connect

    c = connect(rel_db)  # not autocommit: one transaction
    try:
        q(c, "SET client_min_messages = warning")
        q(c, "SELECT training_preprocessor_dl('lim_s.raw', 'lim_s.unc', 'y', 'x', NULL, 255.0, "
             "NULL, NULL, 2, 1)")
        n0 = q(lim, "SELECT count(*) FROM cerebro_db.fits")[0][0]
        with pytest.raises(psycopg2.Error) as e:
            q(c, "SELECT madlib_keras_fit_multiple_model('lim_s.unc', 'lim_s.o', 'lim_s.mst', 1)")
        assert e.value.pgcode == "55000", e.value.pgerror
        assert "created in this transaction" in e.value.pgerror
        assert "COMMIT" in e.value.pgerror
        assert q(lim, "SELECT count(*) FROM cerebro_db.fits")[0][0] == n0
    finally:
        c.rollback()
        c.close()


def test_two_thousand_layers_are_refused_quickly(lim):
    arch = json.loads(mlp_json())
    layers = arch["config"]["layers"]
    dense = layers[1]
    for i in range(2000):
        d = json.loads(json.dumps(dense))
        d["config"]["name"] = f"d{i}"
        layers.insert(2, d)
    refused(lim, "SELECT load_keras_model('lim_s.big', %s)", (json.dumps(arch),), "54000",
            "more than 1000 layers", seconds=5.0)


def test_a_model_bigger_than_the_server_is_refused_before_its_weights_exist(lim):
    """A Dense layer of 10^9 units (784 x 10^9 weights): load_keras_model refuses it
    (54000) without making its weights, so the backend is not killed for memory (which
    would restart every session of the server); a fit whose architecture was swapped for
    it in the table after loading is refused the same way, by the workers' checks."""
    arch = json.loads(mlp_json())
    arch["config"]["layers"][1]["config"]["units"] = 1_000_000_000
    refused(lim, "SELECT load_keras_model('lim_s.big', %s)", (json.dumps(arch),), "54000",
            "parameters, more than the", seconds=30.0)
    q(lim, "SELECT load_keras_model('lim_s.swap', %s)", (mlp_json(),))
    q(lim, "UPDATE lim_s.swap SET model_arch = %s", (json.dumps(arch),))
    q(lim, "SELECT load_model_selection_table('lim_s.swap', 'lim_s.swap_mst', ARRAY[1], "
           "ARRAY[%s], ARRAY['batch_size=32'])", (COMPILE,))
    try:
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', "
                     "'lim_s.swap_mst', 1)", None, "54000", "parameters, more than the",
                seconds=60.0)
    finally:
        q(lim, "DROP TABLE lim_s.swap, lim_s.swap_mst, lim_s.swap_mst_summary")


def test_a_batch_whose_activations_do_not_fit_is_refused_before_any_work(lim):
    """A convolution with few weights but many filters makes millions of values a row; a
    batch of all 120 rows (batch_size 1000 on 120 rows trains batches of 120) would hold more
    than memory / BYTES_PER_BATCH_VALUE of them: the workers' checks refuse the fit (54000)
    with the batch size that fits, before anything is written."""
    from cerebro_db import keras_arch

    limit = keras_arch.physical_memory() // keras_arch.BYTES_PER_BATCH_VALUE
    filters = limit // (120 * 784) + 1
    arch = {"class_name": "Sequential", "config": {"name": "wide", "layers": [
        {"class_name": "Reshape", "config": {"name": "r", "target_shape": [28, 28, 1],
                                             "batch_input_shape": [None, 784]}},
        {"class_name": "Conv2D", "config": {"name": "c", "filters": filters,
                                            "kernel_size": [3, 3], "padding": "same"}},
        {"class_name": "GlobalAveragePooling2D", "config": {"name": "g"}},
        {"class_name": "Dense", "config": {"name": "o", "units": 10,
                                           "activation": "softmax"}}]}}
    q(lim, "SELECT load_keras_model('lim_s.wide', %s)", (json.dumps(arch),))
    q(lim, "SELECT load_model_selection_table('lim_s.wide', 'lim_s.wide_mst', ARRAY[1], "
           "ARRAY[%s], ARRAY['batch_size=1000'])", (COMPILE,))
    try:
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', "
                     "'lim_s.wide_mst', 1)", None, "54000",
                "a batch of 120 rows makes", seconds=60.0)
        with pytest.raises(psycopg2.Error) as e:
            q(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', "
                   "'lim_s.wide_mst', 1)")
        most = limit // (784 + 784 + 784 * filters + filters + 10)
        assert f"Use batch_size {most:,} or less" in e.value.pgerror, e.value.pgerror
    finally:
        q(lim, "DROP TABLE lim_s.wide, lim_s.wide_mst, lim_s.wide_mst_summary")


def test_worker_limits_are_the_dbas(lim, rel_db):
    """Limits come from cerebro_db.limits, which only its owner can change; a role's SET of
    a setting of the same name changes nothing."""
    roles = Roles(lim, rel_db)
    try:
        eve = roles.create("lim_eve")
        ce = roles.connect(eve)
        with pytest.raises(psycopg2.Error) as e:
            q(ce, "INSERT INTO cerebro_db.limits VALUES ('max_workers_per_fit', NULL, 100)")
        assert e.value.pgcode == "42501"
        with pytest.raises(psycopg2.Error) as e:
            q(ce, "UPDATE cerebro_db.limits SET value = 100")
        assert e.value.pgcode == "42501"
        q(lim, "INSERT INTO cerebro_db.limits VALUES ('max_workers_per_fit', NULL, 1)")
        q(lim, "SET cerebro_db.max_workers_per_fit = 100")
        refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', 'lim_s.mst', 1)",
                None, "22023", "more than this role's max_workers_per_fit (1)")
        # a row for the role overrides the one for every role
        q(lim, "INSERT INTO cerebro_db.limits VALUES ('max_workers_per_fit', current_user, 2), "
               "('max_workers_per_role', current_user, 3)")
        # a running fit of this role (live coordinator: this session) holds 2 workers
        fit = q(lim, "INSERT INTO cerebro_db.fits (kind, source_table, model_output_table, "
                     "policy, num_partitions, num_iterations, metrics_compute_frequency, "
                     "random_state, total_units, coordinator_pid) VALUES ('fit', 's', 'o', "
                     "'mop', 2, 1, 1, 1, 2, pg_backend_pid()) RETURNING fit_id")[0][0]
        q(lim, "INSERT INTO cerebro_db.fit_workers (fit_id, worker, partitions, status) VALUES "
               "(%s, 0, '{0}', 'active'), (%s, 1, '{1}', 'active')", (fit, fit))
        try:
            refused(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', "
                         "'lim_s.mst', 1)", None, "22023",
                    "other running fits hold 2, more than its max_workers_per_role (3)")
            with pytest.raises(psycopg2.Error) as e:
                q(lim, "SELECT cerebro_db_fit_workers(%s, 3)", (fit,))
            assert e.value.pgcode == "22023" and "max_workers_per_fit (2)" in e.value.pgerror
        finally:
            q(lim, "DELETE FROM cerebro_db.fits WHERE fit_id = %s", (fit,))
    finally:
        q(lim, "RESET cerebro_db.max_workers_per_fit")
        q(lim, "DELETE FROM cerebro_db.limits")
        roles.drop()


class Notices(list):
    """The notices about worker limits only (psycopg2 keeps its default list to 50)."""

    def append(self, notice: str) -> None:
        if "worker limits" in notice:
            super().append(notice)


@contextlib.contextmanager
def long_fit(lim, rel_db) -> Iterator[Any]:
    """With max_workers_per_role 3 for the role: a fit of 100,000 iterations running in
    another session of the role (its connection is yielded, with ``notices``), once its
    units are being logged; cancelled at the end (and checked to end so: 57014)."""
    q(lim, "INSERT INTO cerebro_db.limits VALUES ('max_workers_per_role', current_user, 3)")
    runner = connect_as(rel_db, q(lim, "SELECT current_user")[0][0])
    q(runner, "SET client_min_messages = notice")
    runner.notices = Notices()
    failed: list[Exception] = []

    def run() -> None:
        try:
            q(runner, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.long', "
                      "'lim_s.mst', 100000)")
        except psycopg2.Error as e:
            failed.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        for _ in range(600):  # until it trains (its worker request is cleared as it starts)
            if q(lim, "SELECT count(*) FROM cerebro_db.units u JOIN cerebro_db.fits f "
                      "USING (fit_id) WHERE f.status = 'running'")[0][0] > 2:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the long fit did not start")
        yield runner
    finally:
        runner.cancel()
        t.join(60)
        runner.close()
        q(lim, "DELETE FROM cerebro_db.limits")
        q(lim, "DROP TABLE IF EXISTS lim_s.long, lim_s.long_summary, lim_s.long_info")
    assert failed and failed[0].pgcode == "57014"


def live_workers(conn) -> int:
    """The worker sessions of the connection's role, as the server has them."""
    q(conn, "SELECT pg_stat_clear_snapshot()")
    return q(conn, "SELECT count(*) FROM pg_stat_activity WHERE usename = current_user "
                   "AND application_name ~ '^cerebro_db [0-9]+_[0-9]+ worker [0-9]+$'")[0][0]


def test_a_role_cannot_free_its_workers_by_editing_its_catalog_rows(lim, rel_db):
    """With a fit of the role running on 2 workers, marking that fit's workers closed in
    fit_workers (rows the role may write) does not let another fit start past
    max_workers_per_role: the role's live worker sessions count too."""
    with long_fit(lim, rel_db):
        assert live_workers(lim) == 2
        q(lim, "UPDATE cerebro_db.fit_workers w SET status = 'closed' FROM cerebro_db.fits f "
               "WHERE f.fit_id = w.fit_id AND f.status = 'running'")
        with pytest.raises(psycopg2.Error) as e:
            q(lim, "SELECT madlib_keras_fit_multiple_model('lim_s.p', 'lim_s.o', 'lim_s.mst', 1)")
        assert e.value.pgcode == "22023", e.value.pgerror
        assert "other running fits hold 2, more than its max_workers_per_role (3)" \
            in e.value.pgerror


def test_the_coordinator_grants_workers_within_the_limits_whatever_the_request(lim, rel_db):
    """The role writes fits.requested_workers itself (past cerebro_db_fit_workers' check):
    the coordinator still grants no more workers than max_workers_per_role allows."""
    with long_fit(lim, rel_db) as runner:
        assert live_workers(lim) == 2
        assert q(lim, "UPDATE cerebro_db.fits SET requested_workers = 5 "
                      "WHERE status = 'running' RETURNING fit_id")
        time.sleep(4)  # the coordinator polls the request every 0.5 s
        assert live_workers(lim) == 3
    assert any("asked for 5 worker sessions; this role's worker limits allow 3 now" in n
               for n in runner.notices), runner.notices
