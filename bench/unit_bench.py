"""Per-unit training throughput: cerebro_db's training unit against raw Keras on the same arrays.

    python bench/unit_bench.py [--rows 10000] [--reps 7] [--skip-db]

Two comparisons, both with 1 TensorFlow thread per process (what each worker session gets
on this 2-core machine: ``worker_threads = cores // workers``):

same process   one Python process, Fashion-MNIST ``--rows`` rows x 784. For each configuration
               (an MLP 784-128-64-10 with batch 32, 128 and 512, a small CNN with batch
               128), a warm Keras model runs ``model.fit(x, y, batch_size, epochs=1)``
               (Keras' default ``shuffle=True``) and a warm :class:`ModelCache` runs
               ``training.train_unit`` on the same arrays with the state bytes round trip a
               worker does (state in, state out, the next unit starts from the returned
               bytes). Repetitions are interleaved (raw and ours alternate, in alternating
               order) after two warm-up calls each; medians are reported.

in database    a real ``madlib_keras_fit_multiple_model`` over 2 partitions of ``--rows``
               rows each (4 MLP 128-64 configurations, batch 128, 2 iterations, 2 worker
               sessions, use_caching), ``--rounds`` times: per train unit, rows /
               seconds_run (``train_unit`` in the worker, including its in-process state
               load and save) and rows / the whole unit (also reading the state from and
               writing it to the catalog), medians over the units, then over the fits. Raw
               Keras runs in 2 concurrent processes (the same contention the 2 workers
               have) before, between and after the fits, each fitting its partition's
               arrays, read from the packed table and decoded as the worker does.

Results: bench/results/unit.md (the exact command and the machine's load are recorded).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

ADAM = "loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})', metrics=['accuracy']"


def fashion(rows: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from tooling.datasets import find_dataset_dir, load_split

    x, y = load_split(find_dataset_dir("fashion-mnist"), "train")
    x = (x[offset:offset + rows].reshape(rows, 784) / 255.0).astype(np.float32)
    return x, np.eye(10, dtype=np.float32)[y[offset:offset + rows]]


def mlp_json() -> str:
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")]).to_json()


def cnn_json() -> str:
    import keras

    L = keras.layers
    return keras.Sequential([keras.Input((28, 28, 1)), L.Conv2D(8, 3, activation="relu"),
                             L.MaxPooling2D(), L.Conv2D(16, 3, activation="relu"),
                             L.MaxPooling2D(), L.Flatten(),
                             L.Dense(10, activation="softmax")]).to_json()


def keras_model(arch: str, cp: str) -> Any:
    import keras

    from cerebro_db import params

    m = keras.models.model_from_json(arch)
    m.compile(**params.parse_compile_params(cp).to_keras())
    return m


def median(v: list[float]) -> float:
    return float(statistics.median(v))


# --------------------------------------------------------------------------- same process


def same_process(rows: int, reps: int) -> list[dict[str, Any]]:
    from cerebro_db import training

    training.configure_runtime(1)
    x, y = fashion(rows)
    cp = ADAM.format(lr=0.001)
    cases = [("MLP 784-128-64-10", mlp_json(), 32), ("MLP 784-128-64-10", mlp_json(), 128),
             ("MLP 784-128-64-10", mlp_json(), 512), ("CNN conv8-conv16-dense10", cnn_json(), 128)]
    cache = training.ModelCache(max_models=8)
    out = []
    for name, arch, bs in cases:
        r = {"model": name, "batch_size": bs, "rows": rows,
             **one_case(cache, arch, cp, bs, x, y, "CNN" in name, reps)}
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def one_case(cache: Any, arch: str, cp: str, bs: int, x: np.ndarray, y: np.ndarray,
             image: bool, reps: int) -> dict[str, float]:
    from cerebro_db import training

    raw = keras_model(arch, cp)
    xr = x.reshape((x.shape[0], 28, 28, 1)) if image else x
    state = [training.initial_state(arch, cp, 1)]
    fp = f"batch_size={bs}"
    seed = [0]

    def ours() -> None:
        seed[0] += 1
        state[0], _ = training.train_unit(cache, arch, cp, fp, state[0], x, y, seed[0])

    def keras_fit() -> None:
        raw.fit(xr, y, batch_size=bs, epochs=1, verbose=0)

    wall, cpu = interleaved({"ours": ours, "raw": keras_fit}, reps)
    r = {"ours_s": median(wall["ours"]), "raw_s": median(wall["raw"]),
         "ours_cpu": median(cpu["ours"]), "raw_cpu": median(cpu["raw"])}
    r["ratio"] = r["raw_s"] / r["ours_s"]
    r["ratio_cpu"] = r["raw_cpu"] / r["ours_cpu"]
    return r


def interleaved(fns: dict[str, Callable[[], None]], reps: int
                ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall-clock and process CPU seconds of each call, after two warm-up calls each."""
    for f in fns.values():
        f()
        f()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for i in range(reps):
        for k in (names if i % 2 == 0 else names[::-1]):
            t, c = time.perf_counter(), time.process_time()
            fns[k]()
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    return wall, cpu


