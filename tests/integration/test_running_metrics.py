"""``cerebro_db.training_metrics = 'running'``: a fit's training metrics are the means its
training units measured as they trained (what Keras' ``fit`` reports), not a forward pass
of each evaluated epoch's model over the training rows (MADlib's, the default). Against the
real server: the evaluation units then compute the validation metrics only (none without a
validation table), the models are bitwise those of the default, the ``_info`` series are
the row-weighted means of the logged training units, a bad value is refused before any
work, and a resumed fit keeps the setting it started with."""
from __future__ import annotations

import math

import pytest

from ..helpers import error_of, q, worker_sessions_gone
from .test_faults import (  # noqa: F401 - fl: a fixture
    CONFIGS,
    ITERATIONS,
    PARTITIONS,
    SEED,
    fail_by_retry_bound,
    fl,
    last_fit,
)

psycopg2 = pytest.importorskip("psycopg2")

pytestmark = pytest.mark.db


def fit(conn, out, setting="running", validation="fl_v"):
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    q(conn, "SELECT set_config('cerebro_db.training_metrics', %s, false)", (setting,))
    try:
        q(conn, "SELECT madlib_keras_fit_multiple_model('fl_p', %s, 'fl_mst', %s, FALSE, %s, 1, "
                "FALSE, NULL, NULL, TRUE, 'mop', NULL, %s)", (out, ITERATIONS, validation, SEED))
    finally:
        q(conn, "RESET cerebro_db.training_metrics")
    return last_fit(conn, out)


def kinds(conn, fit_id):
    return q(conn, "SELECT kind, count(*), count(DISTINCT (mst_key, epoch, partition)) FROM "
                   "cerebro_db.units WHERE fit_id = %s GROUP BY 1 ORDER BY 1", (fit_id,))


def weights(conn, out):
    return {k: bytes(w) for k, w in q(conn, f"SELECT mst_key, model_weights FROM {out}")}


def info(conn, out):
    return {r[0]: r[1:] for r in q(
        conn, f"SELECT mst_key, training_loss, training_metrics_all, validation_loss, "
              f"training_metrics_final, training_loss_final FROM {out}_info")}


def running_means(conn, fit_id):
    """mst_key -> per epoch (loss, [metrics]): the row-weighted means of its training units."""
    rows = q(conn, "SELECT mst_key, epoch, loss, rows, metrics FROM cerebro_db.units "
                   "WHERE fit_id = %s AND kind = 'train' ORDER BY mst_key, epoch", (fit_id,))
    by: dict[int, dict[int, list]] = {}
    for k, e, loss, n, m in rows:
        by.setdefault(k, {}).setdefault(e, []).append((loss, n, m))
    out = {}
    for k, epochs in by.items():
        out[k] = []
        for e in sorted(epochs):
            parts = epochs[e]
            total = sum(n for _, n, _ in parts)
            loss = math.fsum(v * n for v, n, _ in parts) / total
            mets = [math.fsum(m[i] * n for _, n, m in parts) / total
                    for i in range(len(parts[0][2]))]
            out[k].append((loss, mets))
    return out


@pytest.fixture(scope="module")
def running(fl):  # noqa: F811 - the fixture imported above
    """A running-metrics fit with validation: fit_id and its weights."""
    del fl.notices[:]
    fit_id = fit(fl, "rm_run")
    said = list(fl.notices)
    yield fit_id, weights(fl, "rm_run"), said
    q(fl, "DROP TABLE IF EXISTS rm_run, rm_run_info, rm_run_summary")


