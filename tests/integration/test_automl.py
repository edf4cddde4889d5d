"""madlib_keras_automl on the real server: each procedure end to end, the catalog of
decisions, reproducibility, and bad input leaving nothing behind."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cerebro_db.automl.hyperband import hyperband_schedule

from ..helpers import load_mnist_rows, mlp_json, q

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db

CGRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': "
         "['Adam'], 'lr': [0.0005, 0.05, 'log']}], 'metrics': ['accuracy']}")
FGRID = "{'batch_size': [32, 64]}"


@pytest.fixture(scope="module")
def am(session_conn):
    """600 MNIST training and 200 validation rows over 2 partitions; two MLPs."""
    conn = session_conn
    load_mnist_rows(conn, *(("am_train", 0, 600), ("am_test", 600, 800)))
    q(conn, "DROP TABLE IF EXISTS am_p, am_p_summary, am_v, am_v_summary, am_arch")
    q(conn, "SELECT training_preprocessor_dl('am_train', 'am_p', 'y', 'x', NULL, 255.0, NULL, "
            "NULL, 2, 3)")
    q(conn, "SELECT validation_preprocessor_dl('am_test', 'am_v', 'y', 'x', 'am_p')")
    q(conn, "SELECT load_keras_model('am_arch', %s)", (mlp_json(8),))
    q(conn, "SELECT load_keras_model('am_arch', %s)", (mlp_json(24),))
    return conn


def automl(conn, out, method, params, seed=11, validation="am_v", ids=(1, 2),
           cgrid=CGRID, fgrid=FGRID, freq=None, training_metrics=None):
    """One run; ``training_metrics``: ``cerebro_db.training_metrics`` for the call."""
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary, {out}_mst, "
            f"{out}_mst_summary")
    if training_metrics is not None:
        q(conn, "SELECT set_config('cerebro_db.training_metrics', %s, false)",
          (training_metrics,))
    try:
        q(conn, "SELECT madlib_keras_automl('am_p', %s, 'am_arch', %s, %s, %s, %s, %s, %s, %s, "
                "NULL, FALSE, %s, %s)",
          (out, out + "_mst", list(ids), cgrid, fgrid, method, params, seed, validation, freq))
    finally:
        if training_metrics is not None and not conn.closed:
            q(conn, "RESET cerebro_db.training_metrics")
    return q(conn, f"SELECT max(fit_id) FROM {out}_info")[0][0]


def info(conn, out, cols="*"):
    with conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM {out}_info ORDER BY mst_key")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def decisions(conn, fit_id):
    return q(conn, "SELECT decision, mst_key, target, reason FROM cerebro_db.automl_decisions "
                   "WHERE fit_id = %s ORDER BY seq", (fit_id,))


def best_by_validation(rows):
    scored = [(r["validation_loss_final"], r["mst_key"]) for r in rows
              if r["validation_loss_final"] is not None
              and not np.isnan(r["validation_loss_final"])]
    return min(scored)[1]


@pytest.fixture(scope="module")
def hb(am):
    """One Hyperband run (R=3, eta=3, seed 11) shared by the tests below; its fit_id."""
    return automl(am, "am_hb", "hyperband", "R=3, eta=3")


def test_hyperband_runs_the_brackets_diagonally(am, hb) -> None:
    fit_id = hb
    sched = hyperband_schedule(3, 3, 0)
    rows = info(am, "am_hb")
    first_round = [x for x in sched if x[1] == 0]
    assert len(rows) == sum(n for _, _, n, _ in first_round)  # every config launched once
    assert {r["s"] for r in rows} == {s for s, *_ in first_round}
    # the longest-trained trial of each bracket trained the bracket's last r_i epochs
    for s, i, n, r_i in sched:
        in_round = [r for r in rows if r["s"] == s and r["i"] >= i]
        assert len(in_round) == n
        assert all(max(r["metrics_iters"]) >= r_i for r in in_round)
    dec = decisions(am, fit_id)
    assert [d for d in dec if d[0] == "extend"], dec
    assert [d for d in dec if d[0] == "stop"], dec
    status = dict(q(am, "SELECT status, count(*) FROM cerebro_db.fits WHERE fit_id = %s "
                        "GROUP BY 1", (fit_id,)))
    assert status == {"done": 1}
    # the model selection table holds the best configuration by validation loss
    (best,) = q(am, "SELECT mst_key FROM am_hb_mst")
    assert best[0] == best_by_validation(rows)
    summ = q(am, "SELECT automl_method, automl_params, random_state FROM am_hb_summary")[0]
    assert summ == ("hyperband", "R=3, eta=3", "11")
    assert q(am, "SELECT (options->>'best_mst_key')::int FROM cerebro_db.fits "
                 "WHERE fit_id = %s", (fit_id,)) == [(best[0],)]
    assert q(am, "SELECT count(*) FROM am_hb")[0][0] == len(rows)


def test_hyperband_is_reproducible(am, hb) -> None:
    """Same seed, same configurations, same metrics."""
    automl(am, "am_hb2", "hyperband", "R=3, eta=3", seed=11)
    cols = "mst_key, compile_params, fit_params, validation_loss, training_loss, s, i"
    assert info(am, "am_hb", cols) == info(am, "am_hb2", cols)


def test_hyperopt_tpe_runs_num_configs(am) -> None:
    fit_id = automl(am, "am_ho", "hyperopt", "num_configs=4, num_iterations=1, algorithm=tpe")
    rows = info(am, "am_ho")
    assert len(rows) == 4
    assert all(r["metrics_iters"] == [1] for r in rows)
    assert len({(r["compile_params"], r["fit_params"], r["model_id"]) for r in rows}) == 4
    assert [d[0] for d in decisions(am, fit_id)].count("launch") == 4


def test_grid_and_random_are_one_shot(am) -> None:
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], "
             "'metrics': ['accuracy']}")
    automl(am, "am_grid", "grid", "num_iterations=1", ids=(1, 2), cgrid=cgrid)
    assert len(info(am, "am_grid")) == 4  # 2 models x 2 batch sizes
    automl(am, "am_rand", "random", "num_configs=3, num_iterations=1", validation=None)
    rows = info(am, "am_rand")
    assert len(rows) == 3 and all(r["validation_loss"] is None for r in rows)
    # without validation data the ranking is by training loss
    (best,) = q(am, "SELECT mst_key FROM am_rand_mst")[0]
    assert best == min((r["training_loss_final"], r["mst_key"]) for r in rows)[1]


def test_hyperband_schedule_table(am) -> None:
    q(am, "DROP TABLE IF EXISTS am_sched")
    q(am, "SELECT hyperband_schedule('am_sched', 81, 3)")
    got = q(am, "SELECT s, i, n_i, r_i FROM am_sched ORDER BY s DESC, i")
    assert [tuple(r) for r in got] == [tuple(r) for r in hyperband_schedule(81, 3, 0)]
    assert got[0] == (4, 0, 81, 1)


def tables(conn):
    return set(q(conn, "SELECT oid::regclass::text FROM pg_class WHERE relkind = 'r'"))


@pytest.mark.parametrize("args, sqlstate, fragment", [
    ({"method": "nosuch"}, "22023", "automl_method must be one of"),
    ({"params": "R=3, bogus=1"}, "22023", "bogus"),
    ({"params": "R=0"}, "22023", "R"),
    ({"ids": [7]}, "42704", "model_id 7"),
    ({"ids": []}, "22023", "model_id_list must not be empty"),
    ({"cgrid": "__import__('os').system('touch /tmp/pwned')"}, "22023", ""),
    ({"fgrid": "{'batch_size': [32], 'nonsense': [1]}"}, "22023", "nonsense"),
    ({"out": "am_bad; DROP TABLE am_p"}, "42602", ""),
    # every choice of the grid is checked, not only the one a run would draw first (an
    # outside pass saw an unknown loss fail in a worker)
    ({"cgrid": "{'loss': ['categorical_crossentropy', 'no_such_loss'], "
               "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.1, 'log']}],"
               " 'metrics': ['accuracy']}"}, "22023", "unknown loss 'no_such_loss'"),
    ({"cgrid": "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
               "[{'optimizer': ['Adam']}], 'metrics': ['accuracy', 'no_such_metric']}"},
     "22023", "unknown metric 'no_such_metric'"),
    # MADlib's hyperopt: "'metrics_compute_frequency' out of iteration range"
    ({"method": "hyperopt", "params": "num_configs=2, num_iterations=2", "freq": 3}, "22023",
     "metrics_compute_frequency must be between 1 and num_iterations of automl_params (2)"),
    ({"method": "random", "params": "num_configs=1, num_iterations=1", "freq": 2}, "22023",
     "metrics_compute_frequency must be between 1 and num_iterations"),
])
def test_bad_input_is_rejected_before_any_work(am, args, sqlstate, fragment) -> None:
    before = tables(am)
    fits_before = q(am, "SELECT count(*) FROM cerebro_db.fits")[0][0]
    call = {"out": "am_bad", "method": "hyperband", "params": "R=3", "ids": [1], "cgrid": CGRID,
                "fgrid": FGRID, "freq": None}
    call.update(args)
    with pytest.raises(psycopg2.Error) as e:
        q(am, "SELECT madlib_keras_automl('am_p', %s, 'am_arch', 'am_bad_mst', %s, %s, %s, "
              "%s, %s, 1, metrics_compute_frequency => %s)",
          (call["out"], call["ids"], call["cgrid"], call["fgrid"], call["method"],
           call["params"], call["freq"]))
    assert e.value.pgcode == sqlstate, e.value.pgerror
    assert fragment in e.value.pgerror
    assert tables(am) == before
    assert q(am, "SELECT count(*) FROM cerebro_db.fits")[0][0] == fits_before


def test_existing_selection_table_is_refused(am) -> None:
    q(am, "DROP TABLE IF EXISTS am_taken_mst; CREATE TABLE am_taken_mst (x int)")
    with pytest.raises(psycopg2.Error) as e:
        q(am, "SELECT madlib_keras_automl('am_p', 'am_taken', 'am_arch', 'am_taken_mst', "
              "ARRAY[1], %s, %s, 'random', 'num_configs=1, num_iterations=1')", (CGRID, FGRID))
    assert e.value.pgcode == "42P07"


def test_decisions_and_trials_are_visible_in_the_catalog(am, hb) -> None:
    fit_id = hb
    trials = q(am, "SELECT mst_key, status, target, last_epoch FROM cerebro_db.automl_trials "
                   "WHERE fit_id = %s ORDER BY mst_key", (fit_id,))
    assert trials and all(s in ("paused", "stopped") for _, s, _, _ in trials)
    assert all(e == t for _, s, t, e in trials if s == "paused")
    state = q(am, "SELECT method, state FROM cerebro_db.automl_state WHERE fit_id = %s",
              (fit_id,))[0]
    assert state[0] == "hyperband" and json.loads(json.dumps(state[1]))["tuner"] == "hyperband"


def test_asha_promotes_without_rung_barrier(am) -> None:
    fit_id = automl(am, "am_asha", "asha", "min_r=1, max_r=3, eta=3, max_configs=5")
    rows = info(am, "am_asha")
    assert len(rows) == 5 and {r["bracket"] for r in rows} == {0}
    promoted = [r for r in rows if r["rung"] == 1]
    assert promoted and all(max(r["metrics_iters"]) == 3 for r in promoted)
    assert all(max(r["metrics_iters"]) == 1 for r in rows if r["rung"] == 0)
    extends = [d for d in decisions(am, fit_id) if d[0] == "extend"]
    assert sorted(d[1] for d in extends) == sorted(r["mst_key"] for r in promoted)
    assert all(d[2] == 3 for d in extends)


def test_mltuner_forks_branches_and_frees_the_losers(am) -> None:
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam(learning_rate=0.001)'], "
             "'metrics': ['accuracy']}")
    fit_id = automl(am, "am_mlt", "mltuner", "num_iterations=3, num_branches=2, "
                    "search_steps=1, max_trial_epochs=1, max_retunes=1", ids=(1,),
                    cgrid=cgrid, fgrid="{'batch_size': [32]}")
    trials = q(am, "SELECT mst_key, parent, status FROM cerebro_db.automl_trials "
                   "WHERE fit_id = %s ORDER BY mst_key", (fit_id,))
    freed = {k for k, _, s in trials if s == "freed"}
    assert freed, trials
    rows = info(am, "am_mlt")
    assert rows and not freed & {r["mst_key"] for r in rows}
    assert all(r["learning_rate"] is not None and r["role"] for r in rows)
    # branches with other learning rates say so in their compile_params
    lrs = {r["learning_rate"] for r in rows}
    assert all(f"{r['learning_rate']:g}".rstrip("0") in r["compile_params"]
               or "learning_rate" in r["compile_params"] for r in rows), (lrs, rows)
    (states,) = q(am, "SELECT count(*) FROM cerebro_db.model_states WHERE fit_id = %s AND "
                      "mst_key = ANY(%s)", (fit_id, sorted(freed)))[0]
    assert states == 0


def test_output_in_a_missing_schema_is_refused_before_any_work(am) -> None:
    fits_before = q(am, "SELECT count(*) FROM cerebro_db.fits")[0][0]
    with pytest.raises(psycopg2.Error) as e:
        q(am, "SELECT madlib_keras_automl('am_p', 'nosuchschema.out', 'am_arch', 'am_x_mst', "
              "ARRAY[1], %s, %s, 'random', 'num_configs=1, num_iterations=1')", (CGRID, FGRID))
    assert e.value.pgcode == "3F000", e.value.pgerror
    with pytest.raises(psycopg2.Error) as e:
        q(am, "SELECT hyperband_schedule('nosuchschema.sched', 9)")
    assert e.value.pgcode == "3F000", e.value.pgerror
    assert q(am, "SELECT count(*) FROM cerebro_db.fits")[0][0] == fits_before


@pytest.mark.parametrize("source, cgrid, sqlstate", [
    ("am_missing", CGRID, "42P01"),      # no such source table
    ("am_train", CGRID, "42P01"),        # a raw table, not a packed one (no _summary)
    ("am_p", None, "22004"),             # NULL grid
])
def test_bad_source_or_null_grid(am, source, cgrid, sqlstate) -> None:
    before = tables(am)
    with pytest.raises(psycopg2.Error) as e:
        q(am, "SELECT madlib_keras_automl(%s, 'am_bad2', 'am_arch', 'am_bad2_mst', ARRAY[1], "
              "%s, %s, 'random', 'num_configs=1, num_iterations=1')", (source, cgrid, FGRID))
    assert e.value.pgcode == sqlstate, e.value.pgerror
    assert tables(am) == before


def kill_and_resume(am, dbname, out, method, params, **kw) -> int:
    """Run ``method`` in another session, terminate that session while a worker is inside a
    (lingering) epoch-2 unit, let the orphaned unit commit, then madlib_keras_fit_resume.
    Checks what every resumed run must satisfy; returns the fit_id."""
    import threading
    import time

    from ..helpers import connect

    c2 = connect(dbname)
    c2.autocommit = True
    pid = c2.get_backend_pid()
    # epoch-2 units linger, so the kill lands while a worker is inside one
    q(c2, "SELECT set_config('cerebro_db.test_hook', %s, false)",
      (json.dumps([{"point": "before_train", "epoch": 2, "seconds": 3}]),))
    errors: list[BaseException] = []

    def go() -> None:
        try:
            automl(c2, out, method, params, **kw)
        except BaseException as e:  # noqa: BLE001 - expected: the session is killed
            errors.append(e)

    n0 = q(am, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    t = threading.Thread(target=go, daemon=True)
    t.start()
    fit_id = None
    end = time.monotonic() + 300
    while time.monotonic() < end:
        r = q(am, "SELECT f.fit_id, count(u.*) FILTER (WHERE u.kind = 'train' AND u.epoch = 2) "
                  "FROM cerebro_db.fits f LEFT JOIN cerebro_db.units u USING (fit_id) "
                  "WHERE f.fit_id > %s AND f.model_output_table = %s GROUP BY 1", (n0, out))
        busy = q(am, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                     "'cerebro_db %%worker%%' AND state = 'active' AND query LIKE '%%, 2, %%'")
        if r and r[0][1] >= 1 and busy[0][0] >= 1:
            fit_id = r[0][0]
            break
        time.sleep(0.05)
    assert fit_id is not None, "the run never reached a lingering epoch-2 unit"
    before = q(am, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s", (fit_id,))[0][0]
    q(am, "SELECT pg_terminate_backend(%s)", (pid,))
    t.join(60)
    assert errors and not t.is_alive()
    # the orphaned worker finishes (and commits) its unit, then its session ends
    end = time.monotonic() + 60
    while q(am, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE "
                "'cerebro_db %%worker%%'")[0][0]:
        assert time.monotonic() < end
        time.sleep(0.1)
    assert q(am, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s",
             (fit_id,))[0][0] > before
    assert q(am, "SELECT status FROM cerebro_db.fit_progress WHERE fit_id = %s",
             (fit_id,))[0][0] == "interrupted"
    assert q(am, "SELECT (book->>'seq')::int FROM cerebro_db.automl_state "
                 "WHERE fit_id = %s", (fit_id,))[0][0] >= 1
    with pytest.raises(psycopg2.Error) as e:  # its outputs' names are taken
        q(am, f"CREATE TABLE {out}_mst (x int); SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    assert e.value.pgcode == "42P07"
    # its role may edit the saved state: a trial's target of 10**12 epochs was allocated
    # on resume, a malformed book answered XX000 (a red-team pass); each is 55000, and the
    # fit resumes once the state is put back
    book = q(am, "SELECT book::text FROM cerebro_db.automl_state WHERE fit_id = %s",
             (fit_id,))[0][0]
    for edit in ("jsonb_set(book, '{trials,0,target}', '1000000000000')",
                 "jsonb_set(book, '{trials}', '5')", "'{}'::jsonb"):
        q(am, f"UPDATE cerebro_db.automl_state SET book = {edit} WHERE fit_id = %s", (fit_id,))
        with pytest.raises(psycopg2.Error) as e:
            q(am, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
        assert e.value.pgcode == "55000", (edit, e.value.pgerror)
        assert "saved AutoML state is damaged" in e.value.pgerror, e.value.pgerror
        # the refused resume had claimed the fit: it is failed again, saying why
        assert q(am, "SELECT status, message LIKE '%%state is damaged%%' FROM "
                     "cerebro_db.fits WHERE fit_id = %s", (fit_id,)) == [("failed", True)]
        q(am, "UPDATE cerebro_db.automl_state SET book = %s WHERE fit_id = %s", (book, fit_id))
    del am.notices[:]
    q(am, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    said = " ".join(am.notices)
    m = re.search(r"\((\d+) of them reported to the procedure only now\)", said)
    assert m and int(m.group(1)) >= 1, said
    assert q(am, "SELECT status, resumes FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [("done", 4)]  # three refused attempts, then this one
    # every unit once, every decision once, every output trial in _info
    assert q(am, "SELECT count(*) = count(DISTINCT (mst_key, epoch, partition, kind)) FROM "
                 "cerebro_db.units WHERE fit_id = %s", (fit_id,))[0][0]
    seqs = [r[0] for r in q(am, "SELECT seq FROM cerebro_db.automl_decisions WHERE fit_id = %s "
                                "ORDER BY seq", (fit_id,))]
    assert seqs == list(range(1, len(seqs) + 1))
    kept = q(am, "SELECT mst_key FROM cerebro_db.automl_trials WHERE fit_id = %s AND status "
                 "<> 'freed' ORDER BY 1", (fit_id,))
    assert q(am, f"SELECT mst_key FROM {out}_info ORDER BY 1") == kept
    assert q(am, f"SELECT count(*) FROM {out}")[0][0] == len(kept)
    c2.close()
    return fit_id


def test_killed_hyperband_run_resumes_like_a_fit(am, hb, dbname, tables) -> None:
    """A Hyperband run killed mid-unit and resumed (an orphaned unit committed after the
    last saved step is reported on resume) is the uninterrupted run with the same seed
    (``hb``): the same trials, decisions and losses."""
    tables += ["am_res", "am_res_info", "am_res_mst"]
    fit_id = kill_and_resume(am, dbname, "am_res", "hyperband", "R=3, eta=3")
    assert sorted(decisions(am, fit_id)) == sorted(decisions(am, hb))
    got, want = info(am, "am_res"), info(am, "am_hb")
    assert [(r["mst_key"], r["s"], r["i"], r["metrics_iters"]) for r in got] == \
        [(r["mst_key"], r["s"], r["i"], r["metrics_iters"]) for r in want]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a["validation_loss"], b["validation_loss"], rtol=1e-5)
    assert q(am, "SELECT mst_key FROM am_res_mst") == q(am, "SELECT mst_key FROM am_hb_mst")


def test_killed_mltuner_run_resumes(am, dbname, tables) -> None:
    """MLtuner forks branches (state copies); killed and resumed, it finishes with one
    output lineage and a consistent catalog (its decisions depend on timing, so it is not
    compared with an uninterrupted run)."""
    tables += ["am_mlr", "am_mlr_info", "am_mlr_mst"]
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam(learning_rate=0.001)'], "
             "'metrics': ['accuracy']}")
    fit_id = kill_and_resume(am, dbname, "am_mlr", "mltuner", "num_iterations=3, "
                             "num_branches=2, search_steps=1, max_trial_epochs=1, max_retunes=1",
                             ids=(1,), cgrid=cgrid, fgrid="{'batch_size': [32]}")
    assert q(am, "SELECT count(*) FROM cerebro_db.automl_decisions WHERE fit_id = %s AND "
                 "decision = 'free'", (fit_id,))[0][0] >= 1
    assert q(am, "SELECT count(*) FROM am_mlr_info")[0][0] >= 1


def test_a_space_smaller_than_hyperbands_brackets_is_said(am) -> None:
    """R=3, eta=3 draws 3 + 2 configurations; a grid of 2 leaves the last bracket none (an
    outside pass saw that happen without a word)."""
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
             "[{'optimizer': ['Adam'], 'lr': [0.01]}], 'metrics': ['accuracy']}")
    del am.notices[:]
    automl(am, "am_short", "hyperband", "R=3, eta=3", ids=(1,), cgrid=cgrid,
           fgrid="{'batch_size': [32, 64]}")
    said = [n for n in am.notices if "the search space has 2 configurations" in n]
    assert len(said) == 1 and "fewer than the 5 the Hyperband brackets draw" in said[0]
    assert len(info(am, "am_short")) == 2
    del am.notices[:]
    automl(am, "am_short", "hyperband", "R=3, eta=3", ids=(1, 2), cgrid=cgrid,
           fgrid="{'batch_size': [32, 64, 128]}")
    assert not [n for n in am.notices if "the search space has" in n]


def test_a_call_without_automl_params_records_the_defaults(am) -> None:
    """MADlib's _summary names the parameters used, the defaults when the call gave none."""
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
             "[{'optimizer': ['Adam'], 'lr': [0.01]}], 'metrics': ['accuracy']}")
    automl(am, "am_dflt", "grid", None, ids=(1,), cgrid=cgrid, fgrid="{'batch_size': [64]}")
    assert q(am, "SELECT automl_params FROM am_dflt_summary") == [("num_iterations=5",)]


