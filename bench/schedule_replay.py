"""The scheduling policies replayed on the unit times a benchmark run measured.

    python bench/schedule_replay.py [bench/results/results.json] [--seeds 20]
                                    [--costs measured|uniform|none]

For every workload of a ``bench/suite.py`` results file that has a logged ``mop`` run, each
training unit's measured duration (config, epoch, partition: first units included, with
their model build and trace; the cold read of a worker's first unit, its ``load``, goes to
whatever unit a worker runs first in the replay) and each evaluation unit's (all its kinds
together)
drive :func:`cerebro_db.simulation.simulate` with the policy fits use (``'mop'`` with
``prefer_lagging``, ``seeded_order``, ``cost_aware``, ``rotated_order`` and
``config_costs``; ``--seeds`` seeds) and with ``'ring'``, without and with the run's
evaluations. ``config_costs`` stands for the static estimate a fit computes from the
architectures (``cerebro_db.scheduling.costs``, which the results file does not hold):
``measured`` (default) takes each config's mean measured unit time (an estimate as good as
the run's own measurement), ``uniform`` gives every config the same cost (what a fit gets
when an architecture is not covered), ``none`` leaves the option out (the rotation by
mst_key). Printed per workload: the mean and max makespan of MOP, its mean and max ratio to
the bench's lower bound (``max(sum of all unit times / p,``
:func:`~cerebro_db.scheduling.invariants.lower_bound` ``of the training units)``: with
evaluations, their time counts in the sum), its max ratio to the larger of that bound and
:func:`~cerebro_db.scheduling.invariants.partition_bound` (the replayed times are fixed per
partition and each partition has one worker, so the busiest partition's work is a bound
too), the ring's makespan and MOP / ring. Simulated
makespans leave out what the simulator does not model (contention between workers, the
coordinator's round trips).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cerebro_db.scheduling import get_policy, lower_bound, partition_bound
from cerebro_db.simulation import simulate

FIT_OPTIONS = {"prefer_lagging": True, "seeded_order": True, "cost_aware": True,
               "rotated_order": True}


def bench_bound(log: list[Any], p: int) -> float:
    """The bench's lower bound of a run: ``max(sum of all unit times / p, lower_bound)``."""
    return max(sum(r.duration for r in log if r.ok) / p, lower_bound(log, p))


def replay(units: list[dict[str, Any]], p: int, seeds: int, with_evals: bool,
           costs: str = "measured") -> dict[str, float]:
    train: dict[tuple[int, int, int], float] = {}
    evals: dict[tuple[int, int, int], float] = {}
    cold: dict[int, float] = {}  # worker -> the first read of its partition
    first = {}
    for u in sorted(units, key=lambda u: u["start"]):
        first.setdefault(u["worker"], id(u))
    for u in units:
        key = (u["config"], u["epoch"], u["partition"])
        d = u["end"] - u["start"]
        if first[u["worker"]] == id(u):
            cold[u["worker"]] = float(u.get("load") or 0.0)
            d -= cold[u["worker"]]
        if u["kind"] == "train":
            train[key] = d
        else:
            evals[key] = evals.get(key, 0.0) + d
    configs = sorted({c for c, _, _ in train})
    epochs = max(e for _, e, _ in train)
    eval_epochs = sorted({e for _, e, _ in evals}) if with_evals else []

    def times():
        seen: dict[tuple[int, int], int] = {}
        seen_eval: dict[tuple[int, int], int] = {}
        started: set[int] = set()

        def warm(w: int) -> float:
            if w in started:
                return 0.0
            started.add(w)
            return cold.get(w, 0.0)

        def t(c: int, q: int, w: int) -> float:
            seen[(c, q)] = seen.get((c, q), 0) + 1
            return train[(c, seen[(c, q)], q)] + warm(w)

        def te(c: int, q: int, w: int) -> float:
            seen_eval[(c, q)] = seen_eval.get((c, q), 0) + 1
            return evals.get((c, eval_epochs[seen_eval[(c, q)] - 1], q), 0.0) + warm(w)

        return t, te

    options: dict[str, Any] = dict(FIT_OPTIONS)
    if costs == "measured":
        per: dict[int, list[float]] = {}
        for (c, _, _), d in train.items():
            per.setdefault(c, []).append(d)
        options["config_costs"] = {c: statistics.mean(v) for c, v in per.items()}
    elif costs == "uniform":
        options["config_costs"] = {c: 1.0 for c in configs}
    mop = []
    for seed in range(seeds):
        t, te = times()
        mop.append(simulate(get_policy("mop", random_state=seed, **options), configs, p,
                            epochs, t, eval_time=te, eval_epochs=eval_epochs))
    t, te = times()
    ring = simulate(get_policy("ring"), configs, p, epochs, t, eval_time=te,
                    eval_epochs=eval_epochs)
    spans = [r.makespan for r in mop]
    return {"mop_mean": statistics.mean(spans), "mop_max": max(spans),
            "ratio_lb_mean": statistics.mean(r.makespan / bench_bound(r.log, p) for r in mop),
            "ratio_lb_max": max(r.makespan / bench_bound(r.log, p) for r in mop),
            "ratio_part_max": max(r.makespan / max(bench_bound(r.log, p),
                                                    partition_bound(r.log)) for r in mop),
            "ring": ring.makespan,
            "mop_over_ring_mean": statistics.mean(spans) / ring.makespan,
            "mop_over_ring_max": max(spans) / ring.makespan}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(ROOT / "bench/results/results.json"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--costs", choices=("measured", "uniform", "none"), default="measured")
    a = ap.parse_args()
    data = json.loads(Path(a.results).read_text())
    p = int(data["partitions"])
    print("| workload | evaluations | MOP mean (max) s | MOP / lower bound mean (max) | "
          "MOP / max(bound, busiest partition) max | ring s | MOP / ring mean (max) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, w in data["workloads"].items():
        runs = w.get("runs", {}).get("mop") or []
        if not runs or not runs[0].get("units"):
            continue
        for with_evals in (False, True):
            r = replay(runs[0]["units"], p, a.seeds, with_evals, a.costs)
            print(f"| {name} | {'yes' if with_evals else 'no'} | {r['mop_mean']:.2f} "
                  f"({r['mop_max']:.2f}) | {r['ratio_lb_mean']:.3f} ({r['ratio_lb_max']:.3f}) "
                  f"| {r['ratio_part_max']:.3f} | {r['ring']:.2f} | {r['mop_over_ring_mean']:.3f} "
                  f"({r['mop_over_ring_max']:.3f}) |")


if __name__ == "__main__":
    main()
