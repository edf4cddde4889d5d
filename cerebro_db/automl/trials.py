"""The engine side of the AutoML template, kept pure: trials, their targets, the rules.

:class:`TrialBook` applies a :class:`~.base.Tuner`'s decisions to the scheduling
bookkeeping (:class:`cerebro_db.scheduling.Progress`), enforces the rules of the contract
(a bug in a procedure fails loudly instead of training the wrong thing), says which epochs
are evaluated, and turns finished units and evaluations into the reports the tuner reads.
Side effects that need the database (registering a trial, copying a parent's state,
logging a decision) go to a :class:`Sink`; the real engine's sink writes the catalog, a test's
sink records them. Nothing here touches SQL, TensorFlow or an executor.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import INTERNAL_ERROR, CerebroError
from ..scheduling import TRAIN, Progress
from .base import (
    Decision,
    EngineView,
    EpochReport,
    Extend,
    Launch,
    Stop,
    TrialSpec,
    Tuner,
    UnitReport,
)

__all__ = ["MAX_IDLE_CALLS", "AutoMLError", "EvalEpochs", "Sink", "TrialBook", "TrialStatus"]

MAX_IDLE_CALLS = 1000
"""Most :meth:`Tuner.on_idle` calls in one engine step (a procedure that keeps answering
without filling the workers is a bug)."""


class AutoMLError(CerebroError):
    """A procedure broke the contract (SQLSTATE XX000: a bug, not the user's input)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"the AutoML procedure {message}", INTERNAL_ERROR)


class Sink(Protocol):
    """What the engine does outside the bookkeeping."""

    def launch(self, spec: TrialSpec, target: int) -> None:
        """Register a new trial (its configuration row); with ``spec.parent``, copy the
        parent's latest state to it first."""

    def record(self, seq: int, kind: str, trial_id: int, target: int | None,
               reason: str | None, meta: Mapping[str, Any], now: float) -> None:
        """Log a decision (kind: launch, extend, stop, free)."""


@dataclass
class TrialStatus:
    """Per trial: its spec, whether stopped or freed, its evaluated epochs' scores."""

    spec: TrialSpec
    stopped: bool = False
    freed: bool = False
    reason: str | None = None
    last_epoch: int | None = None
    score: float | None = None
    meta: dict[str, Any] | None = None


class EvalEpochs(Mapping[int, frozenset[int]]):
    """config -> epochs evaluated: its current target, and every ``frequency`` epochs.

    Read by :class:`Progress` at the moment an epoch completes, so a target changed while
    the trial ran counts as it is then."""

    def __init__(self, book: TrialBook) -> None:
        self.book = book

    def __getitem__(self, config: int) -> frozenset[int]:
        target = self.book.progress.targets[config]
        f = self.book.frequency
        every = frozenset(range(f, target + 1, f)) if f else frozenset()
        return every | {target}

    def __iter__(self) -> Iterator[int]:
        return iter(self.book.progress.targets)

    def __len__(self) -> int:
        return len(self.book.progress.targets)


class TrialBook:
    """Trials of one AutoML run on ``num_partitions`` partitions and ``workers``."""

    def __init__(self, tuner: Tuner, sink: Sink, num_partitions: int,
                 workers: Mapping[int, Any], frequency: int | None = None) -> None:
        self.tuner = tuner
        self.sink = sink
        self.frequency = frequency
        self.trials: dict[int, TrialStatus] = {}
        self.seq = 0
        self.progress = Progress({}, num_partitions, workers, EvalEpochs(self))
        # what the tuner has been told: training units per trial, evaluated epochs per trial
        self.reported_units: dict[int, int] = {}
        self.reported_epochs: dict[int, set[int]] = {}

    # -- state ----------------------------------------------------------------------------

    def training(self) -> frozenset[int]:
        """Trials with epochs left before their target."""
        p = self.progress
        return frozenset(c for c, t in self.trials.items()
                         if not t.stopped and p.completed[c] < p.targets[c])

    def paused(self) -> frozenset[int]:
        """Trials at their target, waiting for a decision."""
        p = self.progress
        return frozenset(c for c, t in self.trials.items()
                         if not t.stopped and p.completed[c] >= p.targets[c])

    def evaluating(self) -> frozenset[int]:
        """Trials with an evaluation unit pending or running. Their results reach the tuner
        when the last unit of the epoch ends, so a trial at its target is in flight until
        then. Derived from ``progress`` alone, which a resumed run rebuilds from the unit log
        (an evaluation cut short is queued again), so it needs no state of its own."""
        p = self.progress
        return frozenset({u.config for u in p.pending_evals}
                         | {u.config for u in p.running.values() if u.kind != TRAIN})

    def view(self, now: float) -> EngineView:
        return EngineView(len(self.progress.workers), self.training(), self.paused(), now,
                          self.evaluating())

    def total_units(self) -> int:
        """Training units the current targets add up to (grows as the procedure decides)."""
        n = self.progress.num_partitions
        return sum(max(t, self.progress.completed[c]) for c, t in self.progress.targets.items()
                   ) * n

    def finished(self) -> bool:
        """The procedure is done and nothing is left to train, evaluate or run."""
        return self.tuner.done() and self.progress.all_done()

    def outputs(self) -> list[int]:
        """Trials that reach the outputs (all but the freed), ascending."""
        return sorted(c for c, t in self.trials.items() if not t.freed)

    def freed(self) -> list[int]:
        return sorted(c for c, t in self.trials.items() if t.freed)

    def ranking(self) -> list[int]:
        """Output trials, best first: by the score of their last evaluated epoch (NaN and
        never-evaluated last), ties by trial id."""
        from .base import score_key

        def key(c: int) -> tuple[tuple[int, float], int]:
            s = self.trials[c].score
            return (score_key(float("nan") if s is None else s), c)

        return sorted(self.outputs(), key=key)

    # -- decisions ------------------------------------------------------------------------

    def _status(self, trial_id: int, what: str) -> TrialStatus:
        t = self.trials.get(trial_id)
        if t is None:
            raise AutoMLError(f"asked to {what} trial {trial_id}, which was never launched")
        if t.freed:
            raise AutoMLError(f"asked to {what} trial {trial_id}, which was freed")
        return t

    def apply(self, decisions: list[Decision], now: float) -> None:
        """Apply decisions in order (raises :class:`AutoMLError` on a broken rule)."""
        p = self.progress
        for d in decisions:
            self.seq += 1
            if isinstance(d, Launch):
                s = d.spec
                if s.trial_id in self.trials:
                    raise AutoMLError(f"launched trial {s.trial_id} twice")
                if d.target < 1:
                    raise AutoMLError(f"launched trial {s.trial_id} with target {d.target}")
                if s.parent is not None:
                    parent = self._status(s.parent, "fork")
                    if not parent.stopped and p.completed[s.parent] < p.targets[s.parent]:
                        raise AutoMLError(f"forked trial {s.trial_id} from trial {s.parent}, "
                                          "which is still training")
                    if any(u.config == s.parent and u.kind == "train"
                           for u in p.running.values()):
                        raise AutoMLError(f"forked trial {s.trial_id} from trial {s.parent} "
                                          "while one of its units runs")
                self.sink.launch(s, d.target)
                self.trials[s.trial_id] = TrialStatus(s, meta=dict(s.meta))
                p.targets[s.trial_id] = int(d.target)
                p.completed[s.trial_id] = 0
                p.visited[s.trial_id] = set()
                self.sink.record(self.seq, "launch", s.trial_id, d.target, None,
                                 {**s.meta, "parent": s.parent, "tunables": dict(s.tunables)},
                                 now)
            elif isinstance(d, Extend):
                t = self._status(d.trial_id, "extend")
                if t.stopped:
                    raise AutoMLError(f"extended trial {d.trial_id}, which was stopped")
                if d.target < p.completed[d.trial_id]:
                    raise AutoMLError(f"extended trial {d.trial_id} to {d.target} epochs, but "
                                      f"it has trained {p.completed[d.trial_id]}")
                p.targets[d.trial_id] = max(p.targets[d.trial_id], int(d.target))
                if d.meta:
                    t.meta = {**(t.meta or {}), **dict(d.meta)}
                self.sink.record(self.seq, "extend", d.trial_id, d.target, None, d.meta, now)
            elif isinstance(d, Stop):
                t = self._status(d.trial_id, "stop")
                t.stopped = True
                t.reason = d.reason
                p.set_target(d.trial_id, p.completed[d.trial_id])
                if d.free:
                    t.freed = True
                    p.pending_evals[:] = [u for u in p.pending_evals if u.config != d.trial_id]
                self.sink.record(self.seq, "free" if d.free else "stop", d.trial_id, None,
                                 d.reason, {}, now)
            else:
                raise AutoMLError(f"returned {d!r}, which is not a decision")

    def start(self, now: float = 0.0) -> None:
        self.apply(self.tuner.start(), now)

    def fill(self, now: float) -> None:
        """Ask the tuner to use idle capacity until it has nothing more (or it is full)."""
        for _ in range(MAX_IDLE_CALLS):
            view = self.view(now)
            if view.free_slots <= 0:
                return
            decisions = self.tuner.on_idle(view)
            if not decisions:
                return
            self.apply(decisions, now)
        raise AutoMLError(f"kept deciding for {MAX_IDLE_CALLS} calls without filling the "
                          "workers")

    def check_stalled(self) -> None:
        """Raise if nothing can ever happen again but the procedure is not done."""
        if self.progress.all_done() and not self.tuner.done():
            raise AutoMLError(f"{self.tuner.name!r} stalled: nothing is training and it "
                              "decided nothing more, but it is not done")

    # -- resume ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The book's own state (JSON values): decision count, trials, targets, and what
        the tuner has been told. Saved with the tuner's state, in one transaction, after
        every engine step; :meth:`restore` reads it back."""
        return {
            "seq": self.seq,
            "trials": [{"spec": t.spec.to_json(), "stopped": t.stopped, "freed": t.freed,
                        "reason": t.reason, "last_epoch": t.last_epoch,
                        "score": _json_float(t.score), "meta": t.meta or {},
                        "target": self.progress.targets[c],
                        "units": self.reported_units.get(c, 0),
                        "epochs": sorted(self.reported_epochs.get(c, ()))}
                       for c, t in sorted(self.trials.items())],
        }

    def restore(self, data: Mapping[str, Any]) -> dict[int, int]:
        """Take back :meth:`to_json`'s state; returns trial -> target. The caller rebuilds
        ``progress`` (from the unit log) with those targets, then reports what the log holds
        beyond ``reported_units`` / ``reported_epochs`` as if it had just happened."""
        from .base import TrialSpec
        from .options import MAX_EPOCHS, MAX_TRIALS

        # the saved state is a catalog row its role may edit: a target of 10**12 epochs
        # allocated per epoch on resume (a red-team pass); ValueError for the caller to name
        if not isinstance(data.get("trials"), list) or len(data["trials"]) > MAX_TRIALS:
            raise ValueError(f"trials is not a list of at most {MAX_TRIALS}")
        self.seq = int(data["seq"])
        targets: dict[int, int] = {}
        self.trials, self.reported_units, self.reported_epochs = {}, {}, {}
        for d in data["trials"]:
            spec = TrialSpec.from_json(d["spec"])
            c = spec.trial_id
            score = d.get("score")
            self.trials[c] = TrialStatus(
                spec, bool(d["stopped"]), bool(d["freed"]), d.get("reason"),
                None if d.get("last_epoch") is None else int(d["last_epoch"]),
                None if score is None else float(score), dict(d.get("meta") or {}))
            targets[c] = int(d["target"])
            if not 0 <= targets[c] <= MAX_EPOCHS:
                raise ValueError(f"trial {c}'s target is {targets[c]} epochs, not 0 to "
                                 f"{MAX_EPOCHS}")
            self.reported_units[c] = int(d.get("units") or 0)
            self.reported_epochs[c] = {int(e) for e in d.get("epochs") or ()}
        return targets

    # -- reports --------------------------------------------------------------------------

    def unit_done(self, trial_id: int, epoch: int, partition: int, loss: float | None, rows: int,
                  seconds: float, now: float) -> None:
        self.reported_units[trial_id] = self.reported_units.get(trial_id, 0) + 1
        if self.trials[trial_id].freed:
            return  # a freed trial's last unit ends unreported
        r = UnitReport(trial_id, epoch, partition, _float(loss), int(rows), float(seconds), now)
        self.apply(self.tuner.on_unit(r), now)

    def epoch_evaluated(self, trial_id: int, epoch: int, train: tuple[float, dict[str, float]],
                        valid: tuple[float, dict[str, float]] | None, now: float) -> None:
        t = self.trials[trial_id]
        self.reported_epochs.setdefault(trial_id, set()).add(epoch)
        if t.freed:
            return
        p = self.progress
        at_target = p.targets[trial_id] == epoch and p.completed[trial_id] == epoch
        r = EpochReport(trial_id, epoch, _float(train[0]), dict(train[1]),
                        None if valid is None else _float(valid[0]),
                        None if valid is None else dict(valid[1]), at_target, now)
        if t.last_epoch is None or epoch >= t.last_epoch:
            t.last_epoch, t.score = epoch, r.score
        self.apply(self.tuner.on_epoch(r), now)


def _json_float(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def state_for_jsonb(state_json: str) -> str:
    """A tuner's JSON state with NaN and infinities as strings (``jsonb`` has no NaN);
    :func:`state_from_jsonb` turns them back."""
    import json

    def fix(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return json.dumps(fix(json.loads(state_json)), sort_keys=True, separators=(",", ":"))


def state_from_jsonb(text: str) -> str:
    """Inverse of :func:`state_for_jsonb`: JSON text a tuner can be restored from."""
    import json

    def back(v: Any) -> Any:
        if isinstance(v, str) and v in _NONFINITE:
            return _NONFINITE[v]
        if isinstance(v, dict):
            return {k: back(x) for k, x in v.items()}
        if isinstance(v, list):
            return [back(x) for x in v]
        return v

    return json.dumps(back(json.loads(text)), sort_keys=True, separators=(",", ":"))
