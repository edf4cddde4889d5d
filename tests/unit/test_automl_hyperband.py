"""Hyperband: the schedule (the paper's table, exact integer arithmetic, skip_last) and the
diagonal execution on the engine with the simulated executor (survivors, epochs, reproducibility, resume)."""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_db.automl.base import EpochReport, Extend, Launch, Stop, TrialSpec, score_key
from cerebro_db.automl.hyperband import Hyperband, hyperband_s_max, hyperband_schedule
from cerebro_db.automl.registry import get_tuner, tuner_from_state_json
from cerebro_db.automl.simulate import EpochScores, SimResult, random_unit_time, simulate_tuner
from cerebro_db.errors import CerebroError

pytest.importorskip("keras")  # the search space parses the compile params

ScoreFn = Callable[[TrialSpec, int], float]

COMPILE = ("{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
           "'lr': [0.00001, 1.0, 'log'], 'momentum': [0.0, 0.99, 'linear']}]}")
FIT = "{'batch_size': [8, 1024, 'log']}"
SMALL = "{'loss': ['mse'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.1]}]}"


def _tuner(R: int, eta: int, skip_last: int = 0, random_state: int | None = 1,
           compile_grid: str = COMPILE, model_ids: tuple[int, ...] = (1, 2)) -> Hyperband:
    return Hyperband(model_ids=list(model_ids), compile_grid=compile_grid, fit_grid=FIT,
                     num_workers=4, random_state=random_state, R=R, eta=eta,
                     skip_last=skip_last)


def run(t: Hyperband, score: ScoreFn, *, num_workers: int, seed: int = 0,
        frequency: int | None = None, roundtrip: bool | Collection[int] = False) -> SimResult:
    """``t`` on the engine, scored by ``score(spec, epoch)``, one partition per worker
    (at most two), unit times drawn from ``seed``."""
    return simulate_tuner(t, num_partitions=min(num_workers, 2), num_workers=num_workers,
                          metrics_compute_frequency=frequency, loss_model=EpochScores(score),
                          unit_time=random_unit_time(seed), seed=seed, roundtrip_state=roundtrip)


def _scorer(seed: int, nan_rate: float = 0.05, levels: int = 7) -> ScoreFn:
    """Random scores per (config, epoch) from a small set (ties), sometimes NaN."""

    def score(spec: TrialSpec, epoch: int) -> float:
        r = random.Random(f"{seed}|{spec.model_id}|{spec.compile_params}|{spec.fit_params}"
                          f"|{epoch}")
        return math.nan if r.random() < nan_rate else float(r.randrange(levels))

    return score


# -- the schedule -------------------------------------------------------------------------

PAPER_R81_ETA3 = {
    4: [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    3: [(34, 3), (11, 9), (3, 27), (1, 81)],
    2: [(15, 9), (5, 27), (1, 81)],
    1: [(8, 27), (2, 81)],
    0: [(5, 81)],
}


def test_schedule_matches_the_paper_table() -> None:
    rows = hyperband_schedule(81, 3)
    got: dict[int, list[tuple[int, int]]] = {}
    for s, i, n, r in rows:
        assert i == len(got.setdefault(s, []))
        got[s].append((n, r))
    assert got == PAPER_R81_ETA3
    assert [s for s, *_ in rows] == sorted((s for s, *_ in rows), reverse=True)


def test_schedule_s_max_is_exact() -> None:
    assert math.floor(math.log(243, 3)) == 4  # what MADlib computes
    rows = hyperband_schedule(243, 3)
    assert rows[0] == (5, 0, 243, 1)
    assert max(s for s, *_ in rows) == 5
    assert hyperband_schedule(6, 3) == [(1, 0, 3, 2), (1, 1, 1, 6), (0, 0, 2, 6)]


def test_schedule_rounds_epochs_half_up() -> None:
    # R=5, eta=2: r = 5/4, 5/2, 5 for bracket 2
    assert [r for s, _, _, r in hyperband_schedule(5, 2) if s == 2] == [1, 3, 5]


def test_skip_last_drops_the_last_rounds_of_every_bracket() -> None:
    full = hyperband_schedule(81, 3)
    for k in range(5):
        rows = hyperband_schedule(81, 3, k)
        assert rows == [row for row in full if row[1] <= row[0] - k]
        assert {s for s, *_ in rows} == set(range(k, 5))
    with pytest.raises(CerebroError, match="skip_last must be less than the number"):
        hyperband_schedule(81, 3, 5)


@settings(max_examples=150, deadline=None)
@given(R=st.integers(1, 3000), eta=st.integers(2, 9), data=st.data())
def test_schedule_properties(R: int, eta: int, data: st.DataObject) -> None:
    s_max = max(s for s in range(20) if eta**s <= R)
    skip = data.draw(st.integers(0, s_max))
    rows = hyperband_schedule(R, eta, skip)
    assert len(rows) == sum(s + 1 - skip for s in range(skip, s_max + 1))
    for s, i, n, r in rows:
        n0 = math.ceil(Fraction(s_max + 1, s + 1) * eta**s)
        assert n == n0 // eta**i >= 1
        exact = Fraction(R * eta**i, eta**s)
        assert r >= 1 and abs(r - exact) <= Fraction(1, 2)
        assert r == math.floor(exact + Fraction(1, 2))
    if skip == 0:
        assert {r for s, i, n, r in rows if i == s} == {R}


# -- execution ------------------------------------------------------------------------------

def _check_run(r: SimResult, t: Hyperband, score: ScoreFn) -> None:
    sched = {(s, i): (n, ep) for s, i, n, ep in t.schedule()}
    by_bracket: dict[int, list[int]] = {}
    for k in r.trials:
        by_bracket.setdefault(t.info(k)["s"], []).append(k)
    # every bracket that can run starts with its n configurations (the space is large)
    assert set(by_bracket) == {s for s, _ in sched}
    for s, ids in by_bracket.items():
        assert len(ids) == sched[(s, 0)][0]
        members = sorted(ids)
        last = max(i for (b, i) in sched if b == s)
        for i in range(last + 1):
            n_i, r_i = sched[(s, i)]
            assert len(members) == n_i
            if i == last:
                break
            ranked = sorted(members, key=lambda k: (score_key(score(r.trials[k].spec, r_i)),
                                                    k))
            survivors = sorted(k for k in ids if t.info(k)["i"] >= i + 1)
            assert survivors == sorted(ranked[:sched[(s, i + 1)][0]])
            members = survivors
        for k in ids:
            tr = r.trials[k]
            assert tr.completed == sched[(s, t.info(k)["i"])][1]
            assert tr.stopped == (t.info(k)["i"] < last)
    # diagonal: targets never decrease in decision order
    targets = [d.decision.target for d in r.decisions if not isinstance(d.decision, Stop)]
    assert targets == sorted(targets)
    assert t.done()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), skip=st.integers(0, 2), workers=st.integers(1, 6))
