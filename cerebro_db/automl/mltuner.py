"""MLtuner: online tuning of training tunables by forking branches (``automl_method =>
'mltuner'``).

Implementation note. After Cui, Ganger and Gibbons, "MLtuner: System Support for Automatic
Machine Learning Tuning" (SoCC 2018): training tunables (learning rate; momentum and batch
size when asked) are chosen by trial and error on short *branches* forked from a snapshot,
ranked by convergence speed, and re-tuned when progress stalls. Here, on model hopper
parallelism with epoch granularity, per configuration of the search space (every grid point,
or ``num_configs`` samples when the space has distributions), independently and in parallel:

1. *Tuning.* Candidates start from the same state: at first, fresh launches (the *main*
   trial, the configuration as given, plus ``num_branches`` with other settings, the
   compile/fit strings rewritten to say so); at a re-tuning, forks of the current trial
   (``Launch`` with ``parent`` and ``tunables``): one *keep* branch with the current settings
   and ``num_branches`` new ones. Each runs for the *trial length* ``L`` epochs (1 at first).
   The loss trace of a branch is its training units' losses (``UnitReport``) against its own
   cumulative training seconds. Convergence speed (:func:`convergence`) compares the
   candidates of a round from their *common start*: ``(start - reached) / seconds -
   noise_penalty * se``, where ``reached`` is the branch's training loss evaluated at the
   end of its trial (``EpochReport.train_loss`` at epoch ``L``; the mean of its last epoch's
   unit losses when missing), ``seconds`` is ``L`` times the median seconds per epoch of the
   round's candidates with the same batch size (so machine noise does not rank branches that
   cost the same), and ``se`` the standard error of the least-squares slope of the trace
   downsampled to ``5`` means (its scatter). ``start`` is the evaluated training loss of the
   forked state at a re-tuning; at the first tuning the branches are fresh launches (each
   with its own seeded initial weights, all drawn alike) whose starting loss is not reported,
   so ``start`` is the highest loss seen in the round: every branch ran ``L`` epochs, so
   within a batch size the ranking is by the loss reached whatever the start, and the start
   only weighs loss against time across batch sizes (and sets the speed the stall test
   compares with). Ranking by each branch's own trace slope instead would make a too-high
   rate, whose first unit reports a huge loss and then drops steeply to a worse plateau,
   look fastest. A branch is *diverged* if a loss is NaN/inf (freed at once), its
   downsampled loss ends above where it began, or (at a re-tuning) it reached a loss above
   the common start; *stable* if not diverged, it has at least ``MIN_POINTS`` (3) loss
   points, its downsampled trace decreases strictly and its speed is positive. When no
   branch is stable (always so with 2 partitions and ``L = 1``: 2 points) the trial length
   doubles (the survivors are extended to ``2L``) while ``2L <= max_trial_epochs`` and
   within the budget. The tunable search is ``search_steps`` batches: batch 1 stratified
   log-uniform learning rates over ``[lr_min, lr_max]`` (at a re-tuning, ``retune_spread``
   decades each side of the current rate), batch 2 around the best so far within one
   stratum width. The fastest stable branch wins; the others and the snapshot they forked
   from are stopped with ``free=True`` (they vanish from the outputs).
2. *Training.* The winner trains on in windows of ``L`` epochs. At the end of a window, the
   speed over the window (from the evaluated training loss at its start to the one at its
   end, per second of the window, noise penalised likewise) is compared with the speed at
   the last tuning: below ``stall_fraction`` of it (or increasing), progress has stalled and
   the procedure re-tunes from the current state.

Bounds (the paper keeps tuning a small share of the run and re-tunes only on a plateau):
at most ``max_retunes`` re-tunings per configuration, and a re-tuning starts (and its trial
length doubles) only if the epochs spent on losing branches, counting that round's expected
losers, stay at most ``max_tuning_share`` of all epochs the configuration would train (losers
plus ``num_iterations``); the first tuning always runs. ``num_iterations``
is the number of epochs along the output lineage of each configuration. The output of a
configuration is its final winning branch; if every branch ever diverges, the snapshot (or
the main trial at the start) is kept instead.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import numpy as np

from ..errors import invalid
from .base import (
    TUNABLES,
    Decision,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    UnitReport,
)
from .options import (
    MAX_EPOCHS,
    MAX_TRIALS,
    int_option,
    num_workers_option,
    number_option,
    seed_option,
)
from .space import SearchSpace

__all__ = ["BATCH_SIZES", "MIN_POINTS", "Convergence", "Group", "MLtuner", "convergence"]

BATCH_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256)
"""Batch sizes the tunable search draws from."""

DOWNSAMPLE_POINTS = 5
"""Points of the downsampled loss trace."""


MIN_POINTS = 3
"""Loss points a branch needs before it can be called stable."""

MAX_BRANCHES = 256
"""Most ``num_branches`` accepted."""
MAX_SEARCH_STEPS = 256
"""Most ``search_steps`` accepted."""
MAX_RETUNES = 10_000
"""Most ``max_retunes`` accepted."""


@dataclass(frozen=True)
class Convergence:
    """What a loss trace says: ``speed`` (loss decrease per second from the start to the
    loss reached, noise penalised), ``stable``, ``diverged`` (NaN/inf), ``increasing`` (ends
    above where it began)."""

    speed: float
    stable: bool
    diverged: bool
    increasing: bool


def convergence(trace: Sequence[tuple[float, float]], noise_penalty: float = 1.0,
                points: int = DOWNSAMPLE_POINTS, *, start: float | None = None,
                reached: float | None = None, seconds: float | None = None,
                min_points: int = MIN_POINTS) -> Convergence:
    """Convergence of a trace of (cumulative seconds, loss), oldest first.

    ``start``: the loss the trace started from (the common start of the branches compared;
    default: the trace's first downsampled point); ``reached``: the loss at its end (default:
    the last downsampled point); ``seconds``: the time it took (default: the trace's span
    between those points). Speed is ``(start - reached) / seconds`` minus ``noise_penalty``
    times the standard error of the least-squares slope of the downsampled trace (its
    scatter). Stable: at least ``min_points`` points, not diverged, the downsampled trace
    strictly decreasing and a positive speed; increasing: the trace ends above where it
    began, or ``reached`` is above ``start``."""
    if not trace:
        return Convergence(math.nan, False, False, False)
    ts = np.array([t for t, _ in trace], dtype=float)
    ys = np.array([y for _, y in trace], dtype=float)
    if not np.all(np.isfinite(ys)) or (reached is not None and not math.isfinite(reached)):
        return Convergence(-math.inf, False, True, False)
    k = min(points, len(ys))
    idx = np.array_split(np.arange(len(ys)), k)
    tm = np.array([ts[i].mean() for i in idx])
    ym = np.array([ys[i].mean() for i in idx])
    y0 = float(ym[0]) if start is None or not math.isfinite(start) else float(start)
    y1 = float(ym[-1]) if reached is None else float(reached)
    span = float(tm[-1] - tm[0]) if seconds is None else float(seconds)
    increasing = bool(ym[-1] > ym[0]) or y1 > y0
    if k < 2 and start is None:
        return Convergence(math.nan, False, False, increasing)
    if not span > 0:
        return Convergence(math.nan, False, False, increasing)
    se = 0.0
    sxx = float(((tm - tm.mean()) ** 2).sum())
    if k > 2 and sxx > 0:
        b = float(((tm - tm.mean()) * (ym - ym.mean())).sum()) / sxx
        res = ym - (ym.mean() + b * (tm - tm.mean()))
        se = math.sqrt(float((res**2).sum()) / (k - 2) / sxx)
    speed = (y0 - y1) / span - noise_penalty * se
    stable = (len(ys) >= min_points and not increasing and bool(np.all(np.diff(ym) < 0))
              and speed > 0)
    return Convergence(speed, stable, False, increasing)


@dataclass
class Group:
    """The bookkeeping of one configuration of the search space (its trials are branches)."""

    config: int
    """1-based number of the configuration."""
    range: tuple[float, float]
    """Learning-rate range of the current search batch."""
    phase: str = "tune"
    """``'tune'`` (a tuning round runs), ``'train'`` (the winner trains on) or ``'done'``."""
    checkpoint: int | None = None
    """The trial the current tuning round forked from (None at the first tuning)."""
    base: int = 0
    """Lineage epochs before the current tuning round."""
    L: int = 1
    """Trial length: epochs each candidate of a round trains, and of a training window."""
    step: int = 1
    """Search batch of the current round (1 .. ``search_steps``)."""
    cands: list[int] = field(default_factory=list)
    """Candidates of the current round."""
    waiting: list[int] = field(default_factory=list)
    """Candidates whose result for the current trial length is not in yet."""
    current: int | None = None
    """The winner that trains on (phase ``'train'``)."""
    window_start: int = 0
    """Epoch of ``current`` where the training window began."""
    speed: float | None = None
    """The winner's convergence speed at the last tuning."""
    retunes: int = 0
    tuning_epochs: int = 0
    """Epochs spent on branches that lost."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per tuning (see :meth:`MLtuner.history`)."""
    output: int | None = None
    """The trial that stands for the configuration in the outputs so far."""
    start_loss: float | None = None
    """Evaluated training loss of the state a re-tuning round forked from."""
    last_loss: float | None = None
    """Evaluated training loss of ``current`` at the start of its window."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (non-finite numbers as strings)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["range"] = list(self.range)
        for k in ("speed", "start_loss", "last_loss"):
            d[k] = _enc(d[k])
        return json_copy(d)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Group:
        """Inverse of :meth:`to_json`."""
        kw = json_copy(dict(d))
        lo, hi = kw.pop("range")
        for k in ("speed", "start_loss", "last_loss"):
            kw[k] = _dec(kw[k])
        return cls(range=(float(lo), float(hi)), **kw)


@functools.lru_cache(maxsize=4096)
def _parse(compile_params: str, fit_params: str) -> tuple[Any, Any]:
    from ..params import parse_compile_params, parse_fit_params

    return parse_compile_params(compile_params), parse_fit_params(fit_params)


def _settings(compile_params: str, fit_params: str) -> dict[str, Any]:
    cp, fp = _parse(compile_params, fit_params)
    kw = cp.optimizer.kwargs
    default_lr = 0.01 if cp.optimizer.name == "SGD" else 0.001
    return {"learning_rate": float(kw.get("learning_rate", default_lr)),
            "momentum": None if kw.get("momentum") is None else float(kw["momentum"]),
            "batch_size": int(fp.batch_size)}


def _has_momentum(compile_params: str, fit_params: str) -> bool:
    from ..params import optimizer_arguments

    cp, _ = _parse(compile_params, fit_params)
    return "momentum" in (optimizer_arguments(cp.optimizer.name) or ())


def _rewrite(compile_params: str, fit_params: str, s: Mapping[str, Any]) -> tuple[str, str]:
    """The compile/fit strings with the tunables of ``s`` set."""
    from ..params import OptimizerSpec

    cp, fp = _parse(compile_params, fit_params)
    kw = dict(cp.optimizer.kwargs)
    for k in ("learning_rate", "momentum"):
        if k in s:
            kw[k] = s[k]
    cp2 = replace(cp, optimizer=OptimizerSpec(cp.optimizer.name, kw))
    fp2 = replace(fp, batch_size=int(s["batch_size"])) if "batch_size" in s else fp
    return cp2.canonical(), fp2.canonical()


def _round3(x: float) -> float:
    return float(f"{x:.3g}")


def _enc(x: float | None) -> float | str | None:
    return x if x is None or math.isfinite(x) else repr(float(x))


def _dec(x: float | str | None) -> float | None:
    return None if x is None else float(x)


class MLtuner(Tuner):
    """MLtuner-style tuning of training tunables (see the module docstring)."""

    name = "mltuner"
    defaults: ClassVar[dict[str, Any]] = {
        "num_configs": 4, "num_iterations": 20, "num_branches": 4, "search_steps": 2,
        "max_retunes": 3, "max_tuning_share": 0.5, "max_trial_epochs": 8,
        "tunables": "learning_rate", "lr_min": 1e-5, "lr_max": 1.0, "retune_spread": 1.0,
        "stall_fraction": 0.2, "noise_penalty": 1.0,
    }
    option_names = tuple(defaults)

    def __init__(self, *, model_ids: Sequence[int], compile_grid: str, fit_grid: str,
                 num_workers: int, random_state: int | None = None, num_configs: int = 4,
                 num_iterations: int = 20, num_branches: int = 4, search_steps: int = 2,
                 max_retunes: int = 3, max_tuning_share: float = 0.5,
                 max_trial_epochs: int = 8, tunables: str = "learning_rate",
                 lr_min: float = 1e-5, lr_max: float = 1.0, retune_spread: float = 1.0,
                 stall_fraction: float = 0.2, noise_penalty: float = 1.0) -> None:
        self.num_configs = int_option("num_configs", num_configs, 1, MAX_TRIALS)
        self.num_iterations = int_option("num_iterations", num_iterations, 2, MAX_EPOCHS)
        self.num_branches = int_option("num_branches", num_branches, 1, MAX_BRANCHES)
        self.search_steps = int_option("search_steps", search_steps, 1, MAX_SEARCH_STEPS)
        self.max_retunes = int_option("max_retunes", max_retunes, 0, MAX_RETUNES)
        self.max_tuning_share = number_option("max_tuning_share", max_tuning_share, 0.0, 1.0)
        self.max_trial_epochs = int_option("max_trial_epochs", max_trial_epochs, 1, MAX_EPOCHS)
        self.lr_min = number_option("lr_min", lr_min, 0.0, low_open=True)
        self.lr_max = number_option("lr_max", lr_max, self.lr_min, low_open=True)
        self.retune_spread = number_option("retune_spread", retune_spread, 0.0, low_open=True)
        self.stall_fraction = number_option("stall_fraction", stall_fraction, 0.0, 1.0)
        self.noise_penalty = number_option("noise_penalty", noise_penalty, 0.0)
        if not isinstance(tunables, str):
            raise invalid(f"automl_params: tunables must be a string, got {tunables!r}")
        names = [t.strip().lower() for t in tunables.split(",") if t.strip()]
        bad = [t for t in names if t not in TUNABLES]
        if not names or bad:
            raise invalid(f"automl_params: tunables must list some of {', '.join(TUNABLES)}, "
                          f"got {tunables!r}", hint="e.g. tunables='learning_rate,batch_size'")
        if "learning_rate" not in names:
            raise invalid(f"automl_params: tunables must include learning_rate, got {tunables!r}")
        self.tunables_text = tunables
        self.tunables = tuple(t for t in TUNABLES if t in names)
        self.space = SearchSpace(model_ids, compile_grid, fit_grid)
        self.num_workers = num_workers_option(num_workers)
        self.random_state = seed_option(random_state)
        self._rng = np.random.default_rng(self.random_state)
        self._next_id = 1
        self._groups: list[Group] = []
        self._trials: dict[int, dict[str, Any]] = {}
        self._traces: dict[int, list[list[float]]] = {}

    # -- contract ------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        return {"model_ids": list(self.space.model_ids), "compile_grid": self.space.compile_text,
                "fit_grid": self.space.fit_text, "num_workers": self.num_workers,
                "random_state": self.random_state, "num_configs": self.num_configs,
                "num_iterations": self.num_iterations, "num_branches": self.num_branches,
                "search_steps": self.search_steps, "max_retunes": self.max_retunes,
                "max_tuning_share": self.max_tuning_share,
                "max_trial_epochs": self.max_trial_epochs, "tunables": self.tunables_text,
                "lr_min": self.lr_min, "lr_max": self.lr_max,
                "retune_spread": self.retune_spread, "stall_fraction": self.stall_fraction,
                "noise_penalty": self.noise_penalty}

    def start(self) -> list[Decision]:
        if self.space.has_distributions:
            points = self.space.sample_distinct(self._rng, self.num_configs, set())
        else:
            points = self.space.grid()
        out: list[Decision] = []
        for i, p in enumerate(points):
            g = Group(config=i + 1, range=(self.lr_min, self.lr_max))
            self._groups.append(g)
            main = self._new_trial(g, p.model_id, p.compile_params, p.fit_params, None, {},
                                   "main")
            out.append(Launch(main, 1))
            out.extend(self._batch(g, p.model_id, p.compile_params, p.fit_params,
                                   self.lr_min, self.lr_max))
        return out

    def on_unit(self, report: UnitReport) -> list[Decision]:
        tid = report.trial_id
        tr = self._traces.get(tid)
        if tr is None:
            return []
        t0 = tr[-1][0] if tr else 0.0
        loss = report.loss if math.isfinite(report.loss) else math.nan
        tr.append([t0 + report.seconds, float(report.epoch), loss])
        if math.isfinite(loss):
            return []
        g = self._groups[self._trials[tid]["config"] - 1]
        if g.phase != "tune" or tid not in g.waiting:
            return []
        g.waiting.remove(tid)
        out = [self._drop(g, tid, "diverged")]
        if not g.waiting:
            out += self._resolve(g)
        return out

    def on_epoch(self, report: EpochReport) -> list[Decision]:
        tid = report.trial_id
        if tid not in self._trials or not report.at_target:
            return []
        g = self._groups[self._trials[tid]["config"] - 1]
        if g.phase == "tune" and tid in g.waiting and report.epoch == g.L:
            self._trials[tid]["reached"] = _enc(report.train_loss)
            g.waiting.remove(tid)
            return self._resolve(g) if not g.waiting else []
        if g.phase == "train" and tid == g.current:
            return self._window_end(g, report.epoch, report.train_loss)
        return []

    def done(self) -> bool:
        return bool(self._groups) and all(g.phase == "done" for g in self._groups)

    def info(self, trial_id: int) -> dict[str, Any]:
        t = self._trials.get(trial_id)
        if t is None:
            return {}
        g = self._groups[t["config"] - 1]
        s = t["settings"]
        return {"config": t["config"], "role": t["role"], "parent": t["spec"]["parent"],
                "learning_rate": s["learning_rate"], "momentum": s["momentum"],
                "batch_size": s["batch_size"], "retunes": g.retunes, "trial_epochs": g.L}

    def info_columns(self) -> list[tuple[str, str]]:
        return [("config", "integer"), ("role", "text"), ("parent", "integer"),
                ("learning_rate", "double precision"), ("momentum", "double precision"),
                ("batch_size", "integer"), ("retunes", "integer"), ("trial_epochs", "integer")]

    def history(self, config: int) -> list[dict[str, Any]]:
        """The tunings of configuration ``config`` (1-based): lineage epoch where it
        started, trial length, winner and its settings and speed."""
        return [dict(h) for h in self._groups[config - 1].history]

    def group(self, config: int) -> Group:
        """A copy of the bookkeeping of configuration ``config`` (1-based)."""
        return Group.from_json(self._groups[config - 1].to_json())

    # -- trials ----------------------------------------------------------------------------

    def _new_trial(self, g: Group, model_id: int, c: str, f: str, parent: int | None,
                   tunables: Mapping[str, Any], role: str) -> TrialSpec:
        tid = self._next_id
        self._next_id += 1
        meta = {"config": g.config, "role": role}
        spec = TrialSpec(tid, model_id, c, f, parent, dict(tunables), meta)
        self._trials[tid] = {"config": g.config, "role": role, "spec": spec.to_json(),
                             "settings": _settings(c, f)}
        self._traces[tid] = []
        g.cands.append(tid)
        g.waiting.append(tid)
        return spec

    def _sample(self, c: str, f: str, lo: float, hi: float, n: int) -> list[dict[str, Any]]:
        lo, hi = max(lo, self.lr_min), min(hi, self.lr_max)
        a, b = math.log10(lo), math.log10(hi)
        mom = "momentum" in self.tunables and _has_momentum(c, f)
        out = []
        for j in range(n):
            u = (j + float(self._rng.uniform())) / n
            s: dict[str, Any] = {"learning_rate": min(max(_round3(10 ** (a + u * (b - a))),
                                                          lo), hi)}
            if mom:
                s["momentum"] = min(0.99, 1.0 - _round3(10 ** float(self._rng.uniform(-2, 0))))
            if "batch_size" in self.tunables:
                s["batch_size"] = BATCH_SIZES[int(self._rng.integers(len(BATCH_SIZES)))]
            out.append(s)
        return out

    def _batch(self, g: Group, model_id: int, c: str, f: str, lo: float,
               hi: float) -> list[Decision]:
        g.range = (lo, hi)
        out: list[Decision] = []
        for s in self._sample(c, f, lo, hi, self.num_branches):
            c2, f2 = _rewrite(c, f, s)
            tun = s if g.checkpoint is not None else {}
            spec = self._new_trial(g, model_id, c2, f2, g.checkpoint, tun, "branch")
            out.append(Launch(spec, g.L))
        return out

    def _spec(self, tid: int) -> TrialSpec:
        return TrialSpec.from_json(self._trials[tid]["spec"])

    def _epochs(self, tid: int) -> int:
        tr = self._traces.get(tid) or []
        return int(max((e for _, e, _ in tr), default=0))

    def _drop(self, g: Group, tid: int, reason: str, final: bool = False) -> Decision:
        """Stop a candidate that lost; unless ``final``, the main trial of a first tuning is
        kept (stopped, not freed) as the configuration's output of last resort."""
        if not final and g.checkpoint is None and self._trials[tid]["role"] == "main":
            g.output = tid
            return Stop(tid, reason)
        g.tuning_epochs += self._epochs(tid)
        self._traces.pop(tid, None)
        self._trials[tid]["freed"] = True
        if g.output == tid:
            g.output = None
        return Stop(tid, reason, free=True)

    def _window(self, tid: int, since_epoch: int) -> tuple[list[tuple[float, float]], float]:
        """The trace of ``tid`` after epoch ``since_epoch`` and the seconds it took."""
        tr = self._traces.get(tid, [])
        before = [t for t, e, _ in tr if e <= since_epoch]
        after = [(t, y) for t, e, y in tr if e > since_epoch]
        t0 = before[-1] if before else 0.0
        return after, (after[-1][0] - t0 if after else 0.0)

    def _rank(self, g: Group, cands: Sequence[int]) -> dict[int, Convergence]:
        """Convergence of the candidates of a tuning round, all measured from the common
        start to the loss each reached after ``L`` epochs, per second of a typical epoch of
        their batch size (see the module docstring)."""
        start = g.start_loss
        if start is None or not math.isfinite(start):
            seen = [y for c in cands for _, _, y in self._traces.get(c) or []]
            seen += [r for c in cands if (r := _dec(self._trials[c].get("reached")))
                     is not None]
            seen = [y for y in seen if math.isfinite(y)]
            start = max(seen) if seen else None
        per_epoch: dict[int, list[float]] = {}
        for c in cands:
            tr = self._traces.get(c) or []
            if tr and self._epochs(c) > 0:
                bs = self._trials[c]["settings"]["batch_size"]
                per_epoch.setdefault(bs, []).append(tr[-1][0] / self._epochs(c))
        out: dict[int, Convergence] = {}
        for c in cands:
            trace, _ = self._window(c, 0)
            reached = _dec(self._trials[c].get("reached"))
            if reached is None and trace:
                last = max(e for _, e, _ in self._traces[c])
                reached = float(np.mean([y for _, e, y in self._traces[c] if e == last]))
            times = per_epoch.get(self._trials[c]["settings"]["batch_size"])
            secs = g.L * float(np.median(times)) if times else None
            out[c] = convergence(trace, self.noise_penalty, start=start, reached=reached,
                                 seconds=secs)
        return out

    # -- tuning ------------------------------------------------------------------------------

    def _resolve(self, g: Group) -> list[Decision]:
        """Every candidate of the current batch has reported: double, search on, or pick."""
        out: list[Decision] = []
        alive = [c for c in g.cands if not self._trials[c].get("freed")
                 and c != g.output]
        res: dict[int, Convergence] = {}
        for c, m in self._rank(g, alive).items():
            if m.diverged or m.increasing:
                out.append(self._drop(g, c, "diverged"))
            else:
                res[c] = m
        stable = [c for c in res if res[c].stable]
        lineage = g.base + g.L
        if not stable and res and g.step == 1 and 2 * g.L <= self.max_trial_epochs \
                and g.base + 2 * g.L <= self.num_iterations \
                and (g.checkpoint is None
                     or self._share_ok(g.tuning_epochs + (len(res) - 1) * 2 * g.L)):
            g.L *= 2
            g.waiting = sorted(res)
            return out + [Extend(c, g.L) for c in sorted(res)]
        pool = stable or list(res)
        best = max(pool, key=lambda c: (res[c].speed, -c)) if pool else None
        if best is not None and stable and g.step < self.search_steps:
            g.step += 1
            lo, hi = g.range
            width = (math.log10(hi) - math.log10(lo)) / self.num_branches
            lr = self._trials[best]["settings"]["learning_rate"]
            spec = self._spec(best)
            src = self._spec(g.checkpoint) if g.checkpoint is not None else spec
            batch = self._batch(g, src.model_id, src.compile_params, src.fit_params,
                                lr / 10**width, lr * 10**width)
            return out + batch
        if best is None:
            g.phase = "done"
            keep = g.checkpoint if g.checkpoint is not None else g.output
            g.output = keep
            for c in g.cands:
                if c != keep and not self._trials[c].get("freed"):
                    out.append(self._drop(g, c, "diverged", final=True))
            if keep is not None and g.checkpoint is not None:
                out.append(Stop(keep, "every branch diverged"))
            return out
        for c in g.cands:
            if c != best and not self._trials[c].get("freed"):
                out.append(self._drop(g, c, "lost tuning", final=True))
        if g.checkpoint is not None:
            cp = g.checkpoint
            self._trials[cp]["freed"] = True
            self._traces.pop(cp, None)
            out.append(Stop(cp, f"replaced by branch {best}", free=True))
        s = self._trials[best]["settings"]
        g.history.append({"at_epoch": g.base, "trial_epochs": g.L, "winner": best,
                             "learning_rate": s["learning_rate"], "momentum": s["momentum"],
                             "batch_size": s["batch_size"], "speed": _enc(res[best].speed),
                             "stable": res[best].stable, "candidates": len(g.cands)})
        g.phase, g.checkpoint, g.current, g.output = "train", None, best, best
        g.cands, g.waiting, g.step = [], [], 1
        g.speed, g.window_start = res[best].speed, g.L
        g.last_loss = _dec(self._trials[best].get("reached"))
        remaining = self.num_iterations - lineage
        if remaining <= 0:
            g.phase = "done"
            return out + [Stop(best, "completed")]
        return out + [Extend(best, g.L + min(g.L, remaining))]

    def _share_ok(self, tuning_epochs: int) -> bool:
        """Whether ``tuning_epochs`` on losing branches stay within ``max_tuning_share`` of
        all the epochs of the configuration (those plus ``num_iterations``)."""
        return tuning_epochs <= self.max_tuning_share * (tuning_epochs + self.num_iterations)

    def _window_end(self, g: Group, epoch: int, loss: float) -> list[Decision]:
        cur = g.current
        assert cur is not None  # a window ends on the group's current trial
        lineage = g.base + epoch
        remaining = self.num_iterations - lineage
        trace, secs = self._window(cur, g.window_start)
        m = convergence(trace, self.noise_penalty, start=g.last_loss,
                        reached=loss if math.isfinite(loss) else math.nan,
                        seconds=secs, min_points=1)
        g.last_loss = loss
        if m.diverged:
            g.phase = "done"
            return [Stop(cur, "diverged")]
        if remaining <= 0:
            g.phase = "done"
            return [Stop(cur, "completed")]
        speed = g.speed if g.speed is not None and math.isfinite(g.speed) else 0.0
        stalled = m.increasing or not (m.speed >= self.stall_fraction * speed)
        L = min(g.L, remaining)
        within = self._share_ok(g.tuning_epochs + self.num_branches * self.search_steps * L)
        if stalled and g.retunes < self.max_retunes and within:
            g.retunes += 1
            spec = self._spec(cur)
            g.phase, g.checkpoint, g.base, g.L, g.step = "tune", cur, lineage, L, 1
            g.cands, g.waiting, g.current, g.start_loss = [], [], None, loss
            keep = self._new_trial(g, spec.model_id, spec.compile_params, spec.fit_params, cur,
                                   {}, "keep")
            lr = self._trials[cur]["settings"]["learning_rate"]
            sp = 10**self.retune_spread
            return [Launch(keep, L)] + self._batch(g, spec.model_id, spec.compile_params,
                                                   spec.fit_params, lr / sp, lr * sp)
        g.window_start = epoch
        return [Extend(cur, epoch + min(g.L, remaining))]

    # -- state -----------------------------------------------------------------------------

    def _dynamic_state(self) -> dict[str, Any]:
        return json_copy({
            "rng": self._rng.bit_generator.state,
            "next_id": self._next_id,
            "groups": [g.to_json() for g in self._groups],
            "trials": [[k, v] for k, v in sorted(self._trials.items())],
            "traces": [[k, [[t, e, _enc(y)] for t, e, y in v]]
                       for k, v in sorted(self._traces.items())],
        })

    def _restore(self, state: Mapping[str, Any]) -> None:
        if not state:
            return
        self._rng.bit_generator.state = state["rng"]
        self._next_id = int(state["next_id"])
        self._groups = [Group.from_json(g) for g in state["groups"]]
        self._trials = {int(k): json_copy(v) for k, v in state["trials"]}
        self._traces = {int(k): [[float(t), float(e), float(_dec(y))]  # type: ignore[arg-type]
                                 for t, e, y in v] for k, v in state["traces"]}


def json_copy(x: Any) -> Any:
    """A deep copy through plain JSON types (lists, dicts with str keys)."""
    if isinstance(x, dict):
        return {str(k): json_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_copy(v) for v in x]
    return x
