"""Plain Keras baselines of the suite, run as a subprocess (so its memory is its own).

    python bench/keras_runner.py sequential DATA.npz --threads N [--pipeline P] [--shard I/P]
        [--onednn 0|1]
    python bench/keras_runner.py averaging DATA.npz --config I --epochs E --partitions P
    python bench/keras_runner.py eval-batches DATA.npz --threads N

``sequential``: every configuration of DATA.json one after another in this one process, on
the numpy arrays in memory, ``epochs`` passes each, training and validation metrics after
every epoch (what cerebro_db computes too; ``--train-metrics running``: the training metrics
are fit's history, its running means, as with ``cerebro_db.training_metrics = 'running'``);
``--pipeline numpy`` hands Keras the numpy
arrays (its usual input: Keras builds a new pipeline per call, and runs one batch per call
of its train function), ``--pipeline dataset`` is Keras at its fastest: tf.data pipelines
made once from tensors and reused (a seeded reshuffle of row indices each epoch, batches
gathered from the tensors, prefetched; evaluation batches from the tensors), and
``steps_per_execution`` covering a whole pass (the batches run in a loop inside the graph);
with either pipeline the evaluations run at the batch size that evaluated fastest in this
process before the clock started (:func:`eval_batches`);
the suite measures both and keeps the faster; ``--onednn`` sets ``TF_ENABLE_ONEDNN_OPTS``
(TensorFlow's oneDNN kernels; TensorFlow leaves them off on CPUs without AVX-512, cerebro_db
turns them on), which the suite measures both ways too; ``--pipeline units`` is not Keras' API but
cerebro_db's own unit code (``cerebro_db.training``: ``initial_state``, ``train_unit`` and
``evaluate`` on the arrays, one model cache) in this one process, without a database: a
fit over p workers against it shows what the parallelism itself gives; with
``--shard I/P`` only rows I, I+P, ... of the
training and validation arrays (p such processes side by side: the limit of data-parallel
work on this machine). ``averaging``: MADlib's single-model training
(``madlib_keras_fit``): each of P partitions trains a copy of the current weights for one
epoch, the copies are averaged (weighted by rows), repeat; simulated sequentially in this
process (one Keras model per partition, whose optimizer state persists across rounds as in
MADlib's segment cache); next to it the same configuration trained by plain sequential SGD.
``eval-batches``: only the evaluation batch size of each configuration (:func:`eval_batches`
with numpy input, as Ray Tune's trials evaluate), for the Ray baseline, whose trials cannot
measure it before their clock starts.
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load(path: str) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    meta = json.loads(Path(path).with_suffix(".json").read_text())
    d = np.load(path)
    k = meta["num_classes"]
    eye = np.eye(k, dtype=np.float32)
    return meta, d["x"], eye[d["y"]], d["vx"], eye[d["vy"]]


def build(cfg: dict, seed: int = 1, steps_per_execution: int = 1):
    import keras

    from cerebro_db import params

    keras.utils.set_random_seed(seed)
    m = keras.models.model_from_json(cfg["arch_json"])
    m.compile(**params.parse_compile_params(cfg["compile_params"]).to_keras(),
              steps_per_execution=steps_per_execution)
    return m


def pipelines(x, y, vx, vy):
    """(train(batch_size, seed), evaluation(batch_size)): tf.data pipelines over tensors made
    once; the training one reshuffles its row indices every pass; evaluation gives the
    (training rows, validation rows) pipelines of that batch size, each made once."""
    import tensorflow as tf

    tx, ty, tvx, tvy = (tf.constant(a) for a in (x, y, vx, vy))
    n = len(x)

    def train(batch_size: int, seed: int):
        return (tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True)
                .batch(batch_size).map(lambda i: (tf.gather(tx, i), tf.gather(ty, i)))
                .prefetch(tf.data.AUTOTUNE))

    made: dict[int, tuple] = {}

    def evaluation(batch_size: int) -> tuple:
        if batch_size not in made:
            made[batch_size] = tuple(
                tf.data.Dataset.from_tensor_slices((a, b)).batch(batch_size).prefetch(
                    tf.data.AUTOTUNE) for a, b in ((tx, ty), (tvx, tvy)))
        return made[batch_size]

    return train, evaluation


EVAL_BATCHES = (64, 128, 256, 512, 1024, 2048)
"""The evaluation batch sizes the sequential baseline tries (:func:`eval_batches`)."""


def eval_batches(meta: dict, vx, vy, pipeline: str, evaluation=None) -> dict[str, int]:
    """Keras' evaluation at its best: for each architecture of the workload (its JSON without
    layer names: ``keras_arch.cache_key``), the batch size of :data:`EVAL_BATCHES` whose
    ``evaluate`` of the validation rows ran fastest in this process (best of two timed calls
    after an untimed one, on a model built as the run builds it), measured before the run's
    clock starts. The batch size of an evaluation changes its results only by rounding.
    Until 2026-11-30 every evaluation ran at 1,024 rows a batch, which suits the MLPs but not
    the CNNs: measured on this host with 2 threads, 70,000 rows of the suite's CNN evaluated
    in 0.82 s at 1,024 and 0.64 s at 128 (1 thread: 1.28 against 0.82 s). With ``--shard``
    (the limit) each of the p processes measures its own, side by side, so their clocks
    start within about the same time of each other."""
    from cerebro_db.keras_arch import cache_key  # the JSON without Keras' layer names

    best: dict[str, int] = {}
    for cfg in meta["configs"]:
        arch = cache_key(cfg["arch_json"])
        if arch in best:
            continue
        m = build(cfg, steps_per_execution=1 << 20 if pipeline == "dataset" else 1)
        seconds = {}
        for bs in EVAL_BATCHES:
            if pipeline == "dataset":
                data = evaluation(bs)[1]

                def call(m=m, data=data):
                    m.evaluate(data, verbose=0)
            else:
                def call(m=m, bs=bs):
                    m.evaluate(vx, vy, batch_size=bs, verbose=0)
            call()
            runs = []
            for _ in range(2):
                t = time.perf_counter()
                call()
                runs.append(time.perf_counter() - t)
            seconds[bs] = min(runs)
        best[arch] = min(seconds, key=seconds.__getitem__)
    return best


def sequential(path: str, threads: int, shard: str | None = None,
               pipeline: str = "numpy", train_metrics: str = "evaluated") -> dict:
    from cerebro_db.training import configure_runtime

    configure_runtime(threads)
    meta, x, y, vx, vy = load(path)
    if shard:
        i, p = (int(v) for v in shard.split("/"))
        x, y, vx, vy = x[i::p], y[i::p], vx[i::p], vy[i::p]
    import keras  # noqa: F401 - imported before the clock starts, like a warm process

    if pipeline == "units":
        t0 = time.perf_counter()
        return {**units_in_one_process(meta, x, y, vx, vy, t0), "threads": threads,
                "pipeline": pipeline, "rows": len(x), "shard": shard}
    train = evaluation = None
    if pipeline == "dataset":
        train, evaluation = pipelines(x, y, vx, vy)
    from cerebro_db.keras_arch import cache_key

    t = time.perf_counter()
    ebs = eval_batches(meta, vx, vy, pipeline, evaluation)
    calibration = time.perf_counter() - t
    t0 = time.perf_counter()
    runs = []
    for cfg in meta["configs"]:
        m = build(cfg, steps_per_execution=1 << 20 if pipeline == "dataset" else 1)
        bs = ebs[cache_key(cfg["arch_json"])]
        curve, train_s, eval_s = [], 0.0, 0.0
        if train is not None:
            ds = train(cfg["batch_size"], 1)
            train_eval, valid_eval = evaluation(bs)
        for _ in range(meta["epochs"]):
            t = time.perf_counter()
            # training metrics 'running': what fit's history reports (its running means), no
            # pass over the training rows (cerebro_db.training_metrics = 'running')
            evaluated = train_metrics == "evaluated"
            if train is not None:
                m.fit(ds, epochs=1, verbose=0)
                t2 = time.perf_counter()
                if evaluated:
                    m.evaluate(train_eval, verbose=0)
                r = m.evaluate(valid_eval, verbose=0, return_dict=True)
            else:
                m.fit(x, y, batch_size=cfg["batch_size"], epochs=1, verbose=0, shuffle=True)
                t2 = time.perf_counter()
                if evaluated:
                    m.evaluate(x, y, batch_size=bs, verbose=0)
                r = m.evaluate(vx, vy, batch_size=bs, verbose=0, return_dict=True)
            eval_s += time.perf_counter() - t2
            train_s += t2 - t
            curve.append(float(r["accuracy"]))
        runs.append({"curve": curve, "train_s": train_s, "eval_s": eval_s, "eval_batch": bs})
    return {"makespan": time.perf_counter() - t0, "threads": threads, "pipeline": pipeline,
            "train_metrics": train_metrics, "configs": runs, "rows": len(x), "shard": shard,
            "eval_batches": sorted(set(ebs.values())), "calibration_s": calibration}


def config_eval_batches(path: str, threads: int) -> dict:
    """Each configuration's evaluation batch size (:func:`eval_batches`, numpy input, on
    ``threads`` TensorFlow threads), in the order of DATA.json's configurations."""
    from cerebro_db.keras_arch import cache_key
    from cerebro_db.training import configure_runtime

    configure_runtime(threads)
    meta, _, _, vx, vy = load(path)
    t = time.perf_counter()
    ebs = eval_batches(meta, vx, vy, "numpy")
    return {"eval_batch": [ebs[cache_key(c["arch_json"])] for c in meta["configs"]],
            "threads": threads, "calibration_s": time.perf_counter() - t}


