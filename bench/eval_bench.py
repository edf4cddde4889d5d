"""Training and evaluation units inside the worker code against raw Keras, in one process.

    python bench/eval_bench.py [--reps 5] [--package DIR] [--out bench/results/eval.md]

Everything runs inside ONE database backend (a PL/Python function), so both sides share the
process, its single TensorFlow thread (``worker_threads = 1``, what each of 2 workers gets
on a 2-core machine) and whatever else the machine is doing at that moment; repetitions of
the sides are interleaved (alternating order) after two warm-up calls each, and medians are
reported. Data: full Fashion-MNIST, 60,000 training rows packed as one partition (one
buffer, as MADlib's default buffer size gives) and the 10,000 test rows as validation.

training unit   raw: ``model.fit(x, y, batch_size, epochs=1)`` on numpy arrays (a warm
                model, Keras' defaults); Keras at its best: the same model compiled with
                ``steps_per_execution`` covering the pass, fed by a tf.data pipeline made
                once from tensors (seeded reshuffle of row indices, gathered batches,
                prefetch; what bench/keras_runner.py's ``--pipeline dataset`` does);
                cached: ``training.train_unit`` on the partition the worker keeps
                (``worker.partition_data`` with its per-unit fingerprint query, state bytes
                in and out as a worker does); streaming: the same over
                ``worker.partition_buffers`` (``use_caching => FALSE``) as a worker streams
                its partition unit after unit: the reusable array still holds the buffer
                (the same stored row version), so it is not read again; streaming, buffer
                read: the same with the array made to forget what it holds first, so the
                buffer is read from the table and decoded in the unit (what every unit
                pays where a partition has several buffers); for evaluation also
                "read, overlapped": the same with ``overlap`` (the rows read are
                evaluated in a second thread while the rest is read; what a worker does
                where the fit leaves a core free). This process has a core to spare for
                it; a fit whose workers fill the machine's cores has none.
evaluation unit the training partition and the validation rows (what a worker's evaluation
                unit does after an epoch). raw: ``model.evaluate`` on both with the
                configuration's batch size (what a sequential Keras script does) and with
                the worker's evaluation batch size; at its best: the best-compiled model
                on tf.data batches of the evaluation batch size; cached / streaming: ``training.evaluate``
                as the worker calls it (``training.eval_batch_size``).
                The metric values of ours and raw at the same batch size are compared.

``--package DIR`` puts DIR first on the backend's ``sys.path`` (e.g. an older checkout's
package) to measure the code before a change with the same script. The first read of the
partition (``partition_data``) is timed too. Needs the embedded server (``make start``) and
the database CEREBRO_BENCH_DB (default ``cerebro_bench``, created when missing).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BODY = r'''
import inspect, json, os, statistics, sys, time
a = json.loads(spec)
if a.get("package"):
    sys.path.insert(0, a["package"])
import numpy as np
from cerebro_db.catalog import Catalog
from cerebro_db import training, worker
training.configure_runtime(1)
import keras
from cerebro_db import params

cat = Catalog(plpy, a["schema"])
out = {"package": os.path.dirname(os.path.dirname(worker.__file__)), "cases": []}

def med(v):
    return float(statistics.median(v))

def interleaved(fns, reps):
    for f in fns.values():
        f(); f()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    names = list(fns)
    for i in range(reps):
        for k in (names if i % 2 == 0 else names[::-1]):
            t, c = time.perf_counter(), time.process_time()
            fns[k]()
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    return {k: {"wall": med(wall[k]), "cpu": med(cpu[k])} for k in fns}

t = time.perf_counter()
x, y = worker.partition_data(cat, a["train"], "x", "y", 0, use_caching=False)
out["first_read_s"] = time.perf_counter() - t
vx, vy = worker.partition_data(cat, a["valid"], "x", "y", 0, use_caching=False)
out["rows"], out["valid_rows"] = int(x.shape[0]), int(vx.shape[0])
shapes = {a["train"]: x.shape, a["valid"]: vx.shape}
can_overlap = "overlap" in inspect.signature(worker.partition_buffers).parameters
xr, yr = np.array(x), np.array(y)          # plain numpy arrays for raw Keras
vxr, vyr = np.array(vx), np.array(vy)
del x, y, vx, vy

for case in a["cases"]:
    arch, cp, bs = case["arch"], case["compile_params"], case["batch_size"]
    image = case["image"]
    shape = (-1, 28, 28, 1) if image else (-1, 784)
    xk, vxk = xr.reshape(shape), vxr.reshape(shape)
    raw = keras.models.model_from_json(arch)
    raw.compile(**params.parse_compile_params(cp).to_keras())
    best = keras.models.model_from_json(arch)
    best.compile(**params.parse_compile_params(cp).to_keras(), steps_per_execution=1 << 20)
    import tensorflow as tf
    tx, ty, tvx, tvy = (tf.constant(v) for v in (xk, yr, vxk, vyr))
    n_rows = int(xk.shape[0])
    best_train = (tf.data.Dataset.range(n_rows)
                  .shuffle(n_rows, seed=1, reshuffle_each_iteration=True).batch(bs)
                  .map(lambda i: (tf.gather(tx, i), tf.gather(ty, i)))
                  .prefetch(tf.data.AUTOTUNE))
    cache = training.ModelCache(max_models=8)
    state = [training.initial_state(arch, cp, 1)]
    seed = [0]
    fp = f"batch_size={bs}"
    if hasattr(training, "eval_batch_size"):  # what the worker uses
        ebs = training.eval_batch_size(cache.get(arch, cp).model, bs)
    else:  # the code before eval_batch_size
        ebs = max(bs, worker.EVAL_BATCH)

    def cached():
        xc, yc = worker.partition_data(cat, a["train"], "x", "y", 0)
        return xc, worker.labels_for(cp, yc)

    def cached_valid():
        xc, yc = worker.partition_data(cat, a["valid"], "x", "y", 0)
        return xc, worker.labels_for(cp, yc)

    def unit(data):
        seed[0] += 1
        state[0], _ = training.train_unit(cache, arch, cp, fp, state[0], *data, seed[0])

    def stream(table, read=False, overlap=False):
        if read:  # the reusable array forgets what it holds: the unit reads its buffer
            training.stream_array(shapes[table])
        if overlap:
            return worker.partition_buffers(cat, table, "x", "y", 0, cp, overlap=True), None
        return worker.partition_buffers(cat, table, "x", "y", 0, cp), None

    def ev(data, vdata):
        r1 = training.evaluate(cache, arch, cp, state[0], *data, batch_size=ebs)
        r2 = training.evaluate(cache, arch, cp, state[0], *vdata, batch_size=ebs)
        return r1, r2

    train = interleaved({
        "raw": lambda: raw.fit(xk, yr, batch_size=bs, epochs=1, verbose=0),
        "best": lambda: best.fit(best_train, epochs=1, verbose=0),
        "cached": lambda: unit(cached()),
        "streaming": lambda: unit(stream(a["train"])),
        "streaming_read": lambda: unit(stream(a["train"], read=True)),
    }, case["reps"])
    # raw Keras evaluates the weights ours has now
    training._load_any(cache.get(arch, cp), state[0])
    raw.set_weights(cache.get(arch, cp).model.get_weights())
    best.set_weights(cache.get(arch, cp).model.get_weights())
    best_eval = [tf.data.Dataset.from_tensor_slices(d).batch(ebs).prefetch(tf.data.AUTOTUNE)
                 for d in ((tx, ty), (tvx, tvy))]
    evals = interleaved({
        "raw_bs": lambda: (raw.evaluate(xk, yr, batch_size=bs, verbose=0),
                           raw.evaluate(vxk, vyr, batch_size=bs, verbose=0)),
        "raw_ebs": lambda: (raw.evaluate(xk, yr, batch_size=ebs, verbose=0),
                            raw.evaluate(vxk, vyr, batch_size=ebs, verbose=0)),
        "best": lambda: (best.evaluate(best_eval[0], verbose=0),
                         best.evaluate(best_eval[1], verbose=0)),
        "cached": lambda: ev(cached(), cached_valid()),
        "streaming": lambda: ev(stream(a["train"]), stream(a["valid"])),
        "streaming_read": lambda: ev(stream(a["train"], True), stream(a["valid"], True)),
        **({"streaming_overlap": lambda: ev(stream(a["train"], True, True),
                                            stream(a["valid"], True, True))}
           if can_overlap else {}),
    }, case["reps"])
    ours_c = ev(cached(), cached_valid())
    ours_s = ev(stream(a["train"]), stream(a["valid"]))
    ours_r = ev(stream(a["train"], True), stream(a["valid"], True))
    ours_o = ev(stream(a["train"], True, True), stream(a["valid"], True, True)) \
        if can_overlap else ours_r
    ref = (raw.evaluate(xk, yr, batch_size=ebs, verbose=0, return_dict=True),
           raw.evaluate(vxk, vyr, batch_size=ebs, verbose=0, return_dict=True))
    diff = 0.0
    for ours in (ours_c, ours_s, ours_r, ours_o):
        for o, r in zip(ours, ref):
            vals = {"loss": o.loss, **o.metrics}
            for k, v in r.items():
                diff = max(diff, abs(vals[k] - v) / max(abs(v), 1e-12))
    out["cases"].append({"name": case["name"], "batch_size": bs, "eval_batch": ebs,
                         "train": train, "eval": evals, "max_rel_diff": diff,
                         "values": {"ours": {"loss": ours_c[0].loss, **ours_c[0].metrics},
                                    "raw": ref[0]}})
    plpy.notice(json.dumps(out["cases"][-1]))
out["vm_hwm_mb"] = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
                       .split()[1]) / 1024
# both sides: one process, one setting (None: a package from before the probe)
out["onednn"] = training.onednn_enabled() if hasattr(training, "onednn_enabled") else None
return json.dumps(out)
'''


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


CP = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', metrics=['accuracy']"


def q(conn, sql, args=None):
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall() if cur.description else None


def setup(conn) -> None:
    """Full Fashion-MNIST packed as one training partition (one buffer) and validation."""
    import numpy as np

    from tooling.datasets import copy_payload, find_dataset_dir, load_split

    have = q(conn, "SELECT to_regclass('evb_train_p') IS NOT NULL AND "
                   "to_regclass('evb_valid_p') IS NOT NULL")[0][0]
    if have and q(conn, "SELECT sum((x_shape)[1]) FROM evb_train_p")[0][0] == 60000:
        return
    d = find_dataset_dir("fashion-mnist")
    for name, split in (("evb_train", "train"), ("evb_valid", "t10k")):
        x, y = load_split(d, split)
        q(conn, f"DROP TABLE IF EXISTS {name}, {name}_p, {name}_p_summary")
        q(conn, f"CREATE TABLE {name} (id integer, y integer, x real[])")
        with conn.cursor() as cur:
            cur.copy_expert(f"COPY {name} FROM STDIN (FORMAT binary)", io.BytesIO(
                copy_payload(np.arange(len(y)), y.astype(np.int32), x)))
    q(conn, "SELECT training_preprocessor_dl('evb_train', 'evb_train_p', 'y', 'x', NULL, 255.0, "
            "NULL, NULL, 1, 1)")
    q(conn, "SELECT validation_preprocessor_dl('evb_valid', 'evb_valid_p', 'y', 'x', "
            "'evb_train_p', NULL, NULL, 1)")


def _read(side: dict, name: str = "streaming_read") -> str:
    """A 'buffer read' streaming side's seconds and its difference to cached."""
    r = side.get(name)
    if r is None:  # a JSON from before the side existed
        return "n/a | n/a"
    return f"{r['wall']:.3f} | {r['wall'] / side['cached']['wall'] - 1:+.0%}"


