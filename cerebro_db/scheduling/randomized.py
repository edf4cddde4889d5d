"""Randomized asynchronous model hopper parallelism (the default policy, ``'mop'``).

Implementation note. This is the randomized scheduler of Cerebro (Nakandala, Zhang and Kumar,
"Cerebro: A Data System for Optimized Deep Learning Model Selection", VLDB 2020, Algorithm 1):
whenever workers are idle, each of them, in random order, picks uniformly at random a config
that is not training anywhere and has not yet visited that worker's partition in the current
epoch. What differs from the paper:

- no epoch barrier: the paper schedules one epoch at a time; here a config starts its next
  epoch as soon as its own epoch is done (docs/architecture.md), so fast configs never wait for
  slow ones and the tail of one epoch overlaps the head of the next;
- replicas: a worker may hold several partitions (Cerebro's replica-aware variant); it first
  picks a config among those with an unvisited partition it holds, then one such partition,
  both uniformly;
- evaluation units: a worker with no eligible training unit takes the oldest pending
  evaluation unit on a partition it holds (evaluations read a frozen state and never block
  training);
- ``prefer_lagging=True`` (off by default, so the default is the paper's uniform choice)
  draws only among the eligible configs with the most training units left, an LPT-like
  tie-break that keeps configs in step and removes most of the tail where few configs remain
  and workers idle (see the measured ratios in ``tests/unit/test_scheduling.py``);
- ``cost_aware=True`` (what fits use) breaks ties among the most lagging configs by their
  measured training unit time (``Snapshot.unit_seconds``: the mean over the latest epoch
  measured, without the config's one-off first unit; a config not measured yet counts as
  the mean of the measured ones): the most expensive first, as in longest
  processing time first list scheduling, so the long units do not end up in the tail. It
  decides only which config a worker takes next, never a config's visit order under
  ``seeded_order``, so models stay reproducible. (Ranking by remaining work, units left x unit
  time, without ``prefer_lagging``'s lock-step was measured too and gave longer tails: see
  ``tests/unit/test_scheduling.py``);
- ``seeded_order=True`` fixes each config's visit order per epoch as a permutation drawn from
  (random_state, config, epoch) alone, so a config trains on the same sequence of partitions
  whatever the timing of the workers: two runs with the same seed give the same models.
  Which config a worker takes among those whose next partition it holds stays random;
- ``rotated_order=True`` (with ``seeded_order``; what fits with a ``random_state`` use) draws
  one permutation of the partitions per epoch from the seed and has config ``c`` visit it as a
  rotation starting at offset ``c + shift``: consecutive configs start on different
  partitions, so at every moment about as many configs wait for each worker (independent
  random orders pile several configs onto one partition and leave other workers idle);
- the random stream is Python's Mersenne Twister seeded by ``random_state``. It is not
  saved: a resumed fit starts a new stream from the same seed, and its choices follow the
  resumed run's timing; under ``seeded_order`` the configs' visit orders, hence the models,
  are those of an uninterrupted run.
"""
from __future__ import annotations

import operator
import random
from collections.abc import Callable
from typing import Any

from ..errors import invalid
from .base import TRAIN, Assignment, Policy, Snapshot, _check_bool, assign_evals

__all__ = ["RandomizedMOP"]


