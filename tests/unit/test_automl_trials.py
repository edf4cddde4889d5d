"""The engine-side rules of the AutoML template (TrialBook), without a database."""
from __future__ import annotations

import math

import pytest

from cerebro_db.automl.base import EngineView, Extend, Launch, Stop, TrialSpec, Tuner
from cerebro_db.automl.trials import AutoMLError, TrialBook
from cerebro_db.scheduling import TRAIN, Assignment


class Recorder:
    def __init__(self) -> None:
        self.launched: list[tuple[int, int | None, int]] = []
        self.decisions: list[tuple[int, str, int]] = []

    def launch(self, spec: TrialSpec, target: int) -> None:
        self.launched.append((spec.trial_id, spec.parent, target))

    def record(self, seq, kind, trial_id, target, reason, meta, now) -> None:
        self.decisions.append((seq, kind, trial_id))


class Scripted(Tuner):
    """Returns pre-set decisions: at start, per (trial, epoch) report, and on idle."""

    name = "scripted"

    def __init__(self, start=(), on_epoch=None, idle=(), done_after=True) -> None:
        self._start = list(start)
        self._on_epoch = dict(on_epoch or {})
        self._idle = list(idle)
        self._done = done_after
        self.reports: list = []
        self.idle_calls = 0

    def start(self):
        return self._start

    def on_epoch(self, r):
        self.reports.append(r)
        return self._on_epoch.get((r.trial_id, r.epoch), [])

    def on_idle(self, view: EngineView):
        self.idle_calls += 1
        return self._idle.pop(0) if self._idle else []

    def done(self):
        return self._done

    def options(self):
        return {}


def spec(k: int, parent: int | None = None) -> TrialSpec:
    return TrialSpec(k, 1, "loss='mse',optimizer='SGD'", "batch_size=8", parent=parent)


def run_epoch(book: TrialBook, trial: int, partitions: int = 2) -> None:
    p = book.progress
    for q in range(partitions):
        a = Assignment(q % len(p.workers), trial, p.completed[trial] + 1, q, TRAIN)
        # the worker holding partition q
        w = next(w for w, held in p.workers.items() if q in held)
        a = Assignment(w, trial, a.epoch, q, TRAIN)
        p.start(a)
        p.finish(w, True)


def book_with(tuner: Tuner, freq: int | None = None) -> tuple[TrialBook, Recorder]:
    rec = Recorder()
    return TrialBook(tuner, rec, 2, {0: {0}, 1: {1}}, freq), rec


def test_launch_targets_and_evaluation_epochs() -> None:
    book, rec = book_with(Scripted([Launch(spec(1), 3), Launch(spec(2), 1)]), freq=2)
    book.start()
    assert rec.launched == [(1, None, 3), (2, None, 1)]
    assert book.training() == {1, 2} and book.total_units() == 8
    run_epoch(book, 2)
    assert [u.epoch for u in book.progress.pending_evals] == [1, 1]  # at its target
    assert book.paused() == {2}
    run_epoch(book, 1)
    assert not any(u.config == 1 for u in book.progress.pending_evals)  # 1 is not 2k nor 3
    run_epoch(book, 1)
    assert {u.epoch for u in book.progress.pending_evals if u.config == 1} == {2}


def test_extend_raises_target_and_target_counts_when_the_epoch_completes() -> None:
    book, _ = book_with(Scripted([Launch(spec(1), 1)]))
    book.start()
    book.apply([Extend(1, 2)], 0.0)
    run_epoch(book, 1)
    assert not book.progress.pending_evals  # epoch 1 is no longer the target
    run_epoch(book, 1)
    assert len(book.progress.pending_evals) == 2


