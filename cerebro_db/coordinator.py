"""The fit loop: ask a scheduling policy, dispatch units to an executor, collect results.

Knows nothing of SQL text or TensorFlow. The executor gives idle workers, takes a unit
(``submit(assignment, options)``) and returns finished units (``wait()``); the policy
decides; :class:`~cerebro_db.scheduling.Progress` refuses any assignment that would break
an invariant. There is no barrier unless the policy makes one (the ``ring`` policy).

Faults. A unit whose worker session was lost (``data["lost"]``: killed, crashed, past its
timeout) counts for nothing: the worker's transaction rolled back, so the config's state is
the one before the unit. The coordinator records the attempt (``executor.unit_failed``),
gives the worker a fresh session (``executor.recover``; without one the worker leaves the
fit) and re-queues the unit, up to ``max_unit_retries`` times per unit. A unit that fails
inside a healthy worker (the worker's own error answer, e.g. a shape mismatch) fails the fit
with the worker's message and traceback.

Replicas and elasticity. A worker that leaves (lost for good, or retired) takes its
partitions with it; those that no other worker holds (no replica) are given to the workers
left (:func:`~cerebro_db.scheduling.cover`: on one server any session can read any
partition). With a :class:`WorkerPool`, the coordinator asks between units (at most every
``pool.poll_interval`` seconds) whether another session asked for a different number of
workers: new workers join holding ``pool.holds(worker)`` (fresh ids), surplus workers
(highest ids first) are retired once their unit in flight ends (a unit is never killed for
a removal). The policy sees the change from the next assignment on.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .errors import CONNECTION_FAILURE, INTERNAL_ERROR, CerebroError
from .scheduling import EVAL, TRAIN, Assignment, Policy, Progress, RunningUnit, cover


class Executor(Protocol):
    """Runs units on workers. An executor that can also take a busy worker's next unit
    while its current one runs (pipelined dispatch) has ``can_queue(worker)`` and
    ``queue(a, options) -> bool``; :func:`run_fit` then queues one unit ahead per worker
    (and tells it so first through its ``pipeline(on)``, where it has one). One whose
    ``bundle()`` is above 1 takes that many units in one ``submit(a, options, then)``
    (``then``: the later units and their options), and answers one result per unit, in
    order."""

    def submit(self, a: Assignment, options: dict[str, Any]) -> None: ...
    def wait(self, timeout: float | None = None) -> list[tuple[int, bool, dict[str, Any]]]:
        ...

    def recover(self, worker: int) -> bool: ...
    def unit_failed(self, unit: RunningUnit, attempt: int, data: dict[str, Any]) -> None: ...


class WorkerPool(Protocol):
    """Opens and closes worker sessions while a fit runs (elasticity)."""

    poll_interval: float

    def requested(self) -> int | None:
        """A new number of workers asked for since the last call, else None."""
        ...

    def holds(self, worker: int) -> frozenset[int]: ...
    def join(self, worker: int, partitions: frozenset[int]) -> bool: ...
    def leave(self, worker: int, status: str) -> None: ...
    def granted(self, worker: int, partitions: frozenset[int]) -> None: ...


class FitHooks(Protocol):
    """What an AutoML run adds to the loop (:mod:`cerebro_db.automl.engine`): it changes the
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


class NoWorkerLeft(WorkerFailed):
    """Every worker left the fit (lost, and could not be opened again)."""


@dataclass
class ConfigResult:
    """Per configuration: per-epoch training loss and evaluation results."""

    train_loss: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    evals: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)
    # seconds from the fit's start to the end of the epoch's last training unit (what
    # metrics_elapsed_time reports: when the model that the epoch's metrics describe was
    # made, however late its evaluation ran)
    trained_at: dict[int, float] = field(default_factory=dict)


@dataclass
class FitOutcome:
    results: dict[int, ConfigResult]
    seconds: float
    units: int
    retried: int = 0