class RandomizedMOP(Policy):
    """Cerebro's randomized MOP scheduler without barriers (registry names ``'mop'``,
    ``'random'``).

    ``random_state``: seed (a non-negative integer); ``None`` draws one from the system, and
    :meth:`options` then reports the drawn seed so the run can be replayed.
    ``prefer_lagging``: choose only among the eligible configs with the most training units
    left (ties at random) instead of among all eligible configs.
    """

    name = "mop"
    option_names = ("random_state", "prefer_lagging", "seeded_order", "cost_aware",
                    "rotated_order")

    def __init__(self, random_state: int | None = None, prefer_lagging: bool = False,
                 seeded_order: bool = False, cost_aware: bool = False,
                 rotated_order: bool = False) -> None:
        self.prefer_lagging = _check_bool("prefer_lagging", prefer_lagging)
        self.seeded_order = _check_bool("seeded_order", seeded_order)
        self.cost_aware = _check_bool("cost_aware", cost_aware)
        self.rotated_order = _check_bool("rotated_order", rotated_order)
        if random_state is None:
            random_state = random.SystemRandom().randrange(2**32)
        if isinstance(random_state, bool):
            raise invalid(f"random_state must be a non-negative integer, got {random_state!r}")
        try:
            seed = operator.index(random_state)
        except TypeError:
            raise invalid(
                f"random_state must be a non-negative integer, got {random_state!r}"
            ) from None
        if seed < 0:
            raise invalid(f"random_state must be a non-negative integer, got {seed}")
        self.random_state = seed
        self._rng = random.Random(seed)

    def options(self) -> dict[str, Any]:
        """``{"random_state": seed, "prefer_lagging": bool, "seeded_order": bool,
        "cost_aware": bool, "rotated_order": bool}``."""
        return {"random_state": self.random_state, "prefer_lagging": self.prefer_lagging,
                "seeded_order": self.seeded_order, "cost_aware": self.cost_aware,
                "rotated_order": self.rotated_order}

    def visit_order(self, config: int, epoch: int, num_partitions: int) -> list[int]:
        """The partitions ``config`` visits in ``epoch``, in order, under ``seeded_order``."""
        if self.rotated_order:
            rng = random.Random(f"{self.random_state}:rotation:{epoch}")
            perm = rng.sample(range(num_partitions), num_partitions)
            shift = rng.randrange(num_partitions)
            return [perm[(config + shift + i) % num_partitions] for i in range(num_partitions)]
        return random.Random(f"{self.random_state}:{config}:{epoch}").sample(
            range(num_partitions), num_partitions)

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        """Random eligible config for each idle worker, in random worker order."""
        idle = list(snapshot.idle_workers)
        self._rng.shuffle(idle)
        taken = {c for c in snapshot.configs if snapshot.is_training(c)}
        out: list[Assignment] = []
        leftover: list[int] = []
        cost = _unit_cost(snapshot)
        for w in idle:
            held = snapshot.workers[w]
            candidates = []
            for c in snapshot.configs:
                if c in taken or snapshot.finished(c):
                    continue
                parts = held & snapshot.unvisited(c)
                if parts and self.seeded_order:
                    seen = len(snapshot.visited.get(c, ()))
                    nxt = self.visit_order(c, snapshot.current_epoch(c),
                                           snapshot.num_partitions)[seen]
                    parts = parts & {nxt}
                if parts:
                    candidates.append((c, parts))
            if not candidates:
                leftover.append(w)
                continue
            if self.prefer_lagging:
                most = max(_units_left(snapshot, c) for c, _ in candidates)
                candidates = [x for x in candidates if _units_left(snapshot, x[0]) == most]
            if self.cost_aware and len(candidates) > 1:
                dearest = max(cost(c) for c, _ in candidates)
                candidates = [x for x in candidates if cost(x[0]) >= dearest * (1 - 1e-9)]
            c, parts = candidates[self._rng.randrange(len(candidates))]
            ordered = sorted(parts)
            q = ordered[0] if len(ordered) == 1 else ordered[self._rng.randrange(len(ordered))]
            taken.add(c)
            out.append(Assignment(w, c, snapshot.current_epoch(c), q, TRAIN))
        out.extend(assign_evals(snapshot, sorted(leftover)))
        return out


def _units_left(snapshot: Snapshot, config: int) -> int:
    left = snapshot.target_epochs[config] - snapshot.completed(config)
    return left * snapshot.num_partitions - len(snapshot.visited.get(config, ()))


def _unit_cost(snapshot: Snapshot) -> Callable[[int], float]:
    """config -> estimated seconds per training unit: measured, else the mean of the measured
    configs (1.0 when none is measured yet)."""
    known = snapshot.unit_seconds
    default = sum(known.values()) / len(known) if known else 1.0
    return lambda c: known.get(c, default)
