"""Pictures of fits from the catalog (matplotlib, drawn off-screen; ``save`` writes PNG).

Every function takes DataFrames as ``Client`` returns them and returns the Figure. The drawn
artists carry ids (``gid``) so that tests and notebooks can find them: ``unit:<unit_id>`` on
each Gantt bar, ``hop:<mst_key>:<n>`` on each hop arrow, ``curve:<mst_key>:<kind>`` on each
learning curve, ``trial:<mst_key>`` / ``decision:<decision_id>`` on the AutoML timeline.
"""
from __future__ import annotations

import json
from typing import Any

import pandas as pd

KIND_STYLE = {  # height, alpha, hatch
    "train": (0.8, 1.0, None),
    "eval_train": (0.35, 0.5, "////"),
    "eval_valid": (0.35, 0.5, "...."),
}
DECISION_MARK = {"launch": ("^", "tab:green"), "extend": (">", "black"),
                 "stop": ("x", "tab:red"), "free": ("o", "tab:gray")}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | None, dpi: int = 110, fmt: str = "png") -> Any:
    """Write ``fig`` to ``path`` (when given) as ``fmt`` and release it from pyplot."""
    plt = _plt()
    if path:
        fig.savefig(path, dpi=dpi, format=fmt)
    plt.close(fig)
    return fig


def _seconds(t: Any, t0: Any) -> float:
    return float((pd.Timestamp(t) - pd.Timestamp(t0)).total_seconds())


