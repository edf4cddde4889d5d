"""How well the static unit cost estimate (``cerebro_db.scheduling.costs``) ranks the
configurations of a benchmark run, against their measured training unit times.

    python bench/cost_check.py [bench/results/results.json]

For every workload of a ``bench/suite.py`` results file: each configuration's measured time
per row (median of its training units' ``run`` time over rows, in the mop, mop_warm and ring
runs, leaving out a config's first unit on each worker, which traces), against
``unit_cost`` of its architecture and batch size. Only ratios within a workload matter (the
scheduler compares a fit's configurations with each other), so a scale per workload is
fitted (mean log ratio) and the geometric mean of the remaining error is printed; then the
same for a grid of ``ROW_OVERHEAD_FLOPS`` and ``STEP_OVERHEAD_FLOPS``, with the best pair.
"""
from __future__ import annotations

import json
import math
import statistics as st
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import workloads

from cerebro_db.scheduling import costs

RUNS = ("mop", "mop_warm", "ring")


def measured(results: dict) -> list[tuple[str, float, int, float]]:
    """(workload, forward flops, batch size, measured seconds per row) per configuration."""
    defs = {w.name: w for w in workloads.workloads(workloads.SCALES[results.get("scale") or
                                                                    "default"])}
    out = []
    for name, wl in results["workloads"].items():
        if name not in defs:
            continue
        per: dict[int, list[float]] = {}
        for system in RUNS:
            for run in wl["runs"].get(system, []):
                seen = set()
                for u in sorted(run.get("units") or [], key=lambda u: u["start"]):
                    if u["kind"] != "train" or not u.get("rows"):
                        continue
                    if (u["config"], u["worker"]) not in seen:
                        seen.add((u["config"], u["worker"]))
                        continue
                    per.setdefault(u["config"], []).append(u["run"] / u["rows"])
        for key, times in per.items():
            cfg = defs[name].configs[key - 1]
            flops = costs.forward_flops(cfg["arch_json"])
            if flops is not None:
                out.append((name, flops, int(cfg["batch_size"]), st.median(times)))
    return out


def errors(rows: list[tuple[str, float, int, float]], row: float, step: float
           ) -> dict[str, float]:
    """workload -> geometric mean error of the estimate after its best scale."""
    out = {}
    for name in sorted({r[0] for r in rows}):
        logs = [math.log(t / (3 * f + row + step / b)) for n, f, b, t in rows if n == name]
        mean = st.mean(logs)
        out[name] = math.exp(st.mean(abs(x - mean) for x in logs))
    return out


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench/results/results.json"
    rows = measured(json.loads(path.read_text()))
    now = errors(rows, costs.ROW_OVERHEAD_FLOPS, costs.STEP_OVERHEAD_FLOPS)
    print(f"{len(rows)} configurations; current constants: mean "
          f"{st.mean(now.values()):.3f}x, " +
          ", ".join(f"{k} {v:.3f}x" for k, v in now.items()))
    grid = [(st.mean(errors(rows, r, s).values()), r, s)
            for r in (0, 1e5, 2e5, 3e5, 1e6, 2e6, 5e6)
            for s in (0, 1e6, 5e6, 1e7, 2e7, 4e7, 8e7, 1.6e8)]
    best = min(grid)
    print(f"best of the grid: ROW_OVERHEAD_FLOPS {best[1]:.0e}, STEP_OVERHEAD_FLOPS "
          f"{best[2]:.0e}: mean {best[0]:.3f}x")


if __name__ == "__main__":
    main()
