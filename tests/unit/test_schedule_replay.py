"""bench/schedule_replay.py: a run's one-off costs are charged where the replayed schedule
causes them (per worker and model family), not where they fell in the measured run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import schedule_replay

STEADY = {1: 0.10, 2: 0.12, 3: 0.30, 4: 0.32}  # config -> steady training unit seconds
EVAL = 0.05
ONE_OFF = {"a": 0.9, "b": 0.5}  # family -> build and trace of its training step
EVAL_ONE_OFF = {"a": 0.2, "b": 0.1}
FAMILY = {1: "a", 2: "a", 3: "b", 4: "b"}


def _run_log(epochs: int = 2) -> list[dict]:
    """A two-worker run's unit log (one partition each): every config visits both
    partitions each epoch, and a worker's first unit of a family carries the one-off."""
    units: list[dict] = []
    clock = {0: 0.0, 1: 0.0}
    built: set[tuple[int, str, str]] = set()
    for e in range(1, epochs + 1):
        for w in (0, 1):  # worker w holds partition w
            for c in (1, 2, 3, 4) if w == 0 else (3, 4, 1, 2):
                for kind, d, extra in (("train", STEADY[c], ONE_OFF),
                                       ("eval_train", EVAL, EVAL_ONE_OFF)):
                    group = "train" if kind == "train" else "eval"
                    if (w, FAMILY[c], group) not in built:
                        built.add((w, FAMILY[c], group))
                        d += extra[FAMILY[c]]
                    units.append({"config": c, "epoch": e, "partition": w, "worker": w,
                                  "kind": kind, "start": clock[w], "end": clock[w] + d,
                                  "load": 0.0})
                    clock[w] += d
    return units


def test_families_share_a_build_per_worker() -> None:
    configs = [{"arch": "mlp", "l2": 0.0}, {"arch": "mlp", "l2": 0.0},
               {"arch": "mlp", "l2": 0.01}, {"arch": "cnn", "l2": 0.0}]
    fam = schedule_replay.families(configs)
    assert fam[1] == fam[2] and len({fam[1], fam[3], fam[4]}) == 3
    assert schedule_replay.families(None) == {}


@pytest.mark.parametrize("with_evals", [False, True])
def test_each_policy_pays_the_builds_its_own_placement_causes(with_evals: bool) -> None:
    units = _run_log()
    r = schedule_replay.replay(units, 2, 3, with_evals, family=FAMILY)
    # every config trains on both partitions, one worker each: both workers build both
    # families (for training, and for evaluation when evaluations are replayed)
    steady = sum(STEADY.values()) * 2 * 2  # 2 partitions, 2 epochs
    one_offs = 2 * sum(ONE_OFF.values())
    if with_evals:
        steady += EVAL * len(STEADY) * 2 * 2
        one_offs += 2 * sum(EVAL_ONE_OFF.values())
    assert r["ring_work"] == pytest.approx(steady + one_offs)
    assert r["mop_work_max"] == pytest.approx(steady + one_offs)
    assert r["mop_over_ring_mean"] <= 1.0 + 1e-9


def test_without_families_a_run_time_one_off_stays_with_its_config() -> None:
    # each config its own family: a config's first unit on a worker is its build, and the
    # replay keeps the units' total (nothing is extracted as a shared one-off that would
    # then be charged once per family)
    units = _run_log(epochs=1)
    r = schedule_replay.replay(units, 2, 2, False)
    total = sum(u["end"] - u["start"] for u in units if u["kind"] == "train")
    assert r["ring_work"] == pytest.approx(total)


def test_the_ring_pays_its_builds_in_its_first_hop() -> None:
    # the ring deals configs 1, 3 to group 0 and 2, 4 to group 1; in hop h worker w trains
    # group (w + h) mod 2 on partition w, with a barrier per hop. Each worker builds both
    # families in its first hop, so the hops take max(0.1 + 0.3, 0.12 + 0.32) + 0.9 + 0.5,
    # then 0.44 three times. Charged where they fell in the run (configs 1 and 3 on each
    # partition) they would land in two different hops of the ring: 1.8 + 1.8 + 2 x 0.44.
    r = schedule_replay.replay(_run_log(), 2, 1, False, family=FAMILY)
    hop = max(STEADY[1] + STEADY[3], STEADY[2] + STEADY[4])
    assert r["ring"] == pytest.approx(hop + ONE_OFF["a"] + ONE_OFF["b"] + 3 * hop)
