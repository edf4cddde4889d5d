"""Model hopper training in PostgreSQL against sequential Keras, side by side in one run.

    python bench/fit_bench.py [--rows 20000] [--iterations 3] [--configs homogeneous|heterogeneous|both]

Fashion-MNIST (--rows training rows, 10,000 validation rows), p = 2 partitions, 16 MLP
configurations, validation metrics every iteration. For each set of configurations it runs,
in the same run and on the same data:

  cerebro_db   madlib_keras_fit_multiple_model, policy 'mop', use_caching, 2 worker sessions
  ring         the same with the 'ring' policy (MADlib's rotation with a barrier per hop)
  sequential   one Python process training the same configurations one after another with
               Keras on in-memory numpy arrays (2 TensorFlow threads), same epochs and
               validation

and reports: makespan, makespan / lower bound from the run's own unit log (lower bound =
max(sum of unit times / p, longest configuration's total unit time)), speed-up over
sequential, per-unit training throughput inside the database against raw Keras fitting the
same partition-sized arrays with the same threads (1 per worker), and where the time went.
Results: bench/results/fit.md.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import connect


def configs(kind: str) -> list[tuple[dict, str, str]]:
    """(architecture spec, compile_params, fit_params) x 16."""
    out = []
    if kind == "homogeneous":
        for opt in ("Adam", "SGD"):
            for lr in (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064):
                lr2 = lr if opt == "Adam" else lr * 4
                out.append(({"hidden": [128, 64]},
                            (f"loss='categorical_crossentropy', optimizer='{opt}(learning_rate="
                            f"{lr2})', metrics=['accuracy']"), "batch_size=128"))
    else:
        for hidden in ([32], [256, 128], [512, 256, 128], [64]):
            for bs in (64, 256):
                for lr in (0.001, 0.003):
                    out.append(({"hidden": hidden},
                                (f"loss='categorical_crossentropy', optimizer='Adam(learning_rate="
                                f"{lr})', metrics=['accuracy']"), f"batch_size={bs}"))
    return out


def arch_json(spec: dict) -> str:
    import keras

    layers = [keras.Input((784,))] + [keras.layers.Dense(h, activation="relu")
                                      for h in spec["hidden"]]
    return keras.Sequential(layers + [keras.layers.Dense(10, activation="softmax")]).to_json()


def q(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def load(conn, rows: int) -> None:
    from tooling.datasets import copy_payload, find_dataset_dir, load_split

    d = find_dataset_dir("fashion-mnist")
    for table, split, n in (("bench_fit_train", "train", rows), ("bench_fit_valid", "t10k", 10000)):
        x, y = load_split(d, split)
        q(conn, f"DROP TABLE IF EXISTS {table}")
        q(conn, f"CREATE TABLE {table} (id integer, y integer, x real[])")
        with conn.cursor() as cur:
            cur.copy_expert(f"COPY {table} FROM STDIN (FORMAT binary)", io.BytesIO(
                copy_payload(np.arange(n), y[:n].astype(np.int32), x[:n])))
    q(conn, "DROP TABLE IF EXISTS bench_fit_p, bench_fit_p_summary, bench_fit_v, "
            "bench_fit_v_summary")
    q(conn, "SELECT training_preprocessor_dl('bench_fit_train', 'bench_fit_p', 'y', 'x', NULL, "
            "255.0, NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('bench_fit_valid', 'bench_fit_v', 'y', 'x', "
            "'bench_fit_p')")


def setup_configs(conn, kind: str) -> list[tuple[dict, str, str]]:
    cs = configs(kind)
    q(conn, "DROP TABLE IF EXISTS bench_fit_arch, bench_fit_mst, bench_fit_mst_summary")
    specs = []
    for spec, _, _ in cs:
        if spec not in specs:
            specs.append(spec)
            q(conn, "SELECT load_keras_model('bench_fit_arch', %s)", (arch_json(spec),))
    q(conn, "CREATE TABLE bench_fit_mst (mst_key serial PRIMARY KEY, model_id int, "
            "compile_params varchar, fit_params varchar)")
    q(conn, "CREATE TABLE bench_fit_mst_summary AS SELECT 'bench_fit_arch'::varchar AS "
            "model_arch_table, NULL::varchar AS object_table")
    for spec, cp, fp in cs:
        q(conn, "INSERT INTO bench_fit_mst (model_id, compile_params, fit_params) VALUES "
                "(%s, %s, %s)", (specs.index(spec) + 1, cp, fp))
    return cs


def run_db(conn, policy: str, params: str | None, iterations: int) -> dict:
    q(conn, "DROP TABLE IF EXISTS bench_fit_out, bench_fit_out_info, bench_fit_out_summary")
    t0 = time.perf_counter()
    q(conn, "SELECT madlib_keras_fit_multiple_model('bench_fit_p', 'bench_fit_out', "
            "'bench_fit_mst', %s, FALSE, 'bench_fit_v', 1, FALSE, NULL, NULL, TRUE, %s, %s, 1)",
      (iterations, policy, params))
    wall = time.perf_counter() - t0
    fit_id = q(conn, "SELECT max(fit_id) FROM cerebro_db.fits")[0][0]
    units = q(conn, """SELECT mst_key, kind, extract(epoch FROM ended_at - started_at)::float8,
                              seconds_load, seconds_run, seconds_save, rows, worker,
                              extract(epoch FROM started_at)::float8, extract(epoch FROM ended_at)::float8
                         FROM cerebro_db.units WHERE fit_id = %s""", (fit_id,))
    span = q(conn, "SELECT extract(epoch FROM ended_at - started_at)::float8 FROM cerebro_db.fits "
                   "WHERE fit_id = %s", (fit_id,))[0][0]
    first = min(u[8] for u in units)
    last = max(u[9] for u in units)
    per_config: dict[int, float] = {}
    total = 0.0
    for u in units:
        total += u[2]
        per_config[u[0]] = per_config.get(u[0], 0.0) + u[2]
    lb = max(total / 2, max(per_config.values()))
    train = [u for u in units if u[1] == "train"]
    acc = q(conn, "SELECT max(validation_metrics_final) FROM bench_fit_out_info")[0][0]
    return {
        "wall": wall, "fit_span": float(span), "units_span": last - first,
        "lower_bound": lb, "ratio": (last - first) / lb,
        "train_s": sum(u[4] for u in train), "load_s": sum(u[3] for u in train),
        "save_s": sum(u[5] for u in train),
        "eval_s": sum(u[2] for u in units if u[1] != "train"),
        "busy_s": total, "idle_s": 2 * (last - first) - total,
        "unit_rows_per_s": sum(u[6] for u in train) / sum(u[4] for u in train),
        "best_valid_acc": acc,
    }


SEQ = """
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from cerebro_db import training
training.configure_runtime({threads})
import keras
from cerebro_db import params
from tooling.datasets import find_dataset_dir, load_split
d = find_dataset_dir("fashion-mnist")
x, y = load_split(d, "train"); vx, vy = load_split(d, "t10k")
x = x[:{rows}].reshape({rows}, -1).astype("float32") / 255.0
y = np.eye(10, dtype="float32")[y[:{rows}]]
vx = vx.reshape(10000, -1).astype("float32") / 255.0
vy = np.eye(10, dtype="float32")[vy]
cs = json.loads({cs!r})
mode = {mode!r}
if mode == "sequential":
    t0 = time.perf_counter(); best = 0
    for arch, cp, fp in cs:
        keras.utils.set_random_seed(1)
        m = keras.models.model_from_json(arch)
        m.compile(**params.parse_compile_params(cp).to_keras())
        bs = params.parse_fit_params(fp).batch_size
        for it in range({iterations}):
            m.fit(x, y, batch_size=bs, epochs=1, verbose=0)
            m.evaluate(x, y, batch_size=1024, verbose=0)
            r = m.evaluate(vx, vy, batch_size=1024, verbose=0, return_dict=True)
        best = max(best, r["accuracy"])
    print(json.dumps({{"seconds": time.perf_counter() - t0, "best_valid_acc": best}}))
