"""The fit loop: ask a scheduling policy, dispatch units to an executor, collect results.

Knows nothing of SQL text or TensorFlow. The executor gives idle workers, takes a unit
(``submit(assignment, options)``) and returns finished units (``wait()``); the policy
decides; :class:`~cerebro_db.scheduling.Progress` refuses any assignment that would break
an invariant. There is no barrier unless the policy makes one (the ``ring`` policy).
"""
from __future__ import annotations

import collections
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .errors import CerebroError
from .scheduling import TRAIN, Assignment, Policy, Progress


class Executor(Protocol):
    def submit(self, a: Assignment, options: dict[str, Any]) -> None: ...
    def wait(self) -> list[tuple[int, bool, dict[str, Any]]]: ...


class FitHooks(Protocol):
    """What an AutoML run adds to the loop (:mod:`cerebro_db.tuning`): it changes the
    configs and targets of ``progress`` between steps; ``run_fit`` then simply runs what
    the targets say."""

    def before_assign(self, now: float) -> None: ...
    def finished(self) -> bool: ...
    def stalled(self) -> None: ...
    def total_units(self) -> int: ...
    def on_train(self, config: int, epoch: int, partition: int, data: dict[str, Any],
                 now: float) -> None: ...
    def on_evaluated(self, config: int, epoch: int, result: ConfigResult, now: float
                     ) -> None: ...


class WorkerFailed(CerebroError):
    """A unit failed in a worker; carries the worker's message and traceback."""


@dataclass
class ConfigResult:
    """Per configuration: per-epoch training loss and evaluation results."""

    train_loss: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    evals: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)
    eval_done_at: dict[int, float] = field(default_factory=dict)


@dataclass
class FitOutcome:
    results: dict[int, ConfigResult]
    seconds: float
    units: int


def run_fit(policy: Policy, progress: Progress, executor: Executor, *,
            eval_kinds: Sequence[str], num_partitions: int,
            snapshot_epochs: Callable[[int, int], bool],
            notice: Callable[[str], None] = lambda m: None,
            clock: Callable[[], float] = time.monotonic,
            hooks: FitHooks | None = None) -> FitOutcome:
    """Run every unit of the fit to the end; raise :class:`WorkerFailed` on a unit's failure.

    ``eval_kinds`` are what an evaluation unit computes ('eval_train', 'eval_valid');
    ``snapshot_epochs(config, epoch)`` says whether the state at the end of that epoch is
    kept for evaluation.
    """
    start = clock()
    results: dict[int, ConfigResult] = collections.defaultdict(ConfigResult)
    for c in progress.targets:
        results[c] = ConfigResult()
    total = sum(progress.targets.values()) * num_partitions
    done_units = 0
    best: tuple[float, int] | None = None
    while True:
        if hooks is not None:
            hooks.before_assign(clock() - start)
            total = hooks.total_units()
        if progress.all_done() and (hooks is None or hooks.finished()):
            break
        snap = progress.snapshot(clock() - start)
        for a in policy.assign(snap):
            progress.start(a)
            opts: dict[str, Any] = {"reset_optimizer": a.reset_optimizer}
            if a.kind == TRAIN:
                last = len(progress.visited[a.config]) == num_partitions - 1
                opts["completes_epoch"] = last
                opts["snapshot"] = last and snapshot_epochs(a.config, a.epoch)
            else:
                opts["eval_kinds"] = list(eval_kinds)
            executor.submit(a, opts)
        if not progress.running:
            if hooks is not None:
                hooks.stalled()
            raise CerebroError("the scheduling policy has nothing to run but the fit is not "
                               "done", "XX000")
        for worker, ok, data in executor.wait():
            unit = progress.running[worker]
            if not ok:
                raise WorkerFailed(
                    f"worker {worker} failed on configuration {unit.config} "
                    f"(epoch {unit.epoch}, partition {unit.partition}): {data.get('message')}",
                    data.get("sqlstate") or "XX000",
                    hint=data.get("hint"), detail=data.get("detail"))
            epoch_before = progress.completed[unit.config]
            progress.finish(worker, True)
            r = results[unit.config]
            if unit.kind == TRAIN:
                done_units += 1
                r.train_loss.setdefault(unit.epoch, []).append((data["loss"], data["rows"]))
                if hooks is not None:
                    hooks.on_train(unit.config, unit.epoch, unit.partition, data,
                                   clock() - start)
                if progress.completed[unit.config] > epoch_before:
                    elapsed = clock() - start
                    loss = _mean(r.train_loss[unit.epoch])
                    if not math.isnan(loss) and (best is None or loss < best[0]):
                        best = (loss, unit.config)
                    eta = elapsed / done_units * max(0, total - done_units)
                    shown_best = f"{best[0]:.4g} (mst_key {best[1]})" if best else "NaN"
                    notice(
                        f"mst_key {unit.config}: epoch {unit.epoch}/"
                        f"{progress.targets[unit.config]} done, training loss {loss:.4g}; "
                        f"{done_units}/{total} units ({100 * done_units / total:.0f}%), "
                        f"best {shown_best}, elapsed {elapsed:.1f} s, ETA {eta:.1f} s")
            else:
                for kind, res in data.get("evals", {}).items():
                    r.evals.setdefault((unit.epoch, kind), []).append(res)
                if len(r.evals.get((unit.epoch, eval_kinds[0]), [])) == num_partitions:
                    r.eval_done_at[unit.epoch] = clock() - start
                    if hooks is not None:
                        hooks.on_evaluated(unit.config, unit.epoch, r, clock() - start)
    return FitOutcome(dict(results), clock() - start, done_units)


def _mean(pairs: list[tuple[float, int]]) -> float:
    rows = sum(n for _, n in pairs)
    return math.fsum(v * n for v, n in pairs) / rows if rows else float("nan")


def combine(parts: list[dict[str, Any]]) -> tuple[float, list[float]]:
    """Row-weighted loss and metrics over partitions."""
    rows = sum(p["rows"] for p in parts)
    loss = math.fsum(p["loss"] * p["rows"] for p in parts) / rows
    names = list(parts[0]["metrics"])
    metrics = [math.fsum(p["metrics"][k] * p["rows"] for p in parts) / rows for k in names]
    return loss, metrics
