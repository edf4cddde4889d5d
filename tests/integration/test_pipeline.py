"""Pipelined dispatch on the real server: worker sessions run chains of units, each busy
worker's next unit posted ahead in ``unit_postings`` (``cerebro_db.pipeline_depth``), and
train the same models as one unit per statement; units that overlap in time (an evaluation
and its config's next epoch) read the states they must."""
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
DEPTH = 32
"""The depth these tests chain units at (the default is 1: no pipelined dispatch)."""


def load_tables(conn, prefix: str) -> None:
    """600 training and 200 validation rows over 2 partitions (``PREFIX_p``, ``PREFIX_v``);
    4 configs (``PREFIX_mst``)."""
    load_mnist_rows(conn, (f"{prefix}_train", 0, 600), (f"{prefix}_test", 600, 800))
    q(conn, "DROP TABLE IF EXISTS " + ", ".join(
        f"{prefix}_{t}" for t in ("p", "p_summary", "v", "v_summary", "arch", "mst",
                                  "mst_summary")))
    q(conn, f"SELECT training_preprocessor_dl('{prefix}_train', '{prefix}_p', 'y', 'x', NULL, "
            "255.0, NULL, NULL, 2, 3)")
    q(conn, f"SELECT validation_preprocessor_dl('{prefix}_test', '{prefix}_v', 'y', 'x', "
            f"'{prefix}_p')")
    q(conn, f"SELECT load_keras_model('{prefix}_arch', %s)", (mlp_json(8),))
    q(conn, f"SELECT load_model_selection_table('{prefix}_arch', '{prefix}_mst', ARRAY[1], "
            "%s, %s)", (COMPILES, FITS))


@pytest.fixture(scope="module")
def pl(session_conn):
    conn = session_conn
    load_tables(conn, "pl")
    q(conn, "SET cerebro_db.pipeline_depth = %s", (DEPTH,))
    yield conn
    q(conn, "RESET cerebro_db.pipeline_depth")
    q(conn, "RESET cerebro_db.test_hook")


def fit(conn, out: str, prefix: str = "pl") -> list[tuple]:
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, f"SELECT madlib_keras_fit_multiple_model('{prefix}_p', %s, '{prefix}_mst', 3, "
            f"FALSE, '{prefix}_v', 1, FALSE, NULL, NULL, TRUE, 'mop', NULL, 11)", (out,))
    return q(conn, f"SELECT mst_key, training_loss, training_metrics, validation_loss, "
                   f"validation_metrics FROM {out}_info ORDER BY mst_key")


POSTED = "SELECT count(*) FROM cerebro_db.unit_postings WHERE kind = 'unit'"
"""Units posted ahead in worker sessions' slots."""


def watch(dbname: str, count: str, stop: threading.Event, seen: list[int]) -> None:
    """Run ``count`` (one number) every 5 ms while a fit runs."""
    c = connect(dbname, autocommit=True)
    try:
        while not stop.is_set():
            seen.append(q(c, count)[0][0])
            stop.wait(0.005)
    finally:
        c.close()


def watched_fit(conn, dbname: str, out: str, count: str = POSTED,
                prefix: str = "pl") -> tuple[list[tuple], int]:
    """A fit, and the most that ``count`` counted at once while it ran."""
    stop, seen = threading.Event(), [0]
    t = threading.Thread(target=watch, args=(dbname, count, stop, seen))
    t.start()
    try:
        got = fit(conn, out, prefix)
    finally:
        stop.set()
        t.join()
    return got, max(seen)


def test_a_pipelined_fit_trains_what_one_unit_per_statement_trains(pl, dbname):
    """Depth 32: units are posted ahead (seen in unit_postings while the fit runs, gone
    after it); the losses and metrics equal, bitwise, those of a fit with depth 1, which
    posts nothing, and of one with the setting unset (the default: depth 1)."""
    chained, ahead = watched_fit(pl, dbname, "pl_out")
    assert ahead > 0
    assert q(pl, "SELECT count(*) FROM cerebro_db.unit_postings") == [(0,)]
    runs = []
    for setting in ("SET cerebro_db.pipeline_depth = 1", "RESET cerebro_db.pipeline_depth"):
        q(pl, setting)
        try:
            runs.append(watched_fit(pl, dbname, "pl_out1"))
        finally:
            q(pl, "SET cerebro_db.pipeline_depth = %s", (DEPTH,))
    assert runs == [(chained, 0), (chained, 0)]
    assert len(chained) == 4