def test_running_metrics_are_the_training_units_and_train_the_same_models(fl, running,  # noqa: F811
                                                                           tables):
    tables += ["rm_eval", "rm_eval_info"]
    evaluated = fit(fl, "rm_eval", setting="evaluated")
    fit_id, w, said = running
    n = CONFIGS * ITERATIONS * PARTITIONS
    assert kinds(fl, evaluated) == [("eval_train", n, n), ("eval_valid", n, n), ("train", n, n)]
    # the evaluation units compute the validation metrics only
    assert kinds(fl, fit_id) == [("eval_valid", n, n), ("train", n, n)]
    for f, value in ((evaluated, "evaluated"), (fit_id, "running")):
        assert q(fl, "SELECT options->>'training_metrics' FROM cerebro_db.fits WHERE "
                     "fit_id = %s", (f,)) == [(value,)]
    # the same models, bitwise: training is untouched
    assert w == weights(fl, "rm_eval")
    ev, run = info(fl, "rm_eval"), info(fl, "rm_run")
    means = running_means(fl, fit_id)
    assert sorted(run) == sorted(means) == [1, 2]
    for k in run:
        t_loss, t_all, v_loss, t_final, t_loss_final = run[k]
        assert len(t_loss) == ITERATIONS and len(t_all) == ITERATIONS
        for e, (loss, mets) in enumerate(means[k]):
            assert t_loss[e] == pytest.approx(loss, rel=1e-12, abs=1e-12)
            assert t_all[e] == pytest.approx(mets, rel=1e-12, abs=1e-12)
        assert t_final == pytest.approx(means[k][-1][1][0], rel=1e-12)
        assert t_loss_final == pytest.approx(means[k][-1][0], rel=1e-12)
        # validation: the same models evaluated the same way
        assert v_loss == pytest.approx(ev[k][2], rel=1e-9, abs=1e-12)
        # and the training series really are another measure than the evaluated one
        assert any(abs(a - b) > 1e-6 for a, b in zip(t_loss, ev[k][0]))
    assert any("running training metrics" in m for m in said), said


def test_without_validation_a_running_fit_has_no_evaluation_units(fl, tables):  # noqa: F811
    tables += ["rm_noval", "rm_noval_info"]
    fit_id = fit(fl, "rm_noval", validation=None)
    n = CONFIGS * ITERATIONS * PARTITIONS
    assert kinds(fl, fit_id) == [("train", n, n)]
    got, means = info(fl, "rm_noval"), running_means(fl, fit_id)
    for k in got:
        assert got[k][0] == pytest.approx([m[0] for m in means[k]], rel=1e-12)
        assert got[k][2] is None  # no validation_loss
    assert q(fl, "SELECT status, units_done, total_units FROM cerebro_db.fit_progress "
                 "WHERE fit_id = %s", (fit_id,)) == [("done", n, n)]
    # madlib_keras_fit too: its _summary carries the series
    q(fl, "DROP TABLE IF EXISTS rm_one, rm_one_summary")
    tables += ["rm_one"]
    q(fl, "SET cerebro_db.training_metrics = 'running'")
    try:
        cp = "loss='categorical_crossentropy', optimizer='Adam', metrics=['accuracy']"
        q(fl, "SELECT madlib_keras_fit('fl_p', 'rm_one', 'fl_arch', 1, %s, 'batch_size=50', "
              "2, FALSE, NULL, 1)", (cp,))
    finally:
        q(fl, "RESET cerebro_db.training_metrics")
    one = last_fit(fl, "rm_one")
    assert kinds(fl, one) == [("train", 2 * PARTITIONS, 2 * PARTITIONS)]
    loss, mets = q(fl, "SELECT training_loss, training_metrics FROM rm_one_summary")[0]
    m = running_means(fl, one)[1]
    assert loss == pytest.approx([x[0] for x in m], rel=1e-12)
    assert mets == pytest.approx([x[1][0] for x in m], rel=1e-12)