def unit_kinds(conn, fit_id):
    return [k for (k,) in q(conn, "SELECT DISTINCT kind FROM cerebro_db.units WHERE fit_id = %s "
                                  "ORDER BY 1", (fit_id,))]


def running_means(conn, fit_id, mst_key, epochs):
    """The row-weighted mean loss of ``mst_key``'s training units at each of ``epochs``."""
    rows = q(conn, "SELECT epoch, sum(loss * rows) / sum(rows) FROM cerebro_db.units WHERE "
                   "fit_id = %s AND mst_key = %s AND kind = 'train' GROUP BY 1", (fit_id, mst_key))
    by = dict(rows)
    return [by[e] for e in epochs]


def test_hyperband_with_running_training_metrics(am, hb) -> None:
    """``cerebro_db.training_metrics = 'running'`` with a validation table: the evaluation
    units compute the validation metrics only, the procedure decides exactly as with
    evaluated training metrics (it ranks by validation loss), the models are bitwise the
    same, and ``_info``'s training losses are the training units' running means."""
    del am.notices[:]
    fit_id = automl(am, "am_hbr", "hyperband", "R=3, eta=3", training_metrics="running")
    assert not [m for m in am.notices if "ignored" in m], am.notices
    assert unit_kinds(am, fit_id) == ["eval_valid", "train"]
    assert unit_kinds(am, hb) == ["eval_train", "eval_valid", "train"]
    assert q(am, "SELECT options->>'training_metrics' FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [("running",)]
    assert decisions(am, fit_id) == decisions(am, hb)
    got, want = info(am, "am_hbr"), info(am, "am_hb")
    assert [(r["mst_key"], r["s"], r["i"], r["metrics_iters"], r["validation_loss"])
            for r in got] == [(r["mst_key"], r["s"], r["i"], r["metrics_iters"],
                               r["validation_loss"]) for r in want]
    for r, w in zip(got, want):
        assert r["training_loss"] == pytest.approx(
            running_means(am, fit_id, r["mst_key"], r["metrics_iters"]), rel=1e-12)
        assert r["training_loss"] != pytest.approx(w["training_loss"], rel=1e-6)
    weights = "SELECT mst_key, model_weights FROM {} ORDER BY 1"
    assert [(k, bytes(w)) for k, w in q(am, weights.format("am_hbr"))] == \
        [(k, bytes(w)) for k, w in q(am, weights.format("am_hb"))]
    assert q(am, "SELECT mst_key FROM am_hbr_mst") == q(am, "SELECT mst_key FROM am_hb_mst")
    assert q(am, "SELECT metrics_compute_frequency FROM am_hbr_summary") == \
        q(am, "SELECT metrics_compute_frequency FROM am_hb_summary")


def test_killed_running_metrics_run_resumes_with_them(am, dbname, tables) -> None:
    """Killed mid-unit and resumed from a session whose setting is the default, a run with
    running training metrics goes on with them and ends as the uninterrupted one."""
    tables += ["am_rres", "am_rres_info", "am_rres_mst"]
    fit_id = kill_and_resume(am, dbname, "am_rres", "hyperband", "R=3, eta=3",
                             training_metrics="running")
    assert unit_kinds(am, fit_id) == ["eval_valid", "train"]
    if q(am, "SELECT to_regclass('am_hbr_info')") == [(None,)]:  # run alone
        automl(am, "am_hbr", "hyperband", "R=3, eta=3", training_metrics="running")
    base = q(am, "SELECT max(fit_id) FROM am_hbr_info")[0][0]
    assert sorted(decisions(am, fit_id)) == sorted(decisions(am, base))
    cols = "mst_key, metrics_iters, training_loss, validation_loss"
    for a, b in zip(info(am, "am_rres", cols), info(am, "am_hbr", cols), strict=True):
        assert (a["mst_key"], a["metrics_iters"]) == (b["mst_key"], b["metrics_iters"])
        np.testing.assert_allclose(a["training_loss"], b["training_loss"], rtol=1e-9)
        np.testing.assert_allclose(a["validation_loss"], b["validation_loss"], rtol=1e-5)


@pytest.mark.parametrize("method, params, validation, why", [
    ("grid", "num_iterations=1", None, "without a validation_table"),
    ("mltuner", "num_iterations=2, num_branches=1, search_steps=1, max_trial_epochs=1",
     "am_v", "MLtuner's convergence test"),
])
def test_running_training_metrics_are_ignored_where_the_procedure_needs_them(
        am, tables, method, params, validation, why) -> None:
    tables += ["am_rig", "am_rig_info", "am_rig_mst"]
    del am.notices[:]
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer': ['Adam'], "
             "'metrics': ['accuracy']}")
    fit_id = automl(am, "am_rig", method, params, validation=validation, ids=(1,), cgrid=cgrid,
                    fgrid="{'batch_size': [64]}", training_metrics="running")
    said = [m for m in am.notices if "= 'running' ignored" in m]
    assert len(said) == 1 and why in said[0], am.notices
    assert "eval_train" in unit_kinds(am, fit_id)
    assert q(am, "SELECT options->>'training_metrics' FROM cerebro_db.fits WHERE fit_id = %s",
             (fit_id,)) == [("evaluated",)]