def run_fit(policy: Policy, progress: Progress, executor: Executor, *,
            eval_kinds: Sequence[str], num_partitions: int,
            snapshot_epochs: Callable[[int, int], bool],
            notice: Callable[[str], None] = lambda m: None,
            clock: Callable[[], float] = time.monotonic, max_unit_retries: int = 3,
            results: dict[int, ConfigResult] | None = None, done_units: int = 0,
            elapsed_before: float = 0.0, hooks: FitHooks | None = None,
            pool: WorkerPool | None = None, running_metrics: bool = False) -> FitOutcome:
    """Run every unit of the fit to the end; raise :class:`WorkerFailed` on a unit's failure
    (or when a unit lost its worker session more than ``max_unit_retries`` times).

    ``eval_kinds`` are what an evaluation unit computes ('eval_train', 'eval_valid');
    ``snapshot_epochs(config, epoch)`` says whether the state at the end of that epoch is
    kept for evaluation. A resumed fit passes what its log already holds: ``results``,
    ``done_units`` (training units done) and ``elapsed_before`` (seconds already spent).
    ``pool``: worker sessions can join and leave while the fit runs (see the module).
    ``running_metrics``: the training metrics are what each training unit measured as it
    trained (recorded as the epoch's 'eval_train' parts; ``eval_kinds`` then has no
    'eval_train'). Under AutoML only with validation: its hooks learn an epoch's end from
    its evaluation, then the validation's.
    """
    if running_metrics and hooks is not None and list(eval_kinds) != ["eval_valid"]:
        raise CerebroError("running training metrics under AutoML need validation",
                           INTERNAL_ERROR)
    start = clock() - elapsed_before
    results = results if results is not None else {}
    for c in progress.targets:
        results.setdefault(c, ConfigResult())
    total = sum(progress.targets.values()) * num_partitions
    done_before = done_units
    best: tuple[float, int] | None = None
    attempts: dict[tuple[int, int, int, str], int] = {}
    retried = 0
    elastic = _Elastic(progress, pool, notice)
    # pipelined dispatch: each busy worker gets its next unit while its current one runs
    # (not under AutoML, whose decisions need every result first)
    ahead = hooks is None and policy.lookahead and callable(getattr(executor, "queue", None))
    pipeline = getattr(executor, "pipeline", None)
    if callable(pipeline):
        pipeline(ahead)
    # evaluation bundles: a worker given an evaluation unit may get its next ones in the
    # same statement (the policy decides them as queued units are decided; not under AutoML)
    bundle = getattr(executor, "bundle", None)
    size = bundle() if hooks is None and policy.lookahead and callable(bundle) else 1
    taken: dict[int, list[Assignment]] = {}  # worker -> its bundle's units not started yet

    def options(a: Assignment, prog: Progress) -> dict[str, Any]:
        opts: dict[str, Any] = {"reset_optimizer": a.reset_optimizer,
                                "attempt": attempts.get(_key(a), 0)}
        if a.kind == TRAIN:
            seen = len(prog.visited[a.config])
            opts["completes_epoch"] = seen == num_partitions - 1
            # the epoch before's end state, kept for its evaluation by the unit that moves
            # the config on (until then the evaluation reads 'current')
            opts["keep_previous"] = seen == 0 and snapshot_epochs(a.config, a.epoch - 1)
        else:
            opts["eval_kinds"] = list(eval_kinds)
        return opts

    while True:
        elastic.rescale()
        if hooks is not None:
            hooks.before_assign(clock() - start)
            total = hooks.total_units()
        if progress.all_done() and (hooks is None or hooks.finished()):
            break
        snap = progress.snapshot(clock() - start)
        picks = policy.assign(snap)
        for a in picks:
            progress.start(a)
        for a in picks:
            more = (_bundle(policy, progress, a, size, clock() - start,
                            lambda b: not attempts.get(_key(b)))
                    if size > 1 and a.kind == EVAL and a.worker not in elastic.retiring
                    and not attempts.get(_key(a)) else [])
            if more:
                taken[a.worker] = more
                executor.submit(a, options(a, progress),  # type: ignore[call-arg]
                                [(b, options(b, progress)) for b in more])
            else:
                executor.submit(a, options(a, progress))
        if ahead:
            _queue_ahead(policy, progress, executor, options,
                         elastic.retiring | taken.keys(), clock() - start)
        if not progress.running:
            if hooks is not None:
                hooks.stalled()
            if not progress.workers:  # every worker left (lost, could not reconnect)
                raise NoWorkerLeft(
                    "every worker of the fit is gone (their sessions were lost and could not "
                    "be opened again), so the fit cannot go on",
                    CONNECTION_FAILURE,
                    hint="Its committed units are kept: once the workers can connect again "
                    "(a remote cluster running, the server accepting connections), resume "
                    "the fit with madlib_keras_fit_resume.")
            raise CerebroError("the scheduling policy has nothing to run but the fit is not "
                               "done", INTERNAL_ERROR)
        finished = executor.wait(pool.poll_interval) if pool is not None else executor.wait()
        for worker, ok, data in finished:
            unit = progress.running[worker]
            if not ok and data.get("lost"):
                progress.finish(worker, False)
                lost = [unit]
                for b in taken.pop(worker, []):  # the rest of its bundle: lost with it
                    progress.give_back(b)
                    lost.append(RunningUnit(b.worker, b.config, b.epoch, b.partition, b.kind))
                for u in lost:  # each counts an attempt (and is then retried alone)
                    key = _key(u)
                    attempts[key] = attempts.get(key, 0) + 1
                    retried += 1
                    executor.unit_failed(u, attempts[key] - 1, data)
                    where = (f"configuration {u.config} (epoch {u.epoch}, partition "
                             f"{u.partition}, {u.kind})")
                    if attempts[key] > max_unit_retries:
                        raise WorkerFailed(
                            f"{where} lost its worker session {attempts[key]} times; last: "
                            f"{data.get('message')}", data.get("sqlstate") or CONNECTION_FAILURE,
                            hint="Raise cerebro_db.max_unit_retries, or look for what ends the "
                            "worker sessions (server log).")
                key = _key(unit)
                where = (f"configuration {unit.config} (epoch {unit.epoch}, partition "
                         f"{unit.partition}, {unit.kind})" + (
                             f" and the {len(lost) - 1} evaluation units of its bundle"
                             if len(lost) > 1 else ""))
                if worker in elastic.retiring:
                    elastic.leave(worker, "removed")
                elif not executor.recover(worker):
                    notice(f"worker {worker} lost its session and could not reconnect; it "
                           "leaves the fit")
                    elastic.leave(worker, "lost")
                else:
                    progress.forget_reads(worker)  # a fresh session: nothing read yet
                    notice(f"worker {worker} lost its session ({data.get('message')}); "
                           f"{where} is queued again (retry {attempts[key]} of "
                           f"{max_unit_retries})")
                continue
            if not ok:
                raise WorkerFailed(
                    f"worker {worker} failed on configuration {unit.config} "
                    f"(epoch {unit.epoch}, partition {unit.partition}): {data.get('message')}",
                    data.get("sqlstate") or INTERNAL_ERROR,
                    hint=data.get("hint"), detail=data.get("detail"))
            epoch_before = progress.completed[unit.config]
            progress.finish(worker, True)
            if taken.get(worker):  # the bundle's next unit ran after this one
                progress.start_taken(taken[worker].pop(0))
                if not taken[worker]:
                    del taken[worker]
            if unit.kind == TRAIN:
                progress.observe(unit.config, data.get("seconds"), unit.epoch)
            else:
                progress.observe_eval(unit.config, data.get("seconds"))
            progress.observe_read(worker, unit.partition, data.get("read_seconds"))
            if worker in elastic.retiring and worker not in progress.running:
                elastic.leave(worker, "removed")
            r = results.setdefault(unit.config, ConfigResult())
            if unit.kind == TRAIN:
                done_units += 1
                r.train_loss.setdefault(unit.epoch, []).append((data["loss"], data["rows"]))
                if running_metrics:
                    r.evals.setdefault((unit.epoch, "eval_train"), []).append(
                        {"loss": data["loss"], "rows": data["rows"],
                         "metrics": data.get("metrics") or {}})
                if len(r.train_loss[unit.epoch]) == num_partitions:
                    r.trained_at[unit.epoch] = clock() - start
                if hooks is not None:
                    hooks.on_train(unit.config, unit.epoch, unit.partition, data,
                                   clock() - start)
                if progress.completed[unit.config] > epoch_before:
                    elapsed = clock() - start
                    loss = _mean(r.train_loss[unit.epoch])
                    if not math.isnan(loss) and (best is None or loss < best[0]):
                        best = (loss, unit.config)
                    eta = elapsed / max(done_units - done_before, 1) * max(0, total - done_units)
                    shown_best = f"{best[0]:.4g} (mst_key {best[1]})" if best else "NaN"
                    notice(
                        f"mst_key {unit.config}: epoch {unit.epoch}/"
                        f"{progress.targets[unit.config]} done, training loss {loss:.4g}; "
                        f"{done_units}/{total} units ({100 * done_units / total:.0f}%), "
                        f"best {shown_best}, elapsed {elapsed:.1f} s, ETA {eta:.1f} s")
            else:
                for kind, res in data.get("evals", {}).items():
                    r.evals.setdefault((unit.epoch, kind), []).append(res)
                if hooks is not None and \
                        len(r.evals.get((unit.epoch, eval_kinds[0]), [])) == num_partitions:
                    hooks.on_evaluated(unit.config, unit.epoch, r, clock() - start)
        for w in [w for w in taken if w not in progress.running]:
            for b in taken.pop(w):  # an answer without them (never so, but never lost)
                progress.give_back(b)
    return FitOutcome(results, clock() - start, done_units, retried)


