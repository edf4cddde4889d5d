"""Scheduled model selection without pg_cron: a job's runs, called by hand as pg_cron would.

One job over a small synthetic table (4 features, 3 classes, a serial key), two
configurations of a tiny MLP, 1 iteration on 2 partitions. The tests run in file order and
share the job: first run, incremental repack + warm start, readers during a run, a failed
run keeping the outputs, an overlapping run, unscheduling.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ..helpers import error_of, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

def add_rows(conn, lo: int, hi: int) -> None:
    """Rows lo..hi-1 of a deterministic synthetic table (features from the row number)."""
    q(conn, "INSERT INTO jsrc (id, x, y) SELECT g, ARRAY[sin(g), cos(g), sin(2 * g), "
            "(g %% 7) / 7.0]::real[], (g %% 3) FROM generate_series(%s, %s) g", (lo, hi - 1))


def weights(conn, table: str) -> dict[int, bytes]:
    return {k: bytes(w) for k, w in q(conn, f"SELECT mst_key, model_weights FROM {table}")}


def runs(conn, job: str) -> list[dict]:
    with conn.cursor() as cur:
        cur.execute("SELECT * FROM cerebro_db.job_runs WHERE job_name = %s ORDER BY run", (job,))
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]


def staging_tables(conn) -> list[str]:
    return [r[0] for r in q(conn, "SELECT relname FROM pg_class WHERE relname LIKE "
                                  "'\\_\\_cerebro\\_job\\_%%'")]


def decoded_rows(conn, table: str) -> np.ndarray:
    """Every packed row as one float vector (features then one-hot label), sorted."""
    out = []
    for x, y, xs, ys in q(conn, f"SELECT x, y, x_shape, y_shape FROM {table}"):
        xa = np.frombuffer(bytes(x), "<f4").reshape(xs)
        ya = np.frombuffer(bytes(y), "<i2").reshape(ys).astype(np.float32)
        out.append(np.concatenate([xa, ya], axis=1))
    rows = np.concatenate(out)
    return rows[np.lexsort(rows.T[::-1])]


@pytest.fixture(scope="module")
def job(session_conn):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary CASCADE")
    q(conn, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(conn, 0, 300)
    q(conn, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('jarch', 'jmst', ARRAY[1], ARRAY["
            "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
            "metrics=['accuracy']$$, $$loss='categorical_crossentropy', "
            "optimizer='SGD(learning_rate=0.1)', metrics=['accuracy']$$], "
            "ARRAY['batch_size=16'])")
    job_id = q(conn, """SELECT schedule_model_selection('nightly', NULL, 'jsrc', 'jpacked', 'y',
        'x', 'jout', 'jmst', fit_options => '{"num_iterations": 1, "random_state": 5}',
        preprocess_options => '{"num_partitions": 2, "random_state": 3}', key_column => 'id',
        warm_start => TRUE, retries => 1, retry_delay => '0 seconds')""")[0][0]
    yield conn, job_id
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch, jmst, jmst_summary, jpacked, jpacked_summary, "
            "jout, jout_summary, jout_info, jfull, jfull_summary CASCADE")
    q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name = 'nightly'")


def test_schedule_checks_its_arguments_and_leaves_nothing(job):
    conn, _ = job
    base = ("'jsrc', 'jp2', 'y', 'x', 'jo2', 'jmst'")
    cases = [
        (f"SELECT schedule_model_selection(NULL, NULL, {base})", "22004"),
        ((f"SELECT schedule_model_selection('nightly', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1}')"), "42710"),
        (("SELECT schedule_model_selection('j2', NULL, 'nosuch', 'jp2', 'y', 'x', 'jo2', 'jmst', "
         "fit_options => '{\"num_iterations\": 1}')"), "42P01"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1}', key_column => 'nope')"), "42703"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, method => 'magic', "
         "fit_options => '{\"num_iterations\": 1}')"), "22023"),
        (f"SELECT schedule_model_selection('j2', NULL, {base})", "22023"),  # num_iterations
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1, \"bogus\": 2}')"), "22023"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": \"many\"}')"), "22023"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1, \"source_table\": \"x\"}')"), "22023"),
        (("SELECT schedule_model_selection('j2', NULL, 'jsrc', 'jp2', 'y', 'x', 'jo2', 'jmst2', "
         "method => 'automl', warm_start => TRUE)"), "0A000"),
        (("SELECT schedule_model_selection('j2', NULL, 'jsrc', 'jp2', 'y', 'x', 'jmst', 'jmst', "
         "fit_options => '{\"num_iterations\": 1}')"), "42P07"),  # output exists
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1}', retries => -1)"), "22023"),
        # values the functions refuse at once are refused when the job is defined, not at
        # its first run (an outside pass)
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 0}')"), "22023"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1, \"validation_table\": \"no_such\"}')"),
         "42P01"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1, \"scheduling_policy\": \"rnig\"}')"),
         "22023"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1, \"policy_params\": \"bogus=1\"}')"),
         "22023"),
        ((f"SELECT schedule_model_selection('j2', NULL, {base}, "
         "fit_options => '{\"num_iterations\": 1}', "
         "preprocess_options => '{\"num_partitions\": -1}')"), "22023"),
        (("SELECT schedule_model_selection('j2', NULL, 'jsrc', 'jp2', 'y', 'x', 'jo2', 'jmst2', "
          "method => 'automl', fit_options => '{\"model_arch_table\": \"jarch\", "
          "\"model_id_list\": [1], \"compile_params_grid\": \"{}\", "
          "\"fit_params_grid\": \"{}\", \"automl_method\": \"hyperbandit\"}')"),
         "22023"),
    ]
    for sql, state in cases:
        assert error_of(conn, sql).pgcode == state, sql
    assert q(conn, "SELECT count(*) FROM cerebro_db.jobs")[0][0] == 1
    assert q(conn, "SELECT to_regclass('jp2'), to_regclass('jo2')")[0] == (None, None)
    # an unknown job
    assert error_of(conn, "CALL run_model_selection_job('nosuch')").pgcode == "42704"
    assert error_of(conn, "SELECT unschedule_model_selection('nosuch')").pgcode == "42704"


def test_first_run_packs_trains_publishes_and_records(job):
    conn, job_id = job
    q(conn, "CALL run_model_selection_job('nightly')")
    (r,) = runs(conn, "nightly")
    assert (r["run"], r["status"], r["attempts"]) == (1, "succeeded", 1), r["message"]
    assert (r["new_rows"], r["rows_trained"]) == (300, 300)
    assert r["ended_at"] >= r["started_at"]
    fit = q(conn, "SELECT model_output_table, status, source_table FROM cerebro_db.fits "
                  "WHERE fit_id = %s", (r["fit_id"],))[0]
    assert fit[0] == "jout" and fit[1] == "done"
    # the best configuration is the _info row with the smallest training loss (no validation)
    best = q(conn, "SELECT mst_key, training_loss_final, fit_id FROM jout_info "
                   "ORDER BY training_loss_final LIMIT 1")[0]
    assert (r["best_mst_key"], r["best_metric_name"]) == (best[0], "training_loss")
    assert r["best_metric"] == pytest.approx(best[1])
    assert best[2] == r["fit_id"]
    assert f"mst_key={best[0]}," in r["best_config"]
    assert q(conn, "SELECT model, model_info FROM jout_summary")[0] == ("jout", "jout_info")
    assert set(weights(conn, "jout")) == {1, 2}
    assert staging_tables(conn) == []
    view = q(conn, "SELECT last_run, last_status, packed_rows, packed_through "
                   "FROM cerebro_db.model_selection_jobs WHERE job_id = %s", (job_id,))[0]
    assert view == (1, "succeeded", 300, "299")
    # a job's fit is not resumed by hand: its outputs go to staging names only the job's run
    # publishes (an outside pass resumed a cancelled run's fit; its tables stayed unpublished)
    e = error_of(conn, f"SELECT madlib_keras_fit_resume({r['fit_id']})")
    assert e.pgcode == "55000", e.pgerror
    assert 'is run 1 of model selection job "nightly"' in e.pgerror, e.pgerror


def test_incremental_repack_equals_a_full_repack_and_warm_start(job):
    conn, _ = job
    before = weights(conn, "jout")
    buffers = q(conn, "SELECT count(*) FROM jpacked")[0][0]
    add_rows(conn, 300, 315)  # 5 % more rows
    q(conn, "CALL run_model_selection_job('nightly')")
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"]) == (2, "succeeded"), r["message"]
    assert (r["new_rows"], r["rows_trained"]) == (15, 315)
    # only new buffers were added: the first run's buffers are still there
    assert q(conn, "SELECT count(*) FROM jpacked WHERE buffer_id < %s", (buffers,))[0][0] \
        == buffers
    assert q(conn, "SELECT num_rows FROM jpacked_summary")[0][0] == 315
    q(conn, "DROP TABLE IF EXISTS jfull, jfull_summary")
    q(conn, "SELECT training_preprocessor_dl('jsrc', 'jfull', 'y', 'x', NULL, 1.0, NULL, NULL, "
            "2, 3)")
    inc, full = decoded_rows(conn, "jpacked"), decoded_rows(conn, "jfull")
    assert inc.shape == (315, 4 + 3)
    np.testing.assert_array_equal(inc, full)
    cols = "y_class_values, normalizing_const, num_classes, num_partitions, num_rows"
    assert q(conn, f"SELECT {cols} FROM jpacked_summary") == \
        q(conn, f"SELECT {cols} FROM jfull_summary")
    # both partitions still hold data
    assert q(conn, "SELECT count(DISTINCT __dist_key__) FROM jpacked")[0][0] == 2
    # warm start: the second fit started from the first run's published weights
    init = {k: bytes(w) for k, w in q(conn, "SELECT mst_key, init_weights FROM "
                                            "cerebro_db.fit_configs WHERE fit_id = %s",
                                      (r["fit_id"],))}
    assert init == before
    assert weights(conn, "jout") != before


def test_readers_see_the_previous_outputs_until_the_new_are_complete(job, dsn):
    conn, _ = job
    before = weights(conn, "jout")
    errors: list[BaseException] = []

    def run() -> None:
        c = psycopg2.connect(dsn)
        c.autocommit = True
        try:
            q(c, "CALL run_model_selection_job('nightly')")
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)
        finally:
            c.close()

    last_fit = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits")[0][0]
    t = threading.Thread(target=run)
    t.start()
    seen_running = 0
    deadline = time.monotonic() + 300

    def running() -> int:
        return q(conn, "SELECT count(*) FROM cerebro_db.fits WHERE fit_id > %s AND "
                       "status = 'running'", (last_fit,))[0][0]

    refused = None
    while t.is_alive() and time.monotonic() < deadline:
        if running() and refused is None:
            # an outside pass: unscheduling a job while it ran failed the run at its end
            # and left its history row 'running'; now refused while a run is going
            refused = error_of(conn, "SELECT unschedule_model_selection('nightly')")
        if running():
            now, staged = weights(conn, "jout"), staging_tables(conn)
            # the fit turns 'done' in the transaction that publishes (the job's): when it
            # still runs after these reads, they came before that commit; when it no longer
            # does, the commit may have come between the first check and the reads
            if running():
                seen_running += 1
                assert now == before
                assert staged == []  # the staging tables are not committed yet
        time.sleep(0.2)
    t.join()
    assert not errors, errors
    assert seen_running > 0
    assert refused is not None and refused.pgcode == "55006", refused
    assert 'job "nightly" is running' in refused.pgerror, refused.pgerror
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"], r["new_rows"]) == (3, "succeeded", 0), r["message"]
    assert weights(conn, "jout") != before
    assert q(conn, "SELECT DISTINCT fit_id FROM jout_info")[0][0] == r["fit_id"]


def test_a_failed_run_keeps_the_outputs_records_and_retries(job):
    conn, _ = job
    before = weights(conn, "jout")
    info = q(conn, "SELECT * FROM jout_info ORDER BY mst_key")
    q(conn, "ALTER TABLE jmst RENAME TO jmst_away")
    try:
        # recorded, then the call fails too (pg_cron's job_run_details says failed)
        e = error_of(conn, "CALL run_model_selection_job('nightly')")
        assert e.pgcode == "P0001" and 'job "nightly" failed' in e.pgerror, e.pgerror
        assert e.diag.message_detail.startswith("attempt 1, train: ")
    finally:
        q(conn, "ALTER TABLE jmst_away RENAME TO jmst")
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"], r["attempts"]) == (4, "failed", 2)
    assert r["ended_at"] is not None
    lines = r["message"].splitlines()
    assert lines[0].startswith("attempt 1, train: ") and "jmst" in lines[0]
    assert "42P01" in lines[0]
    assert lines[1].startswith("attempt 2, train: ")
    assert weights(conn, "jout") == before
    assert q(conn, "SELECT * FROM jout_info ORDER BY mst_key") == info
    assert staging_tables(conn) == []
    view = q(conn, "SELECT last_status, last_run FROM cerebro_db.model_selection_jobs "
                   "WHERE job_name = 'nightly'")[0]
    assert view == ("failed", 4)


def test_a_run_that_finds_the_previous_still_going_records_that_and_leaves(job, dsn):
    """A run begun in another session of the owner (its 'running' row, its session alive)
    makes a run skip; an advisory lock on the job's id (what any role can take) does not;
    once that session has ended, the next run marks the row it left failed and runs."""
    conn, job_id = job
    before = weights(conn, "jout")
    other = psycopg2.connect(dsn)
    other.autocommit = True
    try:
        going = q(other, "SELECT cerebro_db.__job_step('nightly', NULL, 'begin')")[0][0]
        q(other, "SELECT pg_advisory_lock(1128416836, %s)", (job_id,))  # the old lock's key
        t0 = time.monotonic()
        q(conn, "CALL run_model_selection_job('nightly')")
        assert time.monotonic() - t0 < 10
        pid = q(other, "SELECT pg_backend_pid()")[0][0]
    finally:
        other.close()
    r5, r6 = runs(conn, "nightly")[-2:]
    assert (r5["run_id"], r5["run"], r5["status"], r5["backend_pid"]) == (int(going), 5,
                                                                          "running", pid)
    assert (r6["run"], r6["status"]) == (6, "skipped")
    assert f"run 5 (backend pid {pid})" in r6["message"] and "still going" in r6["message"]
    assert r6["fit_id"] is None
    assert weights(conn, "jout") == before
    for _ in range(100):  # the closed session leaves pg_stat_activity
        if not q(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0]:
            break
        time.sleep(0.05)
    q(conn, "CALL run_model_selection_job('nightly')")
    r5, r6, r7 = runs(conn, "nightly")[-3:]
    assert (r5["status"], r7["run"], r7["status"]) == ("failed", 7, "succeeded"), r7["message"]
    assert "interrupted: its session ended" in r5["message"]


def test_explicit_ids_are_replaced_by_the_sequences(job):
    """job_id and run_id come from their sequences whatever a role's INSERT gives, so no
    role can hold the ids the sequences hand out next (a unique violation in another role's
    job). A superuser's explicit ids are kept: that is pg_restore bringing the catalog back."""
    conn, job_id = job
    q(conn, "DROP ROLE IF EXISTS squatter")
    q(conn, "CREATE ROLE squatter")
    q(conn, "GRANT USAGE ON SCHEMA cerebro_db TO squatter")
    try:
        q(conn, "SET ROLE squatter")
        nxt = q(conn, "SELECT last_value + 1 FROM cerebro_db.jobs_job_id_seq")[0][0]
        got = q(conn, "INSERT INTO cerebro_db.jobs (job_id, job_name, method, source_table, "
                      "packed_table, dependent_varname, independent_varname, model_output_table) "
                      "VALUES (%s, 'squat', 'fit', 's', 'p', 'y', 'x', 'o') RETURNING job_id",
                (nxt + 5,))[0][0]
        assert got != nxt + 5
        run_next = q(conn, "SELECT last_value + 1 FROM cerebro_db.job_runs_run_id_seq")[0][0]
        run_id = q(conn, "INSERT INTO cerebro_db.job_runs (run_id, job_id, job_name, run) "
                         "VALUES (%s, %s, 'squat', 1) RETURNING run_id",
                   (run_next + 5, got))[0][0]
        assert run_id != run_next + 5
        q(conn, "UPDATE cerebro_db.jobs SET job_id = %s WHERE job_id = %s", (job_id, got))
        assert q(conn, "SELECT count(*) FROM cerebro_db.jobs WHERE job_id = %s", (got,)) == [(1,)]
        q(conn, "RESET ROLE")
        kept = q(conn, "INSERT INTO cerebro_db.jobs (job_id, job_name, method, source_table, "
                       "packed_table, dependent_varname, independent_varname, "
                       "model_output_table) VALUES (%s, 'squat_su', 'fit', 's', 'p', 'y', 'x', "
                       "'o') RETURNING job_id", (10**9,))[0][0]
        assert kept == 10**9
    finally:
        q(conn, "RESET ROLE")
        q(conn, "DELETE FROM cerebro_db.job_runs WHERE job_name = 'squat'")
        q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name IN ('squat', 'squat_su')")
        q(conn, "REVOKE USAGE ON SCHEMA cerebro_db FROM squatter")
        q(conn, "DROP ROLE squatter")