def _wall(side: dict, name: str) -> str:
    return f"{side[name]['wall']:.3f}" if name in side else "n/a"


def _ratio(side: dict, a: str, b: str) -> str:
    return f"{side[a]['wall'] / side[b]['wall']:.2f}x" if a in side and b in side else "n/a"


def report(res: dict, args: argparse.Namespace, cmd: str, load0: str, load1: str) -> str:
    rows, vrows = res["rows"], res["valid_rows"]
    lines = [
        "# Training and evaluation units vs raw Keras, one process",
        "", f"`{cmd}`", "",
        (f"Package measured: `{res['package']}`. Load average {load0} at the start, {load1} at "
         f"the end ({os.cpu_count()} cores; "
         + ("the machine was shared with other work when this started, so absolute seconds "
            "are inflated" if float(load0.split(",")[0]) > (os.cpu_count() or 1) / 2 else
            "quiet at the start")
         + "). Every figure of a table is measured in the same process, interleaved with its "
         "comparison, so the ratios hold even where the machine's speed drifts; CPU seconds "
         "(the process' own, all its threads) are the steadier figure on a loaded machine. "
         + {True: "TensorFlow's oneDNN kernels on (cerebro_db's default), for ours and Keras "
                  "alike (one process).",
            False: "TensorFlow's oneDNN kernels off, for ours and Keras alike (one process).",
            None: ""}[res.get("onednn")]),
        "",
        (f"Data: Fashion-MNIST, {rows:,} training rows packed as one partition of one buffer, "
         f"{vrows:,} validation rows. 1 TensorFlow thread. Medians of {args.reps} interleaved "
         "repetitions after two warm-up calls each. First read of the training partition "
         f"(`worker.partition_data`, table to arrays): {res['first_read_s']:.3f} s. Peak "
         f"RSS of the backend over the whole run: {res['vm_hwm_mb']:,.0f} MB."),
        "",
        "## Training unit (one epoch over the partition)",
        "",
        ("Throughput ratio = raw seconds / ours (>= 1: ours is at least as fast as Keras' `fit`); "
         "Keras at its best: `steps_per_execution` covering the pass and a tf.data pipeline "
         "made once. "
         "Streaming (`use_caching` FALSE): 'streaming' as a worker streams its one-buffer "
         "partition unit after unit (its reusable array still holds the buffer: not read "
         "again); 'buffer read' with the array made to forget it first, so the unit reads "
         "the buffer from the table (what every streamed unit pays where a partition has "
         "several buffers)."),
        "",
        ("| model | batch | raw fit (s) | Keras at its best (s) | cached unit (s) | cached / raw "
         "| cached / best | streaming unit (s) "
         "| streaming / raw | streaming vs cached | streaming, buffer read (s) | read vs cached "
         "| CPU: cached / raw | CPU: streaming / raw |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res["cases"]:
        t = c["train"]
        lines.append(
            f"| {c['name']} | {c['batch_size']} | {t['raw']['wall']:.3f} | "
            f"{_wall(t, 'best')} | "
            f"{t['cached']['wall']:.3f} | **{t['raw']['wall'] / t['cached']['wall']:.2f}x** | "
            f"**{_ratio(t, 'best', 'cached')}** | "
            f"{t['streaming']['wall']:.3f} | **{t['raw']['wall'] / t['streaming']['wall']:.2f}x** | "
            f"{t['streaming']['wall'] / t['cached']['wall'] - 1:+.0%} | {_read(t)} | "
            f"{t['raw']['cpu'] / t['cached']['cpu']:.2f}x | "
            f"{t['raw']['cpu'] / t['streaming']['cpu']:.2f}x |")
    lines += [
        "", f"## Evaluation unit ({rows:,} training-partition rows + {vrows:,} validation rows)",
        "",
        ("raw bs = `model.evaluate` with the configuration's batch size (a sequential Keras "
         "script); raw ebs = with the worker's evaluation batch size; Keras at its best = "
         "`steps_per_execution` covering the data, tf.data batches of the evaluation batch "
         "size from tensors. Ratio = raw seconds / ours. max rel. diff = largest relative difference between ours (cached and all "
         "streaming sides) and raw Keras' `evaluate` at the same batch size over the loss and "
         "metrics. 'read, overlapped': buffers read as in 'buffers read' while a second "
         "thread evaluates the rows already in (this process has a core to spare; a worker "
         "does it only where the fit leaves one)."),
        "",
        ("| model | batch / eval batch | raw bs (s) | raw ebs (s) | Keras at its best (s) "
         "| cached (s) | cached vs raw bs "
         "| cached vs raw ebs | cached vs best | streaming (s) | streaming vs raw ebs | streaming vs cached "
         "| streaming, buffers read (s) | read vs cached | read, overlapped (s) "
         "| overlapped vs cached "
         "| CPU: cached vs raw bs / ebs | CPU: streaming vs raw ebs | max rel. diff |"),
        "|---|" + "---:|" * 18,
    ]
    for c in res["cases"]:
        e = c["eval"]
        lines.append(
            f"| {c['name']} | {c['batch_size']} / {c['eval_batch']} | {e['raw_bs']['wall']:.3f} "
            f"| {e['raw_ebs']['wall']:.3f} | {_wall(e, 'best')} | {e['cached']['wall']:.3f} | "
            f"**{e['raw_bs']['wall'] / e['cached']['wall']:.2f}x** | "
            f"**{e['raw_ebs']['wall'] / e['cached']['wall']:.2f}x** | "
            f"**{_ratio(e, 'best', 'cached')}** | "
            f"{e['streaming']['wall']:.3f} | "
            f"**{e['raw_ebs']['wall'] / e['streaming']['wall']:.2f}x** | "
            f"{e['streaming']['wall'] / e['cached']['wall'] - 1:+.0%} | {_read(e)} | "
            f"{_read(e, 'streaming_overlap')} | "
            f"{e['raw_bs']['cpu'] / e['cached']['cpu']:.2f}x / "
            f"{e['raw_ebs']['cpu'] / e['cached']['cpu']:.2f}x | "
            f"{e['raw_ebs']['cpu'] / e['streaming']['cpu']:.2f}x | "
            f"{c['max_rel_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cnn-reps", type=int, default=3)
    ap.add_argument("--package", default=None, help="a directory holding another cerebro_db")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "eval.md"))
    ap.add_argument("--report", default=None, help="rewrite the report from this JSON (with "
                    "its command and loads given by --cmd and --loads)")
    ap.add_argument("--cmd", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--loads", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.report:
        res = json.loads(Path(args.report).read_text())
        text = report(res, args, args.cmd or "", *(args.loads or ("?", "?")))
        Path(args.out).write_text(text)
        print(text)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from common import connect

    conn = connect()
    setup(conn)
    cases = [
        {"name": "MLP 784-128-64-10", "arch": mlp_json(), "batch_size": 128, "image": False},
        {"name": "MLP 784-128-64-10", "arch": mlp_json(), "batch_size": 512, "image": False},
        {"name": "CNN conv8-conv16-dense10", "arch": cnn_json(), "batch_size": 128,
         "image": True},
    ]
    for c in cases:
        c["compile_params"] = CP
        c["reps"] = args.cnn_reps if c["image"] else args.reps
    schema = q(conn, "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                     "ON n.oid = e.extnamespace WHERE e.extname = 'cerebro_db'")[0][0]
    load0 = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    q(conn, "CREATE FUNCTION pg_temp.cerebro_eval_bench(spec text) RETURNS text "
            "LANGUAGE plpython3u AS $body$" + BODY + "$body$")
    conn.notices.clear()
    res = json.loads(q(conn, "SELECT pg_temp.cerebro_eval_bench(%s)", (json.dumps({
        "schema": schema, "train": "evb_train_p", "valid": "evb_valid_p",
        "package": args.package, "cases": cases}),))[0][0])
    load1 = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    cmd = "python bench/eval_bench.py " + " ".join(sys.argv[1:])
    text = report(res, args, cmd.strip(), load0, load1)
    out = Path(args.out)
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
