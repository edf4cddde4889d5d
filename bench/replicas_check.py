"""Whether replicated partitions even out workers that run at different speeds.

    python bench/replicas_check.py WORKLOAD [PAIRS] [--load]

On a ``bench/workloads.py`` workload already in the benchmark database (``--load`` packs it
first), warm fits with ``'mop'`` alternate ``SET cerebro_db.replicas = 1`` and ``= 2``
(``PAIRS`` pairs, default 3, the order swapped every pair) in one session. Printed per fit:
the span of the unit log, span / (all unit time / 2) (what a schedule that kept both workers
busy to the end would reach: 1), each worker's busy time, and which partitions each worker
trained; then the medians. With one replica a worker trains only its own partition, so when
one worker runs the same units slower the other idles at the end; with two (what fits get by
default when the data fits the cache budget), a worker with nothing left on its own partition
takes the other's units (the visit orders are seeded, so the models are the same).
"""
from __future__ import annotations

import os
import statistics as st
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import suite
import workloads
from common import connect


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not args:
        sys.exit(__doc__)
    name, pairs = args[0], int(args[1]) if len(args) > 1 else 3
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    w = workloads.workloads(workloads.SCALES["default"], {name})[0]
    db = suite.Db(connect(), w)
    if "--load" in sys.argv:
        db.load()
    db.fit("mop", None)  # opens and warms the worker sessions
    ratios: dict[int, list[float]] = {1: [], 2: []}
    for i in range(pairs):
        for r in (1, 2) if i % 2 == 0 else (2, 1):
            suite.q(db.fit_conn, f"SET cerebro_db.replicas = {r}")
            units = db.fit("mop", None, warm=True)["units"]
            span = max(u["end"] for u in units) - min(u["start"] for u in units)
            busy: dict[int, float] = {}
            for u in units:
                busy[u["worker"]] = busy.get(u["worker"], 0.0) + u["end"] - u["start"]
            ratio = span / (sum(busy.values()) / 2)
            ratios[r].append(ratio)
            held = sorted({(u["worker"], u["partition"]) for u in units})
            print(f"replicas {r}: span {span:.2f} s, span / (work / 2) {ratio:.3f}, busy "
                  f"{[round(b, 2) for b in busy.values()]} s, (worker, partition) {held}",
                  flush=True)
    for r, xs in ratios.items():
        print(f"replicas {r}: median span / (work / 2) {st.median(xs):.3f} over {len(xs)} fits")


if __name__ == "__main__":
    main()