def units_in_one_process(meta: dict, x, y, vx, vy, t0: float) -> dict:
    """Every configuration one after another through cerebro_db's unit code, each epoch a
    training unit over all rows, then the evaluation of the training and validation rows
    (a fit's work, one partition, no database)."""
    from cerebro_db import training

    xs, vxs = training.aligned_empty(x.shape), training.aligned_empty(vx.shape)
    xs[:], vxs[:] = x, vx  # the worker's reader fills such arrays (shared with the tensors)
    cache = training.ModelCache(max_models=8)
    runs = []
    for i, cfg in enumerate(meta["configs"]):
        arch, cp, fp = cfg["arch_json"], cfg["compile_params"], cfg["fit_params"]
        state = training.initial_state(arch, cp, seed=1 + i)
        bs = training.eval_batch_size(cache.get(arch, cp).model, cfg["batch_size"])
        curve, train_s, eval_s = [], 0.0, 0.0
        for epoch in range(meta["epochs"]):
            t = time.perf_counter()
            state, _ = training.train_unit(cache, arch, cp, fp, state, xs, y, seed=epoch)
            t2 = time.perf_counter()
            training.evaluate(cache, arch, cp, state, xs, y, batch_size=bs)
            r = training.evaluate(cache, arch, cp, state, vxs, vy, batch_size=bs)
            eval_s += time.perf_counter() - t2
            train_s += t2 - t
            curve.append(float(r.metrics["accuracy"]))
        runs.append({"curve": curve, "train_s": train_s, "eval_s": eval_s})
    return {"makespan": time.perf_counter() - t0, "configs": runs}