def _bundle(policy: Policy, progress: Progress, a: Assignment, size: int, now: float,
            fresh: Callable[[Assignment], bool]) -> list[Assignment]:
    """The evaluation units ``a``'s worker runs after ``a`` in the same statement: what the
    policy would give it next, one after another, decided on :meth:`Progress.ahead` copies
    as a queued unit is (a look-ahead snapshot: home partitions only, nothing in a fit's
    tail where another holder could take them sooner), while that is an evaluation unit
    that never lost its session (``fresh``: a unit retried after a loss runs alone, so a
    unit that ends its session is found out), up to ``size`` units in all. They are taken
    out of the pending ones (:meth:`Progress.take`)."""
    more: list[Assignment] = []
    p, w = progress, a.worker
    while len(more) < size - 1:
        p, b = _next_for(policy, p, w, now)
        if b is None or b.kind != EVAL or not fresh(b):
            break
        p.start(b)
        more.append(b)
    for b in more:
        progress.take(b)
    return more


def _next_for(policy: Policy, progress: Progress, worker: int, now: float
              ) -> tuple[Progress, Assignment | None]:
    """What the policy would give busy ``worker`` if its unit in flight ended now: the
    :meth:`Progress.ahead` copy and the policy's pick on its look-ahead snapshot (None:
    nothing)."""
    ahead = progress.ahead(worker)
    snap = dataclasses.replace(ahead.snapshot(now), idle_workers=(worker,), ahead=True)
    picks = [a for a in policy.assign(snap) if a.worker == worker]
    return ahead, picks[0] if picks else None