# --------------------------------------------------------------------------- in database


def q(conn: Any, sql: str, args: Any = None) -> Any:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def setup_db(conn: Any, rows: int) -> None:
    from tooling.datasets import copy_payload, find_dataset_dir, load_split

    n = 2 * rows
    x, y = load_split(find_dataset_dir("fashion-mnist"), "train")
    q(conn, "DROP TABLE IF EXISTS bench_unit_src, bench_unit_p, bench_unit_p_summary, "
            "bench_unit_arch, bench_unit_mst, bench_unit_mst_summary")
    q(conn, "CREATE TABLE bench_unit_src (id integer, y integer, x real[])")
    with conn.cursor() as cur:
        cur.copy_expert("COPY bench_unit_src FROM STDIN (FORMAT binary)", io.BytesIO(
            copy_payload(np.arange(n), y[:n].astype(np.int32), x[:n])))
    q(conn, "SELECT training_preprocessor_dl('bench_unit_src', 'bench_unit_p', 'y', 'x', NULL, "
            "255.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT load_keras_model('bench_unit_arch', %s)", (mlp_json(),))
    q(conn, "SELECT load_model_selection_table('bench_unit_arch', 'bench_unit_mst', ARRAY[1], "
            "%s, ARRAY['batch_size=128'])",
      ([ADAM.format(lr=lr) for lr in (0.0005, 0.001, 0.002, 0.004)],))


def run_db(conn: Any, iterations: int) -> dict[str, Any]:
    q(conn, "DROP TABLE IF EXISTS bench_unit_out, bench_unit_out_info, bench_unit_out_summary")
    q(conn, "SELECT madlib_keras_fit_multiple_model('bench_unit_p', 'bench_unit_out', "
            "'bench_unit_mst', %s, FALSE, NULL, NULL, FALSE, NULL, NULL, TRUE, 'mop', NULL, 1)",
      (iterations,))
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits WHERE model_output_table = "
                     "'bench_unit_out'")[0][0]
    units = q(conn, """SELECT rows, seconds_run, extract(epoch FROM ended_at - started_at)::float8,
                              seconds_load, seconds_save, worker
                         FROM cerebro_db.units WHERE fit_id = %s AND kind = 'train'
                        ORDER BY started_at""", (fit_id,))
    # a worker's first unit builds and traces the model: left out
    seen: set[int] = set()
    warm = []
    for u in units:
        if u[5] in seen:
            warm.append(u)
        seen.add(u[5])
    return {
        "fit_id": fit_id, "units": len(warm),
        "rows_per_s_run": median([u[0] / u[1] for u in warm]),
        "rows_per_s_unit": median([u[0] / u[2] for u in warm]),
        "seconds_run": median([u[1] for u in warm]),
        "seconds_unit": median([u[2] for u in warm]),
        "seconds_load": median([u[3] for u in warm]),
        "seconds_save": median([u[4] for u in warm]),
    }


def partition_arrays(conn: Any, partition: int) -> tuple[np.ndarray, np.ndarray]:
    """The partition's buffers decoded and concatenated as the worker does."""
    from cerebro_db.training import decode_buffer

    rows = q(conn, "SELECT x, x_shape, y, y_shape FROM bench_unit_p WHERE __dist_key__ = %s "
                   "ORDER BY buffer_id", (partition,))
    xs, ys = [], []
    for xb, xsh, yb, ysh in rows:
        ydt = "float32" if len(yb) == 4 * int(np.prod(ysh)) else "int16"
        x, y = decode_buffer(bytes(xb), xsh, bytes(yb), ysh, ydt)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def raw_worker(partition: int, reps: int) -> None:
    """One of the concurrent raw Keras processes: warm up, say ready, wait for go, fit."""
    from common import connect

    from cerebro_db import training

    training.configure_runtime(1)
    conn = connect()
    x, y = partition_arrays(conn, partition)
    conn.close()
    m = keras_model(mlp_json(), ADAM.format(lr=0.001))
    for _ in range(2):
        m.fit(x, y, batch_size=128, epochs=1, verbose=0)
    print("ready", flush=True)
    sys.stdin.readline()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        m.fit(x, y, batch_size=128, epochs=1, verbose=0)
        times.append(time.perf_counter() - t)
    print(json.dumps({"rows": int(x.shape[0]), "times": times}), flush=True)


