"""bench/RESULTS.md and the figures (bench/figures/*.png) from the suite's raw results.

    python bench/report.py [bench/results/results.json]

Everything in the report is computed here from the results file the suite wrote; nothing is
typed in by hand except the notes on Cerebro's own implementation (bench/results/cerebro_dl.md,
written from the output of bench/cerebro_dl_try.sh).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import schedule_replay

FIG = ROOT / "bench" / "figures"
OUT = ROOT / "bench" / "RESULTS.md"

NAMES = {
    "mop": "cerebro_db (mop)",
    "ring": "cerebro_db (ring)",
    "ring_reset": "cerebro_db (ring, optimizer reset per hop)",
    "sequential": "sequential Keras",
    "ray": "Ray Tune (2 trials)",
    "mop_warm": "cerebro_db (mop, second fit of the session)",
    "keras_split": "p Keras processes on 1/p of the rows each",
    "units_one_process": "cerebro_db's units in one process (no database)",
    "units_split": "cerebro_db's units in p processes on 1/p of the rows each (no database)",
}
DB = ("mop", "ring", "ring_reset", "mop_warm")
MB = 2**20


def median_run(runs: list[dict]) -> dict:
    """The run with the median makespan (the lower middle one for an even count)."""
    s = sorted(runs, key=lambda r: r["makespan"])
    return s[(len(s) - 1) // 2]


def quotient(a: float, b: float) -> str:
    """a / b to two decimals, n/a where either is missing."""
    return "n/a" if math.isnan(a / b) else f"{a / b:.2f}"


def med(runs: list[dict], key: str = "makespan") -> float:
    return statistics.median(r[key] for r in runs)


# --------------------------------------------------------------------------- unit-log metrics


DISPATCH_GAP = 0.02
"""A pause between two units of one worker shorter than this counts as dispatch (commit,
answer, next statement), a longer one as waiting for a config to be free."""


def db_metrics(run: dict, p: int, epochs: int) -> dict[str, float]:
    """Lower bound, span, time breakdown and state traffic of one cerebro_db run."""
    from cerebro_db.scheduling.invariants import lower_bound

    units = run["units"]
    train = [u for u in units if u["kind"] == "train"]
    evals = [u for u in units if u["kind"] != "train"]
    dur = [u["end"] - u["start"] for u in units]
    span = max(u["end"] for u in units) - min(u["start"] for u in units)
    recs = [{**u, "kind": "train", "ok": True} for u in train]
    lb_train = lower_bound(recs, p)
    lb = max(sum(dur) / p, lb_train)
    # state traffic: every training unit writes its state; every one but a config's first
    # reads the previous one; an evaluation call reads the epoch's state once per
    # partition (the first unit of the next epoch keeps it by relabelling: nothing written).
    size: dict[int, int] = {}
    first: dict[int, float] = {}
    for u in train:
        size[u["config"]] = u["state_bytes"] or 0
        first[u["config"]] = min(first.get(u["config"], u["start"]), u["start"])
    written = sum(u["state_bytes"] or 0 for u in train)
    read = sum(u["state_bytes"] or 0 for u in train if u["start"] != first[u["config"]])
    ev_calls = {(u["config"], u["epoch"], u["partition"]) for u in evals}
    read += sum(size.get(c, 0) for c, _, _ in ev_calls)
    busy = sum(dur)
    # dispatch gaps: a worker's short pauses between consecutive units (the unit's commit,
    # the coordinator noticing it and sending the next); longer pauses wait for a config
    gaps = 0.0
    for w in {u["worker"] for u in units}:
        mine = sorted((u for u in units if u["worker"] == w), key=lambda u: u["start"])
        gaps += sum(g for a, b in zip(mine, mine[1:])
                    if 0 <= (g := b["start"] - a["end"]) < DISPATCH_GAP)
    # the load of a worker's first unit includes importing TensorFlow and the first read of
    # its partition; the first unit of each config builds the config's initial weights
    by_worker: dict[int, dict] = {}
    for u in sorted(train, key=lambda u: u["start"]):
        by_worker.setdefault(u["worker"], u)
    worker_first = {id(u) for u in by_worker.values()}
    config_first = {id(u) for u in train if u["start"] == first[u["config"]]} - worker_first
    return {
        "load_worker_first": sum(u["load"] or 0 for u in train if id(u) in worker_first),
        "load_config_first": sum(u["load"] or 0 for u in train if id(u) in config_first),
        "load_state": sum(u["load"] or 0 for u in train
                          if id(u) not in worker_first and id(u) not in config_first),
        "span": span, "lb": lb, "lb_train": lb_train, "ratio": span / lb if lb else float("nan"),
        "busiest": span / max(sum(u["end"] - u["start"] for u in units if u["worker"] == w)
                              for w in {u["worker"] for u in units}),
        "wall_ratio": run["makespan"] / lb if lb else float("nan"),
        "train": sum(u["run"] or 0 for u in train),
        "load": sum(u["load"] or 0 for u in train),
        "save": sum(u["save"] or 0 for u in train),
        "eval_load": sum(u["load"] or 0 for u in evals),
        "eval": sum(u["run"] or 0 for u in evals),
        "idle": p * span - busy,
        "gaps": gaps / (p * span) if span else float("nan"),
        "outside": p * (run["makespan"] - span),
        "moved_per_epoch": (written + read) / epochs,
        "state_mean": statistics.mean(size.values()) if size else 0,
    }


def paired(mop: list[dict] | None, ring: list[dict] | None,
           per_work: tuple[int, int] | None = None) -> str:
    """Median over the interleaved rounds of mop's makespan / the ring's, and the rounds
    mop won ('n/a' without both). With ``per_work`` (p, epochs) each fit's makespan is
    first divided by its own lower bound (the units it ran, at the speed it ran them:
    ``db_metrics``' wall ratio): whatever the machine's speed did to a fit's units
    cancels, what the system did around them (start-up, dispatch, idle workers, the
    schedule) stays."""
    if not mop or not ring:
        return "n/a"
    def size(run: dict) -> float:
        return db_metrics(run, *per_work)["wall_ratio"] if per_work else run["makespan"]
    ratios = [size(m) / size(r) for m, r in zip(mop, ring)]
    wins = sum(x < 1 for x in ratios)
    ci = median_interval(ratios)
    return (f"{statistics.median(ratios):.3f} ({wins} of {len(ratios)}"
            + ("" if per_work else " faster")
            + (f"; 95% {ci[0]:.3f}-{ci[1]:.3f}" if ci else "") + ")")


def cold_paired(pairs: list[dict] | None) -> str:
    """Median over the rounds of a cold mop fit's makespan / sequential Keras' in the same
    round (a workload's ``cold_pairs``), the number of rounds and the median's 95%
    interval; 'n/a' without rounds."""
    if not pairs:
        return "n/a"
    ratios = [r["mop"] / r["sequential"] for r in pairs]
    ci = median_interval(ratios)
    return (f"{statistics.median(ratios):.3f} ({len(ratios)} round{'' if len(ratios) == 1 else 's'}"
            + (f"; 95% {ci[0]:.3f}-{ci[1]:.3f}" if ci else "") + ")")


def median_interval(xs: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of ``xs`` (independent
    rounds): the order statistics ``x(k)`` and ``x(n+1-k)`` with the largest ``k`` whose
    binomial coverage ``1 - 2 P(Bin(n, 1/2) < k)`` is at least ``level``; None when even
    the whole range covers less (fewer than 6 values at 95%)."""
    n = len(xs)
    cover = 1.0 - 2.0 * 0.5 ** n  # k = 1: the range
    if cover < level:
        return None
    k, below = 1, 0.5 ** n  # below: P(Bin(n, 1/2) < k + 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) * 0.5 ** n
        if 1.0 - 2.0 * nxt < level:
            break
        k, below = k + 1, nxt
    ys = sorted(xs)
    return ys[k - 1], ys[n - k]


REPLAY_SEEDS = 5
"""MOP seeds per replay (:func:`replayed`)."""


def replayed(run: dict, p: int, family: dict[int, Any]) -> str:
    """MOP's and the ring's makespans on the unit times of ``run`` (a mop run), replayed
    through the simulator (``bench/schedule_replay.py``, evaluations included, MOP's mean
    over :data:`REPLAY_SEEDS` seeds): mop / ring, the two schedules compared on exactly the
    same units, without the noise of how fast the units ran in each measured run."""
    if not run.get("units"):
        return "n/a"
    r = schedule_replay.replay(run["units"], p, REPLAY_SEEDS, True, family=family)
    return f"{r['mop_over_ring_mean']:.3f} (mop / LB {r['ratio_lb_mean']:.3f})"


def best_acc(curves: list[list[float]]) -> float:
    """Best validation accuracy over configs after the last epoch."""
    return max((c[-1] for c in curves if c), default=float("nan"))


def mem(run: dict) -> tuple[float, float, int]:
    """(peak total MiB, peak of the largest worker process MiB, worker processes)."""
    m = run.get("memory") or {}
    procs = [["worker" if label.startswith("ray::") else label, v]
             for label, v in m.get("procs", [])]
    if any(label.startswith("main ") for label, _ in procs):  # p processes side by side
        mains = [v for label, v in procs if label.startswith("main ")]
        return (m.get("total", 0) / MB, max(mains) / MB, len(mains))
    kind = "main" if any(label == "main" for label, _ in procs) and not any(
        label == "worker" for label, _ in procs) else "worker"
    workers = [v for label, v in procs if label.startswith(kind)]
    return (m.get("total", 0) / MB, max(workers, default=0) / MB, len(workers))


# --------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(run: dict, title: str, path: Path) -> None:
    """The client's Gantt chart (cerebro_db.client.plots.gantt) of a run's unit log, plus the
    end of the SQL call (dashed)."""
    import pandas as pd

    from cerebro_db.client import plots

    units = run["units"]
    df = pd.DataFrame({
        "unit_id": range(len(units)), "mst_key": [u["config"] for u in units],
        "epoch": [u["epoch"] for u in units], "worker": [u["worker"] for u in units],
        "kind": [u["kind"] for u in units],
        "started_at": pd.to_datetime([u["start"] for u in units], unit="s", utc=True),
        "ended_at": pd.to_datetime([u["end"] for u in units], unit="s", utc=True)})
    fig = plots.gantt(df, title=title)
    first = min(u["start"] for u in units)
    ax = fig.axes[0]
    ax.axvline(run["makespan"] - (first - (run.get("fit_start") or first)), color="red",
               linestyle="--", linewidth=0.8)
    plots.save(fig, str(path))


def bars(rows: list[tuple[str, dict[str, float]]], title: str, ylabel: str, path: Path,
         stacked: bool = False) -> None:
    plt = _plt()
    import numpy as np

    keys: list[str] = []
    for _, d in rows:
        keys += [k for k in d if k not in keys]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows) + 2), 4))
    x = np.arange(len(rows))
    if stacked:
        bottom = np.zeros(len(rows))
        for k in keys:
            v = np.array([d.get(k, 0.0) for _, d in rows])
            ax.bar(x, v, 0.6, bottom=bottom, label=k)
            bottom += v
    else:
        w = 0.8 / max(1, len(keys))
        for i, k in enumerate(keys):
            v = [d.get(k, float("nan")) for _, d in rows]
            ax.bar(x - 0.4 + w * (i + 0.5), v, w, label=k)
    ax.set_xticks(x, [n for n, _ in rows], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_fig(wl: dict[str, dict], path: Path) -> None:
    plt = _plt()
    names = [n for n, w in wl.items() if any(r for r in w["runs"].values())
             and w["epochs"] > 0 and not n.startswith("synthetic")]
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        for system, runs in wl[n]["runs"].items():
            cs = median_run(runs)["curves"]
            k = max((len(c) for c in cs), default=0)
            best = [max(c[e] for c in cs if len(c) > e) for e in range(k)]
            ax.plot(range(1, k + 1), best, marker="o", label=NAMES.get(system, system))
        ax.set_title(n, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("best validation accuracy over configs")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def averaging_fig(a: dict, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    e = range(1, a["epochs"] + 1)
    ax.plot(e, a["averaging"], marker="o", label=f"model averaging, p = {a['partitions']} "
                                                 "(MADlib madlib_keras_fit, simulated)")
    ax.plot(e, a["sgd"], marker="s", label="sequential SGD, plain Keras")
    if a.get("cerebro_db_fit"):
        ax.plot(range(1, len(a["cerebro_db_fit"]) + 1), a["cerebro_db_fit"], marker="^",
                label="cerebro_db madlib_keras_fit (MOP sequential SGD)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy")
    ax.set_title("one configuration: model averaging vs sequential SGD", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale_fig(rows: list[tuple[int, dict[str, float]]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    systems = sorted({s for _, d in rows for s in d})
    for s in systems:
        pts = [(n, d[s]) for n, d in rows if s in d]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=NAMES.get(s, s))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("training rows (synthetic)")
    ax.set_ylabel("makespan (s)")
    ax.set_title("synthetic wide tabular: cost against data size", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- report


def _ray_onednn(r: dict) -> str:
    """Whether Ray Tune's trials ran with oneDNN, as its runs recorded (nothing for results
    of an older suite)."""
    seen = {v for w in r["workloads"].values() for run in w.get("runs", {}).get("ray", [])
            for v in run.get("onednn", [])}
    return "" if not seen else (", with oneDNN " + " and ".join(
        "on" if v else "off" for v in sorted(seen, reverse=True)))


def _eval_batches(runs: list[dict], how: str = "per architecture, the size that evaluated "
                  "fastest in the run's process before its clock started") -> str:
    """What a Keras baseline evaluated at (its runs' batch sizes measured fastest,
    ``keras_runner.eval_batches``; ``how``: where they were measured); empty for results of
    an older suite."""
    sizes = sorted({b for r in runs for b in r.get("eval_batches", [])})
    if not sizes:
        return ""
    return (" Its evaluations ran at " + ", ".join(f"{b:,}" for b in sizes)
            + f" rows a batch ({how}).")


def _onednn(on: bool | None) -> str:
    """How a Keras baseline's setting names TensorFlow's oneDNN kernels (None: not recorded,
    results of an older suite)."""
    return "" if on is None else (", oneDNN on" if on else ", oneDNN off")


def fmt(v: float, d: int = 1) -> str:
    return "n/a" if math.isnan(v) else f"{v:,.{d}f}"


def main(path: Path | str = ROOT / "bench" / "results" / "results.json") -> None:
    res = json.loads(Path(path).read_text())
    FIG.mkdir(parents=True, exist_ok=True)
    for old in FIG.glob("*.png"):  # figures of an earlier run must not linger
        old.unlink()
    p = res["partitions"]
    m = res["machine"]
    detail = f" ({m['cpu_detail']})" if m.get("cpu_detail") else ""
    wl: dict[str, dict] = res["workloads"]
    L: list[str] = [
        "# cerebro_db against its peers",
        "",
        ("Generated by `make bench` (`bench/suite.py`, then `bench/report.py`) from "
        f"`bench/results/results.json`; do not edit by hand. Command: `{res['command']}` "
        f"(scale `{res['scale']}`), {res['seconds'] / 60:.1f} minutes in all."),
        "",
        f"Machine: {m.get('cpu', '?')}{detail}, {m['cores']} cores, {m.get('memory_gib', '?')} GiB; "
        f"{m['platform']}; Python {m['python']}, PostgreSQL {m['postgres'].split(' on ')[0]}, "
        f"cerebro_db {m['cerebro_db']}, TensorFlow {m['tensorflow']}, Keras {m['keras']}, "
        f"numpy {m['numpy']}, Ray {m.get('ray')}, psutil {m.get('psutil')}. Load average "
        f"(1, 5, 15 min) at the start, before the suite ran anything, "
        f"{tuple(round(x, 1) for x in m.get('loadavg_start', ()))}, and at the end, the "
        f"suite's own last runs included, {tuple(round(x, 1) for x in m.get('loadavg_end', ()))}: "
        + ("**the machine was shared with other work when this run started** (load above half "
           "the core count), so absolute times are inflated and noisy; ratios between systems "
           "measured minutes apart are affected too. Re-run on a quiet machine for numbers to "
           "quote."
           if m.get("loadavg_start", (0,))[0] > m["cores"] / 2
           else "the machine was quiet when it started (the suite itself keeps the cores "
           "busy, so the load at the end says little about other work)."),
        "",
        ("Systems, on the same arrays and configurations: "
        "**cerebro_db (mop)** = `madlib_keras_fit_multiple_model` with the randomized MOP "
        f"scheduler, p = {p} partitions / worker sessions, `use_caching`, validation every "
        "epoch; **ring** = the same with MADlib's rotation (a barrier per hop); **ring, "
        "optimizer reset per hop** = `policy_params => 'reset_optimizer_per_hop=True'`; "
        "**sequential Keras** = one process, configs one after another at its best (thread "
        "count, input: numpy arrays, or tf.data made once with `steps_per_execution` "
        "covering a pass" + (", and TensorFlow's oneDNN kernels off or on" if any(
            "onednn" in x for w in wl.values() for x in w.get("sequential_settings", []))
            else "") + ", chosen by measurement, below); **Ray Tune** = 2 concurrent trials on a "
        "local Ray cluster (`num_cpus=2`, no dashboard), 1 CPU and 1 TensorFlow thread each, "
        "Keras compiled with `steps_per_execution` covering a pass, data passed with "
        "`tune.with_parameters` and copied into each trial" + _ray_onednn(res) + ". "
        + ("" if "server_onednn" not in m else
           "cerebro_db's worker sessions (and our units in one process) ran with TensorFlow's "
           f"oneDNN kernels {'on' if m['server_onednn'] else 'off'} (cerebro_db's default: "
           "on; TensorFlow's own leaves them off on CPUs without AVX-512). ")
        + "Every system computes training and validation metrics after every epoch."),
        "",
        ("Makespan: wall time of the whole training call (cerebro_db: the SQL call, including "
        "opening the worker sessions and TensorFlow's import in them; Ray: `ray.init` plus "
        "`Tuner.fit`; sequential: from the data in memory to the last evaluation). "
        "Preprocessing (packing into the database) is a one-time cost shown separately. "
        "Makespan / LB: span of the unit log (first unit start to last unit end) over the "
        f"lower bound max(sum of all unit times / {p}, "
        "`cerebro_db.scheduling.invariants.lower_bound` of the training units), which no "
        "schedule of the same units can beat; the wall ratio includes start-up. Span / busiest "
        "worker's work: the span over the most unit time one worker spent, so what it adds "
        "to 1 is time that worker stood idle (dispatch, pauses, waiting for a config); the "
        "rest of span / LB is work the workers did not share evenly (with one replica, a "
        "worker runs only its own partition's units, so a slower worker cannot hand any "
        "off; by default, when the data fits, a worker with nothing left on its own "
        "partition takes the other's). Dispatch gaps / span: the share of the "
        "workers' time spent in pauses shorter than 20 ms between two units (the unit's "
        "commit, the coordinator noticing it and sending the next statement): a per-unit "
        "cost that no schedule removes, part of span / LB. Ring span / LB: the same ratio "
        "for the ring (median of its runs), the schedules compared without the noise of "
        "how fast the units ran in each run. Memory: peak "
        "resident set size sampled every 0.25 s with psutil (cerebro_db: the coordinator "
        "backend, the control session and the worker backends from `pg_stat_activity`; "
        "PostgreSQL backends count the shared buffers they touched. Ray: the driver, raylet, "
        "GCS and worker processes; Ray's object store lives in shared memory that each "
        "process touching it counts). State moved per epoch: from `cerebro_db.units` "
        "(`state_bytes` x reads and writes of the catalog, see report.py). Best accuracy: "
        "the best configuration's validation accuracy after the last epoch. Figures with "
        "repeats report the median run; the repeat count is in each table. The cerebro_db "
        "systems' repeats are interleaved (mop, ring, ... then again from the next system), so "
        "a drift of the machine falls on each alike" + (
            "; before them one unmeasured fit (mop, 1 epoch, in a session of its own) takes "
            "any penalty of the first fit after a workload's loading"
            if any("warm_up_s" in x for x in wl.values()) else
            " (no warm-up fit in this run: the first round's first system, mop, ran its "
            "units slower than the others on most workloads)") + ". Mop / ring makespan, "
        "paired: the median "
        "over the rounds of mop's makespan over the ring's in the same round, and in how many "
        "rounds mop was the faster (a comparison less exposed to the machine's drift than "
        "the two medians; a drift that lasts two fits can still fall on one system twice, "
        "as the order of a round alternates), with a distribution-free 95% interval for "
        "that median (the sign test's order statistics of the rounds' ratios; none below "
        "6 rounds): where it contains 1, the rounds do not tell the two policies apart on "
        "this machine. Mop / ring wall / LB, paired: the same with "
        "each fit's makespan over its own lower bound first (the units it ran at the speed "
        "it ran them), so how fast the machine ran a fit's units cancels and what the "
        "system did around them stays (start-up, dispatch, idle workers, the schedule), "
        "and in how many rounds mop's was the lower. "
        "Mop / ring, the same units replayed: the median mop run's units "
        "(training units per config, epoch and partition; evaluations), each at its steady "
        "time, plus the one-off costs each schedule causes (a worker's first read; per "
        "worker, the first training and the first evaluation unit of a model family, i.e. "
        "of an architecture and regulariser, pay its build and trace, as measured in the "
        "run), driven through the production coordinator loop on "
        "a simulated clock with MOP (the fits' options, mean of "
        f"{REPLAY_SEEDS} seeds) and with the ring (`bench/schedule_replay.py`, one "
        "partition per worker): the schedules alone compared, on every workload, the "
        "ring included where the suite does not run it (the simulator leaves out the "
        "workers' contention and the coordinator's round trips)."),
        "",
    ]

    # ---------------------------------------------------------------- the short answer
    ans = ["## The short answer (computed from this run)", "",
           ("| workload | fastest system | cerebro_db (mop) makespan / fastest | leanest system "
           "(peak RSS total) | cerebro_db (mop) memory / leanest | mop span / LB "
           "| mop span / busiest worker's work | mop dispatch gaps / span "
           "| ring span / LB | mop / ring makespan, paired | mop / ring wall / LB, paired "
           "| mop / ring, the same units replayed |"),
           "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, w in wl.items():
        runs = w["runs"]
        if "mop" not in runs or len(runs) < 2:
            continue
        ms = {s: med(rs) for s, rs in runs.items()}
        mm = {s: mem(median_run(rs))[0] for s, rs in runs.items()}
        fast, lean = min(ms, key=ms.__getitem__), min(mm, key=mm.__getitem__)
        families = schedule_replay.families(w.get("configs"))
        dm = db_metrics(median_run(runs["mop"]), p, w["epochs"])
        ring = (f"{statistics.median(db_metrics(r, p, w['epochs'])['ratio'] for r in runs['ring']):.3f}"
                if runs.get("ring") else "n/a")
        ans.append(f"| {name} | {NAMES.get(fast, fast)} | {ms['mop'] / ms[fast]:.2f} | "
                   f"{NAMES.get(lean, lean)} | {mm['mop'] / mm[lean]:.2f} | {dm['ratio']:.3f} | "
                   f"{dm['busiest']:.3f} | {100 * dm['gaps']:.1f}% | {ring} | "
                   f"{paired(runs.get('mop'), runs.get('ring'))} | "
                   f"{paired(runs.get('mop'), runs.get('ring'), (p, w['epochs']))} | "
                   f"{replayed(median_run(runs['mop']), p, families)} |")
    if len(ans) > 4:
        L += [*ans, ""]

    # ---------------------------------------------------------------- realistic scale
    real = ["## Realistic scale: cerebro_db against one Keras process and the machine's limit",
            "",
            (f"cerebro_db (mop) with every argument at its default, p = {p}; sequential "
             "Keras at its best thread count and input pipeline (measured in this run); the "
             "limit: p concurrent Keras processes, each training every configuration on 1/p "
             "of the rows (sequential's input pipeline and kernels; makespan of the slower "
             "one, measured like sequential's; TensorFlow threads per process: " + (", ".join(
                 f"{name} {'/'.join(str(t) for t in sorted({x.get('threads') for x in w['runs']['keras_split']} - {None}))}"
                 for name, w in wl.items() if w.get("runs", {}).get("keras_split")) or "n/a")
             + ("; where p processes had more threads than the cores, they contended: the "
                "limit there is pessimistic, and the suite now gives each process cores / p"
                if any((x.get("threads") or 0) * p > m["cores"] for w in wl.values()
                       for x in w.get("runs", {}).get("keras_split", [])) else "")
             + "). Coordinator: peak "
             "RSS of the fit's calling backend in the first fit of its session and over all "
             "its fits (a session that runs only fits, several in a row: PostgreSQL's shared "
             "buffers it touched count too, and they add up over the session's fits as it "
             "reads the states and writes new output tables, up to the server's "
             "`shared_buffers`), and its peak private memory over all its fits (`RssAnon`: "
             "its own memory, what a fit costs). First unit: seconds from the call to the "
             "first unit's start (the workers have imported TensorFlow by then), for a cold "
             "fit and for a second fit of the same session. Cold / sequential, paired by "
             "round: rounds of a cold fit and sequential Keras at its best setting run one "
             "after the other (which first alternates), after the columns' own runs: the "
             "median of the rounds' ratios and its 95% interval (as for mop / ring); "
             "measured apart, the two can fall in different spells of the machine's speed."), "",
            ("cerebro_db's second fit: the same fit again in the same session (its workers "
             "stay open). Our units in one process: cerebro_db's own unit code "
             "(`cerebro_db.training`) running every configuration one after another on all "
             "rows in one process, without a database (`keras_runner.py --pipeline units`, "
             "sequential's thread count): a fit / that is what the parallelism over p "
             "workers gives, per-step speed aside (ideal 1/p); it is faster than Keras' "
             "own fit and evaluate, which the targets compare against. Our units in p "
             "processes: the same code in p concurrent processes on 1/p of the rows each "
             "(cores / p threads each; makespan of the slower one): the limit of "
             "data-parallel work with our own kernels, a fit without the database, worker "
             "start-up or scheduling; a fit / that is what all of those cost."), "",
            ("| workload | cerebro_db cold fit (s) | second fit (s) | sequential Keras (s) "
             "| limit (s) | our units, one process (s) | our units, p processes (s) "
             "| cold / sequential "
             "| cold / sequential, paired by round | second / sequential | limit / sequential | cold / limit "
             "| second / our units in one process | our units in p processes / sequential "
             "| cold / our units in p processes | second / our units in p processes "
             "| coordinator peak RSS, first fit / all fits / private (MiB) "
             "| first unit, cold / second fit (s) |"),
            "|---|" + "---:|" * 17]
    for name, w in wl.items():
        runs = w["runs"]
        if "mop" not in runs or "keras_split" not in runs:
            continue
        db, seq = med(runs["mop"]), med(runs["sequential"]) if "sequential" in runs else \
            float("nan")
        second = med(runs["mop_warm"]) if runs.get("mop_warm") else float("nan")
        units = med(runs["units_one_process"]) if runs.get("units_one_process") \
            else float("nan")
        lim = med(runs["keras_split"])
        ours = med(runs["units_split"]) if runs.get("units_split") else float("nan")
        coord, coord_private = (
            max((v for r in runs["mop"] + runs.get("mop_warm", [])
                 for label, v in (r.get("memory") or {}).get(kind, [])
                 if label == "coordinator"), default=float("nan")) / MB
            for kind in ("procs", "private"))
        first = min((r for rs in runs.values() for r in rs if r.get("memory")
                     and "fit_start" in r), key=lambda r: r["fit_start"], default={})
        coord_first = max((v for label, v in (first.get("memory") or {}).get("procs", [])
                           if label == "coordinator"), default=float("nan")) / MB
        cold = statistics.median(r.get("first_unit_s", float("nan")) for r in runs["mop"])
        warm = (statistics.median(r.get("first_unit_s", float("nan"))
                                  for r in runs["mop_warm"]) if "mop_warm" in runs
                else float("nan"))
        real.append(f"| {name} | {fmt(db)} | {fmt(second)} | {fmt(seq)} | {fmt(lim)} | "
                    f"{fmt(units)} | {fmt(ours)} | {quotient(db, seq)} | "
                    f"{cold_paired(w.get('cold_pairs'))} | {quotient(second, seq)} | "
                    f"{quotient(lim, seq)} | {quotient(db, lim)} | {quotient(second, units)} | "
                    f"{quotient(ours, seq)} | {quotient(db, ours)} | {quotient(second, ours)} | "
                    f"{fmt(coord_first, 0)} / {fmt(coord, 0)} / {fmt(coord_private, 0)} | "
                    f"{fmt(cold, 2)} / {fmt(warm, 2)} |")
    if len(real) > 5:
        L += [*real, ""]

    # ---------------------------------------------------------------- where the time goes
    wt = ["## Where the worker sessions' time goes (one extra sampled mop fit per workload)",
          "",
          ("Each workload runs one more cerebro_db (mop) fit after the measured ones, while a "
           "separate session samples `pg_stat_activity` of its worker sessions every "
           "5 ms over the whole call, the opening of the sessions and the checks before the "
           "first unit included (`suite.py: WaitSampler`; its makespan is not reported, the "
           "sampling takes CPU). Running: in a statement without a wait event (training, evaluating, the "
           "worker's Python). WAL: waiting to write or flush WAL (a state's records, the "
           "commit's flush, a buffer evicted ahead of its WAL). Between statements: the "
           "session's statement ended and the next had not come (dispatch; with pipelined "
           "dispatch, a worker waiting for its posted unit is running). Largest waits: the "
           "wait events with the most samples."),
          "",
          ("| workload | samples | running | WAL | data files | locks | other waits | "
           "between statements | largest waits |"),
          "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, w in wl.items():
        ws = (w.get("wait_sample") or {}).get("waits")
        if not ws:
            continue
        counts, n = ws["counts"], sum(ws["counts"].values()) or 1
        top = sorted(ws["events"].items(), key=lambda kv: -kv[1])[:3]
        wt.append(f"| {name} | {n} | " + " | ".join(
            f"{100 * counts.get(k, 0) / n:.1f}%" for k in
            ("running", "WAL", "data files", "locks", "other waits", "between statements"))
            + " | " + ", ".join(f"{e} {100 * v / n:.1f}%" for e, v in top) + " |")
    if len(wt) > 6:
        L += [*wt, ""]

    # ---------------------------------------------------------------- per workload tables
    summary_rows: list[tuple[str, dict[str, float]]] = []
    mem_rows: list[tuple[str, dict[str, float]]] = []
    time_rows: list[tuple[str, dict[str, float]]] = []
    for name, w in wl.items():
        runs = w["runs"]
        if not runs:
            continue
        L += [f"## {w['label']}", "",
              (f"{w['rows']:,} training rows, {w['valid_rows']:,} validation rows, "
              f"{w['features']} features, {len(w['configs'])} configurations, k = {w['epochs']} "
              f"epoch(s); preprocessing into the database (training_preprocessor_dl + "
              f"validation_preprocessor_dl, p = {p}): {fmt(w.get('preprocess_s', float('nan')))} s."),
              ""]
        if "sequential_threads" in w:  # results of an older suite
            L += ["Sequential Keras thread setting (median makespan): " + ", ".join(
                f"{t} thread(s) {fmt(s)} s" for t, s in w["sequential_threads"].items())
                  + "; the faster one is used below and for every later workload.", ""]
        if "sequential_settings" in w and "sequential_chosen" in w:
            L += ["Sequential Keras settings measured on this workload (median makespan, "
                  "runs): " + ", ".join(
                f"{r['threads']} thread(s) with {r['pipeline']} input"
                f"{_onednn(r.get('onednn'))} {fmt(r['makespan'])} s ({r['runs']})"
                for r in w["sequential_settings"])
                  + "; the fastest (" + "{} thread(s), {} input".format(
                      *w["sequential_chosen"][:2]) + _onednn(
                      bool(w["sequential_chosen"][2]) if len(w["sequential_chosen"]) > 2
                      else None) + ") is used below for sequential Keras and the limit, "
                  "its thread count for our units in one process. The input pipeline is "
                  "chosen on the first workload, the thread count and oneDNN on each."
                  + _eval_batches(runs.get("sequential", [])), ""]
        elif "sequential_settings" in w:  # results of an older suite
            L += ["Sequential Keras setting (median makespan): " + ", ".join(
                f"{r['threads']} thread(s) with {r['pipeline']} input {fmt(r['makespan'])} s"
                for r in w["sequential_settings"])
                  + "; the fastest is used below (sequential and the limit) and for every "
                  "later workload.", ""]
        L += [("| system | runs | makespan (s) | vs cerebro_db | makespan / LB (wall / LB) "
              "| peak RSS total (MiB) | largest worker process (MiB) | model state moved per "
              "epoch (MiB) | best validation accuracy |"),
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        base = med(runs["mop"]) if "mop" in runs else float("nan")
        mem_notes: list[str] = []
        srow: dict[str, float] = {}
        mrow: dict[str, float] = {}
        for system, rs in runs.items():
            r = median_run(rs)
            tot, wmax, nw = mem(r)
            ms = med(rs)
            srow[NAMES.get(system, system)] = ms / base
            mrow[NAMES.get(system, system)] = tot
            if system in DB:
                dm = db_metrics(r, p, w["epochs"])
                lbs = f"{dm['ratio']:.3f} ({dm['wall_ratio']:.3f})"
                moved = fmt(dm["moved_per_epoch"] / MB, 2)
            elif system == "ray":
                lbs = "n/a"
                moved = (f"0 (data copied into each of {len(w['configs'])} trials: "
                         f"{r.get('data_bytes', 0) / MB:.1f} MiB each)")
            else:
                lbs, moved = "n/a", "0"
            procs = defaultdict(list)
            for label, v in (r.get("memory") or {}).get("procs", []):
                procs["worker" if label.startswith("ray::") else label].append(v / MB)
            mem_notes.append(f"{NAMES.get(system, system)}: " + ", ".join(
                f"{label} {max(v):,.0f}" + (f" (x{len(v)})" if len(v) > 1 else "")
                for label, v in sorted(procs.items())))
            L.append(f"| {NAMES.get(system, system)} | {len(rs)} | {fmt(ms)} | "
                     f"{ms / base:.2f} | {lbs} | {fmt(tot, 0)} | {fmt(wmax, 0)} "
                     f"({nw} proc.) | {moved} | {fmt(best_acc(r['curves']), 4)} |")
        L += ["", "Peak resident memory per process (MiB): " + "; ".join(mem_notes) + "."]
        summary_rows.append((name, srow))
        mem_rows.append((name, mrow))
        if "ray" in runs:
            r = median_run(runs["ray"])
            L += ["", (f"Ray: `ray.init` took {fmt(r['init_s'])} s of its makespan "
                      f"(Ray {r.get('ray')})." + _eval_batches(
                          runs["ray"], "per configuration, the size that evaluated fastest in "
                          "a process like a trial's, measured before its runs"))]
        if "mop" in runs and "ring" in runs:
            def train_s(run: dict) -> float:
                return sum(u["run"] for u in run["units"] if u["kind"] == "train")
            L += ["", "Mop and ring round by round (interleaved): makespan mop / ring in "
                      "seconds, the training units' summed Keras time (how fast the machine "
                      "ran the same units in each fit) and, where recorded, the CPU seconds "
                      "the hypervisor gave to other guests during each fit (/proc/stat's "
                      "steal) and the coordinator's own CPU seconds (the calling backend, "
                      "taken from the workers on a machine they fill): " + "; ".join(
                          f"{m['makespan']:.1f} / {r['makespan']:.1f} (training "
                          f"{train_s(m):.1f} / {train_s(r):.1f}"
                          + (f", steal {m['steal_s']:.1f} / {r['steal_s']:.1f}"
                             if "steal_s" in m and "steal_s" in r else "")
                          + (f", coordinator {m['coordinator_cpu_s']:.2f} / "
                             f"{r['coordinator_cpu_s']:.2f}"
                             if "coordinator_cpu_s" in m and "coordinator_cpu_s" in r
                             else "") + ")"
                          for m, r in zip(runs["mop"], runs["ring"])) + "."]
        if "mop" in runs:
            r = median_run(runs["mop"])
            dm = db_metrics(r, p, w["epochs"])
            total = p * r["makespan"]
            parts = {"training (fit, incl. state decode/encode)": dm["train"],
                     "worker's first unit: TensorFlow import, first data read":
                         dm["load_worker_first"],
                     "config's first unit: initial weights": dm["load_config_first"],
                     "state load (later units)": dm["load_state"],
                     "state save": dm["save"], "evaluation data load": dm["eval_load"],
                     "evaluation": dm["eval"], "idle between units": dm["idle"],
                     "outside units (start-up, outputs)": dm["outside"]}
            time_rows.append((name, {k: v / total * 100 for k, v in parts.items()}))
            L += ["", f"Where cerebro_db (mop)'s time goes ({p} workers x {fmt(r['makespan'])} s "
                      f"= {fmt(total)} worker-seconds): " + "; ".join(
                          f"{k} {fmt(v)} s ({v / total * 100:.0f}%)" for k, v in parts.items())
                  + f". Mean model state {dm['state_mean'] / MB:.2f} MiB."]
            gantt(r, f"{name}: cerebro_db mop, makespan {r['makespan']:.1f} s, span/LB "
                     f"{dm['ratio']:.3f}", FIG / f"gantt_{name}_mop.png")
            L += ["", f"![Gantt mop](figures/gantt_{name}_mop.png)"]
        for pol in ("ring", "ring_reset"):
            if pol in runs:
                r = median_run(runs[pol])
                dm = db_metrics(r, p, w["epochs"])
                gantt(r, f"{name}: cerebro_db {pol}, makespan {r['makespan']:.1f} s, span/LB "
                         f"{dm['ratio']:.3f}", FIG / f"gantt_{name}_{pol}.png")
                if pol == "ring":
                    L += [f"![Gantt ring](figures/gantt_{name}_ring.png)"]
        L.append("")

    # ---------------------------------------------------------------- scale test
    srows = []
    for name, w in wl.items():
        if name.startswith("synthetic") and w["runs"]:
            srows.append((w["rows"], {s: med(rs) for s, rs in w["runs"].items()}))
    if srows:
        srows.sort()
        scale_fig(srows, FIG / "scale.png")
        L += ["## Scale test (synthetic, in the spirit of Criteo)", "",
              ("Synthetic dense tabular data generated with a fixed seed (128 features, binary "
              "label; not real data): the same 4 MLP configurations, 1 epoch, at x1, x4, x16 "
              "rows."), "",
              "| rows | " + " | ".join(NAMES.get(s, s) + " (s)" for s in srows[0][1])
              + " | sequential / cerebro_db | cerebro_db microseconds per row per config |",
              "|---:|" + "---:|" * (len(srows[0][1]) + 2)]
        for n, d in srows:
            ratio = d.get("sequential", float("nan")) / d.get("mop", float("nan"))
            per = d.get("mop", float("nan")) / (n * 4) * 1e6
            L.append(f"| {n:,} | " + " | ".join(fmt(v) for v in d.values())
                     + f" | {ratio:.2f} | {per:.1f} |")
        L += ["", "![scale](figures/scale.png)", ""]

    # ---------------------------------------------------------------- averaging
    for name, w in wl.items():
        a = w.get("averaging")
        if not a:
            continue
        averaging_fig(a, FIG / "averaging.png")
        c = a["config_label"]
        L += ["## Model averaging (MADlib's madlib_keras_fit) vs sequential SGD", "",
              (f"One configuration ({c['arch']}, lr {c['lr']}, batch {c['batch_size']}) on "
              f"{name}, {a['epochs']} epochs. Model averaging is simulated sequentially in one "
              f"process: each of the p = {a['partitions']} partitions trains a copy of the "
              "current weights for one epoch with its own persistent optimizer (MADlib keeps "
              "the segment model between iterations), then the copies are averaged weighted by "
              "rows; it moves 2 x p x the weights per epoch "
              f"({2 * a['partitions'] * a['weights_bytes'] / MB:.2f} MiB) and its time is not "
              "a parallel time. Sequential SGD: the same configuration trained by plain Keras "
              "over all rows, and by cerebro_db's `madlib_keras_fit` (MOP with one "
              "configuration: sequential SGD over the partitions)."), "",
              "| epoch | model averaging | sequential SGD (Keras) | cerebro_db madlib_keras_fit |",
              "|---:|---:|---:|---:|"]
        for e in range(a["epochs"]):
            cf = a.get("cerebro_db_fit") or []
            L.append(f"| {e + 1} | {a['averaging'][e]:.4f} | {a['sgd'][e]:.4f} | "
                     f"{cf[e]:.4f} |" if e < len(cf) else
                     f"| {e + 1} | {a['averaging'][e]:.4f} | {a['sgd'][e]:.4f} | n/a |")
        L += ["", f"cerebro_db `madlib_keras_fit` call: {fmt(a['cerebro_db_fit_makespan'])} s.",
              "", "![averaging](figures/averaging.png)", ""]

    # ---------------------------------------------------------------- cross-workload figures
    if summary_rows:
        bars(summary_rows, "makespan relative to cerebro_db (mop) (lower is faster)",
             "makespan / cerebro_db mop", FIG / "makespan_ratio.png")
        bars(mem_rows, "peak resident memory of all processes of each system",
             "MiB", FIG / "memory.png")
        curves_fig(wl, FIG / "learning_curves.png")
        L += ["## Figures", "", "![makespan ratio](figures/makespan_ratio.png)", "",
              "![memory](figures/memory.png)", "",
              "![learning curves](figures/learning_curves.png)", ""]
    if time_rows:
        bars(time_rows, "where cerebro_db (mop)'s worker time goes (% of p x makespan)",
             "% of worker time", FIG / "time_breakdown.png", stacked=True)
        L += ["![time breakdown](figures/time_breakdown.png)", "",
              ("The worker logs, per training unit, the time to load (first use of the "
              "partition's buffers plus reading the state from the catalog), run (decoding the "
              "state into the cached Keras model, `fit`, encoding the new state) and save "
              "(writing the state). State decode/encode is not separated from `fit` in the "
              "unit log, so 'training' includes it."), ""]

    notes = ROOT / "bench" / "results" / "cerebro_dl.md"
    if notes.exists():
        L += [notes.read_text().strip(), ""]
    OUT.write_text("\n".join(L) + "\n")
    print(f"wrote {OUT} and {len(list(FIG.glob('*.png')))} figures in {FIG}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ROOT / "bench" / "results" / "results.json")