else:
    # raw throughput: fit one partition-sized array (rows/2) repeatedly on a warm model
    arch, cp, fp = cs[0]
    m = keras.models.model_from_json(arch)
    m.compile(**params.parse_compile_params(cp).to_keras())
    bs = params.parse_fit_params(fp).batch_size
    half = {rows} // 2
    m.fit(x[:half], y[:half], batch_size=bs, epochs=1, verbose=0)
    t0 = time.perf_counter()
    for _ in range(3):
        m.fit(x[:half], y[:half], batch_size=bs, epochs=1, verbose=0)
    print(json.dumps({{"rows_per_s": 3 * half / (time.perf_counter() - t0)}}))
"""


def run_keras(cs, rows, iterations, threads, mode) -> dict:
    code = SEQ.format(root=str(ROOT), threads=threads, rows=rows, iterations=iterations,
                      cs=json.dumps([(arch_json(s), c, f) for s, c, f in cs]), mode=mode)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--configs", default="both", choices=["homogeneous", "heterogeneous", "both"])
    ap.add_argument("--skip-ring", action="store_true")
    args = ap.parse_args()
    conn = connect()
    load(conn, args.rows)
    kinds = ["homogeneous", "heterogeneous"] if args.configs == "both" else [args.configs]
    lines = ["# Training benchmark: model hopper parallelism in PostgreSQL",
             "",
             (f"`python bench/fit_bench.py --rows {args.rows} --iterations {args.iterations} "
             f"--configs {args.configs}`: Fashion-MNIST, {args.rows} training rows, 10,000 "
             f"validation rows, p = 2 partitions / worker sessions, 16 MLP configurations, "
             f"{args.iterations} iterations, validation every iteration; {platform.node()}, "
             f"{os.cpu_count()} cores; one run each (ratios are from the same run)."), ""]
    for kind in kinds:
        cs = setup_configs(conn, kind)
        mop = run_db(conn, "mop", None, args.iterations)
        ring = None if args.skip_ring else run_db(conn, "ring", None, args.iterations)
        seq = run_keras(cs, args.rows, args.iterations, 2, "sequential")
        raw = run_keras(cs, args.rows, args.iterations, 1, "raw")
        print(kind, json.dumps({"mop": mop, "ring": ring, "seq": seq, "raw": raw}, default=str),
              flush=True)
        lines += [f"## {kind} configurations", "",
                  "| system | makespan (s) | vs cerebro_db | best validation accuracy |",
                  "|---|---:|---:|---:|",
                  f"| cerebro_db (mop) | {mop['wall']:.1f} | 1.00 | {mop['best_valid_acc']:.4f} |"]
        if ring:
            lines.append(f"| cerebro_db (ring, MADlib-style barrier per hop) | {ring['wall']:.1f} | "
                         f"{ring['wall'] / mop['wall']:.2f} | {ring['best_valid_acc']:.4f} |")
        lines += [(f"| sequential Keras, one process, 2 threads | {seq['seconds']:.1f} | "
                  f"{seq['seconds'] / mop['wall']:.2f} | {seq['best_valid_acc']:.4f} |"), "",
                  f"- makespan / lower bound (unit log, first unit start to last unit end): "
                  f"**{mop['ratio']:.3f}** (lower bound {mop['lower_bound']:.1f} s, units span "
                  f"{mop['units_span']:.1f} s)" + (f"; ring {ring['ratio']:.3f}" if ring else ""),
                  (f"- speed-up over sequential Keras: **{seq['seconds'] / mop['wall']:.2f}x** "
                  f"(whole SQL call, including worker start-up and writing the outputs)"),
                  (f"- per-unit training throughput in the database: {mop['unit_rows_per_s']:,.0f} "
                  f"rows/s vs raw Keras on the same partition-sized arrays with 1 thread "
                  f"{raw['rows_per_s']:,.0f} rows/s: **{mop['unit_rows_per_s'] / raw['rows_per_s']:.2f}x**"),
                  (f"- where the worker time went (both workers, s): training {mop['train_s']:.1f}, "
                  f"state load {mop['load_s']:.1f} (includes the first read and decode of each "
                  f"partition), state save {mop['save_s']:.1f}, evaluation {mop['eval_s']:.1f}, "
                  f"idle {mop['idle_s']:.1f}; outside the units (connect, TF import in the "
                  f"workers, outputs): {mop['wall'] - mop['units_span']:.1f} s of the "
                  f"{mop['wall']:.1f} s call"), ""]
    out = ROOT / "bench" / "results" / "fit.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