def test_a_class_the_models_cannot_output_fails_the_run_and_publishes_nothing(job):
    """An outside pass: a row of a class the architectures cannot output made the pack step
    publish a repack of every row with 4 classes; training failed, and so did every later
    run, also once the row was deleted (nothing new to pack, the 4-class table stayed)."""
    conn, job_id = job
    before = weights(conn, "jout")
    summary = q(conn, "SELECT y_class_values, num_rows FROM jpacked_summary")[0]
    buffers = q(conn, "SELECT buffer_id, x, y FROM jpacked ORDER BY buffer_id")
    mark = "SELECT packed_through, packed_rows FROM cerebro_db.jobs WHERE job_id = %s"
    through = q(conn, mark, (job_id,))[0]
    q(conn, "INSERT INTO jsrc VALUES (100000, ARRAY[1, 2, 3, 4]::real[], 7)")
    try:
        e = error_of(conn, "CALL run_model_selection_job('nightly')")
        assert e.pgcode == "P0001" and 'job "nightly" failed' in e.pgerror, e.pgerror
    finally:
        q(conn, "DELETE FROM jsrc WHERE id = 100000")
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"], r["attempts"]) == (8, "failed", 2)
    assert "has 3 outputs, but the labels have 4 columns" in r["message"], r["message"]
    assert (r["new_rows"], r["rows_trained"]) == (summary[1] + 1, None)
    assert q(conn, "SELECT y_class_values, num_rows FROM jpacked_summary")[0] == summary
    assert q(conn, "SELECT buffer_id, x, y FROM jpacked ORDER BY buffer_id") == buffers
    assert q(conn, mark, (job_id,))[0] == through
    assert weights(conn, "jout") == before
    assert staging_tables(conn) == []
    q(conn, "CALL run_model_selection_job('nightly')")  # the row is gone: the job runs again
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"], r["new_rows"], r["rows_trained"]) == \
        (9, "succeeded", 0, summary[1]), r["message"]
    assert q(conn, "SELECT source_table FROM cerebro_db.fits WHERE fit_id = %s",
             (r["fit_id"],))[0][0] == "jpacked"
    # the newest row deleted: the largest key is below the last packed one, so the run packs
    # every row again (appending would never drop that row's buffer)
    top = int(through[0])
    q(conn, "DELETE FROM jsrc WHERE id = %s", (top,))
    q(conn, "CALL run_model_selection_job('nightly')")
    r = runs(conn, "nightly")[-1]
    assert (r["run"], r["status"], r["new_rows"], r["rows_trained"]) == \
        (10, "succeeded", summary[1] - 1, summary[1] - 1), r["message"]
    assert q(conn, mark, (job_id,))[0] == (str(top - 1), summary[1] - 1)
    assert q(conn, "SELECT num_rows FROM jpacked_summary")[0][0] == summary[1] - 1
    assert staging_tables(conn) == []


