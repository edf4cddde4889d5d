"""Training metrics evaluated (MADlib's, the default) or running (Keras fit's), side by side.

    python bench/metrics_bench.py [WORKLOAD ...] [--rounds N] [--settings T:D,...] [--out F]

For each ``bench/workloads.py`` workload (default scale; default ``fashion-60k-cnn
fashion-60k-mlp``), packed into the benchmark database first:

  cerebro_db evaluated  a cold ``madlib_keras_fit_multiple_model`` (every argument at its
                        default, validation every epoch), as the suite's ``mop``
  cerebro_db running    the same with ``cerebro_db.training_metrics = 'running'`` set in the
                        fit's session: no evaluation of the training rows
  Keras evaluated       sequential Keras (``keras_runner.py sequential``, tf.data pipeline,
                        the suite's fastest) evaluating the training rows after each epoch,
                        as the suite's sequential baseline
  Keras running         the same taking the training metrics from ``fit``'s history
                        (``--train-metrics running``): what a Keras user gets by default

Keras runs at its best setting, chosen first by one run of the running variant at each
``THREADS:ONEDNN`` of ``--settings`` (default ``1:1,2:1,1:0,2:0``; the evaluated variant
uses the same one). Then ``--rounds`` rounds (default 3) of the four, the order rotated each
round (the machine's drift stays out of the ratios), after an unmeasured warm-up fit.
Printed and written (``--out``, JSON): each side's makespans, and per round cerebro_db /
Keras for both kinds of training metrics, with their medians; the like-for-like pairs are
evaluated / evaluated (what the suite reports) and running / running.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics as st
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import suite
import workloads
from common import connect

SIDES = ("cerebro_db evaluated", "cerebro_db running", "Keras evaluated", "Keras running")


def keras(data: Path, setting: tuple[int, int], metrics: str) -> float:
    out, _ = suite.run_sub(suite.keras_sequential(data, setting[0], "dataset", setting[1],
                                                  "--train-metrics", metrics))
    return float(out["makespan"])


def cerebro(db: suite.Db, metrics: str) -> float:
    suite.q(db.fit_conn, "SELECT set_config('cerebro_db.training_metrics', %s, false)",
            (metrics,))
    try:
        return float(db.fit("mop", None)["makespan"])
    finally:
        suite.q(db.fit_conn, "RESET cerebro_db.training_metrics")


def measure(name: str, rounds: int, settings: list[tuple[int, int]], work: Path) -> dict:
    w = workloads.workloads(workloads.SCALES["default"], {name})[0]
    data = work / f"{name}.npz"
    w.save(data)
    db = suite.Db(connect(), w)
    try:
        suite.log(f"{name}: loading {len(w.y)} + {len(w.vy)} rows")
        db.load()
        tried = {s: keras(data, s, "running") for s in settings}
        best = min(tried, key=tried.__getitem__)
        suite.log(f"{name}: Keras running, threads:oneDNN -> s: "
                  + ", ".join(f"{t}:{d} {v:.1f}" for (t, d), v in tried.items())
                  + f"; best {best[0]}:{best[1]}")
        suite.log(f"{name}: warm-up fit (not measured) {db.warm_up():.1f} s")
        runs: dict[str, list[float]] = {s: [] for s in SIDES}
        for i in range(rounds):
            order = SIDES[i % len(SIDES):] + SIDES[:i % len(SIDES)]
            for side in order:
                system, metrics = side.split(" ")
                runs[side].append(cerebro(db, metrics) if system == "cerebro_db"
                                  else keras(data, best, metrics))
            suite.log(f"{name}: round {i + 1}: " + ", ".join(
                f"{s} {runs[s][-1]:.1f} s" for s in SIDES))
    finally:
        db.cleanup()
    ratios = {m: [c / k for c, k in zip(runs[f"cerebro_db {m}"], runs[f"Keras {m}"])]
              for m in ("evaluated", "running")}
    ratios["cerebro running / evaluated"] = [
        r / e for r, e in zip(runs["cerebro_db running"], runs["cerebro_db evaluated"])]
    ratios["Keras running / evaluated"] = [
        r / e for r, e in zip(runs["Keras running"], runs["Keras evaluated"])]
    return {"workload": name, "rows": len(w.y), "keras_settings": {
        f"{t}:{d}": v for (t, d), v in tried.items()}, "keras_best": list(best),
        "runs": runs, "ratios": ratios,
        "medians": {k: st.median(v) for k, v in {**runs, **ratios}.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", default=["fashion-60k-cnn", "fashion-60k-mlp"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settings", default="1:1,2:1,1:0,2:0")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    settings = [(int(t), int(d)) for t, d in (s.split(":") for s in a.settings.split(","))]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.workloads:
            res = measure(name, a.rounds, settings, Path(tmp))
            out.append(res)
            m = res["medians"]
            print(f"{name}: medians (s): " + ", ".join(f"{s} {m[s]:.1f}" for s in SIDES)
                  + f"; cerebro_db / Keras, paired: evaluated {m['evaluated']:.3f}, running "
                  f"{m['running']:.3f}; running / evaluated: cerebro_db "
                  f"{m['cerebro running / evaluated']:.3f}, Keras "
                  f"{m['Keras running / evaluated']:.3f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
