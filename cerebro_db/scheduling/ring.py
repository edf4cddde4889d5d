"""MADlib-style ring of hops with a barrier after each hop (``'ring'``, for comparison).

Implementation note. This reproduces the schedule of Apache MADlib's
``madlib_keras_fit_multiple_model`` (Model Hopper, MADlib 1.17+): configs are dealt round
robin, in ascending mst_key order, to ``n`` groups; in hop ``h`` (``0 .. n-1``) of an
iteration, the worker holding partition ``w`` trains, one after the other, every config of
group ``(w + h) mod n``; no unit of hop ``h + 1`` starts until every unit of hop ``h`` is done,
and an iteration (epoch) is ``n`` hops. Two layouts:

- ``layout='groups'`` (default): ``n = p`` groups, so a worker trains ``|S| / p`` configs per
  hop and an iteration has ``p`` hops;
- ``layout='slots'``: ``n = max(|S|, p)`` groups of at most one config, MADlib 1.18's layout
  (models rest on extra distribution keys while not training), so an iteration has ``n``
  hops, each training at most one config per partition.

What differs from MADlib: MADlib shuffles the configs with ``random.seed(1)`` before dealing
(Python 2's generator, not reproducible here); we deal in key order. The barrier is enforced by
the policy (a config waits while any unfinished config is at an earlier hop) rather than by one
SQL statement per hop, so evaluation units may fill the idle time at the barrier. With several
workers holding a partition, any of them may train that partition's unit of the hop. MADlib
drops the optimizer state at each hop; ``reset_optimizer_per_hop=True`` reports that in every
assignment for the executor to act on (the policy itself only carries the flag).
"""
from __future__ import annotations

from typing import Any

from ..errors import invalid
from .base import TRAIN, Assignment, Policy, Snapshot, _check_bool, assign_evals

__all__ = ["LAYOUTS", "RingPolicy"]

LAYOUTS: tuple[str, ...] = ("groups", "slots")


class RingPolicy(Policy):
    """MADlib's fixed rotation with a barrier per hop (registry name ``'ring'``)."""

    name = "ring"
    option_names = ("reset_optimizer_per_hop", "layout")

    def __init__(self, reset_optimizer_per_hop: bool = False, layout: str = "groups") -> None:
        self.reset_optimizer_per_hop = _check_bool(
            "reset_optimizer_per_hop", reset_optimizer_per_hop
        )
        if layout not in LAYOUTS:
            raise invalid(
                f"layout must be one of {', '.join(repr(x) for x in LAYOUTS)}, got {layout!r}"
            )
        self.layout = layout
        self._num_groups: int | None = None
        self._groups: dict[int, int] = {}

    def options(self) -> dict[str, Any]:
        """``{"reset_optimizer_per_hop": bool, "layout": str}``."""
        return {"reset_optimizer_per_hop": self.reset_optimizer_per_hop, "layout": self.layout}

    def groups(self) -> dict[int, int]:
        """config -> group, as dealt so far (in dealing order)."""
        return dict(self._groups)

    def _deal(self, snapshot: Snapshot) -> int:
        if self._num_groups is None:
            p = snapshot.num_partitions
            self._num_groups = p if self.layout == "groups" else max(len(snapshot.configs), p)
        for c in snapshot.configs:
            if c not in self._groups:
                self._groups[c] = len(self._groups) % self._num_groups
        return self._num_groups

    def _next_unit(self, snapshot: Snapshot, config: int, n: int) -> tuple[int, int]:
        """(global hop, partition) of the config's next training unit."""
        p = snapshot.num_partitions
        g = self._groups[config]
        seen = snapshot.visited.get(config, frozenset())
        base = snapshot.completed(config) * n
        for h in range(n):
            q = (g - h) % n
            if q < p and q not in seen:
                return base + h, q
        raise AssertionError("a config in progress has an unvisited partition")

    def assign(self, snapshot: Snapshot) -> list[Assignment]:
        """Units of the current hop for idle workers holding their partitions."""
        n = self._deal(snapshot)
        active = [c for c in self._groups if c in snapshot.target_epochs
                  and not snapshot.finished(c)]
        nxt = {c: self._next_unit(snapshot, c, n) for c in active}
        out: list[Assignment] = []
        leftover: list[int] = []
        if nxt:
            hop = min(h for h, _ in nxt.values())
            ready = [c for c in active if nxt[c][0] == hop and not snapshot.is_training(c)]
        else:
            ready = []
        for w in snapshot.idle_workers:
            held = snapshot.workers[w]
            pick = next((c for c in ready if nxt[c][1] in held), None)
            if pick is None:
                leftover.append(w)
                continue
            ready.remove(pick)
            out.append(Assignment(w, pick, snapshot.current_epoch(pick), nxt[pick][1], TRAIN,
                                  self.reset_optimizer_per_hop))
        out.extend(assign_evals(snapshot, leftover))
        return out
