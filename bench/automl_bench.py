"""AutoML in PostgreSQL against Ray Tune: ASHA side by side, and MLtuner against a fixed grid.

    python bench/automl_bench.py [--budget SECONDS] [--rows N]

Fashion-MNIST (--rows training rows, --valid-rows validation rows from the test split), p = 2
partitions / worker sessions, results in bench/results/automl.md and automl_*.png.

Part 1, ASHA (as in section 6.3 of the Cerebro paper): the same search space (two MLPs of
different widths, Adam with a log-uniform learning rate, a batch size choice), the same
grace period / maximum epochs / reduction factor and the same wall-clock budget for

  cerebro_db  madlib_keras_automl(..., 'asha', 'min_r, max_r, eta, max_configs,
              time_budget') on model hopper parallelism, 2 worker sessions
  Ray Tune    ASHAScheduler, task parallel: 2 concurrent trials, each with its own copy of
              the data (tune.with_parameters), local ray.init(num_cpus=2)

reporting configurations explored, epochs trained, best validation accuracy and the best
validation accuracy so far over wall-clock time. The cerebro_db timeline is read from the
catalog: the eval_valid units of each trial (row-weighted mean over partitions) against
the fit's started_at.

Part 2, MLtuner: one MLP configuration; madlib_keras_automl(..., 'mltuner', ...) tuning the
learning rate, against madlib_keras_fit_multiple_model over a fixed grid of learning rates
for the same number of epochs; time to reach a target validation accuracy on the wall
clock of each call (from the fit's started_at).
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import connect

RESULTS = ROOT / "bench" / "results"
HIDDEN = (64, 512)
BATCH_SIZES = (64, 128, 256)
LR_RANGE = (1e-4, 1e-1)
GRID_LRS = (1e-4, 1e-3, 1e-2, 1e-1)
GRID_COLORS = ("C0", "C1", "C2", "C4")
MLT_HIDDEN = 512
MLT_BATCH = 128
COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
                f"[{{'optimizer': ['Adam'], 'lr': [{LR_RANGE[0]}, {LR_RANGE[1]}, 'log']}}], "
                "'metrics': ['accuracy']}")
FIT_GRID = "{'batch_size': [" + ", ".join(str(b) for b in BATCH_SIZES) + "]}"


def q(conn: Any, sql: str, args: Sequence[Any] | None = None) -> list[tuple] | None:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def arch_json(hidden: int) -> str:
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")]).to_json()


def arrays(rows: int, valid_rows: int) -> tuple[np.ndarray, ...]:
    """Raw Fashion-MNIST: the first ``rows`` training and ``valid_rows`` test examples."""
    from tooling.datasets import find_dataset_dir, load_split

    d = find_dataset_dir("fashion-mnist")
    x, y = load_split(d, "train")
    vx, vy = load_split(d, "t10k")
    return x[:rows], y[:rows], vx[:valid_rows], vy[:valid_rows]


def load(conn: Any, data: tuple[np.ndarray, ...]) -> None:
    """Tables bench_automl_{train,valid} by binary COPY, packed on 2 partitions, and the
    architecture table (model_id 1, 2: the two MLP widths)."""
    from tooling.datasets import copy_payload

    x, y, vx, vy = data
    for table, fx, fy in (("bench_automl_train", x, y), ("bench_automl_valid", vx, vy)):
        q(conn, f"DROP TABLE IF EXISTS {table}")
        q(conn, f"CREATE TABLE {table} (id integer, y integer, x real[])")
        with conn.cursor() as cur:
            cur.copy_expert(f"COPY {table} FROM STDIN (FORMAT binary)", io.BytesIO(
                copy_payload(np.arange(len(fy)), fy.astype(np.int32), fx)))
    q(conn, "DROP TABLE IF EXISTS bench_automl_p, bench_automl_p_summary, bench_automl_v, "
            "bench_automl_v_summary, bench_automl_arch")
    q(conn, "SELECT training_preprocessor_dl('bench_automl_train', 'bench_automl_p', 'y', 'x', "
            "NULL, 255.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('bench_automl_valid', 'bench_automl_v', 'y', "
            "'x', 'bench_automl_p')")
    for h in HIDDEN:
        q(conn, "SELECT load_keras_model('bench_automl_arch', %s)", (arch_json(h),))


def drop_outputs(conn: Any, out: str) -> None:
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary, {out}_mst, "
            f"{out}_mst_summary")


def fit_times(conn: Any, fit_id: int) -> tuple[float, float]:
    """(started_at, ended_at) of a fit as epoch seconds."""
    r = q(conn, "SELECT extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)"
                "::float8 FROM cerebro_db.fits WHERE fit_id = %s", (fit_id,))
    return r[0][0], r[0][1]


def eval_points(conn: Any, fit_id: int) -> list[tuple[int, int, float, float]]:
    """(mst_key, epoch, seconds since the fit started, validation accuracy) of every
    evaluated epoch: accuracy is the row-weighted mean over the partitions' eval_valid
    units, the time that of the last of them."""
    rows = q(conn, """
        SELECT u.mst_key, u.epoch,
               extract(epoch FROM max(u.ended_at) - f.started_at)::float8,
               sum(u.metrics[1] * u.rows) / sum(u.rows)
          FROM cerebro_db.units u JOIN cerebro_db.fits f USING (fit_id)
         WHERE u.fit_id = %s AND u.kind = 'eval_valid'
         GROUP BY u.mst_key, u.epoch, f.started_at, f.num_partitions
        HAVING count(*) = f.num_partitions
         ORDER BY 3""", (fit_id,))
    return [(int(k), int(e), float(t), float(a)) for k, e, t, a in rows or []]


def epochs_done(conn: Any, fit_id: int) -> list[float]:
    """Seconds since the fit started at which each (trial, epoch) finished training."""
    rows = q(conn, """
        SELECT extract(epoch FROM max(u.ended_at) - f.started_at)::float8
          FROM cerebro_db.units u JOIN cerebro_db.fits f USING (fit_id)
         WHERE u.fit_id = %s AND u.kind = 'train'
         GROUP BY u.mst_key, u.epoch, f.started_at, f.num_partitions
        HAVING count(*) = f.num_partitions""", (fit_id,))
    return sorted(float(r[0]) for r in rows or [])


def trained_at(conn: Any, fit_id: int) -> dict[tuple[int, int], float]:
    """(mst_key, epoch) -> seconds since the fit started at which that epoch's training
    units (all partitions) had finished."""
    rows = q(conn, """
        SELECT u.mst_key, u.epoch, extract(epoch FROM max(u.ended_at) - f.started_at)::float8
          FROM cerebro_db.units u JOIN cerebro_db.fits f USING (fit_id)
         WHERE u.fit_id = %s AND u.kind = 'train'
         GROUP BY u.mst_key, u.epoch, f.started_at, f.num_partitions
        HAVING count(*) = f.num_partitions""", (fit_id,))
    return {(int(k), int(e)): float(t) for k, e, t in rows or []}


def unit_seconds(conn: Any, fit_id: int) -> dict[str, float]:
    """Worker seconds by unit kind; per training epoch of a trial (units of all partitions,
    leaving out each worker's first unit, which imports TensorFlow and reads its
    partition): mean seconds of the whole units, of Keras training only, of state load and
    save; and the mean seconds of those first units."""
    rows = q(conn, """
        SELECT kind, worker, extract(epoch FROM ended_at - started_at)::float8,
               seconds_load, seconds_run, seconds_save
          FROM cerebro_db.units WHERE fit_id = %s ORDER BY started_at""", (fit_id,)) or []
    parts = q(conn, "SELECT num_partitions FROM cerebro_db.fits WHERE fit_id = %s",
              (fit_id,))[0][0]
    out: dict[str, float] = {}
    seen: set[int] = set()
    first: list[float] = []
    warm: list[tuple[float, float, float]] = []
    for kind, worker, dur, ld, run, sv in rows:
        out[kind] = out.get(kind, 0.0) + dur
        if kind != "train":
            continue
        if worker not in seen:
            seen.add(worker)
            first.append(dur)
        else:
            warm.append((dur, run or 0.0, (ld or 0.0) + (sv or 0.0)))
    out["epoch_unit_s"] = parts * float(np.mean([w[0] for w in warm])) if warm else math.nan
    out["epoch_run_s"] = parts * float(np.mean([w[1] for w in warm])) if warm else math.nan
    out["epoch_io_s"] = parts * float(np.mean([w[2] for w in warm])) if warm else math.nan
    out["first_unit_s"] = float(np.mean(first)) if first else math.nan
    return out


def best_so_far(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """(time, best accuracy up to then), at each improvement."""
    out: list[tuple[float, float]] = []
    for t, a in sorted(points):
        if not out or a > out[-1][1]:
            out.append((t, a))
    return out


def best_within(points: Sequence[tuple[float, float]], limit: float) -> float | None:
    vals = [a for t, a in points if t <= limit]
    return max(vals) if vals else None


# ----------------------------------------------------------------------- part 1: ASHA


def asha_db(conn: Any, args: argparse.Namespace) -> dict[str, Any]:
    out = "bench_automl_asha"
    drop_outputs(conn, out)
    params = (f"min_r={args.min_r}, max_r={args.max_r}, eta={args.eta}, "
              f"max_configs={args.max_configs}, time_budget={args.budget}")
    t0 = time.time()
    q(conn, "SELECT madlib_keras_automl('bench_automl_p', %s, 'bench_automl_arch', %s, "
            "ARRAY[1, 2], %s, %s, 'asha', %s, %s, NULL, FALSE, 'bench_automl_v', NULL, NULL, "
            "NULL, TRUE)", (out, out + "_mst", COMPILE_GRID, FIT_GRID, params, args.seed))
    wall = time.time() - t0
    fit_id = q(conn, f"SELECT max(fit_id) FROM {out}_info")[0][0]
    started, ended = fit_times(conn, fit_id)
    points = eval_points(conn, fit_id)
    done = epochs_done(conn, fit_id)
    launches = [float(r[0]) for r in q(conn, """
        SELECT extract(epoch FROM d.made_at - f.started_at)::float8
          FROM cerebro_db.automl_decisions d JOIN cerebro_db.fits f USING (fit_id)
         WHERE d.fit_id = %s AND d.decision = 'launch'""", (fit_id,)) or []]
    promotions = q(conn, "SELECT count(*) FROM cerebro_db.automl_decisions WHERE fit_id = %s "
                         "AND decision = 'extend'", (fit_id,))[0][0]
    rungs = q(conn, f"SELECT rung, count(*) FROM {out}_info GROUP BY 1 ORDER BY 1")
    best_row = q(conn, f"""SELECT i.mst_key, i.model_id, i.compile_params, i.fit_params,
                                  i.validation_metrics_final
                             FROM {out}_info i JOIN {out}_mst m USING (mst_key)""")[0]
    b = args.budget
    return {
        "params": params, "fit_id": fit_id, "wall": wall, "fit_span": ended - started,
        "startup": started - t0, "points": [(t, a) for _, _, t, a in points],
        "configs": len(launches), "configs_in_budget": sum(t <= b for t in launches),
        "epochs": len(done), "epochs_in_budget": sum(t <= b for t in done),
        "best": max((a for *_, a in points), default=None),
        "best_in_budget": best_within([(t, a) for _, _, t, a in points], b),
        "promotions": promotions, "rungs": rungs, "selected": best_row,
        "units": unit_seconds(conn, fit_id),
    }


def ray_trainable(config: dict[str, Any], data: Any = None, archs: Any = None) -> None:
    """One Ray Tune trial: an epoch at a time, validation after each, reported."""
    import os
    import time as _t

    entered = _t.time()

    import tensorflow as tf
    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass
    import keras
    import numpy as np
    from ray import tune as _tune

    x, y, vx, vy = data
    rng = np.random.default_rng()
    model = keras.models.model_from_json(archs[config["model"]])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=config["lr"]),
                  loss="categorical_crossentropy", metrics=["accuracy"])
    for epoch in range(1, config["max_t"] + 1):
        t0 = _t.time()
        setup = t0 - entered if epoch == 1 else None
        order = rng.permutation(len(x))
        model.fit(x[order], y[order], batch_size=config["batch_size"], epochs=1, verbose=0,
                  shuffle=False)
        t1 = _t.time()
        loss, acc = model.evaluate(vx, vy, batch_size=1024, verbose=0)
        _tune.report({"val_loss": float(loss), "val_accuracy": float(acc), "epoch": epoch,
                      "ts": _t.time(), "fit_s": t1 - t0, "eval_s": _t.time() - t1,
                      "setup_s": setup, "pid": os.getpid()})


def ray_cpu(me: Any, driver_s: float) -> dict[str, float]:
    """CPU seconds of Ray's processes: trial workers (``ray::`` processes) and the rest
    (raylet, GCS, log monitor, ...) since ray.init, and the driver during Tuner.fit."""
    import psutil

    out = {"workers": 0.0, "system": 0.0, "driver": driver_s}
    for p in me.children(recursive=True):
        try:
            name = " ".join(p.cmdline()[:1]) or p.name()
            t = sum(p.cpu_times()[:2])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out["workers" if name.startswith("ray::") else "system"] += t
    return out


def asha_ray(data: tuple[np.ndarray, ...], args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["TF_NUM_INTRAOP_THREADS"] = "1"
    os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    import psutil
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    x, y, vx, vy = data
    prepared = (x.reshape(len(x), -1).astype("float32") / 255.0,
                np.eye(10, dtype="float32")[y],
                vx.reshape(len(vx), -1).astype("float32") / 255.0,
                np.eye(10, dtype="float32")[vy])
    archs = {i + 1: arch_json(h) for i, h in enumerate(HIDDEN)}
    t_init = time.time()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    init_s = time.time() - t_init
    try:
        with tempfile.TemporaryDirectory(prefix="automl_bench_ray_") as store:
            sched = ASHAScheduler(time_attr="training_iteration", grace_period=args.min_r,
                                  max_t=args.max_r, reduction_factor=args.eta)
            tuner = tune.Tuner(
                tune.with_parameters(ray_trainable, data=prepared, archs=archs),
                param_space={"model": tune.choice(sorted(archs)),
                             "lr": tune.loguniform(*LR_RANGE),
                             "batch_size": tune.choice(list(BATCH_SIZES)),
                             "max_t": args.max_r},
                tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=sched,
                                            num_samples=args.max_configs,
                                            max_concurrent_trials=2,
                                            time_budget_s=args.budget, reuse_actors=True),
                run_config=tune.RunConfig(storage_path=store, name="asha", verbose=0))
            me = psutil.Process()
            c0 = sum(me.cpu_times()[:2])
            t0 = time.time()
            grid = tuner.fit()
            wall = time.time() - t0
            cpu = ray_cpu(me, sum(me.cpu_times()[:2]) - c0)
            trials = []
            for r in grid:
                df = r.metrics_dataframe
                reports = [] if df is None or df.empty else df.to_dict("records")
                trials.append({"config": r.config, "error": None if r.error is None
                               else str(r.error)[:300], "reports": reports})
    finally:
        ray.shutdown()
    reports = [rep for t in trials for rep in t["reports"]]
    firsts = sorted((t["reports"][0] for t in trials if t["reports"]), key=lambda r: r["ts"])
    setups = [r["setup_s"] for r in firsts]
    pids: set[Any] = set()
    first_setups = []
    for r in firsts:
        if r["pid"] not in pids:
            pids.add(r["pid"])
            first_setups.append(r["setup_s"])
    points = [(rep["ts"] - t0, rep["val_accuracy"]) for rep in reports]
    b = args.budget
    started = [t for t in trials if t["reports"]]
    best_cfg = max(started, key=lambda t: max(r["val_accuracy"] for r in t["reports"]),
                   default=None)
    return {
        "wall": wall, "init_s": init_s, "points": points, "cpu": cpu,
        "configs": len(started), "trials_created": len(trials),
        "errors": sum(t["error"] is not None and not t["reports"] for t in trials),
        "configs_in_budget": sum(1 for t in started if t["reports"][0]["ts"] - t0 <= b),
        "epochs": len(reports), "epochs_in_budget": sum(t <= b for t, _ in points),
        "best": max((a for _, a in points), default=None),
        "best_in_budget": best_within(points, b),
        "max_epochs_trial": max((len(t["reports"]) for t in started), default=0),
        "reached_max": sum(len(t["reports"]) >= args.max_r for t in started),
        "epoch_fit_s": float(np.mean([r["fit_s"] for r in reports])) if reports else None,
        "epoch_eval_s": float(np.mean([r["eval_s"] for r in reports])) if reports else None,
        "setup_s": float(np.mean(setups)) if setups else None,
        "setup_first_s": float(np.mean(first_setups)) if first_setups else None,
        "best_config": None if best_cfg is None else {
            k: v for k, v in best_cfg["config"].items() if k != "max_t"},
    }


# ------------------------------------------------------------------ part 2: MLtuner


def lr_of(compile_params: str) -> float | None:
    m = re.search(r"(?:learning_rate|lr)\s*=\s*([0-9.eE+-]+)", compile_params)
    return float(m.group(1)) if m else None


def mltuner_db(conn: Any, args: argparse.Namespace) -> dict[str, Any]:
    out = "bench_automl_mlt"
    drop_outputs(conn, out)
    lr0 = math.sqrt(LR_RANGE[0] * LR_RANGE[1])
    cgrid = ("{'loss': ['categorical_crossentropy'], 'optimizer': "
             f"['Adam(learning_rate={lr0:.3g})'], 'metrics': ['accuracy']}}")
    params = f"num_iterations={args.epochs}, lr_min={LR_RANGE[0]}, lr_max={LR_RANGE[1]}" + \
        (f", {args.mltuner_params}" if args.mltuner_params else "")
    t0 = time.time()
    q(conn, "SELECT madlib_keras_automl('bench_automl_p', %s, 'bench_automl_arch', %s, "
            "ARRAY[%s], %s, %s, 'mltuner', %s, %s, NULL, FALSE, 'bench_automl_v', 1, NULL, "
            "NULL, TRUE)", (out, out + "_mst", HIDDEN.index(MLT_HIDDEN) + 1, cgrid,
                            f"{{'batch_size': [{MLT_BATCH}]}}", params, args.seed))
    wall = time.time() - t0
    fit_id = q(conn, f"SELECT max(fit_id) FROM {out}_info")[0][0]
    started, ended = fit_times(conn, fit_id)
    output, chosen_lr = q(conn, f"SELECT mst_key, learning_rate FROM {out}_info "
                                f"ORDER BY mst_key LIMIT 1")[0]
    trials = q(conn, """SELECT a.mst_key, a.parent, a.status, c.compile_params
                          FROM cerebro_db.automl_trials a JOIN cerebro_db.fit_configs c
                         USING (fit_id, mst_key) WHERE a.fit_id = %s ORDER BY a.mst_key""",
               (fit_id,))
    parent = {k: p for k, p, _, _ in trials}
    lineage = [output]
    while parent.get(lineage[-1]) is not None:
        lineage.append(parent[lineage[-1]])
    points = eval_points(conn, fit_id)
    done = trained_at(conn, fit_id)
    freed = [k for k, _, s, _ in trials if s == "freed"]
    trial_epochs = q(conn, "SELECT coalesce(max(epoch), 1) FROM cerebro_db.units WHERE "
                           "fit_id = %s AND kind = 'train' AND mst_key = ANY(%s)",
                     (fit_id, freed))[0][0]
    traces: dict[int, list[float]] = {}
    for k, loss in q(conn, "SELECT mst_key, loss FROM cerebro_db.units WHERE fit_id = %s AND "
                           "kind = 'train' AND epoch <= %s ORDER BY started_at",
                     (fit_id, trial_epochs)) or []:
        traces.setdefault(int(k), []).append(float(loss))
    return {
        "params": params, "lr0": lr0, "traces": traces, "trial_epochs": trial_epochs,
        "fit_id": fit_id, "wall": wall,
        "fit_span": ended - started, "output": output, "chosen_lr": chosen_lr,
        "trials": [(k, p, s, lr_of(c)) for k, p, s, c in trials], "lineage": lineage,
        "lineage_points": [(t, a) for k, _, t, a in points if k in lineage],
        "lineage_trained": [(done[(k, e)], a) for k, e, _, a in points if k in lineage],
        "others_trained": [(done[(k, e)], a) for k, e, _, a in points if k not in lineage],
        "all_points": [(k, t, a) for k, _, t, a in points],
        "epochs": len(epochs_done(conn, fit_id)), "units": unit_seconds(conn, fit_id),
    }


def grid_db(conn: Any, args: argparse.Namespace) -> dict[str, Any]:
    out = "bench_automl_grid"
    drop_outputs(conn, out)
    q(conn, "DROP TABLE IF EXISTS bench_automl_grid_mst, bench_automl_grid_mst_summary")
    q(conn, "CREATE TABLE bench_automl_grid_mst (mst_key serial PRIMARY KEY, model_id int, "
            "compile_params varchar, fit_params varchar)")
    q(conn, "CREATE TABLE bench_automl_grid_mst_summary AS SELECT "
            "'bench_automl_arch'::varchar AS model_arch_table, NULL::varchar AS object_table")
    for lr in GRID_LRS:
        q(conn, "INSERT INTO bench_automl_grid_mst (model_id, compile_params, fit_params) "
                "VALUES (%s, %s, %s)",
          (HIDDEN.index(MLT_HIDDEN) + 1, (f"loss='categorical_crossentropy', optimizer='Adam("
           f"learning_rate={lr})', metrics=['accuracy']"), f"batch_size={MLT_BATCH}"))
    t0 = time.time()
    q(conn, "SELECT madlib_keras_fit_multiple_model('bench_automl_p', %s, "
            "'bench_automl_grid_mst', %s, FALSE, 'bench_automl_v', 1, FALSE, NULL, NULL, TRUE, "
            "'mop', NULL, %s)", (out, args.epochs, args.seed))
    wall = time.time() - t0
    fit_id = q(conn, "SELECT fit_id FROM cerebro_db.fits WHERE model_output_table = %s "
                     "ORDER BY fit_id DESC LIMIT 1", (out,))[0][0]
    started, ended = fit_times(conn, fit_id)
    keys = dict(q(conn, "SELECT mst_key, compile_params FROM bench_automl_grid_mst") or [])
    points = eval_points(conn, fit_id)
    done = trained_at(conn, fit_id)
    per: dict[float, list[tuple[float, float]]] = {}
    per_trained: dict[float, list[tuple[float, float]]] = {}
    for k, e, t, a in points:
        per.setdefault(lr_of(keys[k]) or math.nan, []).append((t, a))
        per_trained.setdefault(lr_of(keys[k]) or math.nan, []).append((done[(k, e)], a))
    return {"fit_id": fit_id, "wall": wall, "fit_span": ended - started, "per_lr": per,
            "per_lr_trained": per_trained,
            "epochs": len(epochs_done(conn, fit_id)), "units": unit_seconds(conn, fit_id)}


def first_reach(points: Sequence[tuple[float, float]], target: float) -> float | None:
    hits = [t for t, a in points if a >= target]
    return min(hits) if hits else None


# ------------------------------------------------------------------------- report


def fmt(v: float | None, spec: str = ".4f") -> str:
    return "n/a" if v is None else format(v, spec)


def plot_asha(db: dict[str, Any], ray_r: dict[str, Any], budget: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts, color in (("cerebro_db ASHA (MOP, in PostgreSQL)", db["points"], "C0"),
                              ("Ray Tune ASHA (task parallel)", ray_r["points"], "C1")):
        curve = best_so_far(pts)
        if curve:
            end = max(max(t for t, _ in pts), budget)
            xs = [t for t, _ in curve] + [end]
            ys = [a for _, a in curve] + [curve[-1][1]]
            ax.step(xs, ys, where="post", color=color, label=label)
            ax.scatter([t for t, _ in pts], [a for _, a in pts], s=8, color=color, alpha=0.35)
    ax.axvline(budget, color="grey", ls="--", lw=1, label=f"budget {budget:g} s")
    ax.set_xlim(left=0)
    ax.set_xlabel("wall-clock seconds since the start of the search")
    ax.set_ylabel("validation accuracy (best so far; dots: every evaluation)")
    ax.set_title("ASHA on Fashion-MNIST: cerebro_db vs Ray Tune, 2 workers")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_mltuner(mlt: dict[str, Any], grid: dict[str, Any], target: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    pts = sorted(mlt["lineage_trained"])
    ax.plot([t for t, _ in pts], [a for _, a in pts], "o-", color="C3", lw=2,
            label=f"MLtuner output lineage (lr {fmt(mlt['chosen_lr'], '.3g')})")
    for i, (lr, gp) in enumerate(sorted(grid["per_lr_trained"].items())):
        gp = sorted(gp)
        ax.plot([t for t, _ in gp], [a for _, a in gp], "s--", color=GRID_COLORS[i % 4], ms=4,
                alpha=0.8, label=f"grid lr {lr:g}")
    others = mlt["others_trained"]
    if others:
        ax.scatter([t for t, _ in others], [a for _, a in others], marker="x", s=18,
                   color="C3", alpha=0.4, label="MLtuner branches not kept")
    ax.axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.2f}")
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since the fit started at which the epoch's training finished "
                  "(each call on its own clock)")
    ax.set_ylabel("validation accuracy")
    lo = min([a for _, a in pts] + [a for gp in grid["per_lr"].values() for _, a in gp]
             + [a for _, _, a in mlt["all_points"]] + [target])
    ax.set_ylim(max(0.0, lo - 0.02), 1.0)
    ax.set_title(f"MLtuner vs fixed learning-rate grid, MLP {MLT_HIDDEN}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_asha(db: dict[str, Any], ray_r: dict[str, Any], args: argparse.Namespace
                ) -> list[str]:
    b = args.budget
    u = db["units"]
    sel = db["selected"]
    lines = [
        "## 1. ASHA: cerebro_db (MOP in PostgreSQL) against Ray Tune (task parallel)", "",
        (f"Search space: model in {{MLP {HIDDEN[0]}, MLP {HIDDEN[1]}}} (one hidden ReLU layer, "
        f"softmax output), Adam with learning rate log-uniform in [{LR_RANGE[0]:g}, "
        f"{LR_RANGE[1]:g}], batch size in {list(BATCH_SIZES)}. ASHA: grace period (min_r) "
        f"{args.min_r}, max_t (max_r) {args.max_r} epochs, reduction factor (eta) {args.eta}, "
        f"at most {args.max_configs} configurations, ranking by validation loss, wall-clock "
        f"budget {b:g} s, 2 workers (cerebro_db: 2 partitions / worker sessions; Ray: 2 "
        f"concurrent trials on `ray.init(num_cpus=2)`), 1 TensorFlow thread per worker."), "",
        (f"- cerebro_db: `madlib_keras_automl(..., 'asha', '{db['params']}')`, "
        f"random_state {args.seed}, use_caching; validation evaluated at each rung's epochs "
        "(ASHA's decision points)."),
        ("- Ray Tune: `ASHAScheduler(grace_period, max_t, reduction_factor)`, `TuneConfig("
        "num_samples=max_configs, max_concurrent_trials=2, time_budget_s=budget, "
        "reuse_actors=True)`, data passed by `tune.with_parameters`; validation after every "
        "epoch (Ray's ASHA needs a report per training_iteration). Each epoch is one Keras "
        "`fit(epochs=1, shuffle=False)` on a numpy permutation of the arrays, the call the "
        "database worker makes on its partition."), "",
        "| | cerebro_db | Ray Tune |", "|---|---:|---:|",
        (f"| configurations explored within the budget | {db['configs_in_budget']} | "
        f"{ray_r['configs_in_budget']} |"),
        (f"| epochs trained within the budget | {db['epochs_in_budget']} | "
        f"{ray_r['epochs_in_budget']} |"),
        (f"| best validation accuracy within the budget | {fmt(db['best_in_budget'])} | "
        f"{fmt(ray_r['best_in_budget'])} |"),
        (f"| configurations / epochs, whole run | {db['configs']} / {db['epochs']} | "
        f"{ray_r['configs']} / {ray_r['epochs']} |"),
        f"| best validation accuracy, whole run | {fmt(db['best'])} | {fmt(ray_r['best'])} |",
        (f"| trials trained to max_r = {args.max_r} epochs | "
        f"{sum(c for r, c in db['rungs'] if r == max(x for x, _ in db['rungs']))} | "
        f"{ray_r['reached_max']} |"),
        (f"| wall clock of the search (s) | {db['fit_span']:.1f} (fit started_at to ended_at)"
        f" | {ray_r['wall']:.1f} (Tuner.fit) |"),
        (f"| wall clock before the search (s) | {db['startup']:.1f} (SQL call to fit "
        f"started_at: checks, worker sessions) | {ray_r['init_s']:.1f} (ray.init) |"),
        (f"| mean seconds of one training epoch of a trial (after warm-up) | "
        f"{u['epoch_unit_s']:.2f} (Keras training {u['epoch_run_s']:.2f}, state load and save "
        f"{u['epoch_io_s']:.2f}) | {fmt(ray_r['epoch_fit_s'], '.2f')} (Keras `fit`) |"),
        (f"| warm-up | first unit of each worker {u['first_unit_s']:.1f} s (TensorFlow import, "
        f"partition read) | trial start to first epoch {fmt(ray_r['setup_s'], '.1f')} s "
        f"(first trial of an actor: {fmt(ray_r['setup_first_s'], '.1f')} s) |"), "",
        ("Timeline: `bench/results/automl_asha.png` (best validation accuracy so far against "
        "wall-clock seconds since the search started: for cerebro_db the fit's started_at "
        "in the catalog, for Ray the call of Tuner.fit; dots are single evaluations)."), "",
        "![ASHA timeline](automl_asha.png)", "",
        (f"- cerebro_db: {db['promotions']} promotions; trials per final rung "
        f"{', '.join(f'rung {r}: {c}' for r, c in db['rungs'])}; selected mst_key {sel[0]} "
        f"(model_id {sel[1]}, {sel[2]}, {sel[3]}), its last validation accuracy "
        f"{fmt(sel[4])}. Worker seconds: training {u.get('train', 0):.1f}, training-data "
        f"evaluation {u.get('eval_train', 0):.1f}, validation evaluation "
        f"{u.get('eval_valid', 0):.1f}."),
        (f"- Ray Tune: best trial {json.dumps(ray_r['best_config'])}; mean validation "
        f"evaluation per epoch {fmt(ray_r['epoch_eval_s'], '.2f')} s; "
        f"{ray_r['trials_created']} trials created, {ray_r['errors']} failed before "
        f"reporting."),
        ("- The cerebro_db `time_budget` stops *launching* new configurations at the budget; "
        "promotions already earned still train, so the call can end after the budget "
        f"(here {db['fit_span']:.1f} s). Ray's `time_budget_s` stops the whole experiment. "
        "The \"within the budget\" rows count only what finished by then on both sides."),
        ("- The two ASHAs differ in one respect: Ray's ASHAScheduler is the *stopping* "
        "variant (a trial keeps training past a rung unless it falls outside the top 1/eta "
        "seen so far at that rung), cerebro_db's is the *promotion* variant of Li et al. "
        "(a trial pauses at its rung and resumes when it is among the top 1/eta). Both "
        "never wait for a full rung."), ""]
    return lines


def trace_note(mlt: dict[str, Any]) -> str:
    """How the chosen branch's first-epoch trace ranks among the candidates': by the drop
    from its first to its last unit, and by its last unit's loss."""
    tr = {k: v for k, v in mlt["traces"].items() if len(v) >= 2}
    chosen = [k for k in tr if k in mlt["lineage"]]
    if not chosen or len(tr) < 2:
        return ""
    c = chosen[0]
    by_drop = sorted(tr, key=lambda k: tr[k][0] - tr[k][-1], reverse=True)
    by_end = sorted(tr, key=lambda k: tr[k][-1])
    return (f" The chosen branch ranks {by_drop.index(c) + 1} of {len(tr)} by the drop from "
            f"its first to its last unit's loss ({tr[c][0]:.3g} to {tr[c][-1]:.3g}) and "
            f"{by_end.index(c) + 1} of {len(tr)} by its last unit's loss (lowest first).")


