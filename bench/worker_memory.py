"""Peak memory of worker sessions against the memory rule (README, "Memory of a worker session").

    python bench/worker_memory.py [--out bench/results/worker_memory.md]

Full Fashion-MNIST (60,000 training rows, 10,000 validation rows) packed over 2 partitions
(one buffer each, 94 MB of features per training partition); 4 MLP 784-128-64-10
configurations, 1 iteration with validation, p = 2 worker sessions. One fit per
``use_caching`` setting (FALSE, NULL with the default budget, NULL with a budget smaller
than a training partition, TRUE) and one on 1,000 rows (the runtime + models baseline).
While a fit runs, every worker session's ``VmHWM`` (peak resident memory, from
``/proc/<pid>/status``; run as root or as the server's OS user on the server's machine) is
``RssAnon`` (private memory) and ``RssShmem`` (the server's shared buffers the backend
touched: shared by all sessions, not a worker's own cost) are sampled every 0.05 s; the
table shows the largest over the workers. The rule is about private memory: the baseline's
plus the data a worker holds at its peak. Uses the tables of
``bench/eval_bench.py`` (run it first, or this script loads them).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import connect
from eval_bench import CP, mlp_json, q, setup

MB = 1 << 20


FIELDS = ("VmHWM", "RssAnon", "RssShmem")


def status(pid: int) -> dict[str, int]:
    """VmHWM (peak resident, all kinds), RssAnon (private memory now) and RssShmem (shared
    memory now: the server's shared buffers this backend has touched) in bytes."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":")[0]
                if k in FIELDS:
                    out[k] = int(line.split()[1]) * 1024
    except OSError:
        return {}
    return out


def run_fit(conn, monitor, source: str, valid: str, out: str, caching: str,
            budget: str | None) -> dict[str, float]:
    q(conn, f"DROP TABLE IF EXISTS {out}, {out}_info, {out}_summary")
    if budget is None:
        q(conn, "RESET cerebro_db.cache_memory")
    else:
        q(conn, "SET cerebro_db.cache_memory = %s", (budget,))
    peaks: dict[str, dict[int, int]] = {k: {} for k in FIELDS}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for (pid,) in q(monitor, "SELECT pid FROM pg_stat_activity WHERE application_name "
                                     "LIKE 'cerebro_db % worker %' AND application_name NOT "
                                     "LIKE '% worker ctl'"):
                for k, v in status(pid).items():
                    peaks[k][pid] = max(peaks[k].get(pid, 0), v)
            time.sleep(0.05)

    th = threading.Thread(target=watch)
    th.start()
    t = time.perf_counter()
    try:
        q(conn, f"SELECT madlib_keras_fit_multiple_model(%s, %s, 'wm_mst', 1, FALSE, %s, 1, "
                f"FALSE, NULL, NULL, {caching}, 'mop', NULL, 1)", (source, out, valid))
    finally:
        done.set()
        th.join()
    q(conn, "RESET cerebro_db.cache_memory")
    return {"seconds": time.perf_counter() - t, "workers": len(peaks["VmHWM"]),
            **{k: max(v.values()) if v else 0 for k, v in peaks.items()}}


UNIT_PEAKS = r"""
import gc, json
from cerebro_db import training, worker
from cerebro_db.catalog import Catalog
training.configure_runtime(1)
cat = Catalog(plpy, schema)
def status():
    d = {}
    for line in open("/proc/self/status"):
        k = line.split(":")[0]
        if k in ("VmHWM", "RssAnon", "RssFile", "RssShmem"):
            d[k] = int(line.split()[1]) * 1024
    return d
def peak(fn):
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    fn()
    d = status()
    return d["VmHWM"] - d["RssFile"] - d["RssShmem"]
arch = plpy.execute("SELECT model_arch::text AS a FROM wm_arch")[0]["a"]
cps = [r["c"] for r in plpy.execute("SELECT compile_params AS c FROM wm_mst ORDER BY mst_key")]
fps = [r["f"] for r in plpy.execute("SELECT fit_params AS f FROM wm_mst ORDER BY mst_key")]
cache = worker.model_cache()
state = {c: training.initial_state(arch, c, 1) for c in cps}
def train(caching, table="wm_train_p"):
    for c, f in zip(cps, fps):
        x, y = worker.unit_data(cat, {"x": "x", "y": "y", "use_caching": caching}, table, 0, c)
        state[c], _ = training.train_unit(cache, arch, c, f, state[c], x, y, 1)
def evaluate(caching):
    for c, f in zip(cps, fps):
        for t in ("wm_train_p", "wm_valid_p"):
            x, y = worker.unit_data(cat, {"x": "x", "y": "y", "use_caching": caching}, t, 0, c)
            bs = training.eval_batch_size(cache.get(arch, c).model, 128)
            training.evaluate(cache, arch, c, state[c], x, y, bs)
for _ in range(2):  # build, trace every batch size, warm the allocators
    train(False); evaluate(False)
gc.collect()
out = {"steady": status()["RssAnon"],
       "streams": int(sum(a.nbytes for a in training._STREAM_ARRAYS.values()))}
out["stream_train"] = peak(lambda: train(False))
out["stream_eval"] = peak(lambda: evaluate(False))
out["cache_fill"] = peak(lambda: (train(True), evaluate(True)))
out["cached_data"] = int(sum(x.nbytes + y.nbytes for x, y in worker._partitions.values()))
out["cached_units"] = peak(lambda: (train(True), evaluate(True)))
worker._partitions.clear()
return json.dumps(out)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "worker_memory.md"))
    args = ap.parse_args()
    conn = connect()
    monitor = connect()
    setup(conn)
    q(conn, "DROP TABLE IF EXISTS wm_train_p, wm_train_p_summary, wm_valid_p, "
            "wm_valid_p_summary, wm_tiny, wm_tiny_v, wm_tiny_p, wm_tiny_p_summary, wm_tiny_vp, "
            "wm_tiny_vp_summary, wm_arch, wm_mst, wm_mst_summary")
    q(conn, "SELECT training_preprocessor_dl('evb_train', 'wm_train_p', 'y', 'x', NULL, 255.0, "
            "NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('evb_valid', 'wm_valid_p', 'y', 'x', "
            "'wm_train_p')")
    q(conn, "CREATE TABLE wm_tiny AS SELECT * FROM evb_train WHERE id < 1000")
    q(conn, "CREATE TABLE wm_tiny_v AS SELECT * FROM evb_valid WHERE id < 200")
    q(conn, "SELECT training_preprocessor_dl('wm_tiny', 'wm_tiny_p', 'y', 'x', NULL, 255.0, "
            "NULL, NULL, 2, 1)")
    q(conn, "SELECT validation_preprocessor_dl('wm_tiny_v', 'wm_tiny_vp', 'y', 'x', "
            "'wm_tiny_p')")
    q(conn, "SELECT load_keras_model('wm_arch', %s)", (mlp_json(),))
    q(conn, "SELECT load_model_selection_table('wm_arch', 'wm_mst', ARRAY[1], %s, %s)",
      ([CP.replace("0.001", lr) for lr in ("0.001", "0.0003")],
       ["batch_size=128", "batch_size=256"]))
    part = q(conn, "SELECT max(octet_length(x)) + 2 * max(octet_length(y)) FROM wm_train_p")[0][0]
    vpart = q(conn, "SELECT max(octet_length(x)) + 2 * max(octet_length(y)) FROM wm_valid_p")[0][0]
    load0 = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    base = run_fit(conn, monitor, "wm_tiny_p", "wm_tiny_vp", "wm_out", "NULL", None)
    runs = [
        ("FALSE", None, "a training and a validation buffer (kept between units)",
         part + vpart),
        ("NULL", None, "training + validation partition (default budget holds both)",
         part + vpart),
        ("NULL", "64MB", ("one training buffer (streamed: larger than the budget) + the "
                          "validation partition (kept)"), part + vpart),
        ("TRUE", None, "training + validation partition", part + vpart),
    ]
    rows = []
    for caching, budget, what, data in runs:
        r = run_fit(conn, monitor, "wm_train_p", "wm_valid_p", "wm_out", caching, budget)
        rows.append((caching, budget, what, data, r))
        print(caching, budget, r, flush=True)
    schema = q(conn, "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
                     "ON n.oid = e.extnamespace WHERE e.extname = 'cerebro_db'")[0][0]
    fresh = connect()
    q(fresh, "CREATE FUNCTION pg_temp.unit_peaks(schema text) RETURNS text "
             "LANGUAGE plpython3u AS $f$" + UNIT_PEAKS + "$f$")
    import json

    u = json.loads(q(fresh, "SELECT pg_temp.unit_peaks(%s)", (schema,))[0][0])
    fresh.close()
    print(u, flush=True)
    load1 = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    lines = [
        "# Worker session memory against the rule", "",
        f"`python bench/worker_memory.py {' '.join(sys.argv[1:])}`".replace(" `", "`"), "",
        (f"Load average {load0} at the start, {load1} at the end (shared 2-core machine; "
         "memory figures do not depend on the load). Full Fashion-MNIST over 2 partitions, "
         f"a training partition is {part / MB:.0f} MB decoded, a validation partition "
         f"{vpart / MB:.0f} MB; 4 MLP configurations, 1 iteration with validation, 2 workers. "
         "Private = the largest sampled RssAnon over the fit's worker sessions (sampled every "
         "0.05 s); shared = RssShmem, the server's shared buffers a worker touched (shared by "
         "every session; reading a 94 MB buffer passes it through them); VmHWM = the kernel's "
         "peak of both."), "",
        (f"Baseline (runtime + models + 1,000 rows): **{base['RssAnon'] / MB:,.0f} MB** "
         f"private per worker (VmHWM {base['VmHWM'] / MB:,.0f} MB)."), "",
        ("| use_caching | cache_memory | data held at the peak (rule) | rule: baseline + data "
         "(MB) | measured private (MB) | measured - rule (MB) | shared (MB) | VmHWM (MB) | "
         "fit (s) |"),
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for caching, budget, what, data, r in rows:
        rule = base["RssAnon"] + data
        lines.append(f"| {caching} | {budget or 'default'} | {what} | {rule / MB:,.0f} | "
                     f"{r['RssAnon'] / MB:,.0f} | {(r['RssAnon'] - rule) / MB:+,.0f} | "
                     f"{r['RssShmem'] / MB:,.0f} | {r['VmHWM'] / MB:,.0f} | "
                     f"{r['seconds']:.1f} |")
    streams = u["streams"]
    st = u["steady"] - streams  # runtime + models + traces: the rule's first term
    lines += [
        "", "## Per unit, one worker session (the rule's terms measured directly)", "",
        ("A fresh session runs the worker code (`worker.unit_data`, `training.train_unit`, "
         "`training.evaluate`) on partition 0 for the 2 configurations, first twice streamed "
         "to build and trace everything; then each step's peak private memory is measured "
         "(VmHWM reset through `/proc/self/clear_refs` before it, VmHWM - RssFile - RssShmem "
         "after it). Streaming keeps a training and a validation buffer in the reusable "
         "stream arrays; caching a partition first releases the stream arrays that hold its "
         "buffers, so the data is held once."), "",
        (f"Steady private memory after warm-up: **{u['steady'] / MB:,.0f} MB**, of which the "
         f"stream arrays {streams / MB:,.0f} MB: runtime + models + traces "
         f"**{st / MB:,.0f} MB**."),
        "",
        ("| step | data held (rule) | rule: runtime + models + traces + data (MB) | "
         "measured peak (MB) | measured - rule (MB) |"),
        "|---|---|---:|---:|---:|",
    ]
    for name, what, data, got in [
            ("2 training units, streamed (FALSE)", "a training and a validation buffer",
             streams, u["stream_train"]),
            ("4 evaluations, streamed (FALSE)", "a training and a validation buffer",
             streams, u["stream_eval"]),
            ("2 units + 4 evaluations filling the cache (TRUE / NULL)",
             "training + validation partition", u["cached_data"], u["cache_fill"]),
            ("the same again from the cache", "training + validation partition",
             u["cached_data"], u["cached_units"])]:
        lines.append(f"| {name} | {what} | {(st + data) / MB:,.0f} | {got / MB:,.0f} | "
                     f"{(got - st - data) / MB:+,.0f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