def raw_concurrent(reps: int) -> dict[str, Any]:
    procs = [subprocess.Popen([sys.executable, __file__, "--raw-worker", str(p), "--reps",
                               str(reps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for p in (0, 1)]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"raw worker failed: {line!r}")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    rates = []
    for p in procs:
        out, _ = p.communicate()
        r = json.loads(out.strip().splitlines()[-1])
        rates += [r["rows"] / t for t in r["times"]]
    return {"rows_per_s": median(rates), "fits": len(rates), "rates": rates}


# --------------------------------------------------------------------------- report


def machine() -> str:
    la = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    import keras
    import tensorflow as tf  # type: ignore[import-untyped]

    return (f"{platform.node()}, {os.cpu_count()} cores, {platform.python_version()}, "
            f"TensorFlow {tf.__version__}, Keras {keras.__version__}, load average {la}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2, help="fits in the database part")
    ap.add_argument("--skip-db", action="store_true")
    ap.add_argument("--raw-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "unit.md"))
    args = ap.parse_args()
    if args.raw_worker is not None:
        raw_worker(args.raw_worker, args.reps)
        return
    cmd = "python bench/unit_bench.py " + " ".join(sys.argv[1:])
    before = machine()
    sp = same_process(args.rows, args.reps)
    lines = ["# Per-unit training throughput: training unit vs raw Keras", "",
             f"`{cmd.strip()}`", "",
             (f"Machine: {before} at the start; load average "
             f"{', '.join(f'{v:.1f}' for v in os.getloadavg())} after the same-process part. "
             "The machine is shared with other work: figures move by +-10-20% between runs; "
             "each table's two sides are interleaved in the same run."), "",
             (f"## Same process, 1 thread, {args.rows} Fashion-MNIST rows, medians of "
             f"{args.reps} interleaved repetitions"), "",
             ("raw = warm Keras model, `model.fit(x, y, batch_size, epochs=1)` (shuffle=True); "
             "ours = `training.train_unit` on a warm ModelCache, state bytes in and out. "
             "Wall-clock seconds and the process' CPU seconds (all its threads, so raw "
             "Keras' prefetch thread counts); on a loaded machine the CPU figures are the "
             "stable ones, wall-clock includes waiting for a core. Throughput ratio = raw "
             "seconds / ours."), "",
             ("| model | batch | raw wall (s) | ours wall (s) | ours / raw, wall | "
              "raw CPU (s) | ours CPU (s) | ours / raw, CPU |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sp:
        lines.append(f"| {r['model']} | {r['batch_size']} | {r['raw_s']:.3f} | "
                     f"{r['ours_s']:.3f} | **{r['ratio']:.2f}x** | {r['raw_cpu']:.3f} | "
                     f"{r['ours_cpu']:.3f} | **{r['ratio_cpu']:.2f}x** |")
    if not args.skip_db:
        from common import connect

        conn = connect()
        setup_db(conn, args.rows)
        rates = raw_concurrent(args.reps)["rates"]
        runs = []
        for _ in range(args.rounds):  # raw, fit, raw, fit, ..., raw
            runs.append(run_db(conn, args.iterations))
            rates += raw_concurrent(args.reps)["rates"]
        raw = {"rows_per_s": median(rates), "fits": len(rates)}
        db = {k: median([r[k] for r in runs]) for k in runs[0] if k not in ("fit_id", "units")}
        db["units"] = sum(r["units"] for r in runs)
        db["fit_id"] = ", ".join(str(r["fit_id"]) for r in runs)
        print(json.dumps({"db": db, "raw": raw}), flush=True)
        lines += ["", (f"## In the database: 2 worker sessions, 2 partitions of ~{args.rows} rows, "
                  "MLP 784-128-64-10, batch 128"), "",
                  (f"fits {db['fit_id']}: 4 configurations x {args.iterations} iterations "
                   "each; per fit the median over its train units (each worker's first unit, "
                   f"which builds the model, left out; {db['units']} units in all), then the "
                   "median over the fits. Raw Keras: 2 concurrent processes, 1 thread each, "
                   "each fitting its partition's arrays (decoded from the packed table), run "
                   f"before, between and after the fits, median over {raw['fits']} fits. "
                   "Wall-clock only (the units table has no CPU time)."), "",
                  "| figure | rows/s | vs raw Keras (2 concurrent) |", "|---|---:|---:|",
                  f"| raw Keras, 2 concurrent processes | {raw['rows_per_s']:,.0f} | 1.00 |",
                  (f"| unit: rows / seconds_run (train_unit in the worker) | "
                  f"{db['rows_per_s_run']:,.0f} | **{db['rows_per_s_run'] / raw['rows_per_s']:.2f}x** |"),
                  (f"| unit: rows / whole unit (incl. state read/write in the catalog) | "
                  f"{db['rows_per_s_unit']:,.0f} | **{db['rows_per_s_unit'] / raw['rows_per_s']:.2f}x** |"),
                  "", (f"Median unit: {db['seconds_unit']:.3f} s, of which load (partition from "
                  f"the worker cache + state from the catalog) {db['seconds_load']:.3f} s, "
                  f"train_unit {db['seconds_run']:.3f} s, state save {db['seconds_save']:.3f} s.")]
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