def test_unschedule_keeps_outputs_and_history(job):
    conn, _ = job
    assert q(conn, "SELECT unschedule_model_selection('nightly')")[0][0] is True
    assert q(conn, "SELECT count(*) FROM cerebro_db.model_selection_jobs")[0][0] == 0
    assert len(runs(conn, "nightly")) == 10
    assert q(conn, "SELECT count(*) FROM jout")[0][0] == 2


def pack_step(conn, job: str, before_end=None) -> str:
    """A run's begin, pack and end steps; ``before_end()`` between pack and end."""
    run = q(conn, "SELECT cerebro_db.__job_step(%s, NULL, 'begin')", (job,))[0][0]
    try:
        said = q(conn, "SELECT cerebro_db.__job_step(%s, %s, 'pack')", (job, run))[0][0]
        if before_end is not None:
            before_end()
        return said
    finally:
        q(conn, "SELECT cerebro_db.__job_step(%s, %s, 'end')", (job, run))


def test_new_rows_with_a_new_class_or_fewer_rows_than_partitions(session_conn):
    """The pack step alone: one new row (fewer than the 2 partitions) is appended; a new
    class value makes the run pack every row again, staged for the train step (which this
    run does not reach: the end step drops it); both equal a full repack."""
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS jsrc, jmst2 CASCADE")
    q(conn, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    q(conn, "CREATE TABLE jmst2 (mst_key integer)")  # only checked to exist here
    add_rows(conn, 0, 60)
    q(conn, """SELECT schedule_model_selection('packonly', NULL, 'jsrc', 'kpacked', 'y', 'x',
        'kout', 'jmst2', fit_options => '{"num_iterations": 1}',
        preprocess_options => '{"num_partitions": 2, "random_state": 3}', key_column => 'id')""")
    try:
        assert pack_step(conn, "packonly") == "ok"
        n_buf = q(conn, "SELECT count(*) FROM kpacked")[0][0]
        add_rows(conn, 60, 61)
        assert pack_step(conn, "packonly") == "ok"
        assert q(conn, "SELECT count(*) FROM kpacked")[0][0] == n_buf + 1
        q(conn, "DROP TABLE IF EXISTS jfull, jfull_summary")
        q(conn, "SELECT training_preprocessor_dl('jsrc', 'jfull', 'y', 'x', NULL, 1.0, NULL, "
                "NULL, 2, 3)")
        np.testing.assert_array_equal(decoded_rows(conn, "kpacked"), decoded_rows(conn, "jfull"))
        # a class the packed table does not have: everything is packed again
        q(conn, "INSERT INTO jsrc VALUES (61, ARRAY[1, 2, 3, 4]::real[], 7)")
        q(conn, "DROP TABLE IF EXISTS jfull, jfull_summary")
        q(conn, "SELECT training_preprocessor_dl('jsrc', 'jfull', 'y', 'x', NULL, 1.0, NULL, "
                "NULL, 2, 3)")
        packed = q(conn, "SELECT __dist_key__, buffer_id, x, y FROM kpacked ORDER BY buffer_id")

        def staged() -> None:
            (stage,) = [t for t in staging_tables(conn) if t.endswith("_repack")]
            assert q(conn, f"SELECT y_class_values, num_rows FROM {stage}_summary")[0] == \
                ([0, 1, 2, 7], 62)
            # a full repack of the same rows with the same seed: the same buffers
            assert q(conn, f"SELECT __dist_key__, buffer_id, x, y FROM {stage} "
                           "ORDER BY buffer_id") == \
                q(conn, "SELECT __dist_key__, buffer_id, x, y FROM jfull ORDER BY buffer_id")

        assert pack_step(conn, "packonly", staged) == "ok"
        # not published: the packed table and the job's high-water mark are as they were
        assert q(conn, "SELECT __dist_key__, buffer_id, x, y FROM kpacked "
                       "ORDER BY buffer_id") == packed
        assert [r["new_rows"] for r in runs(conn, "packonly")] == [60, 1, 62]
        assert [r["rows_trained"] for r in runs(conn, "packonly")] == [None] * 3
        assert q(conn, "SELECT packed_through, packed_rows FROM cerebro_db.jobs "
                       "WHERE job_name = 'packonly'")[0] == ("60", 61)
        assert staging_tables(conn) == []
    finally:
        q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name = 'packonly'")
        q(conn, "DROP TABLE IF EXISTS jsrc, jmst2, kpacked, kpacked_summary, jfull, "
                "jfull_summary CASCADE")


def test_an_automl_job_publishes_the_best_configuration(session_conn, dbname):
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS jsrc, jarch CASCADE")
    q(conn, "CREATE TABLE jsrc (id integer PRIMARY KEY, x real[], y integer)")
    add_rows(conn, 0, 120)
    q(conn, "SELECT load_keras_model('jarch', %s)", (mlp_json(inputs=4, outputs=3),))
    import json

    opts = {"model_arch_table": "jarch", "model_id_list": [1],
            "compile_params_grid": "{'loss': ['categorical_crossentropy'], "
            "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}], "
            "'metrics': ['accuracy']}",
            "fit_params_grid": "{'batch_size': [16]}", "automl_method": "grid",
            "automl_params": "num_iterations=1", "random_state": 2}
    q(conn, "SELECT schedule_model_selection('tuned', NULL, 'jsrc', 'apacked', 'y', 'x', "
            "'aout', 'amst', method => 'automl', fit_options => %s, "
            "preprocess_options => '{\"num_partitions\": 2}')", (json.dumps(opts),))
    try:
        q(conn, "CALL run_model_selection_job('tuned')")
        (r,) = runs(conn, "tuned")
        assert r["status"] == "succeeded", r["message"]
        assert q(conn, "SELECT count(*) FROM aout_info")[0][0] == 2
        best = q(conn, "SELECT mst_key, compile_params FROM aout_info "
                       "ORDER BY training_loss_final LIMIT 1")[0]
        assert r["best_mst_key"] == best[0] and best[1] in r["best_config"]
        assert q(conn, "SELECT count(*) FROM amst")[0][0] == 1
        assert q(conn, "SELECT model_selection_table FROM aout_summary")[0][0] == "amst"
        assert q(conn, "SELECT model_output_table, model_selection_table FROM cerebro_db.fits "
                       "WHERE fit_id = %s", (r["fit_id"],))[0] == ("aout", "amst")
        assert staging_tables(conn) == []
        # one packing seed, drawn when the job was defined: a run on unchanged data trains
        # the same models (a seed drawn per run gave another model every run)
        seed = q(conn, "SELECT (preprocess_options->>'random_state')::int FROM cerebro_db.jobs "
                       "WHERE job_name = 'tuned'")[0][0]
        assert seed is not None
        assert q(conn, "SELECT random_state FROM apacked_summary")[0][0] == seed
        first = q(conn, "SELECT mst_key, training_loss_final FROM aout_info ORDER BY 1")
        q(conn, "CALL run_model_selection_job('tuned')")
        assert runs(conn, "tuned")[-1]["status"] == "succeeded"
        assert q(conn, "SELECT mst_key, training_loss_final FROM aout_info ORDER BY 1") == first
        r = runs(conn, "tuned")[-1]
        # the AutoML timeline of the job's fit: a bar per training unit, a mark per decision
        from cerebro_db.client import Client

        from ..helpers import server_params

        p = server_params()
        c = Client(f"postgresql://{p['user']}@/{dbname}?host={p['host']}&port={p['port']}")
        fig = c.plot_automl(r["fit_id"])
        (ax,) = fig.axes
        units, decisions = c.units(r["fit_id"]), c.automl_decisions(r["fit_id"])
        assert len(decisions) >= 2 and set(decisions["decision"]) >= {"launch"}
        assert len([b for b in ax.patches if (b.get_gid() or "").startswith("trial:")]) == \
            (units["kind"] == "train").sum()
        assert {ln.get_gid() for ln in ax.get_lines() if ln.get_gid()} == \
            {f"decision:{d}" for d in decisions["decision_id"]}
    finally:
        q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name = 'tuned'")
        q(conn, "DROP TABLE IF EXISTS jsrc, jarch, apacked, apacked_summary, aout, aout_info, "
                "aout_summary, amst CASCADE")


def test_names_half_dropped_packed_tables_and_steps_that_fail_in_turn(session_conn):
    """Outside passes: a job whose packed table was another job's output replaced that
    job's models; a packed table dropped by hand (its summary kept) failed every later run;
    a pack attempt that failed after a training failure left the staged repack behind; an
    attempt that found nothing new to append recorded 0 new rows."""
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS rsrc, rarch, rmst, rmst_summary CASCADE")
    q(conn, "CREATE TABLE rsrc (id integer PRIMARY KEY, x real[], y integer)")
    q(conn, "INSERT INTO rsrc SELECT g, ARRAY[sin(g), cos(g), sin(2 * g), (g % 7) / 7.0]"
            "::real[], g % 3 FROM generate_series(0, 119) g")
    q(conn, "SELECT load_keras_model('rarch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('rarch', 'rmst', ARRAY[1], ARRAY["
            "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
            "metrics=['accuracy']$$], ARRAY['batch_size=16'])")
    sched = ("SELECT schedule_model_selection(%s, NULL, 'rsrc', %s, 'y', 'x', %s, 'rmst', "
             """fit_options => '{"num_iterations": 1}', preprocess_options => """
             """'{"num_partitions": 2}', key_column => %s, retries => 1, """
             "retry_delay => '0 seconds')")
    step = "SELECT cerebro_db.__job_step(%s, %s, %s)"
    try:
        q(conn, sched, ("ra", "rpk", "rout", None))
        q(conn, sched, ("rk", "rkpk", "rkout", "id"))
        for args, said in ((("rb", "rout", "rbout", None), 'job "ra" already writes'),
                           (("rb", "public.rpk_summary", "rbout", None), 'job "ra" already'),
                           (("rb", "rbout_info", "rbout", None), "twice")):
            e = error_of(conn, sched, args)
            assert e.pgcode == "42P07" and said in e.pgerror, (args, e.pgerror)
        q(conn, "CALL run_model_selection_job('ra')")
        q(conn, "CALL run_model_selection_job('rk')")
        # the packed table dropped by hand, its summary kept: packed again into the name
        q(conn, "DROP TABLE rpk")
        q(conn, "CALL run_model_selection_job('ra')")
        r = runs(conn, "ra")[-1]
        assert (r["status"], r["new_rows"], r["rows_trained"]) == ("succeeded", 120, 120), r
        assert q(conn, "SELECT num_rows FROM rpk_summary")[0][0] == 120
        # attempt 1 stages a repack and its training fails; attempt 2's pack fails: the end
        # step drops what attempt 1 staged
        run = q(conn, step, ("ra", None, "begin"))[0][0]
        assert q(conn, step, ("ra", run, "pack")) == [("ok",)]
        assert [t for t in staging_tables(conn) if t.endswith("_repack")]
        q(conn, "ALTER TABLE rmst RENAME TO rmst_away")
        assert q(conn, step, ("ra", run, "train")) == [("retry",)]
        q(conn, "ALTER TABLE rsrc RENAME TO rsrc_away")
        assert q(conn, step, ("ra", run, "pack")) == [("failed",)]
        q(conn, "ALTER TABLE rsrc_away RENAME TO rsrc")
        q(conn, "ALTER TABLE rmst_away RENAME TO rmst")
        assert q(conn, step, ("ra", run, "end"))[0][0].startswith("failed")
        assert staging_tables(conn) == []
        assert runs(conn, "ra")[-1]["rows_trained"] is None
        # ten new rows appended by attempt 1, whose training fails; attempt 2 appends none
        q(conn, "INSERT INTO rsrc SELECT g, ARRAY[sin(g), cos(g), sin(2 * g), (g % 7) / 7.0]"
                "::real[], g % 3 FROM generate_series(120, 129) g")
        run = q(conn, step, ("rk", None, "begin"))[0][0]
        assert q(conn, step, ("rk", run, "pack")) == [("ok",)]
        q(conn, "ALTER TABLE rmst RENAME TO rmst_away")
        assert q(conn, step, ("rk", run, "train")) == [("retry",)]
        q(conn, "ALTER TABLE rmst_away RENAME TO rmst")
        assert q(conn, step, ("rk", run, "pack")) == [("ok",)]
        assert q(conn, step, ("rk", run, "train")) == [("ok",)]
        assert q(conn, step, ("rk", run, "end")) == [("ok",)]
        r = runs(conn, "rk")[-1]
        assert (r["status"], r["new_rows"], r["rows_trained"]) == ("succeeded", 10, 130), r
    finally:
        q(conn, "DELETE FROM cerebro_db.jobs WHERE job_name IN ('ra', 'rk', 'rb')")
        q(conn, "DROP TABLE IF EXISTS rsrc, rsrc_away, rarch, rmst, rmst_away, rmst_summary, "
                "rpk, rpk_summary, rout, rout_summary, rout_info, rkpk, rkpk_summary, rkout, "
                "rkout_summary, rkout_info CASCADE")
        for t in staging_tables(conn):
            q(conn, f'DROP TABLE IF EXISTS "{t}" CASCADE')
