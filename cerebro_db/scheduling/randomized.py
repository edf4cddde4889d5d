"""Randomized asynchronous model hopper parallelism (the default policy, ``'mop'``).

Implementation note. This is the randomized scheduler of Cerebro (Nakandala, Zhang and Kumar,
"Cerebro: A Data System for Optimized Deep Learning Model Selection", VLDB 2020, Algorithm 1):
whenever workers are idle, each of them, in random order, picks uniformly at random a config
that is not training anywhere and has not yet visited that worker's partition in the current
epoch. What differs from the paper:

- no epoch barrier: the paper schedules one epoch at a time; here a config starts its next
  epoch as soon as its own epoch is done (docs/architecture.md), so fast configs never wait for
  slow ones and the tail of one epoch overlaps the head of the next;
- replicas: a worker may hold several partitions (Cerebro's replica-aware variant); each held
  partition is one worker's home (:func:`~.replicas.home_partitions`). An idle worker takes a
  training unit on a home partition, else the oldest pending evaluation unit on one, and only
  then (work stealing) a training unit on another partition it holds, else that one's oldest
  evaluation: a worker reads a partition that is not its home only when it would otherwise
  idle, which evens out workers that run at different speeds (on a shared or virtual machine
  two worker sessions differ by 5-20% on the same units) at the price of caching it too. Not
  on a look-ahead snapshot (``Snapshot.ahead``): a busy worker is not idle yet, and the home
  worker may take the unit first. Among the candidates the config is drawn uniformly, then
  (several held partitions unvisited, without ``seeded_order``) one such partition. In the
  tail of the fit (at most ``tail_units`` units per worker left to start: training units
  not in flight and pending evaluations) a look-ahead snapshot gets nothing when some
  partition has several holders: a unit queued on a busy worker waits for its unit in
  flight while another holder may be idle sooner, and the last units are what evens the
  workers out (simulated in ``tests/unit/test_replicas.py``: a short fit with one-off build
  costs, one worker 10% slower, span / (work / 2) up to 1.048 -> at most 1.004; in cold fits
  of the suite's synthetic workloads, medians of 10, 1.038 -> 1.023 and 1.057 -> 1.028);
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
- ``config_costs`` (what ``madlib_keras_fit_multiple_model`` passes: a static estimate of
  each config's unit cost from its architecture and batch size, :mod:`.costs`) replaces the
  offset ``c`` by one planned by longest processing time first over the offsets
  (:func:`balanced_offsets`), so the estimated work starting on each partition (and, in
  lock-step, waiting on each at every hop) is even: with offsets by mst_key, dear configs
  that share an offset queue behind each other on one partition every hop while other
  workers run out of work at the end of each epoch and of the fit. The estimate is static,
  so the orders depend on the inputs and the seed only; unmeasured configs also rank by it
  under ``cost_aware``. Simulated over 400 random heterogeneous profiles
  (``tests/unit/test_scheduling.py``): makespan / lower bound mean 1.039 -> 1.016, max
  1.31 -> 1.15, profiles above 1.05 from 30% to 7%, never slower than the ring (also with
  the estimate off by a log-normal factor of sigma 0.3); the rest are chain-bound (one
  config's own units near the bound: it waits at each hop for the unit running on its next
  partition, which a fixed order cannot dodge);
- the random stream is Python's Mersenne Twister seeded by ``random_state``. It is not
  saved: a resumed fit starts a new stream from the same seed, and its choices follow the
  resumed run's timing; under ``seeded_order`` the configs' visit orders, hence the models,
  are those of an uninterrupted run.
"""
from __future__ import annotations

import operator
import random
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import invalid
from .base import TRAIN, Assignment, EvalUnit, Policy, Snapshot, _check_bool, assign_evals
from .replicas import home_partitions

__all__ = ["FIRST_UNIT_SHARE", "TAIL_UNITS", "RandomizedMOP", "balanced_offsets"]

FIRST_UNIT_SHARE = 0.5
"""The one-off cost of a config's first unit (model build, tracing), as a share of the mean
unit cost, that :func:`balanced_offsets` spreads over the partitions."""


TAIL_UNITS = 3
"""Per worker: with replicas, once no more than this many units per worker are left to start
(training units not in flight and pending evaluations), busy workers get no unit queued
ahead (:func:`_in_tail`)."""