def test_report_at_target_and_score_prefers_validation() -> None:
    t = Scripted([Launch(spec(1), 1)])
    book, _ = book_with(t)
    book.start()
    run_epoch(book, 1)
    book.epoch_evaluated(1, 1, (0.5, {"acc": 0.1}), (0.7, {"acc": 0.2}), 1.0)
    r = t.reports[-1]
    assert r.at_target and r.score == 0.7 and book.trials[1].score == 0.7
    book.epoch_evaluated(1, 1, (0.5, {}), None, 1.0)
    assert t.reports[-1].score == 0.5


@pytest.mark.parametrize("decisions, match", [
    ([Launch(spec(1), 1), Launch(spec(1), 1)], "twice"),
    ([Launch(spec(1), 0)], "target 0"),
    ([Extend(9, 2)], "never launched"),
    ([Stop(9)], "never launched"),
    ([Launch(spec(1), 1), Stop(1), Extend(1, 3)], "stopped"),
    ([Launch(spec(1), 1), Stop(1, free=True), Stop(1)], "freed"),
    ([Launch(spec(1), 2), Launch(spec(2, parent=1), 1)], "still training"),
    ([Launch(spec(2, parent=7), 1)], "never launched"),
])
def test_broken_rules_fail_loudly(decisions, match) -> None:
    book, _ = book_with(Scripted())
    with pytest.raises(AutoMLError, match=match) as e:
        book.apply(decisions, 0.0)
    assert e.value.sqlstate == "XX000"


def test_extend_below_completed_is_an_error() -> None:
    book, _ = book_with(Scripted([Launch(spec(1), 2)]))
    book.start()
    run_epoch(book, 1)
    run_epoch(book, 1)
    with pytest.raises(AutoMLError, match="has trained 2"):
        book.apply([Extend(1, 1)], 0.0)
    book.apply([Extend(1, 2)], 0.0)  # equal: no-op


def test_fork_from_paused_or_stopped_and_free() -> None:
    book, rec = book_with(Scripted([Launch(spec(1), 1)]))
    book.start()
    run_epoch(book, 1)
    book.apply([Launch(spec(2, parent=1), 2), Stop(1, "lost", free=True)], 0.0)
    assert rec.launched[-1] == (2, 1, 2)
    assert book.outputs() == [2] and book.freed() == [1]
    assert [d[1] for d in rec.decisions] == ["launch", "launch", "free"]


def test_fill_calls_on_idle_until_full_or_nothing_and_is_bounded() -> None:
    t = Scripted(idle=[[Launch(spec(1), 1)], [Launch(spec(2), 1)], [Launch(spec(3), 1)]])
    book, _ = book_with(t)
    book.fill(0.0)
    assert book.training() == {1, 2} and t.idle_calls == 2  # two workers: full after two

    class Endless(Scripted):
        def on_idle(self, view):
            return [Extend(1, 1)]  # decides something, never fills a slot

    book2, _ = book_with(Endless([Launch(spec(1), 1)]))
    book2.start()
    with pytest.raises(AutoMLError, match="without filling"):
        book2.fill(0.0)


def test_stalled_and_finished() -> None:
    book, _ = book_with(Scripted(done_after=False))
    with pytest.raises(AutoMLError, match="stalled"):
        book.check_stalled()
    book2, _ = book_with(Scripted([Launch(spec(1), 1)]))
    book2.start()
    assert not book2.finished()
    run_epoch(book2, 1)
    book2.progress.pending_evals.clear()
    assert book2.finished()


def test_ranking_puts_nan_and_unevaluated_last() -> None:
    book, _ = book_with(Scripted([Launch(spec(k), 1) for k in (1, 2, 3, 4)]))
    book.start()
    for k, s in ((1, 0.5), (2, math.nan), (3, 0.2)):
        book.trials[k].score = s
    assert book.ranking() == [3, 1, 2, 4]