@pytest.mark.parametrize("value", ["sometimes", "running; DROP TABLE fl_p", " "])
def test_a_bad_setting_is_refused_before_any_work(fl, value):  # noqa: F811
    before = q(fl, "SELECT count(*) FROM cerebro_db.fits")[0][0]
    q(fl, "DROP TABLE IF EXISTS rm_bad, rm_bad_info, rm_bad_summary")
    q(fl, "SELECT set_config('cerebro_db.training_metrics', %s, false)", (value,))
    try:
        sql = ("SELECT madlib_keras_fit_multiple_model('fl_p', 'rm_bad', 'fl_mst', 1, FALSE, "
               "'fl_v', 1, FALSE, NULL, NULL, TRUE, 'mop', NULL, 1)")
        if value.strip():
            e = error_of(fl, sql)
            assert e.pgcode == "22023", e.pgerror
            assert "cerebro_db.training_metrics must be 'evaluated' or 'running'" in e.pgerror
            assert q(fl, "SELECT count(*) FROM cerebro_db.fits")[0][0] == before
            assert q(fl, "SELECT to_regclass('rm_bad')") == [(None,)]
        else:  # blank: the default
            q(fl, sql)
            fit_id = last_fit(fl, "rm_bad")
            assert q(fl, "SELECT options->>'training_metrics' FROM cerebro_db.fits WHERE "
                         "fit_id = %s", (fit_id,)) == [("evaluated",)]
    finally:
        q(fl, "RESET cerebro_db.training_metrics")
        q(fl, "DROP TABLE IF EXISTS rm_bad, rm_bad_info, rm_bad_summary")


def test_a_resumed_fit_keeps_its_running_metrics(fl, running, dbname, tables):  # noqa: F811
    """Failed mid-way (a unit's session lost twice with max_unit_retries = 1), then resumed
    with the setting back at its default: the fit goes on with running metrics, and its
    models and series equal the uninterrupted running fit's."""
    tables += ["rm_res", "rm_res_info"]
    e = fail_by_retry_bound(fl, dbname, lambda: fit(fl, "rm_res"))
    assert e.value.pgcode == "08006", e.value.pgerror
    fit_id = last_fit(fl, "rm_res")
    done = q(fl, "SELECT count(*) FROM cerebro_db.units WHERE fit_id = %s AND kind = 'train'",
             (fit_id,))[0][0]
    assert 0 < done < CONFIGS * ITERATIONS * PARTITIONS
    assert worker_sessions_gone(fl)
    q(fl, "SELECT madlib_keras_fit_resume(%s)", (fit_id,))
    n = CONFIGS * ITERATIONS * PARTITIONS
    assert kinds(fl, fit_id) == [("eval_valid", n, n), ("train", n, n)]
    base_w = running[1]
    assert weights(fl, "rm_res") == base_w
    got, base = info(fl, "rm_res"), info(fl, "rm_run")
    for k in base:
        assert got[k][0] == pytest.approx(base[k][0], rel=1e-12)  # training_loss
        for a, b in zip(got[k][1], base[k][1], strict=True):  # training_metrics_all
            assert a == pytest.approx(b, rel=1e-12)
        assert got[k][2] == pytest.approx(base[k][2], rel=1e-9)  # validation_loss


def test_the_clients_learning_curves_draw_the_running_training_loss(fl, running, dbname,  # noqa: F811
                                                                    tmp_path):
    from cerebro_db.client import Client

    from ..helpers import server_params

    p = server_params()
    client = Client(f"postgresql://{p['user']}@/{dbname}?host={p['host']}&port={p['port']}")
    fig = client.plot_curves(running[0], str(tmp_path / "c.png"))
    (ax,) = fig.axes
    lines = {ln.get_gid(): ln for ln in ax.get_lines()}
    for k, (t_loss, _, v_loss, *_) in info(fl, "rm_run").items():
        tr, va = lines[f"curve:{k}:train"], lines[f"curve:{k}:eval_valid"]
        assert list(tr.get_xdata()) == list(range(1, ITERATIONS + 1))
        assert list(tr.get_ydata()) == pytest.approx(t_loss, rel=1e-5)
        assert list(va.get_ydata()) == pytest.approx(v_loss, rel=1e-5)
    assert "curve:1:eval_train" not in lines
