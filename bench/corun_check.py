"""What two workers' training units cost each other when they run at the same time.

    python bench/corun_check.py [--rounds 3] [--seconds 8] [--rows 30000]

Two processes, each a worker's share of a fit's work in miniature: cerebro_db's own unit code
(``training.train_unit``, one TensorFlow thread, oneDNN on, as a worker runs it) training one
of the suite's fashion-60k-cnn configurations (batch 64 or 128) over ``rows`` Fashion-MNIST
rows again and again for ``seconds``, both starting together after a warm-up unit. Pairs
(128, 128), (64, 128) and (64, 64), and each batch size alone, interleaved over ``rounds``;
the medians of each side's unit times are printed, and the two ratios that matter: a
batch-128 unit next to another batch-128 unit against next to a batch-64 one, and the
same for batch 64. A scheduler that runs configs in lock-step pairs (MOP's cost-aware
tie-break pairs configs of equal cost, so equal batch sizes) pays the first ratio on half
of its units where the ring's pairs are mixed. No database; the data is Debian's
dataset-fashion-mnist.

    python bench/corun_check.py --order [--rounds 5] [--rows 30000]

One process (nothing beside it) training the four CNN configs' units in MOP's order on a
worker (configs 1, 2, 3, 4: each learning rate's two batch sizes one after the other; the
two learning rates are two compiled models of the worker's cache) and in the ring's (1, 3,
2, 4), each order twice per round, rounds interleaved: the medians of each config's unit
time per order (what the order of a worker's units costs, apart from what runs beside it).
A third order, (1, 2, 4, 3), changes the batch size every second unit, as the ring's does,
but keeps each learning rate's units together, as MOP's does.

    python bench/corun_check.py --switch --rounds 30 --rows 1280

One process, small units (1,280 rows: 20 batch-64 steps, 10 batch-128 steps) in those
orders: the median time of a unit right after a unit of the same batch size and right after
one of the other batch size, which shows any one-off cost of switching the batch size
(MOP's CNN workers switch at every unit, the ring's at 3 of 7).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _setup(rows: int):
    """A worker's runtime (one TensorFlow thread, oneDNN on), ``rows`` training rows as the
    worker holds them, the CNN configs, and a unit function over them."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    import numpy as np
    import workloads

    from cerebro_db import training

    training.configure_runtime(1)
    x, y, _, _ = workloads.images("fashion-mnist", rows, 1)
    xs = training.aligned_empty(x.shape)
    xs[:] = x
    ys = np.eye(10, dtype=np.float32)[y]
    cfgs = workloads.cnn4(10)
    cache = training.ModelCache(max_models=8)
    states: dict[int, bytes] = {}

    def unit(i: int, seed: int) -> float:
        """Config ``i``'s next training unit (its initial state made first, untimed); its
        seconds."""
        c = cfgs[i]
        if i not in states:
            states[i] = training.initial_state(c["arch_json"], c["compile_params"], seed=1 + i)
        t = time.perf_counter()
        states[i], _ = training.train_unit(cache, c["arch_json"], c["compile_params"],
                                           c["fit_params"], states[i], xs, ys, seed=seed)
        return time.perf_counter() - t

    return cfgs, unit


def side(batch: int, rows: int, seconds: float, barrier, out) -> None:
    """One process: warm up, wait for the partner, then train units for ``seconds``."""
    cfgs, unit = _setup(rows)
    i = next(k for k, c in enumerate(cfgs) if c["batch_size"] == batch)
    unit(i, 0)  # warm-up
    if barrier is not None:
        barrier.wait()
    times, end, seed = [], time.perf_counter() + seconds, 1
    while time.perf_counter() < end:
        times.append(unit(i, seed))
        seed += 1
    out.put((batch, times))