def report_mltuner(mlt: dict[str, Any], grid: dict[str, Any], args: argparse.Namespace
                   ) -> tuple[list[str], float]:
    finals = {lr: (max(a for _, a in gp), max(gp)[1]) for lr, gp in
              grid["per_lr"].items()}
    best_lr = max(finals, key=lambda lr: finals[lr][1])
    best_pts = grid["per_lr"][best_lr]
    target = args.target
    note = ""
    if first_reach(best_pts, target) is None:
        reachable = math.floor((max(a for _, a in best_pts) - 1e-9) * 100) / 100
        note = (f" The requested target {target:.2f} was not reached by the best grid "
                f"configuration in this run, so the target is lowered to {reachable:.2f}, the "
                "highest multiple of 0.01 it reached.")
        target = reachable
    t_grid = first_reach(best_pts, target)
    t_grid_tr = first_reach(grid["per_lr_trained"][best_lr], target)
    t_any = min((t for t in (first_reach(gp, target) for gp in
                             grid["per_lr_trained"].values()) if t is not None), default=None)
    t_mlt = first_reach(mlt["lineage_points"], target)
    t_mlt_tr = first_reach(mlt["lineage_trained"], target)
    t_mlt_any = first_reach(mlt["lineage_trained"] + mlt["others_trained"], target)
    lag_grid = float(np.mean([e[0] - t[0] for lr in grid["per_lr"] for e, t in
                              zip(sorted(grid["per_lr"][lr]),
                                  sorted(grid["per_lr_trained"][lr]))]))
    lag_mlt = float(np.mean([e[0] - t[0] for e, t in zip(sorted(mlt["lineage_points"]),
                                                         sorted(mlt["lineage_trained"]))]))
    mu, gu = mlt["units"], grid["units"]
    lines = [
        "## 2. MLtuner against a fixed learning-rate grid", "",
        (f"One configuration: MLP {MLT_HIDDEN}, Adam, batch size {MLT_BATCH}, "
        f"{args.epochs} epochs, validation every epoch, 2 partitions / worker sessions."), "",
        (f"- (a) `madlib_keras_automl(..., 'mltuner', '{mlt['params']}')`; the configuration "
        f"as given starts at learning rate {mlt['lr0']:.3g} (the geometric middle of the "
        f"range, so that neither end is favoured; MLtuner forks branches with other "
        f"learning rates and keeps the fastest-converging one; its other parameters are "
        f"the procedure's defaults unless --mltuner-params says otherwise)."),
        (f"- (b) `madlib_keras_fit_multiple_model` over learning rates "
        f"{', '.join(f'{lr:g}' for lr in GRID_LRS)} ({len(GRID_LRS)} configurations trained "
        f"together by MOP), {args.epochs} epochs each."),
        (f"- Clock: wall clock of each whole call, from its fit's started_at (catalog) to the "
        f"end of the last training unit of the first epoch whose validation accuracy "
        f"reaches the target (the model state that reaches it exists from then on); also "
        f"given: to the end of that epoch's evaluation. The grid trains all its "
        f"configurations at the same time by MOP, so the best grid configuration's time "
        f"includes sharing the 2 workers with the other {len(GRID_LRS) - 1}; MLtuner's "
        f"includes its tuning branches. The model hopper runs evaluation units after the "
        f"training units that are ready, so an epoch's evaluation can end well after its "
        f"training (here on average {lag_grid:.1f} s later for the grid, {lag_mlt:.1f} s "
        f"for MLtuner's output lineage, whose evaluations the tuner waits for).{note}"), "",
        f"Target validation accuracy: **{target:.2f}**.", "",
        "| | MLtuner | best grid configuration |", "|---|---:|---:|",
        (f"| learning rate | {fmt(mlt['chosen_lr'], '.3g')} (chosen) | {best_lr:g} (best "
        f"final validation accuracy) |"),
        (f"| time to reach {target:.2f}: epoch trained (s; n/a: never reached) | "
         f"{fmt(t_mlt_tr, '.1f')} | {fmt(t_grid_tr, '.1f')} |"),
        (f"| time to reach {target:.2f}: epoch evaluated (s) | {fmt(t_mlt, '.1f')} | "
         f"{fmt(t_grid, '.1f')} |"),
        (f"| final validation accuracy | "
        f"{fmt(max(mlt['lineage_points'])[1] if mlt['lineage_points'] else None)} | "
        f"{finals[best_lr][1]:.4f} |"),
        (f"| whole call (s, fit started_at to ended_at) | {mlt['fit_span']:.1f} | "
        f"{grid['fit_span']:.1f} (all {len(GRID_LRS)} configurations) |"),
        (f"| epochs trained (all trials / configurations) | {mlt['epochs']} | "
        f"{grid['epochs']} |"),
        (f"| worker seconds training / evaluating | {mu.get('train', 0):.1f} / "
        f"{mu.get('eval_train', 0) + mu.get('eval_valid', 0):.1f} | "
        f"{gu.get('train', 0):.1f} / {gu.get('eval_train', 0) + gu.get('eval_valid', 0):.1f} |"),
        "",
        (f"- Earliest epoch trained of any grid configuration reaching {target:.2f}: "
         f"{fmt(t_any, '.1f')} s; of any MLtuner trial (including branches later freed): "
         f"{fmt(t_mlt_any, '.1f')} s."),
        "- Grid, final (best) validation accuracy by learning rate: " + ", ".join(
            f"{lr:g}: {fin:.4f} ({mx:.4f})" for lr, (mx, fin) in sorted(finals.items())) + ".",
        "- MLtuner trials (mst_key, parent, status, learning rate): " + "; ".join(
            f"{k}, {p if p is not None else '-'}, {s}, {fmt(lr, '.3g')}"
            for k, p, s, lr in mlt["trials"]) + f"; output lineage {mlt['lineage'][::-1]}.",
        ("- What MLtuner's convergence speed saw: the training loss of each training unit "
         "(one per partition, in the order they ran) in each trial's first "
         f"{mlt['trial_epochs']} epoch(s) (the losing branches' trial length), by learning "
         "rate: " + "; ".join(
             f"{fmt(lr, '.3g')}{' (chosen)' if k in mlt['lineage'] else ''}: ["
             + ", ".join(f"{v:.3g}" for v in mlt["traces"].get(k, [])) + "]"
             for k, _, _, lr in mlt["trials"]) + ". The branches of a tuning round are "
         "ranked from their common start to the training loss each reached at the end of "
         "its trial (evaluated on the training data), per second of a typical epoch of its "
         "batch size, less a penalty for the scatter of the trace; a branch needs at least "
         "3 loss points to count as stable, so with 2 partitions the trial length doubles "
         "to 2 epochs." + trace_note(mlt)),
        "", "![MLtuner vs grid](automl_mltuner.png)", ""]
    return lines, target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=240.0, help="wall-clock seconds for ASHA")
    ap.add_argument("--rows", type=int, default=20000, help="training rows")
    ap.add_argument("--valid-rows", type=int, default=5000)
    ap.add_argument("--min-r", type=int, default=1)
    ap.add_argument("--max-r", type=int, default=9)
    ap.add_argument("--eta", type=int, default=3)
    ap.add_argument("--max-configs", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=6, help="part 2: epochs per configuration")
    ap.add_argument("--mltuner-params", default="",
                    help="part 2: more MLtuner automl_params (default: the procedure's)")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--parts", default="asha,mltuner",
                    help="comma list of asha, mltuner (the report has only these)")
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",")}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    conn = connect()
    data = arrays(args.rows, args.valid_rows)
    t = time.time()
    load(conn, data)
    print(f"loaded in {time.time() - t:.1f} s", flush=True)
    load_avg = os.getloadavg()
    cmd = "python bench/automl_bench.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in
        (("budget", f"{args.budget:g}"), ("rows", args.rows)))
    lines = ["# AutoML benchmark: ASHA and MLtuner in PostgreSQL", "",
             (f"Regenerate: `{cmd}` (all flags: `--help`). Fashion-MNIST, {args.rows:,} "
             f"training rows, {args.valid_rows:,} validation rows (test split), 2 partitions, "
             f"{platform.node()}, {os.cpu_count()} cores, one run. "
             + (f"**The machine was shared with other work during the run** (load average "
                f"{load_avg[0]:.1f} on {os.cpu_count()} cores when it started), so absolute "
                "times are noisy; "
                if load_avg[0] > 0.75 * (os.cpu_count() or 1) else
                f"The machine was quiet (load average {load_avg[0]:.1f} on "
                f"{os.cpu_count()} cores when it started); ")
             + "both systems of each comparison ran one after the other on the same machine."),
             ""]
    if "asha" in parts:
        db = asha_db(conn, args)
        print("asha db", json.dumps({k: v for k, v in db.items() if k != "points"},
                                    default=str), flush=True)
        ray_r = asha_ray(data, args)
        print("asha ray", json.dumps({k: v for k, v in ray_r.items() if k != "points"},
                                     default=str), flush=True)
        plot_asha(db, ray_r, args.budget, RESULTS / "automl_asha.png")
        lines += report_asha(db, ray_r, args)
        lines += asha_findings(db, ray_r, args)
    if "mltuner" in parts:
        mlt = mltuner_db(conn, args)
        print("mltuner", json.dumps({k: v for k, v in mlt.items() if "points" not in k},
                                    default=str), flush=True)
        grid = grid_db(conn, args)
        print("grid", json.dumps({k: v for k, v in grid.items() if not k.startswith("per_lr")},
                                 default=str), flush=True)
        more, target = report_mltuner(mlt, grid, args)
        plot_mltuner(mlt, grid, target, RESULTS / "automl_mltuner.png")
        lines += more
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "automl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def asha_findings(db: dict[str, Any], ray_r: dict[str, Any], args: argparse.Namespace
                  ) -> list[str]:
    """What the numbers say, computed from them (no fixed wording of who won)."""
    u = db["units"]
    ray_epoch = ray_r["epoch_fit_s"] or math.nan
    ratio = u["epoch_unit_s"] / ray_epoch if not math.isnan(ray_epoch) else math.nan
    evals = u.get("eval_train", 0.0) + u.get("eval_valid", 0.0)
    busy = sum(v for k, v in u.items() if k in ("train", "eval_train", "eval_valid"))
    more = "more" if ray_r["configs_in_budget"] > db["configs_in_budget"] else \
        "fewer" if ray_r["configs_in_budget"] < db["configs_in_budget"] else "as many"
    counts = (db["configs_in_budget"], ray_r["configs_in_budget"])
    who = "Both" if min(counts) >= args.max_configs else "One"
    capped = [] if max(counts) < args.max_configs else [
        (f"- {who} of the searches used up max_configs = {args.max_configs} within the "
         "budget, so the configuration counts are capped; compare the epochs, the wall clock "
         "of the search and the accuracy over time.")]
    return [
        "### Why the counts differ", "", *capped,
        (f"- Ray Tune explored {more} configurations within the budget "
         f"({ray_r['configs_in_budget']} vs {db['configs_in_budget']}) and trained "
         f"{ray_r['epochs_in_budget']} vs {db['epochs_in_budget']} epochs. After warm-up, one "
         f"training epoch of a trial took {u['epoch_unit_s']:.2f} s in the database (the "
         f"trial's units over the 2 partitions; each unit loads the model state, trains on "
         f"the partition ({u['epoch_run_s']:.2f} s per epoch) and saves the state back "
         f"({u['epoch_io_s']:.2f} s per epoch)) against {ray_epoch:.2f} s in a Ray trial "
         f"(Keras `fit` on in-memory arrays): {ratio:.2f}x. On the 2 cores Ray's own processes "
         f"(raylet, GCS and the other non-trial processes, since ray.init) used "
         f"{ray_r['cpu']['system']:.1f} CPU seconds and the driver {ray_r['cpu']['driver']:.1f} "
         f"during Tuner.fit, against {ray_r['cpu']['workers']:.1f} for the trial workers; "
         f"the database side has no such processes (its coordinator is the SQL call's "
         f"backend)."),
        (f"- Where the epochs went: beyond the grace period ({args.min_r} epoch(s) for each "
         f"configuration) cerebro_db spent "
         f"{db['epochs_in_budget'] - args.min_r * db['configs_in_budget']} epochs within the "
         f"budget, Ray "
         f"{ray_r['epochs_in_budget'] - args.min_r * ray_r['configs_in_budget']} (at most; "
         f"a configuration still in its first epoch at the budget counts as explored). "
         f"Ray's stopping rule lets a trial continue when it is in the top 1/eta of the "
         f"results seen so far at its rung, which early in the search means few "
         f"competitors; cerebro_db's promotion rule needs eta results at a rung before it "
         f"promotes one, and otherwise launches a new configuration."),
        (f"- Evaluation: cerebro_db evaluates each rung epoch on the training data as well as "
         f"on the validation data ({u.get('eval_train', 0):.1f} s and "
         f"{u.get('eval_valid', 0):.1f} s of worker time, "
         f"{100 * evals / max(busy, 1e-9):.0f}% of its busy worker time); Ray evaluates the "
         f"validation data after every epoch ({fmt(ray_r['epoch_eval_s'], '.2f')} s each) "
         "and takes the training loss from `fit`."),
        (f"- Warm-up inside the budget: each database worker's first unit took "
         f"{u['first_unit_s']:.1f} s (TensorFlow import in the worker session and the first "
         f"read of its partition); a Ray trial took {fmt(ray_r['setup_first_s'], '.1f')} s "
         f"from its start to its first epoch on a fresh actor (TensorFlow import), "
         f"{fmt(ray_r['setup_s'], '.1f')} s on average over all trials (actors are reused). "
         f"Outside the budget: {db['startup']:.1f} s from the SQL call to the fit's start, "
         f"{ray_r['init_s']:.1f} s for ray.init."), ""]


if __name__ == "__main__":
    main()