def test_slots_given_up_at_once_end_their_chains_and_the_fit_goes_on(pl):
    """A slot that finds nothing posted abandons it at once (a test hook sets the wait to
    0): the chain ends there, the next unit goes as a new statement, same models."""
    want = fit(pl, "pl_out2")
    q(pl, "SET cerebro_db.test_hook = %s",
      (json.dumps([{"point": "slot_wait", "seconds": 0},
                   {"point": "before_train", "worker": 1, "seconds": 0.05}]),))
    try:
        got = fit(pl, "pl_out3")
    finally:
        q(pl, "RESET cerebro_db.test_hook")
    assert got == want
    fit_id = q(pl, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                   "'pl_out3'")[0][0]
    assert q(pl, "SELECT status FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == \
        [("done",)]
    assert q(pl, "SELECT count(*) FROM cerebro_db.unit_postings") == [(0,)]


def test_a_slot_of_a_fit_the_role_cannot_see_is_refused_at_once(pl):
    """``__run_slot`` (internal, callable like ``__run_unit``) refuses a fit that does not
    exist for its role before it waits for any posting."""
    e = error_of(pl, "SELECT cerebro_db.__run_slot('t', 987654321, 0, 1, 1, NULL)")
    assert e.pgcode == "42704" and "fit 987654321 does not exist" in e.pgerror


def test_an_evaluation_that_reads_after_its_config_moved_on_gets_its_epochs_state(pl):
    """An evaluation of epoch 1 that reads its state only after its config's first unit of
    epoch 2 committed (a test hook delays it) gets the end-of-epoch-1 state, which that unit
    kept as 'epoch:1' (an evaluation decides between 'epoch:1' and 'current' in one
    statement): its losses and metrics equal an undelayed fit's, bitwise."""
    def fit_id(out: str) -> int:
        return q(pl, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = %s",
                 (out,))[0][0]

    def evals(fid: int) -> list[tuple]:
        return q(pl, "SELECT kind, partition, loss, metrics FROM cerebro_db.units WHERE "
                     "fit_id = %s AND mst_key = 1 AND epoch = 1 AND kind <> 'train' "
                     "ORDER BY kind, partition", (fid,))

    want = fit(pl, "pl_out4")
    ref = fit_id("pl_out4")
    # config 1's first partition in epoch 2 (its seeded visit order): delay its evaluation
    # of epoch 1 on the other one, whose worker is then busy while config 1 moves on
    first = q(pl, "SELECT partition FROM cerebro_db.units WHERE fit_id = %s AND mst_key = 1 "
                  "AND epoch = 2 AND kind = 'train' ORDER BY started_at LIMIT 1", (ref,))[0][0]
    q(pl, "SET cerebro_db.test_hook = %s",
      (json.dumps({"point": "eval", "mst_key": 1, "epoch": 1, "partition": 1 - first,
                   "seconds": 5}),))
    try:
        got = fit(pl, "pl_out5")
    finally:
        q(pl, "RESET cerebro_db.test_hook")
    fid = fit_id("pl_out5")
    moved_on, loaded = q(pl, """
        SELECT (SELECT extract(epoch FROM ended_at) FROM cerebro_db.units WHERE fit_id = %s
                   AND mst_key = 1 AND epoch = 2 AND partition = %s AND kind = 'train'),
               (SELECT extract(epoch FROM started_at) + 5 FROM cerebro_db.units
                 WHERE fit_id = %s AND mst_key = 1 AND epoch = 1 AND partition = %s
                   AND kind = 'eval_train')""", (fid, first, fid, 1 - first))[0]
    assert moved_on < loaded - 1  # the delayed evaluation read after the config moved on
    assert evals(fid) == evals(ref)
    assert got == want
    # the kept versions go with the fit's end; 'current' stays for its outputs
    assert q(pl, "SELECT DISTINCT version FROM cerebro_db.model_states WHERE fit_id = %s",
             (fid,)) == [("current",)]