def test_survivors_are_the_best_of_each_round(seed: int, skip: int, workers: int) -> None:
    t = _tuner(27, 3, skip, random_state=seed)
    score = _scorer(seed)
    r = run(t, score, num_workers=workers, seed=seed, frequency=seed % 3 or None)
    _check_run(r, t, score)


def test_r81_eta3_full_run() -> None:
    t = _tuner(81, 3, random_state=5)
    score = _scorer(5, nan_rate=0.1, levels=20)
    r = run(t, score, num_workers=8, seed=3)
    _check_run(r, t, score)
    assert len(r.trials) == 81 + 34 + 15 + 8 + 5
    # survivors continue from their weights: round i costs n_i * (r_i - r_{i-1}) epochs
    assert sum(tr.completed for tr in r.trials.values()) == sum(
        n * (ep - (ep // 3 if i else 0)) for s, i, n, ep in hyperband_schedule(81, 3))


def test_decisions_are_reproducible_and_seeded() -> None:
    score = _scorer(11)
    a = run(_tuner(9, 3, random_state=42), score, num_workers=3, seed=2).decisions
    b = run(_tuner(9, 3, random_state=42), score, num_workers=3, seed=2).decisions
    c = run(_tuner(9, 3, random_state=43), score, num_workers=3, seed=2).decisions
    assert a == b
    assert a != c


@pytest.mark.parametrize("points", [[5], [17, 40, 41, 90], list(range(0, 200, 7))])
def test_state_round_trip_mid_run_continues_identically(points: list[int]) -> None:
    score = _scorer(3)
    whole = run(_tuner(27, 3, random_state=9), score, num_workers=4, seed=6)
    resumed = run(_tuner(27, 3, random_state=9), score, num_workers=4, seed=6,
                  roundtrip=set(points))
    assert resumed.decisions == whole.decisions
    assert {k: resumed.tuner.info(k) for k in resumed.trials} == \
        {k: whole.tuner.info(k) for k in whole.trials}
    assert resumed.tuner.state_json() == whole.tuner.state_json()


def test_state_keeps_nan_scores_as_json() -> None:
    t = _tuner(9, 3)
    launches = [d for d in t.start() if isinstance(d, Launch)]
    rep = EpochReport(launches[0].spec.trial_id, launches[0].target, math.nan, {}, None,
                      None, True, 1.0)
    t.on_epoch(rep)
    text = t.state_json()
    assert "NaN" not in text
    again = tuner_from_state_json(text)
    assert isinstance(again, Hyperband)
    assert math.isnan(again.score[launches[0].spec.trial_id])


def test_a_space_smaller_than_a_bracket() -> None:
    fit = "{'batch_size': [8, 16, 32]}"
    t = Hyperband(model_ids=[1], compile_grid=SMALL, fit_grid=fit, num_workers=2,
                  random_state=0, R=9, eta=3, skip_last=0)
    r = run(t, lambda spec, e: float(spec.trial_id), num_workers=2)
    assert sorted(r.trials) == [1, 2, 3]
    assert {t.info(k)["s"] for k in r.trials} == {2}
    # bracket 2: 9 wanted, 3 there; keeps n_1 = 3, then n_2 = 1 (the lowest score)
    assert [k for k in r.trials if t.info(k)["i"] == 2] == [1]
    assert r.trials[1].completed == 9 and not r.trials[1].stopped
    assert all(r.trials[k].stopped and r.trials[k].completed == 3 for k in (2, 3))


def test_decision_kinds_per_diagonal() -> None:
    t = _tuner(9, 3)
    first = t.start()
    assert all(isinstance(d, Launch) and d.target == 1 for d in first)
    assert [d.spec.meta["s"] for d in first if isinstance(d, Launch)] == [2] * 9
    out = []
    for k, d in enumerate(first):
        assert isinstance(d, Launch)
        out = t.on_epoch(EpochReport(d.spec.trial_id, 1, float(k), {}, None, None, True,
                                     float(k)))
        if k < len(first) - 1:
            assert out == []
    stops = [d for d in out if isinstance(d, Stop)]
    extends = [d for d in out if isinstance(d, Extend)]
    launches = [d for d in out if isinstance(d, Launch)]
    assert [d.trial_id for d in extends] == [1, 2, 3]
    assert {d.target for d in extends} == {3} and extends[0].meta == {"i": 1}
    assert sorted(d.trial_id for d in stops) == list(range(4, 10))
    assert [d.spec.trial_id for d in launches] == list(range(10, 15))
    assert {d.target for d in launches} == {3}
    assert out == stops + extends + launches


def test_registry_and_info_columns() -> None:
    t = get_tuner("hyperband", "R=27, eta=3, skip_last=1", model_ids=[1], compile_grid=COMPILE,
                  fit_grid=FIT, num_workers=2, random_state=None)
    assert isinstance(t, Hyperband)
    assert (t.R, t.eta, t.skip_last, t.s_max) == (27, 3, 1, 3)
    assert t.info_columns() == [("s", "integer"), ("i", "integer")]
    with pytest.raises(CerebroError, match="skip_last must be less than"):
        get_tuner("hyperband", "R=27, eta=3, skip_last=4", model_ids=[1], compile_grid=COMPILE,
                  fit_grid=FIT, num_workers=2, random_state=None)
    with pytest.raises(CerebroError, match="eta must be at least 2"):
        _tuner(27, 1)


def _params(text: str | None, method: str = "hyperband") -> tuple[int, int, int]:
    t = get_tuner(method, text, model_ids=[1], compile_grid=COMPILE, fit_grid=FIT,
                  num_workers=2, random_state=1)
    assert isinstance(t, Hyperband)
    return t.R, t.eta, t.skip_last


def _error(text: str) -> CerebroError:
    with pytest.raises(CerebroError) as info:
        _params(text)
    return info.value


def test_hyperband_params() -> None:
    """Hyperband reads and checks its own automl_params (keys case-insensitive)."""
    assert _params(None) == (6, 3, 0)
    assert _params("R=243, eta=3, skip_last=5", "Hyperband") == (243, 3, 5)
    assert _params("r=9")[0] == 9
    e = _error("R=243, eta=3, skip_last=6")
    assert "skip_last must be less than the number of brackets (6" in e.message
    assert e.sqlstate == "22023"
    assert _error("R=0").message == "automl_params: R must be at least 1, got 0"
    assert "eta must be at least 2" in _error("eta=1").message
    assert "skip_last must be at least 0" in _error("skip_last=-1").message
    assert "must be an integer" in _error("R=6.0").message
    assert "unknown key 'foo' for hyperband" in _error("foo=1").message
    assert _error("R=6, r=7").sqlstate == "42601"
    # madlib_keras_automl.sql_in: "Should error out for invalid automl params: R"
    assert _error("R=2, eta=3").message == "automl_params: R must be at least eta (3), got 2"


def test_hyperband_limits_are_its_own() -> None:
    """The upper bounds (with their hint) and the configuration count, checked before the
    tuner draws anything."""
    e = _error("R=1000000000")
    assert e.message == "automl_params: R must be at most 100000, got 1000000000"
    assert "Bounds keep one call's work finite" in (e.hint or "")
    assert "eta must be at most 1000" in _error("R=27, eta=1000000").message
    assert "skip_last must be at most 64" in _error("skip_last=65").message
    e = _error("R=100000, eta=2")
    assert "configurations, more than 10000" in e.message and e.hint


@pytest.mark.parametrize("R, eta", [(243, 3), (81, 3), (8, 2), (1, 3), (1000, 10), (999, 10)])
def test_hyperband_s_max_exact(R: int, eta: int) -> None:
    s = hyperband_s_max(R, eta)
    assert eta**s <= R < eta ** (s + 1)
