"""cerebro_db.client against the embedded server: the SQL calls, the DataFrames against the
catalog, the progress bar from another connection, the pictures' artists, the CLI."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ..helpers import mlp_json, q, server_params

pytestmark = pytest.mark.db
CLI = str(Path(sys.executable).with_name("cerebro-db"))


@pytest.fixture(scope="module")
def url(dbname):
    p = server_params()
    return f"postgresql://{p['user']}@/{dbname}?host={p['host']}&port={p['port']}"


@pytest.fixture(scope="module")
def client(url):
    from cerebro_db.client import Client

    return Client(url)


@pytest.fixture(scope="module")
def fit(session_conn, client):
    """A fit of 2 configurations, 2 epochs on 2 partitions with validation, started through
    the client in one thread while the test watches it from another connection."""
    conn = session_conn
    q(conn, "DROP TABLE IF EXISTS csrc, cval, cp, cp_summary, cv, cv_summary, carch, cmst, "
            "cmst_summary, cout, cout_summary, cout_info, cgrid, cgrid_summary CASCADE")
    for t, lo, hi in (("csrc", 0, 400), ("cval", 400, 500)):
        q(conn, f"CREATE TABLE {t} AS SELECT g AS id, ARRAY[sin(g), cos(g), sin(2 * g), "
                f"(g % 7) / 7.0]::real[] AS x, (g % 3) AS y "
                f"FROM generate_series({lo}, {hi - 1}) g")
    q(conn, "SELECT training_preprocessor_dl('csrc', 'cp', 'y', 'x', NULL, 1.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('cval', 'cv', 'y', 'x', 'cp')")
    q(conn, "SELECT load_keras_model('carch', %s)", (mlp_json(inputs=4, outputs=3),))
    q(conn, "SELECT load_model_selection_table('carch', 'cmst', ARRAY[1], ARRAY["
            "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
            "metrics=['accuracy']$$, $$loss='categorical_crossentropy', "
            "optimizer='SGD(learning_rate=0.1)', metrics=['accuracy']$$], "
            "ARRAY['batch_size=16'])")
    before = q(conn, "SELECT coalesce(max(fit_id), 0) FROM cerebro_db.fits")[0][0]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.call("madlib_keras_fit_multiple_model", source_table="cp",
                        model_output_table="cout", model_selection_table="cmst",
                        num_iterations=2, validation_table="cv", random_state=11)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    fit_id = None
    import time

    deadline = time.monotonic() + 120
    while fit_id is None and time.monotonic() < deadline and t.is_alive():
        rows = q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE fit_id > %s", (before,))
        fit_id = rows[0][0] if rows else None
        time.sleep(0.1)
    out = io.StringIO()
    final = client.watch(fit_id, interval=0.3, out=out, timeout=300) if fit_id else None
    t.join()
    assert not errors, errors
    yield {"fit_id": fit_id, "watch": out.getvalue(), "final": final}
    q(conn, "DROP TABLE IF EXISTS csrc, cval, cp, cp_summary, cv, cv_summary, carch, cmst, "
            "cmst_summary, cout, cout_summary, cout_info, cgrid, cgrid_summary CASCADE")


def test_watch_shows_a_progress_bar_from_another_connection(fit):
    assert fit["final"]["status"] == "done"
    lines = fit["watch"].strip().splitlines()
    assert lines[-1].startswith(f"fit {fit['fit_id']} [") and lines[-1].endswith("done")
    assert " 8/8 units " in lines[-1]  # 2 configs x 2 epochs x 2 partitions
    assert "best validation loss " in lines[-1] and "ETA" in lines[-1]
    assert any("running" in ln for ln in lines)


def test_call_binds_values_and_reports_server_errors(client):
    from cerebro_db.client import ClientError

    assert "training_preprocessor_dl" in client.call("training_preprocessor_dl", message="help")
    with pytest.raises(ClientError) as e:
        client.call("madlib_keras_fit_multiple_model", source_table='"No\'such"',
                    model_output_table="x", model_selection_table="y", num_iterations=1)
    assert e.value.sqlstate == "42P01" and "No'such" in e.value.message
    with pytest.raises(ClientError):
        client.call("version(); DROP TABLE cp; --")


def test_dataframes_match_the_catalog(fit, client, session_conn):
    conn, fid = session_conn, fit["fit_id"]
    fits = client.fits()
    row = fits[fits["fit_id"] == fid].iloc[0]
    cat = q(conn, "SELECT kind, status, model_output_table, total_units, num_iterations, "
                  "started_at, ended_at FROM cerebro_db.fits WHERE fit_id = %s", (fid,))[0]
    assert (row["kind"], row["status"], row["model_output_table"], row["total_units"],
            row["num_iterations"]) == cat[:5]
    assert row["started_at"] == cat[5] and row["ended_at"] == cat[6]
    assert row["units_done"] == 8 and row["percent"] == 100
    assert client.fits(status="done", limit=1)["fit_id"].tolist() == [fid]

    units = client.units(fid)
    want = q(conn, "SELECT unit_id, mst_key, epoch, partition, worker, kind, started_at, "
                   "ended_at, rows, loss FROM cerebro_db.units WHERE fit_id = %s "
                   "ORDER BY started_at, unit_id", (fid,))
    cols = ["unit_id", "mst_key", "epoch", "partition", "worker", "kind", "started_at",
            "ended_at", "rows", "loss"]
    assert [tuple(r) for r in units[cols].itertuples(index=False)] == want
    assert set(units["kind"]) == {"train", "eval_train", "eval_valid"}

    info = client.info("cout")
    want = q(conn, "SELECT mst_key, training_loss_final, validation_loss_final, "
                   "validation_loss FROM cout_info ORDER BY mst_key")
    assert [(r.mst_key, r.training_loss_final, r.validation_loss_final, list(r.validation_loss))
            for r in info.itertuples()] == [tuple(w) for w in want]
    assert client.summary("cout")["fit_id"] == fid
    cfg = client.configs(fid)
    assert cfg["mst_key"].tolist() == [1, 2] and cfg["epochs_done"].tolist() == [2, 2]
    w = client.workers(fid)
    assert sorted(w["worker"]) == [0, 1] and set(w["status"]) == {"closed"}
    assert client.automl_trials(fid).empty and client.automl_decisions(fid).empty
    assert list(client.jobs().columns)[:3] == ["job_id", "job_name", "owner"]


def test_gantt_has_one_bar_per_unit_at_the_logged_times(fit, client, tmp_path):
    units = client.units(fit["fit_id"])
    path = tmp_path / "g.png"
    fig = client.plot_gantt(fit["fit_id"], str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (ax,) = fig.axes
    bars = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("unit:")}
    assert len(bars) == len(units) == len(ax.patches)
    t0 = units["started_at"].min()
    workers = sorted(units["worker"].unique())
    for u in units.itertuples():
        b = bars[f"unit:{u.unit_id}"]
        assert b.get_x() == pytest.approx((u.started_at - t0).total_seconds(), abs=1e-6)
        assert b.get_width() == pytest.approx((u.ended_at - u.started_at).total_seconds(),
                                              abs=1e-6)
        assert b.get_y() + b.get_height() / 2 == pytest.approx(workers.index(u.worker))
        assert b.get_height() == pytest.approx(0.8 if u.kind == "train" else 0.35)
    # one arrow per hop: a configuration's next training unit on another worker
    train = units[units["kind"] == "train"].sort_values(["started_at", "unit_id"])
    hops = sum((g["worker"].diff().fillna(0) != 0).sum() for _, g in train.groupby("mst_key"))
    arrows = [c for c in ax.get_children() if (c.get_gid() or "").startswith("hop:")]
    assert len(arrows) == hops


def test_learning_curves_are_the_info_tables_losses(fit, client, tmp_path):
    fig = client.plot_curves(fit["fit_id"], str(tmp_path / "c.png"))
    (ax,) = fig.axes
    lines = {ln.get_gid(): ln for ln in ax.get_lines()}
    info = client.info("cout")
    for r in info.itertuples():
        tr, va = lines[f"curve:{r.mst_key}:eval_train"], lines[f"curve:{r.mst_key}:eval_valid"]
        assert list(tr.get_xdata()) == list(r.metrics_iters)
        assert list(tr.get_ydata()) == pytest.approx(list(r.training_loss), rel=1e-5)
        assert list(va.get_ydata()) == pytest.approx(list(r.validation_loss), rel=1e-5)


def cli(url: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, "--url", url, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_cli_output_and_exit_codes(fit, url, tmp_path):
    fid = fit["fit_id"]
    r = cli(url, "fits")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header.split()[:3] == ["fit_id", "kind", "status"]
    assert any(ln.split()[:3] == [str(fid), "fit_multiple", "done"] for ln in rows)
    r = cli(url, "fits", "--format", "json", "--status", "done")
    assert r.returncode == 0 and fid in [f["fit_id"] for f in json.loads(r.stdout)]
    r = cli(url, "watch", str(fid), "--interval", "0.1")
    assert r.returncode == 0 and r.stdout.strip().endswith("done") and "8/8 units" in r.stdout
    assert cli(url, "watch", "987654").returncode == 4
    out = tmp_path / "g.png"
    r = cli(url, "plot", "gantt", str(fid), "-o", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out)
    assert out.read_bytes()[:4] == b"\x89PNG"
    r = cli(url, "plot", "curves", str(fid), "-o", str(tmp_path / "c.png"))
    assert r.returncode == 0, r.stderr
    r = cli(url, "workers", str(fid), "--format", "csv")
    assert r.returncode == 0 and r.stdout.startswith("fit_id,worker,partitions,status")
    # resizing a fit that has ended is the server's error: exit 1 with its SQLSTATE
    r = cli(url, "workers", str(fid), "3")
    assert r.returncode == 1 and "SQLSTATE" in r.stderr
    r = cli(url, "jobs")
    assert r.returncode == 0
    assert cli(url, "jobs", "no_such_job").returncode == 4
    assert cli(url, "plot", "pie", str(fid)).returncode == 2
    assert cli(url, "bogus").returncode == 2
    for verb in ("fits", "watch", "plot", "cancel", "resume", "workers", "jobs"):
        r = cli(url, verb, "--help")
        assert r.returncode == 0 and "exit codes:" in r.stdout, verb
    bad = "postgresql://nobody@127.0.0.1:1/x"
    r = subprocess.run([CLI, "--url", bad, "fits"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 5 and "cannot connect" in r.stderr


def test_client_on_an_engine_a_connection_or_the_pg_variables(fit, url, dbname):
    import os

    import sqlalchemy as sa

    from cerebro_db.client import Client

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://"))
    try:
        assert fit["fit_id"] in Client(engine).fits()["fit_id"].tolist()
        with engine.connect() as conn:  # the caller's connection and transaction
            c = Client(conn)
            assert c.progress(fit["fit_id"])["status"] == "done"
            assert c.call("cerebro_db_version") == c.df("SELECT cerebro_db_version() AS v")["v"][0]
            assert conn.in_transaction()
    finally:
        engine.dispose()
    p = server_params()
    env = {**os.environ, "PGHOST": p["host"], "PGPORT": str(p["port"]), "PGUSER": p["user"],
           "PGDATABASE": dbname}
    r = subprocess.run([CLI, "fits", "--format", "csv"], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.startswith("fit_id,kind,status"), r.stderr


class _Steps:
    """Stands in for the ``time`` module of the client: each sleep of ``watch`` runs the
    next statement on the fit's row (what the coordinator would do meanwhile)."""

    def __init__(self, conn, fit_id: int, statements: list[str]) -> None:
        import time

        self.monotonic = time.monotonic
        self.conn, self.fit_id, self.left, self.sleeps = conn, fit_id, list(statements), 0

    def sleep(self, _seconds: float) -> None:
        self.sleeps += 1
        if self.left:
            q(self.conn, self.left.pop(0), (self.fit_id,))