class RandomizedMOP(Policy):
    """Cerebro's randomized MOP scheduler without barriers (registry names ``'mop'``,
    ``'random'``).

    ``random_state``: seed (a non-negative integer); ``None`` draws one from the system, and
    :meth:`options` then reports the drawn seed so the run can be replayed.
    ``prefer_lagging``: choose only among the eligible configs with the most training units
    left (ties at random) instead of among all eligible configs.
    ``config_costs``: mst_key -> estimated relative unit cost (positive; keys may be text, as
    stored in JSON), which plans the rotations' offsets under ``rotated_order``.
    ``tail_units``: per worker, the units left to start below which nothing is queued ahead
    when partitions have several holders (:data:`TAIL_UNITS`; 0 turns it off).
    ``priced_reads``: a worker takes a unit on a held partition it has not read yet only
    when that ends the partition's work sooner (:meth:`_steal_limits`; default on, False:
    every such unit, as before).
    """

    name = "mop"
    lookahead = True
    steals = True
    option_names = ("random_state", "prefer_lagging", "seeded_order", "cost_aware",
                    "rotated_order", "config_costs", "tail_units", "priced_reads")

    def __init__(self, random_state: int | None = None, prefer_lagging: bool = False,
                 seeded_order: bool = False, cost_aware: bool = False,
                 rotated_order: bool = False,
                 config_costs: Mapping[Any, Any] | None = None,
                 tail_units: int = TAIL_UNITS, priced_reads: bool = True) -> None:
        self.prefer_lagging = _check_bool("prefer_lagging", prefer_lagging)
        self.seeded_order = _check_bool("seeded_order", seeded_order)
        self.cost_aware = _check_bool("cost_aware", cost_aware)
        self.rotated_order = _check_bool("rotated_order", rotated_order)
        self.config_costs = _check_costs(config_costs)
        if isinstance(tail_units, bool) or not isinstance(tail_units, int) or tail_units < 0:
            raise invalid(f"tail_units must be a non-negative integer, got {tail_units!r}")
        self.tail_units = tail_units
        self.priced_reads = _check_bool("priced_reads", priced_reads)
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
        self._offsets: dict[int, dict[int, int]] = {}  # num_partitions -> config -> offset

    def options(self) -> dict[str, Any]:
        """``{"random_state": seed, "prefer_lagging": bool, "seeded_order": bool,
        "cost_aware": bool, "rotated_order": bool}``, and ``"config_costs": {"mst_key":
        cost}`` when given (JSON keys are text; the constructor takes them back)."""
        out: dict[str, Any] = {
            "random_state": self.random_state, "prefer_lagging": self.prefer_lagging,
            "seeded_order": self.seeded_order, "cost_aware": self.cost_aware,
            "rotated_order": self.rotated_order}
        if self.tail_units != TAIL_UNITS:
            out["tail_units"] = self.tail_units
        if not self.priced_reads:
            out["priced_reads"] = False
        if self.config_costs is not None:
            out["config_costs"] = {str(c): v for c, v in sorted(self.config_costs.items())}
        return out

    def visit_order(self, config: int, epoch: int, num_partitions: int) -> list[int]:
        """The partitions ``config`` visits in ``epoch``, in order, under ``seeded_order``."""
        if self.rotated_order:
            rng = random.Random(f"{self.random_state}:rotation:{epoch}")
            perm = rng.sample(range(num_partitions), num_partitions)
            shift = rng.randrange(num_partitions)
            start = config
            if self.config_costs is not None and config in self.config_costs:
                if num_partitions not in self._offsets:
                    self._offsets[num_partitions] = balanced_offsets(
                        self.config_costs, num_partitions, self.random_state)
                start = self._offsets[num_partitions][config]
            return [perm[(start + shift + i) % num_partitions] for i in range(num_partitions)]
        return random.Random(f"{self.random_state}:{config}:{epoch}").sample(
            range(num_partitions), num_partitions)

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        """Random eligible config for each idle worker, in random worker order: on its home
        partitions first, then their oldest pending evaluation, and only then (replicas, not
        on a look-ahead snapshot) on another partition it holds, then that one's evaluation
        (:func:`~.replicas.home_partitions`)."""
        if snapshot.ahead and _in_tail(snapshot, self.tail_units):
            return []
        idle = list(snapshot.idle_workers)
        self._rng.shuffle(idle)
        taken = {c for c in snapshot.configs if snapshot.is_training(c)}
        home = home_partitions(snapshot.workers, snapshot.num_partitions)
        cost = _unit_cost(snapshot, self.config_costs)
        out: list[Assignment] = []
        leftover = self._train(snapshot, idle, home, taken, cost, out)
        done: set[EvalUnit] = set()
        evals = assign_evals(snapshot, sorted(leftover), partitions=home, taken=done)
        out.extend(evals)
        if snapshot.ahead:
            return out
        busy = {a.worker for a in evals}
        idle = [w for w in leftover if w not in busy]
        away = {w: snapshot.workers[w] - home[w] for w in snapshot.workers}
        # priced only where some idle worker could read a partition it has not read yet
        limit = self._steal_limits(snapshot, home, done, cost, out) if any(
            away[w] - snapshot.warm.get(w, frozenset()) for w in idle) else {}
        leftover = self._train(snapshot, idle, away, taken, cost, out, limit)
        for w in leftover:  # a cold partition's oldest evaluation only within its limit
            cold = away[w] - snapshot.warm.get(w, frozenset())
            for q in cold & limit.keys():
                oldest = next((u for u in snapshot.pending_evals
                               if u.partition == q and u not in done), None)
                if oldest is None or _eval_cost(snapshot, cost, oldest.config) >= limit[q]:
                    away[w] = away[w] - {q}
        out.extend(assign_evals(snapshot, sorted(leftover), partitions=away, taken=done))
        return out

    def _steal_limits(self, snapshot: Snapshot, home: Mapping[int, frozenset[int]],
                      done: set[EvalUnit], cost: Callable[[int], float],
                      out: list[Assignment]) -> dict[int, float]:
        """partition -> the longest unit a worker that has not read it yet may take there:
        its home worker would finish the partition's work at ``F + W`` (``F``: until that
        worker is free, from its units in flight (one overdue by ``d`` counts ``d`` more),
        queued and just assigned; ``W``: the
        training units left on the partition in this and later epochs and its pending
        evaluation units), and a unit of ``t`` seconds taken elsewhere ends at ``L + t``
        (``L``: :attr:`Snapshot.cold_read_seconds`), so the steal shortens the partition's
        work only when ``t < F + W - L``. Early in a fit ``W`` is large and steals go on as
        before (a read pays for all later steals there); in its tail a worker no longer
        reads a partition to take a unit its home worker would finish sooner. Empty while
        no cold read is measured (every steal allowed)."""
        read = snapshot.cold_read_seconds
        if read is None or not self.priced_reads:
            return {}
        now = snapshot.now
        free: dict[int, float] = {}
        for u in snapshot.running:  # a worker's unit in flight first, then its queued one
            t = cost(u.config) if u.kind == TRAIN else _eval_cost(snapshot, cost, u.config)
            if u.worker not in free and u.worker in snapshot.started:
                # what is left of it; a unit overdue by d is taken to need d more (a
                # stalled worker's partition is read elsewhere once it lags by a read)
                t = abs(t - (now - snapshot.started[u.worker]))
            free[u.worker] = free.get(u.worker, 0.0) + t
        for a in out:
            t = cost(a.config) if a.kind == TRAIN else _eval_cost(snapshot, cost, a.config)
            free[a.worker] = free.get(a.worker, 0.0) + t
        wait: dict[int, float] = {}
        flying = {(u.config, u.partition) for u in snapshot.running if u.kind == TRAIN}
        flying |= {(a.config, a.partition) for a in out if a.kind == TRAIN}
        for c in snapshot.configs:
            epochs = snapshot.target_epochs[c] - snapshot.completed(c)
            if epochs <= 0:
                continue
            unvisited = snapshot.unvisited(c)
            for q in range(snapshot.num_partitions):
                left = epochs - (q not in unvisited or (c, q) in flying)
                wait[q] = wait.get(q, 0.0) + left * cost(c)
        for e in snapshot.pending_evals:
            if e not in done:
                wait[e.partition] = wait.get(e.partition, 0.0) + _eval_cost(snapshot, cost,
                                                                            e.config)
        return {q: free.get(h, 0.0) + wait.get(q, 0.0) - read
                for h, parts in home.items() for q in parts}

    def _train(self, snapshot: Snapshot, workers: list[int],
               allowed: Mapping[int, frozenset[int]], taken: set[int],
               cost: Callable[[int], float], out: list[Assignment],
               limit: Mapping[int, float] | None = None) -> list[int]:
        """Training assignments (appended to ``out``) for ``workers`` in order, each on a
        partition in ``allowed[worker]`` (one the worker has not read only for a config
        cheaper than ``limit`` there: :meth:`_steal_limits`); returns the workers left
        without one."""
        leftover: list[int] = []
        lim = limit or {}
        for w in workers:
            held = allowed[w]
            cold = held - snapshot.warm.get(w, frozenset()) if lim else frozenset()
            candidates = []
            for c in snapshot.configs if held else ():
                if c in taken or snapshot.finished(c):
                    continue
                parts = held & snapshot.unvisited(c)
                if parts and self.seeded_order:
                    seen = len(snapshot.visited.get(c, ()))
                    nxt = self.visit_order(c, snapshot.current_epoch(c),
                                           snapshot.num_partitions)[seen]
                    parts = parts & {nxt}
                if parts & cold:
                    parts = frozenset(q for q in parts
                                      if q not in cold or q not in lim or cost(c) < lim[q])
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
        return leftover