def _empty(title: str | None, what: str) -> Any:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.text(0.5, 0.5, what, ha="center", va="center")
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def gantt(units: pd.DataFrame, title: str | None = None) -> Any:
    """The units of a fit by worker over time: one bar per unit (tall: training, labelled
    config.epoch; short and hatched: evaluation on training ``////`` or validation data
    ``....``), coloured by configuration; an arrow for each hop (a configuration's next
    training unit on another worker)."""
    if units.empty:
        return _empty(title, "no units yet")
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    t0 = units["started_at"].min()
    span = max(_seconds(units["ended_at"].max(), t0), 1e-9)
    workers = sorted(int(w) for w in units["worker"].unique())
    row = {w: i for i, w in enumerate(workers)}
    fig, ax = plt.subplots(figsize=(11, 1.4 + 0.7 * len(workers)))
    for u in units.itertuples(index=False):
        h, alpha, hatch = KIND_STYLE.get(u.kind, (0.35, 0.5, None))
        start, end = _seconds(u.started_at, t0), _seconds(u.ended_at, t0)
        y = row[int(u.worker)]
        bars = ax.barh(y, end - start, left=start, height=h,
                       color=cmap((int(u.mst_key) - 1) % 20), alpha=alpha, hatch=hatch,
                       edgecolor="black", linewidth=0.3)
        bars.patches[0].set_gid(f"unit:{int(u.unit_id)}")
        if u.kind == "train" and end - start > 0.04 * span:
            ax.text((start + end) / 2, y, f"{int(u.mst_key)}.{int(u.epoch)}", ha="center",
                    va="center", fontsize=6)
    train = units[units["kind"] == "train"].sort_values(["started_at", "unit_id"])
    for mst, g in train.groupby("mst_key"):
        prev = None
        n = 0
        for u in g.itertuples(index=False):
            if prev is not None and int(prev.worker) != int(u.worker):
                a = ax.annotate("", xy=(_seconds(u.started_at, t0), row[int(u.worker)]),
                                xytext=(_seconds(prev.ended_at, t0), row[int(prev.worker)]),
                                arrowprops={"arrowstyle": "->", "lw": 0.6, "alpha": 0.5,
                                            "color": cmap((int(mst) - 1) % 20)})
                a.set_gid(f"hop:{int(mst)}:{n}")
                n += 1
            prev = u
    ax.set_yticks(range(len(workers)), [f"worker {w}" for w in workers])
    ax.set_ylim(-0.6, len(workers) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first unit started (tall bars: training, labelled "
                  "config.epoch; hatched: evaluation //// training, .... validation data; "
                  "arrows: hops)", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _epoch_losses(units: pd.DataFrame, num_partitions: int) -> pd.DataFrame:
    """Row-weighted loss of each configuration's complete epochs per unit kind."""
    u = units[units["loss"].notna()].copy()
    u["wl"] = u["loss"] * u["rows"]
    g = u.groupby(["mst_key", "kind", "epoch"]).agg(wl=("wl", "sum"), rows=("rows", "sum"),
                                                    n=("unit_id", "count")).reset_index()
    g = g[g["n"] == num_partitions]
    g["loss"] = g["wl"] / g["rows"]
    return g


def learning_curves(units: pd.DataFrame, num_partitions: int,
                    title: str | None = None) -> Any:
    """Loss by epoch for each configuration: training (solid) and validation (dashed), from
    the evaluation units of complete epochs (row-weighted over the partitions). A fit
    without training evaluations (none at all, or running training metrics) shows the
    mean loss of its training units per epoch as its training curve."""
    if units.empty:
        return _empty(title, "no units yet")
    plt = _plt()
    cmap = plt.get_cmap("tab20")
    g = _epoch_losses(units, num_partitions)
    # training: the evaluation units' when there are any, else the mean of the training
    # units (a fit without evaluation units, or one whose training metrics are the running
    # ones, cerebro_db.training_metrics = 'running')
    kinds: list[tuple[str, Any, str]] = [
        ("eval_train", "-", "training") if (g["kind"] == "eval_train").any()
        else ("train", "-", "training (mean of its units)")]
    if (g["kind"] == "eval_valid").any():
        kinds.append(("eval_valid", "--", "validation"))
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    configs = sorted(g["mst_key"].unique())
    fig, ax = plt.subplots(figsize=(9 if len(configs) > 6 else 8, 4.5))
    for mst in configs:
        for i, (kind, style, _) in enumerate(kinds):
            s = g[(g["mst_key"] == mst) & (g["kind"] == kind)].sort_values("epoch")
            if s.empty:
                continue
            (line,) = ax.plot(s["epoch"], s["loss"], style, marker="o", markersize=3,
                              color=cmap((int(mst) - 1) % 20),
                              label=f"config {mst}" if i == 0 else None)
            line.set_gid(f"curve:{int(mst)}:{kind}")
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="black", linestyle=style, label=label)
                for _, style, label in kinds]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.legend(handles=handles, fontsize=7, ncol=1 if len(configs) <= 6 else 2,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _group(meta: Any) -> str:
    m = meta if isinstance(meta, dict) else json.loads(meta or "{}")
    for key, label in (("bracket", "bracket"), ("s", "bracket"), ("config", "branch of")):
        if m.get(key) is not None:
            return f"{label} {m[key]}"
    return ""


def automl_timeline(units: pd.DataFrame, trials: pd.DataFrame, decisions: pd.DataFrame,
                    title: str | None = None) -> Any:
    """An AutoML run over time, one row per trial: its training units as bars coloured by
    bracket (ASHA, Hyperband) or by the configuration it branches from (MLtuner), the
    procedure's decisions as markers (launch ^, extend > with the rung or round it extends
    to, stop x, free o), and a dashed line from a branch's parent to the branch."""
    if units.empty and decisions.empty:
        return _empty(title, "nothing recorded yet")
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    keys = sorted({int(k) for k in trials.get("mst_key", [])} |
                  {int(k) for k in units.get("mst_key", [])})
    row = {k: i for i, k in enumerate(keys)}
    groups = {int(t.mst_key): _group(t.meta) for t in trials.itertuples(index=False)}
    palette = {g: cmap(i % 10) for i, g in enumerate(sorted(set(groups.values())))}
    starts = [units["started_at"].min()] if not units.empty else []
    if not decisions.empty:
        starts.append(decisions["made_at"].min())
    t0 = min(pd.Timestamp(s) for s in starts)
    fig, ax = plt.subplots(figsize=(11, 1.5 + 0.32 * len(keys)))
    for u in units[units["kind"] == "train"].itertuples(index=False):
        k = int(u.mst_key)
        start, end = _seconds(u.started_at, t0), _seconds(u.ended_at, t0)
        bars = ax.barh(row[k], end - start, left=start, height=0.6,
                       color=palette.get(groups.get(k, ""), "tab:gray"), alpha=0.8,
                       edgecolor="white", linewidth=0.8)
        bars.patches[0].set_gid(f"trial:{k}")
    launched: dict[int, float] = {}
    for d in decisions.itertuples(index=False):
        k = int(d.mst_key)
        if k not in row:
            continue
        x = _seconds(d.made_at, t0)
        mark, color = DECISION_MARK.get(d.decision, ("*", "black"))
        (pt,) = ax.plot([x], [row[k]], mark, color=color, markersize=6)
        pt.set_gid(f"decision:{int(d.decision_id)}")
        meta = d.meta if isinstance(d.meta, dict) else json.loads(d.meta or "{}")
        if d.decision == "launch":
            launched.setdefault(k, x)
        if d.decision == "extend":
            step = meta.get("rung", meta.get("i"))
            if step is not None:
                ax.annotate(str(step), (x, row[k]), textcoords="offset points",
                            xytext=(3, 3), fontsize=6)
    for t in trials.itertuples(index=False):
        parent = getattr(t, "parent", None)
        if parent is not None and not pd.isna(parent) and int(parent) in row \
                and int(t.mst_key) in launched:
            x = launched[int(t.mst_key)]
            ax.plot([x, x], [row[int(parent)], row[int(t.mst_key)]], ":", color="black",
                    linewidth=0.7)
    ax.set_yticks(range(len(keys)),
                  [f"{k} {groups.get(k, '')}".strip() for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started (bars: training units; ^ launch, "
                  "> extend to rung/round, x stop, o free; dotted: branch from its parent)",
                  fontsize=8)
    ax.set_ylabel("trial (mst_key)")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
