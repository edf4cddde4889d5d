"""The scheduling policies replayed on the unit times a benchmark run measured.

    python bench/schedule_replay.py [bench/results/results.json] [--seeds 20]
                                    [--costs measured|uniform|none]

For every workload of a ``bench/suite.py`` results file that has a logged ``mop`` run, the
units' measured times (training units per config, epoch and partition; evaluation units per
config, epoch and partition, their kinds together), split into a steady time per unit and
one-off costs that the replay charges where its own schedule causes them (a worker's cold
first read; the build and trace of a model family, per worker and for training and for
evaluation: :func:`replay`)
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


def families(configs: list[dict[str, Any]] | None) -> dict[int, Any]:
    """mst_key -> model family, from a results file's workload ``configs`` (in mst_key
    order): configs of the same architecture and regulariser share one built model and its
    traced functions on a worker (``cerebro_db.training.ModelCache`` keys on the
    architecture and the compile parameters without the learning rate; the batch size is an
    argument of the traced loop), so only a worker's first unit of a family pays its build
    and trace. Empty when the file names no configs (every config its own family)."""
    return {i + 1: (c.get("arch"), c.get("l2")) for i, c in enumerate(configs or ())}


def replay(units: list[dict[str, Any]], p: int, seeds: int, with_evals: bool,
           costs: str = "measured", family: dict[int, Any] | None = None
           ) -> dict[str, float]:
    """Replay a run's units through MOP (``seeds`` seeds) and the ring (module docstring).

    A unit's replayed time is its steady time plus, when it is the first of its kind
    (training, evaluation) and model family (``family``, :func:`families`; by default each
    config its own) on the worker that runs it *in the replay*, the family's one-off cost,
    plus the worker's cold first read on its first unit. Both come from the run: a unit that
    was the first of its kind and family on its worker there has the median of the config's
    other units of that kind as its steady time (else the family's; else its own), and the
    rest is a one-off, averaged per family and kind. So each policy pays the builds and
    traces its own placement causes, as the workers would, rather than where they fell in
    the measured run (which would charge another policy for MOP's placement)."""
    fam = (lambda c: family.get(c, c)) if family else (lambda c: c)

    def group(u: dict[str, Any]) -> str:
        return "train" if u["kind"] == "train" else "eval"

    ordered = sorted(units, key=lambda u: u["start"])
    firsts: set[int] = set()  # units first of their (worker, family, group) in the run
    built_in_run: set[tuple[int, Any, str]] = set()
    cold: dict[int, float] = {}  # worker -> the first read of its partition
    first_on_worker: set[int] = set()
    for u in ordered:
        w = u["worker"]
        if w not in cold:
            cold[w] = float(u.get("load") or 0.0)
            first_on_worker.add(id(u))
        key = (w, fam(u["config"]), group(u))
        if key not in built_in_run:
            built_in_run.add(key)
            firsts.add(id(u))

    def own(u: dict[str, Any]) -> float:
        d = u["end"] - u["start"]
        return d - cold[u["worker"]] if id(u) in first_on_worker else d

    by_config: dict[tuple[int, str], list[float]] = {}
    by_family: dict[tuple[Any, str], list[float]] = {}
    for u in units:
        if id(u) not in firsts:
            by_config.setdefault((u["config"], group(u)), []).append(own(u))
            by_family.setdefault((fam(u["config"]), group(u)), []).append(own(u))
    one_offs: dict[tuple[Any, str], list[float]] = {}
    train: dict[tuple[int, int, int], float] = {}
    evals: dict[tuple[int, int, int], float] = {}
    for u in units:
        d = own(u)
        if id(u) in firsts:
            ref = by_config.get((u["config"], group(u))) or by_family.get(
                (fam(u["config"]), group(u)))
            steady = min(d, statistics.median(ref)) if ref else d
            one_offs.setdefault((fam(u["config"]), group(u)), []).append(d - steady)
            d = steady
        key = (u["config"], u["epoch"], u["partition"])
        if u["kind"] == "train":
            train[key] = d
        else:
            evals[key] = evals.get(key, 0.0) + d
    one_off = {k: statistics.mean(v) for k, v in one_offs.items()}
    configs = sorted({c for c, _, _ in train})
    epochs = max(e for _, e, _ in train)
    eval_epochs = sorted({e for _, e, _ in evals}) if with_evals else []

    def times():
        seen: dict[tuple[int, int], int] = {}
        seen_eval: dict[tuple[int, int], int] = {}
        started: set[int] = set()
        built: set[tuple[int, Any, str]] = set()

        def extra(c: int, w: int, g: str) -> float:
            out = 0.0
            if w not in started:
                started.add(w)
                out += cold.get(w, 0.0)
            if (w, fam(c), g) not in built:
                built.add((w, fam(c), g))
                out += one_off.get((fam(c), g), 0.0)
            return out

        def t(c: int, q: int, w: int) -> float:
            seen[(c, q)] = seen.get((c, q), 0) + 1
            return train[(c, seen[(c, q)], q)] + extra(c, w, "train")

        def te(c: int, q: int, w: int) -> float:
            seen_eval[(c, q)] = seen_eval.get((c, q), 0) + 1
            return evals.get((c, eval_epochs[seen_eval[(c, q)] - 1], q), 0.0) + extra(
                c, w, "eval")

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
            "mop_over_ring_max": max(spans) / ring.makespan,
            "mop_work_max": max(r.busy_time() for r in mop), "ring_work": ring.busy_time()}


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
            r = replay(runs[0]["units"], p, a.seeds, with_evals, a.costs,
                       families(w.get("configs")))
            print(f"| {name} | {'yes' if with_evals else 'no'} | {r['mop_mean']:.2f} "
                  f"({r['mop_max']:.2f}) | {r['ratio_lb_mean']:.3f} ({r['ratio_lb_max']:.3f}) "
                  f"| {r['ratio_part_max']:.3f} | {r['ring']:.2f} | {r['mop_over_ring_mean']:.3f} "
                  f"({r['mop_over_ring_max']:.3f}) |")


if __name__ == "__main__":
    main()