def balanced_offsets(costs: Mapping[int, float], num_partitions: int, seed: int
                     ) -> dict[int, int]:
    """config -> the offset of its rotation, by longest processing time first over the
    offsets: configs in decreasing cost, each to the offset with the least load so far, so
    that the work of the configs starting on each partition (in lock-step, the work waiting
    on each partition at every hop) is as even as the costs allow. A config's load is its
    cost plus :data:`FIRST_UNIT_SHARE` of the mean cost: its first unit also builds the model
    and traces the training step, a one-off cost on its first partition that does not grow
    with the unit cost (balancing the costs alone piles these on the offsets of many cheap
    configs). Ties among equal costs drawn from ``seed``; among equally loaded offsets, the
    lowest. Depends on the costs, the number of partitions and the seed only."""
    rng = random.Random(f"{seed}:offsets:{num_partitions}")
    tie = {c: rng.random() for c in sorted(costs)}
    one_off = FIRST_UNIT_SHARE * sum(costs.values()) / len(costs) if costs else 0.0
    load = [0.0] * num_partitions
    out: dict[int, int] = {}
    for c in sorted(costs, key=lambda c: (-costs[c], tie[c], c)):
        q = min(range(num_partitions), key=lambda q: (load[q], q))
        out[c] = q
        load[q] += costs[c] + one_off
    return out