def averaging(path: str, index: int, epochs: int, p: int) -> dict:
    from cerebro_db.training import configure_runtime

    configure_runtime(2)
    meta, x, y, vx, vy = load(path)
    cfg = meta["configs"][index]
    parts = np.array_split(np.random.default_rng(1).permutation(len(x)), p)
    glob = build(cfg)
    local = [build(cfg) for _ in range(p)]
    ma, ma_s = [], 0.0
    weights_bytes = sum(w.nbytes for w in glob.get_weights())
    for _ in range(epochs):
        t = time.perf_counter()
        w0 = glob.get_weights()
        acc = [np.zeros_like(w, dtype=np.float64) for w in w0]
        for m, idx in zip(local, parts):
            m.set_weights(w0)
            m.fit(x[idx], y[idx], batch_size=cfg["batch_size"], epochs=1, verbose=0, shuffle=True)
            for a, w in zip(acc, m.get_weights()):
                a += w * (len(idx) / len(x))
        glob.set_weights([a.astype(w.dtype) for a, w in zip(acc, w0)])
        ma_s += time.perf_counter() - t
        ma.append(float(glob.evaluate(vx, vy, batch_size=1024, verbose=0, return_dict=True)
                        ["accuracy"]))
    sgd, sgd_s = [], 0.0
    m = build(cfg)
    for _ in range(epochs):
        t = time.perf_counter()
        m.fit(x, y, batch_size=cfg["batch_size"], epochs=1, verbose=0, shuffle=True)
        sgd_s += time.perf_counter() - t
        sgd.append(float(m.evaluate(vx, vy, batch_size=1024, verbose=0, return_dict=True)
                         ["accuracy"]))
    return {"config": index, "partitions": p, "epochs": epochs, "averaging": ma,
            "averaging_train_s": ma_s, "sgd": sgd, "sgd_train_s": sgd_s,
            "weights_bytes": weights_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["sequential", "averaging", "eval-batches"])
    ap.add_argument("data")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--pipeline", choices=["numpy", "dataset", "units"], default="numpy")
    ap.add_argument("--shard", default=None, help="I/P: train on rows I, I+P, ... only")
    ap.add_argument("--onednn", choices=["0", "1"], default=None,
                    help="TF_ENABLE_ONEDNN_OPTS for this process (default: cerebro_db's, on)")
    ap.add_argument("--train-metrics", choices=["evaluated", "running"], default="evaluated",
                    help="sequential: 'running' takes the training metrics from fit's history "
                    "instead of evaluating the training rows after each epoch")
    a = ap.parse_args()
    if a.onednn is not None:  # before anything imports TensorFlow (or cerebro_db's default)
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = a.onednn
    if a.mode == "sequential":
        out = sequential(a.data, a.threads, a.shard, a.pipeline, a.train_metrics)
    elif a.mode == "eval-batches":
        out = config_eval_batches(a.data, a.threads)
    else:
        out = averaging(a.data, a.config, a.epochs, a.partitions)
    from cerebro_db.training import onednn_enabled

    out["onednn"] = onednn_enabled()  # the kernels this run used
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