def order(rounds: int, rows: int) -> None:
    """The ``--order`` check (module docstring)."""
    cfgs, unit = _setup(rows)
    for i in range(len(cfgs)):
        unit(i, 0)  # each model built and traced
    orders = {"mop (1, 2, 3, 4)": [0, 1, 2, 3], "ring (1, 3, 2, 4)": [0, 2, 1, 3],
              "1, 2, 4, 3": [0, 1, 3, 2]}
    got: dict[str, dict[int, list[float]]] = {k: {i: [] for i in range(4)} for k in orders}
    seed = 1
    for r in range(rounds):
        ks = list(orders)
        for k in ks[r % len(ks):] + ks[:r % len(ks)]:
            for _ in range(2):
                for i in orders[k]:
                    got[k][i].append(unit(i, seed))
                    seed += 1
    for k, per in got.items():
        med = {i: statistics.median(t) for i, t in per.items()}
        print(f"{k}: " + ", ".join(f"config {i + 1} (batch {cfgs[i]['batch_size']}) "
                                   f"{m:.3f} s" for i, m in med.items())
              + f"; sum {sum(med.values()):.3f} s")


def switch(rounds: int, rows: int) -> None:
    """The ``--switch`` check (module docstring)."""
    cfgs, unit = _setup(rows)
    for i in range(len(cfgs)):
        unit(i, 0)
        unit(i, 0)
    got: dict[tuple[int, str], list[float]] = {}
    seed = 1
    for r in range(rounds):
        seqs = [[0, 2, 1, 3], [0, 1, 2, 3]]
        for seq in (seqs if r % 2 == 0 else seqs[::-1]):
            prev = None
            for i in seq * 2:
                t = unit(i, seed)
                seed += 1
                if prev is not None:
                    b = cfgs[i]["batch_size"]
                    key = (b, "same" if cfgs[prev]["batch_size"] == b else "other")
                    got.setdefault(key, []).append(t)
                prev = i
    for (b, after), v in sorted(got.items()):
        print(f"batch {b} after the {after} batch size: median {statistics.median(v) * 1e3:.1f} "
              f"ms ({len(v)} units)")


def run(batches: tuple[int, ...], rows: int, seconds: float) -> list[tuple[int, list[float]]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(batches)) if len(batches) > 1 else None
    out = ctx.Queue()
    procs = [ctx.Process(target=side, args=(b, rows, seconds, barrier, out)) for b in batches]
    for p in procs:
        p.start()
    res = []
    while len(res) < len(procs):
        try:
            res.append(out.get(timeout=1.0))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                sys.exit(f"a side failed (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rows", type=int, default=30000)
    ap.add_argument("--order", action="store_true", help="the order check, one process")
    ap.add_argument("--switch", action="store_true", help="the batch-size switch check")
    a = ap.parse_args()
    if a.switch:
        print(f"load {os.getloadavg()[0]:.2f}; switch check, {a.rounds} rounds, {a.rows} rows",
              flush=True)
        switch(a.rounds, a.rows)
        return
    if a.order:
        print(f"load {os.getloadavg()[0]:.2f}; order check, {a.rounds} rounds", flush=True)
        order(a.rounds, a.rows)
        return
    cases = [(128, 128), (64, 128), (64, 64), (128,), (64,)]
    got: dict[tuple[str, int], list[float]] = {}
    print(f"load {os.getloadavg()[0]:.2f}; {a.rounds} rounds of {cases}, {a.seconds} s each, "
          f"{a.rows} rows", flush=True)
    for r in range(a.rounds):
        for case in (cases if r % 2 == 0 else cases[::-1]):
            for batch, times in run(case, a.rows, a.seconds):
                partner = [b for b in case if b != batch] or (
                    [batch] if len(case) > 1 else ["alone"])
                key = (str(partner[0]), batch)
                got.setdefault(key, []).extend(times)
            print(f"round {r + 1} {case} done", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    for (partner, batch), m in sorted(med.items()):
        print(f"batch {batch} next to {partner}: {m:.3f} s per unit "
              f"({len(got[(partner, batch)])} units)")
    print(json.dumps({
        "128 next to 128 / next to 64": round(med[("128", 128)] / med[("64", 128)], 3),
        "64 next to 64 / next to 128": round(med[("64", 64)] / med[("128", 64)], 3),
        "128 next to 128 / alone": round(med[("128", 128)] / med[("alone", 128)], 3),
        "64 next to 64 / alone": round(med[("64", 64)] / med[("alone", 64)], 3),
        "load_end": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
