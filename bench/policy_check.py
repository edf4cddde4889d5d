"""Two settings of the scheduling policy side by side, on cold fits.

    python bench/policy_check.py WORKLOAD PAIRS SIDE_A SIDE_B [--load] [--warm-up]

On a ``bench/workloads.py`` workload already in the benchmark database (``--load`` packs it
first; ``--warm-up`` runs the suite's unmeasured warm-up fit before the measured ones), cold
fits (the session's kept worker sessions closed before each, as the suite's runs) alternate
two sides (``PAIRS`` pairs, the order swapped every pair). A side is
``policy_params`` for ``'mop'`` (``''``: the defaults), or ``POLICY:PARAMS`` (``ring:``,
``mop:tail_units=0``), optionally followed by ``@replicas=N``: the fit runs with
``cerebro_db.replicas`` set to ``N`` in its session (``@replicas=auto``: the default), then
optionally by ``@depth=N``: ``cerebro_db.pipeline_depth`` set to ``N`` (1: no pipelined
dispatch; unset: the default), then optionally by ``@bundle=N``: ``cerebro_db.eval_bundle``
set to ``N`` (1: one evaluation unit per statement; unset: the default). Printed
per fit: makespan, the
span of the unit log, span / lower bound (``bench/report.db_metrics``, as in the report) and
span / busiest worker's work, the units' summed time (by kind, and of the units run
away from their worker's home partition), the times every worker stood idle at once for
more than :data:`STALL` seconds and the CPU time of the fit's
calling backend (the coordinator) and of its worker sessions (opened by the fit: their
TensorFlow import included) and the CPU time the hypervisor gave to other guests meanwhile
(``steal``); then the medians of each side and
the median of A / B makespans within a pair. Alternating in one run keeps the machine's
drift out of the comparison (two workers on this 2-core VM run the same units 5-20% apart
from one run to the next).
"""
from __future__ import annotations

import os
import statistics as st
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import report
import suite
import workloads
from common import connect


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 4:
        sys.exit(__doc__)
    name, pairs, sides = args[0], int(args[1]), (args[2], args[3])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    w = workloads.workloads(workloads.SCALES["default"], {name})[0]
    db = suite.Db(connect(), w)
    if "--load" in sys.argv:
        db.load()
    if "--warm-up" in sys.argv:
        print(f"warm-up fit (unmeasured): {db.warm_up():.1f} s", flush=True)
    seen: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for i in range(pairs):
        for side in sides if i % 2 == 0 else sides[::-1]:
            spec, _, bundle = side.partition("@bundle=")
            spec, _, depth = spec.partition("@depth=")
            spec, _, setting = spec.partition("@replicas=")
            policy, params = spec.split(":", 1) if ":" in spec else ("mop", spec)
            suite.q(db.fit_conn, "SELECT set_config('cerebro_db.replicas', %s, false)",
                    (setting or "auto",))
            suite.q(db.fit_conn, "SELECT set_config('cerebro_db.pipeline_depth', %s, false)",
                    (depth,))
            suite.q(db.fit_conn, "SELECT set_config('cerebro_db.eval_bundle', %s, false)",
                    (bundle,))
            before = suite.process_cpu(db.backend_pid)
            run = db.fit(policy, params or None)
            coordinator = suite.process_cpu(db.backend_pid) - before
            workers = sum(suite.process_cpu(pid) for pid in {u["pid"] for u in run["units"]})
            m = report.db_metrics(run, suite.P, w.epochs)
            m["makespan"] = run["makespan"]
            m["work"] = sum(u["end"] - u["start"] for u in run["units"])
            m["coordinator"], m["workers"] = coordinator, workers
            m["first"] = run["first_unit_s"]
            m["after"] = run["makespan"] - run["first_unit_s"] - m["span"]
            split = _split(run["units"])
            stalls = _stalls(run["units"])
            m["stalls"] = len(stalls)
            seen[side].append(m)
            print(f"{side or 'defaults'!r}: makespan {run['makespan']:.2f} s, span "
                  f"{m['span']:.2f} s (first unit at {m['first']:.2f} s, after the span "
                  f"{m['after']:.2f} s), span / LB {m['ratio']:.3f}, span / busiest "
                  f"{m['busiest']:.3f}, units {m['work']:.2f} s ({split}), CPU: coordinator "
                  f"{coordinator:.2f} s, workers {workers:.2f} s, stolen by the hypervisor "
                  f"{run['steal_s']:.2f} s; every worker idle at once: "
                  f"{', '.join(f'{s:.3f} s at {t:.2f}' for t, s in stalls) or 'never'}",
                  flush=True)
    for side, ms in seen.items():
        print(f"{side or 'defaults'!r}: median makespan "
              f"{st.median(m['makespan'] for m in ms):.2f} s, first unit at "
              f"{st.median(m['first'] for m in ms):.2f} s, after the span "
              f"{st.median(m['after'] for m in ms):.2f} s, span / LB "
              f"{st.median(m['ratio'] for m in ms):.3f}, span / busiest "
              f"{st.median(m['busiest'] for m in ms):.3f}, units "
              f"{st.median(m['work'] for m in ms):.2f} s, CPU: coordinator "
              f"{st.median(m['coordinator'] for m in ms):.2f} s, workers "
              f"{st.median(m['workers'] for m in ms):.2f} s over {len(ms)} fits, "
              f"{sum(m['stalls'] for m in ms)} times every worker idle at once")
    a, b = (seen[s] for s in sides)
    ratios = [x["makespan"] / y["makespan"] for x, y in zip(a, b)]
    print(f"A / B makespan within a pair: median {st.median(ratios):.3f}, A faster in "
          f"{sum(r < 1 for r in ratios)} of {len(ratios)}")


STALL = 0.03
"""Seconds with no unit running on any worker, inside a fit's span, that count as a stall
(every worker waiting at once: a commit held up by the server's WAL flush, the coordinator
late); a dispatch between two units takes a few milliseconds."""


def _stalls(units: list[dict]) -> list[tuple[float, float]]:
    """(seconds since the first unit started, length) of each time in the span when no
    unit ran on any worker for more than :data:`STALL` seconds."""
    t0 = min(u["start"] for u in units)
    out, running, idle_since = [], 0, None
    for t, step in sorted([(u["start"], 1) for u in units] + [(u["end"], -1) for u in units]):
        if running == 0 and idle_since is not None and t - idle_since > STALL:
            out.append((idle_since - t0, t - idle_since))
        running += step
        idle_since = t if running == 0 else None
    return out


def _split(units: list[dict]) -> str:
    """The units' time by kind, and the units a worker ran away from its home partition
    (worker ``q`` < P is at home on partition ``q``): each such unit's worker also read that
    partition, once per fit."""
    by: dict[str, float] = {}
    away, away_s = 0, 0.0
    for u in units:
        s = u["end"] - u["start"]
        by[u["kind"]] = by.get(u["kind"], 0.0) + s
        if u["worker"] < suite.P and u["partition"] != u["worker"]:
            away, away_s = away + 1, away_s + s
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(by.items())) + \
        f"; {away} away from home, {away_s:.2f} s"


if __name__ == "__main__":
    main()