def test_state_survives_jsonb_with_nan() -> None:
    import json

    from cerebro_db.automl.trials import state_for_jsonb, state_from_jsonb

    text = json.dumps({"a": [math.nan, 1.5, math.inf], "b": {"c": -math.inf}})
    stored = state_for_jsonb(text)
    assert "NaN" in stored and "Infinity" in stored
    json.loads(stored, parse_constant=lambda c: pytest.fail(f"bare {c} in jsonb text"))
    back = json.loads(state_from_jsonb(stored))
    assert math.isnan(back["a"][0]) and back["a"][1:] == [1.5, math.inf]
    assert back["b"]["c"] == -math.inf


def test_book_round_trips_through_json_with_what_the_tuner_was_told() -> None:
    import json

    t = Scripted([Launch(spec(1), 2), Launch(spec(2), 1)])
    book, _ = book_with(t)
    book.start()
    run_epoch(book, 2)
    book.unit_done(2, 1, 0, 0.9, 10, 0.1, 1.0)
    book.unit_done(2, 1, 1, 0.8, 10, 0.1, 1.5)
    book.epoch_evaluated(2, 1, (0.5, {}), (math.nan, {}), 2.0)
    book.apply([Stop(2, "done", free=True), Extend(1, 4)], 2.0)
    text = json.dumps(book.to_json())  # plain JSON: NaN scores as strings
    assert "NaN" in text and "nan" not in text.replace("NaN", "")
    again, _ = book_with(Scripted())
    targets = again.restore(json.loads(text))
    assert targets == {1: 4, 2: 1}
    assert again.seq == book.seq == 4
    assert again.reported_units == {1: 0, 2: 2} and again.reported_epochs == {1: set(), 2: {1}}
    t2 = again.trials[2]
    assert t2.freed and t2.stopped and t2.reason == "done" and t2.last_epoch == 1
    assert math.isnan(t2.score) and again.trials[1].spec == book.trials[1].spec


def test_a_trial_waiting_for_its_evaluation_holds_its_slot_also_after_a_resume() -> None:
    """A trial at its target is in flight until its evaluation ends: it counts against the
    free slots with its evaluation units pending or running. A resumed run rebuilds the
    scheduling progress from the unit log (an evaluation unit cut short is queued again)
    and the book from its JSON state, and sees the same."""
    import json

    from cerebro_db.automl.trials import EvalEpochs
    from cerebro_db.scheduling import EVAL, Progress

    book, _ = book_with(Scripted([Launch(spec(1), 1), Launch(spec(2), 2)]))
    book.start()
    p = book.progress
    log: list[dict] = []

    def unit(w: int, config: int, epoch: int, q: int, kind: str, finish: bool = True) -> None:
        p.start(Assignment(w, config, epoch, q, kind))
        if finish:
            p.finish(w, True)
            log.append({"config": config, "epoch": epoch, "partition": q, "worker": w,
                        "kind": kind, "start": len(log), "end": len(log) + 1, "ok": True})

    def seen(b: TrialBook) -> tuple:
        v = b.view(0.0)
        return v.training, v.paused, v.evaluating, v.free_slots

    assert seen(book) == ({1, 2}, set(), set(), 0)
    unit(0, 1, 1, 0, TRAIN)
    unit(1, 1, 1, 1, TRAIN)  # trial 1 reaches its target: two evaluation units pending
    assert seen(book) == ({2}, {1}, {1}, 0)
    unit(0, 1, 1, 0, EVAL)
    unit(1, 1, 1, 1, EVAL, finish=False)  # the last one runs
    assert seen(book) == ({2}, {1}, {1}, 0)

    again, _ = book_with(Scripted())
    targets = again.restore(json.loads(json.dumps(book.to_json())))
    again.progress = Progress(targets, 2, {0: {0}, 1: {1}})  # the targets EvalEpochs reads
    again.progress = Progress.from_log(log, targets, 2, {0: {0}, 1: {1}}, EvalEpochs(again))
    assert [(u.config, u.partition) for u in again.progress.pending_evals] == [(1, 1)]
    assert seen(again) == seen(book)

    p.finish(1, True)  # the evaluation ends: the slot is free
    assert seen(book) == ({2}, {1}, set(), 1)