def _watch_scripted(client, conn, monkeypatch, statements: list[str]):
    """``client.watch`` of a catalog row of a running fit whose coordinator is pid 0 (no
    backend: fit_progress shows it 'interrupted'; no fit runs), ``statements`` applied to
    the row one per sleep of the watch; returns its last row, its output and the steps."""
    from cerebro_db.client import core

    fid = q(conn, "INSERT INTO cerebro_db.fits (kind, source_table, model_output_table, "
                  "policy, num_partitions, num_iterations, metrics_compute_frequency, "
                  "random_state, total_units, coordinator_pid) VALUES ('fit', 's', 'o', "
                  "'mop', 1, 1, 1, 1, 1, 0) RETURNING fit_id")[0][0]
    steps = _Steps(conn, fid, statements)
    monkeypatch.setattr(core, "time", steps)
    out = io.StringIO()
    try:
        final = client.watch(fid, interval=0.01, out=out, timeout=60)
    finally:
        q(conn, "DELETE FROM cerebro_db.fits WHERE fit_id = %s", (fid,))
    return final, out.getvalue(), steps


def test_watch_does_not_end_on_one_reading_of_a_fit_as_interrupted(client, session_conn,
                                                                   monkeypatch):
    # the first sleep gives the fit a live coordinator (this session, older than the
    # fit's start), the second ends it
    live = ("UPDATE cerebro_db.fits SET coordinator_pid = pg_backend_pid(), started_at = "
            "clock_timestamp() WHERE fit_id = %s")
    done = ("UPDATE cerebro_db.fits SET status = 'done', ended_at = clock_timestamp() "
            "WHERE fit_id = %s")
    final, out, _ = _watch_scripted(client, session_conn, monkeypatch, [live, done])
    assert final["status"] == "done", out
    assert "interrupted" not in out and "running" in out


