"""A long pure-Python loop inside an entry point lets a cancel, statement_timeout and a
terminate through (it polls the server with ``SELECT 1``, see cerebro_db/interrupts.py).

The loop: generate_model_configs drawing 100,000 random configurations, about a minute of
Python on this machine, with no SQL in between.
"""
from __future__ import annotations

import threading
import time

import pytest

from ..helpers import connect, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

CALL = ("SELECT generate_model_configs('lp_arch', 'lp_mst', ARRAY[1], "
        "$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
        "[{'optimizer': ['Adam'], 'lr': [0.00001, 0.1, 'log']}], 'metrics': ['accuracy']}$$, "
        "$${'batch_size': [16, 512]}$$, 'random', 100000, 1)")


@pytest.fixture(scope="module")
def lp(admin, rel_db):
    q(admin, "DROP TABLE IF EXISTS lp_arch, lp_mst, lp_mst_summary")
    q(admin, "SELECT load_keras_model('lp_arch', %s)", (mlp_json(),))
    c = connect(rel_db)
    c.autocommit = True
    yield c
    c.close()
    q(admin, "DROP TABLE IF EXISTS lp_arch, lp_mst, lp_mst_summary")


def run_until(conn, action, delay: float = 1.5) -> tuple[BaseException | None, float]:
    """Run CALL on ``conn``, do ``action(pid)`` after ``delay`` s from another connection;
    returns the error and the seconds the call took."""
    pid = conn.get_backend_pid()
    timer = threading.Timer(delay, action, args=(pid,)) if action else None
    if timer:
        timer.start()
    t0 = time.monotonic()
    err = None
    try:
        q(conn, CALL)
    except (psycopg2.Error, psycopg2.OperationalError) as e:
        err = e
    if timer:
        timer.join()
    return err, time.monotonic() - t0


def test_statement_timeout_stops_the_loop(lp, admin):
    q(lp, "SET statement_timeout = '2s'")
    try:
        err, took = run_until(lp, None)
    finally:
        q(lp, "RESET statement_timeout")
    assert err is not None and err.pgcode == "57014", err
    assert took < 15, took
    assert q(admin, "SELECT to_regclass('lp_mst') IS NULL") == [(True,)]


def test_cancel_stops_the_loop(lp, admin):
    err, took = run_until(lp, lambda pid: q(admin, "SELECT pg_cancel_backend(%s)", (pid,)))
    assert err is not None and err.pgcode == "57014", err
    assert took < 15, took


def test_terminate_ends_the_session(admin, rel_db):
    c = connect(rel_db)
    c.autocommit = True
    try:
        err, took = run_until(c, lambda pid: q(admin, "SELECT pg_terminate_backend(%s)",
                                                (pid,)))
        assert err is not None, "the call was not ended"
        assert took < 15, took
        assert c.closed or isinstance(err, psycopg2.OperationalError)
    finally:
        c.close()