def _queue_ahead(policy: Policy, progress: Progress, executor: Any,
                 options: Callable[[Assignment, Progress], dict[str, Any]],
                 skip: set[int], now: float) -> None:
    """Queue the next unit of every busy worker that has none queued (and is not leaving
    or running a bundle, ``skip``):
    what the policy would give it if its unit in flight ended now, decided on
    :meth:`Progress.ahead`. A worker the policy has nothing for now gets its next unit the
    usual way once it is idle."""
    for w in sorted(progress.running):
        if w in progress.queued or w in skip or not executor.can_queue(w):
            continue
        ahead, a = _next_for(policy, progress, w, now)
        if a is None:
            continue
        ahead.check(a)
        if executor.queue(a, options(a, ahead)):
            progress.queue(a, ahead)


class _Elastic:
    """Workers joining and leaving a running fit (see the module docstring)."""

    def __init__(self, progress: Progress, pool: WorkerPool | None,
                 notice: Callable[[str], None]) -> None:
        self.progress, self.pool, self.notice = progress, pool, notice
        self.retiring: set[int] = set()
        self.next_id = max(progress.workers, default=-1) + 1

    def rescale(self) -> None:
        if self.pool is None:
            return
        want = self.pool.requested()
        if want is None:
            return
        active = [w for w in sorted(self.progress.workers) if w not in self.retiring]
        while len(active) < want and self.retiring:
            w = min(self.retiring)
            self.retiring.discard(w)
            active.append(w)
            self.notice(f"worker {w} stays in the fit (asked for {want} workers)")
        while len(active) < want:
            w = self.next_id
            self.next_id += 1
            parts = self.pool.holds(w)
            if not self.pool.join(w, parts):
                self.notice(f"worker {w} could not open its session; the fit goes on with "
                            f"{len(active)} workers")
                break
            self.progress.add_worker(w, parts)
            active.append(w)
            self.notice(f"worker {w} joins the fit holding partitions {sorted(parts)}")
        for w in sorted(active, reverse=True)[:max(0, len(active) - want)]:
            if w in self.progress.running:
                self.retiring.add(w)
                self.notice(f"worker {w} leaves the fit after its unit in flight")
            else:
                self.leave(w, "removed")

    def leave(self, worker: int, status: str) -> None:
        """``worker`` (idle) leaves; partitions only it held go to the workers left."""
        self.progress.remove_worker(worker)
        self.retiring.discard(worker)
        self.next_id = max(self.next_id, worker + 1)
        if self.pool is not None:
            self.pool.leave(worker, status)
        if status == "removed":
            self.notice(f"worker {worker} left the fit")
        for w, parts in cover(self.progress.workers, self.progress.num_partitions).items():
            extra = parts - self.progress.workers[w]
            if extra:
                self.progress.grant(w, extra)
                if self.pool is not None:
                    self.pool.granted(w, parts)
                self.notice(f"worker {w} now also serves partitions {sorted(extra)} (no "
                            f"other worker holds them)")


def _key(u: Assignment | RunningUnit) -> tuple[int, int, int, str]:
    return (u.config, u.epoch, u.partition, u.kind)


def _mean(pairs: list[tuple[float, int]]) -> float:
    pairs = [(v, n) for v, n in pairs if n]  # an empty partition's NaN weighs nothing
    rows = sum(n for _, n in pairs)
    return math.fsum(v * n for v, n in pairs) / rows if rows else float("nan")


def combine(parts: list[dict[str, Any]]) -> tuple[float, list[float]]:
    """Row-weighted loss and metrics over partitions (metrics by position: a resumed fit
    reads them back from the unit log as arrays); partitions without rows are left out."""
    parts = [p for p in parts if p["rows"]]
    if not parts:
        return float("nan"), []
    rows = sum(p["rows"] for p in parts)
    loss = math.fsum(p["loss"] * p["rows"] for p in parts) / rows
    vals = [list(p["metrics"].values()) for p in parts]  # in the order the worker gave
    metrics = [math.fsum(v[i] * p["rows"] for v, p in zip(vals, parts)) / rows
               for i in range(len(vals[0]))]
    return loss, metrics