def test_watch_reports_a_fit_that_stays_interrupted(client, session_conn, monkeypatch):
    from cerebro_db.client import core

    final, out, steps = _watch_scripted(client, session_conn, monkeypatch, [])
    assert final["status"] == "interrupted" and out.strip().endswith("interrupted")
    assert steps.sleeps == core.INTERRUPTED_REREADS


def test_a_fit_id_the_server_cannot_read_is_a_client_error(client):
    from cerebro_db.client import ClientError

    for read in (client.watch, client.units, client.progress):
        with pytest.raises(ClientError) as e:
            read("1; DROP TABLE cp")
        assert e.value.sqlstate == "22P02", read
    with pytest.raises(ClientError) as e:
        client.watch(-1)
    assert e.value.sqlstate == "42704"


def test_bad_use_is_a_client_error_and_a_usage_exit(fit, client, url, tmp_path):
    """An outside pass got tracebacks, exit 1 and empty figures for these."""
    from cerebro_db.client import Client, ClientError

    fid = fit["fit_id"]
    for bind in ("garbage", "mysql://u@h/d"):
        with pytest.raises(ClientError, match="not a PostgreSQL URL"):
            Client(bind)
    with pytest.raises(ClientError) as e:
        client.info("x; DROP TABLE cp")
    assert e.value.sqlstate in ("22023", "42602")
    with pytest.raises(ClientError, match="num_workers must be an integer"):
        client.resize(fid, "x")
    with pytest.raises(ClientError) as e:
        client.plot_gantt(987654, str(tmp_path / "none.png"))
    assert e.value.sqlstate == "42704" and not (tmp_path / "none.png").exists()
    with pytest.raises(ClientError, match="is not an AutoML run"):
        client.plot_automl(fid, str(tmp_path / "a.png"))
    assert client.progress(fid)["best_mst_key"] in (1, 2)
    # an outside pass: these read as empty frames, a traceback and a TypeError
    for read in (client.units, client.configs, client.workers, client.automl_trials,
                 client.automl_decisions):
        with pytest.raises(ClientError) as e:
            read(987654)
        assert e.value.sqlstate == "42704", read
    with pytest.raises(ClientError, match="cannot write the picture to"):
        client.plot_gantt(fid, str(tmp_path / "no" / "such" / "g.png"))
    assert str(client.workers(fid)["pid"].dtype) in ("Int64", "int64")
    assert "madlib_keras_fit" in client.call("madlib_keras_fit", "help")
    client.call("generate_model_configs", "carch", "cgrid", [1],
                {"loss": ["categorical_crossentropy"], "metrics": ["accuracy"],
                 "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.01, 0.1]}]},
                {"batch_size": [8, 16], "shuffle": [True]}, search_type="grid")
    assert client.df("SELECT count(*) AS n, bool_and(fit_params LIKE '%%shuffle=True%%') "
                     "AS t FROM cgrid").iloc[0].tolist() == [4, True]
    # numpy values are numbers (their repr is a call the server refuses); NaN, NUL, a path
    # that is not one and a picture format we do not write are the caller's errors
    import numpy as np

    client.call("generate_model_configs", "carch", "cgrid", [1],
                {"loss": ["categorical_crossentropy"],
                 "optimizer_params_list": [{"optimizer": ["SGD"],
                                            "lr": list(np.logspace(-3, -1, 2))}]},
                {"batch_size": [np.int64(8)], "epochs": np.array([1])})
    assert client.df("SELECT count(*) AS n FROM cgrid")["n"][0] == 6
    with pytest.raises(ClientError) as e:
        client.call("generate_model_configs", "carch", "cgrid", [1],
                    {"loss": ["mse"], "optimizer_params_list": [{"lr": [float("nan")]}]},
                    {"batch_size": [8]})
    assert e.value.sqlstate == "22023" and "not a finite number" in e.value.message
    with pytest.raises(ClientError, match="NUL"):
        client.call("training_preprocessor_dl", "a\x00b")
    with pytest.raises(ClientError, match="must be a file name"):
        client.plot_gantt(fid, 5)
    with pytest.raises(ClientError, match="formats are png, svg, pdf"):
        client.plot_gantt(fid, str(tmp_path / "g.jpg"))
    client.plot_gantt(fid, tmp_path / "g.svg")
    assert b"<svg" in (tmp_path / "g.svg").read_bytes()[:500]
    for args in (["--url", "not-a-url", "fits"], ["--url", url, "--schema", "x;y", "fits"],
                 ["--url", url, "fits", "--limit", "-1"],
                 ["--url", url, "fits", "--limit", "99999999999999999999"],
                 ["--url", url, "watch", str(fid), "--interval", "-1"],
                 ["--url", url, "watch", str(fid), "--timeout", "nan"],
                 ["--url", url, "workers", str(fid), "99999999999"],
                 ["--url", url, "watch", "99999999999999999999"],
                 ["--url", url, "plot", "gantt", str(fid), "-o", "/no/such/dir/g.png"]):
        r = subprocess.run([CLI, *args], capture_output=True, text=True, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
    r = cli(url, "plot", "automl", str(fid), "-o", str(tmp_path / "a.png"))
    assert r.returncode == 1 and "not an AutoML run" in r.stderr
