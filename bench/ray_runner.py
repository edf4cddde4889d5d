"""Ray Tune baseline of the suite (task parallelism), run as a subprocess.

    python bench/ray_runner.py DATA.npz [--concurrent 2] [--eval-batch JSON]

A local Ray cluster (``ray.init(num_cpus=2, include_dashboard=False)``, no network) runs every
configuration of DATA.json as a trial, ``--concurrent`` at a time, 1 CPU and 1 TensorFlow
thread each. The arrays go to the trials through ``tune.with_parameters`` (Ray's object
store) and every trial copies them into its own memory, the usual task-parallel set-up in
which each trial holds the whole data set. Each trial trains its configuration for the
epochs of DATA.json with training and validation metrics after every epoch. Trial actors are
reused (``reuse_actors=True``), so a worker process with TensorFlow loaded serves several
trials. The evaluations run at ``--eval-batch``'s size for each configuration (a JSON list
in DATA.json's order: what evaluated fastest in a process like a trial, measured by the suite
before this run with ``keras_runner.py eval-batches``; default 1,024 rows a batch). Prints
one JSON line: makespan (ray.init to the end of Tuner.fit), the time ray.init took, and per trial its
validation accuracy curve.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def trainable(config: dict, data: dict) -> None:
    """One trial: copy the data, train the configuration, report after every epoch."""
    import numpy as np
    from ray import tune

    from cerebro_db.training import configure_runtime, onednn_enabled

    configure_runtime(1)
    from keras_runner import build

    onednn = onednn_enabled()  # set by cerebro_db's import: on
    x, y, vx, vy = (np.array(data[k], copy=True) for k in ("x", "y", "vx", "vy"))
    cfg = data["configs"][config["i"]]
    bs = data["eval_batch"][config["i"]]
    m = build(cfg, steps_per_execution=1 << 20)  # Keras' fastest: one call per pass
    for e in range(data["epochs"]):
        t = time.perf_counter()
        m.fit(x, y, batch_size=cfg["batch_size"], epochs=1, verbose=0, shuffle=True)
        train_s = time.perf_counter() - t
        m.evaluate(x, y, batch_size=bs, verbose=0)
        r = m.evaluate(vx, vy, batch_size=bs, verbose=0, return_dict=True)
        tune.report({"val_acc": float(r["accuracy"]), "epoch": e + 1, "train_s": train_s,
                     "pid": os.getpid(), "onednn": onednn})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--concurrent", type=int, default=2)
    ap.add_argument("--eval-batch", default=None,
                    help="JSON list: each configuration's evaluation batch size")
    a = ap.parse_args()
    from keras_runner import load

    meta, x, y, vx, vy = load(a.data)
    eval_batch = json.loads(a.eval_batch) if a.eval_batch else [1024] * len(meta["configs"])
    if len(eval_batch) != len(meta["configs"]) or not all(
            type(b) is int and b > 0 for b in eval_batch):
        raise SystemExit(f"--eval-batch needs {len(meta['configs'])} positive integers")
    t0 = time.perf_counter()
    import ray
    from ray import tune

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    t_init = time.perf_counter() - t0
    data = {"x": x, "y": y, "vx": vx, "vy": vy, "configs": meta["configs"],
            "epochs": meta["epochs"], "eval_batch": eval_batch}
    with tempfile.TemporaryDirectory(prefix="cerebro_bench_ray_") as tmp:
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(trainable, data=data), {"cpu": 1}),
            param_space={"i": tune.grid_search(list(range(len(meta["configs"]))))},
            tune_config=tune.TuneConfig(max_concurrent_trials=a.concurrent, reuse_actors=True),
            run_config=tune.RunConfig(storage_path=tmp, name="bench", verbose=0),
        )
        grid = tuner.fit()
        makespan = time.perf_counter() - t0
        trials = []
        for r in grid:
            df = r.metrics_dataframe
            if r.error or df is None:
                raise SystemExit(f"trial failed: {r.error}")
            df = df.sort_values("epoch")
            trials.append({"i": int(r.config["i"]), "curve": [float(v) for v in df["val_acc"]],
                           "train_s": float(df["train_s"].sum()), "pid": int(df["pid"].iloc[0]),
                           "onednn": bool(df["onednn"].iloc[0])})
    ray.shutdown()
    trials.sort(key=lambda t: t["i"])
    print(json.dumps({"makespan": makespan, "init_s": t_init, "configs": trials,
                      "eval_batches": sorted(set(eval_batch)),
                      "processes": len({t["pid"] for t in trials}),
                      "onednn": sorted({t["onednn"] for t in trials}),
                      "data_bytes": int(sum(v.nbytes for v in (x, y, vx, vy))),
                      "ray": ray.__version__}), flush=True)


if __name__ == "__main__":
    main()
