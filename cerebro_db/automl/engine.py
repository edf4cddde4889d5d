"""The AutoML engine: a :class:`~.trials.TrialBook` driven by the fit loop, kept pure.

One engine runs every AutoML procedure, in the server and in the simulation
(:mod:`.simulate`): :func:`run_automl` hands the book's scheduling progress to
:func:`cerebro_db.coordinator.run_fit` with the ``'mop'`` policy, and :class:`AutoMLHooks`
connects the loop to the book (the procedure fills idle workers before each assignment,
hears every training unit and evaluated epoch, and the run ends when the procedure is done
and nothing is left). What differs is only what is plugged in: the executor (worker sessions
or a simulated clock), the book's :class:`~.trials.Sink` and :meth:`AutoMLHooks.persist`
(the fit service writes the catalog there; :mod:`cerebro_db.automl_run`).
Nothing here touches SQL, TensorFlow or an executor's internals.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Callable

from ..coordinator import ConfigResult, Executor, FitOutcome, combine, run_fit
from ..scheduling import Policy, get_policy
from .trials import EvalEpochs, TrialBook

__all__ = ["AutoMLHooks", "automl_policy", "combined", "run_automl"]


def automl_policy(random_state: int) -> Policy:
    """The scheduling policy of an AutoML run: randomized MOP, lagging trials first, each
    trial's visit order per epoch drawn from ``random_state`` (a seeded run trains the same
    models whatever the timing)."""
    return get_policy("mop", random_state=random_state, prefer_lagging=True, seeded_order=True,
                      cost_aware=True, rotated_order=True)


class AutoMLHooks:
    """:class:`cerebro_db.coordinator.FitHooks` of an AutoML run: connects ``book`` to the
    fit loop. ``eval_kinds``: what an evaluation unit computes (``'eval_train'`` first, then
    ``'eval_valid'`` when there is validation data); ``method``: the procedure's name, for
    the notices. :meth:`persist` is called after every engine step; here it keeps nothing
    (the SQL entry point's subclass saves the step to the catalog)."""

    def __init__(self, book: TrialBook, method: str, eval_kinds: Sequence[str],
                 notice: Callable[[str], None] = lambda m: None) -> None:
        self.book, self.method = book, method
        self.eval_kinds = list(eval_kinds)
        self.notice = notice

    def before_assign(self, now: float) -> None:
        self.book.fill(now)
        self.persist()

    def persist(self) -> None:
        """Save the state the last step left (trials, the procedure's and the book's)."""

    def finished(self) -> bool:
        return self.book.finished()

    def stalled(self) -> None:
        self.book.check_stalled()

    def total_units(self) -> int:
        return self.book.total_units()

    def on_train(self, config: int, epoch: int, partition: int, data: dict[str, Any],
                 now: float) -> None:
        self.book.unit_done(config, epoch, partition, data.get("loss"), data.get("rows", 0),
                            data.get("train_seconds", data.get("seconds", 0.0)), now)

    def on_evaluated(self, config: int, epoch: int, result: ConfigResult, now: float) -> None:
        train = combined(result.evals[(epoch, "eval_train")])
        valid = combined(result.evals[(epoch, "eval_valid")]) \
            if "eval_valid" in self.eval_kinds else None
        self.book.epoch_evaluated(config, epoch, train, valid, now)
        t = self.book.trials[config]
        shown = "NaN" if t.score is None else f"{t.score:.4g}"
        self.notice(f"{self.method}: mst_key {config} evaluated at epoch {epoch}, "
                    f"{'validation' if valid else 'training'} loss {shown}; "
                    f"{len(self.book.training())} training, {len(self.book.paused())} paused, "
                    f"{len(self.book.trials)} launched; {now:.1f} s")


def combined(parts: list[dict[str, Any]]) -> tuple[float, dict[str, float]]:
    """Row-weighted loss and named metrics of an epoch's evaluation units (a partition with
    no rows reports no metric names)."""
    loss, metrics = combine(parts)
    # names from a part the worker measured: one read back from the unit log (a resume, or
    # a retried unit found committed) keys its metrics by position
    named = [p for p in parts if p.get("rows") and not all(str(k).isdigit()
                                                            for k in p["metrics"])]
    names = next((list(p["metrics"]) for p in named or [p for p in parts if p.get("rows")]),
                 [])
    return loss, dict(zip(names, metrics))


def run_automl(hooks: AutoMLHooks, executor: Executor, *, random_state: int,
               notice: Callable[[str], None] = lambda m: None,
               clock: Callable[[], float] = time.monotonic, max_unit_retries: int = 3,
               results: dict[int, ConfigResult] | None = None, done_units: int = 0,
               elapsed_before: float = 0.0, running_metrics: bool = False) -> FitOutcome:
    """Run the trials of ``hooks.book`` until its procedure is done (see the module).

    The keyword arguments are :func:`~cerebro_db.coordinator.run_fit`'s; a resumed run
    passes what its unit log holds (``results``, ``done_units``, ``elapsed_before``).
    ``running_metrics`` needs validation (``hooks.eval_kinds`` ``['eval_valid']``): an epoch
    is reported to the procedure when its validation is complete."""
    book = hooks.book
    evals = EvalEpochs(book)
    return run_fit(automl_policy(random_state), book.progress, executor,
                   eval_kinds=hooks.eval_kinds, num_partitions=book.progress.num_partitions,
                   snapshot_epochs=lambda c, e: e in evals[c], notice=notice, clock=clock,
                   max_unit_retries=max_unit_retries, results=results, done_units=done_units,
                   elapsed_before=elapsed_before, hooks=hooks, running_metrics=running_metrics)