def _check_costs(costs: Mapping[Any, Any] | None) -> dict[int, float] | None:
    if costs is None:
        return None
    if not isinstance(costs, Mapping):
        raise invalid(f"config_costs must be a mapping of mst_key to cost, got {costs!r}")
    out: dict[int, float] = {}
    for k, v in costs.items():
        try:
            key = int(k)
        except (TypeError, ValueError):
            raise invalid(f"config_costs keys must be mst_keys, got {k!r}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                or v == float("inf"):
            raise invalid(f"config_costs must be positive numbers, got {v!r} for {k!r}")
        out[key] = float(v)
    return out


def _in_tail(snapshot: Snapshot, per_worker: int) -> bool:
    """Whether the fit is in its tail and some partition has several holders: a unit queued
    ahead on a busy worker then waits for that worker's unit in flight although another
    holder of its partition may be idle sooner (the last units are what evens the workers
    out), so units go to whichever worker is idle first (a dispatch round trip each)."""
    held = [q for parts in snapshot.workers.values() for q in parts]
    if len(held) == len(set(held)):  # every partition has one holder
        return False
    left = len(snapshot.pending_evals) + sum(
        _units_left(snapshot, c) - (1 if snapshot.is_training(c) else 0)
        for c in snapshot.configs)
    return left <= per_worker * len(snapshot.workers)


EVAL_SHARE = 1.0 / 3.0
"""An evaluation unit's cost as a share of its config's training unit cost while no
evaluation unit is measured (a forward pass without the backward one)."""


def _eval_cost(snapshot: Snapshot, cost: Callable[[int], float], config: int) -> float:
    """config -> estimated seconds of its evaluation unit: measured; else the mean of the
    measured configs'; else :data:`EVAL_SHARE` of its training unit's."""
    known = snapshot.eval_seconds
    if config in known:
        return known[config]
    if known:
        return sum(known.values()) / len(known)
    return EVAL_SHARE * cost(config)


def _units_left(snapshot: Snapshot, config: int) -> int:
    left = snapshot.target_epochs[config] - snapshot.completed(config)
    return left * snapshot.num_partitions - len(snapshot.visited.get(config, ()))


def _unit_cost(snapshot: Snapshot, static: Mapping[int, float] | None = None
               ) -> Callable[[int], float]:
    """config -> estimated seconds per training unit: measured; else its static cost
    (``config_costs``) scaled to seconds by the measured configs' ratio of measured to static
    cost; else the mean of the measured configs (1.0 when none is measured yet)."""
    known = snapshot.unit_seconds
    default = sum(known.values()) / len(known) if known else 1.0
    if static:
        both = [c for c in known if c in static]
        scale = (sum(known[c] for c in both) / sum(static[c] for c in both)) if both else 1.0
        return lambda c: known[c] if c in known else (
            static[c] * scale if c in static else default)
    return lambda c: known.get(c, default)
