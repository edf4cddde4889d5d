"""Replicated partitions: which worker holds which partitions (pure).

With a replication factor ``r`` worker ``w`` (``w < p``) holds partitions
``{w, w+1, ..., w+r-1} mod p``, so every partition is held by ``r`` workers and a lost
worker's partitions are still served by the others. A worker that joins beyond the first
``p`` (elasticity) holds every partition: on a single PostgreSQL server any worker session can
read any partition, and "holding" only says what the worker may train (and caches).

Each held partition is the *home* of one of the first ``p`` workers (:func:`home_partitions`):
worker ``q`` for partition ``q`` while it holds it, else one of its holders; a worker that
joined later is at home on all it holds. A policy that knows homes
(``'mop'``) gives a worker its home partitions' units first and lets it take another held
partition's unit only when it would otherwise idle, so with replicas a worker reads (and
caches) a partition that is not its home only to help a slower one.
:func:`auto_replicas` is the default of ``cerebro_db.replicas``: every worker holds every
partition when the fit's data fits one worker's cache budget.
"""
from __future__ import annotations

from collections.abc import Mapping

from .base import SchedulingError

__all__ = ["auto_replicas", "cover", "home_partitions", "initial_workers", "replica_partitions",
           "uncovered"]


def replica_partitions(worker: int, num_partitions: int, replicas: int) -> frozenset[int]:
    """The partitions ``worker`` holds under replication factor ``replicas``."""
    if num_partitions < 1:
        raise SchedulingError(f"num_partitions must be at least 1, got {num_partitions}")
    if replicas < 1:
        raise SchedulingError(f"replicas must be at least 1, got {replicas}")
    if worker < 0:
        raise SchedulingError(f"worker must be non-negative, got {worker}")
    if worker >= num_partitions:
        return frozenset(range(num_partitions))
    r = min(replicas, num_partitions)
    return frozenset((worker + i) % num_partitions for i in range(r))


def initial_workers(num_workers: int, num_partitions: int, replicas: int
                    ) -> dict[int, frozenset[int]]:
    """Workers ``0 .. num_workers-1`` with their partitions; fewer workers than partitions
    hold the partitions round-robin (each at least its replica set) so all are covered."""
    if num_workers < 1:
        raise SchedulingError(f"num_workers must be at least 1, got {num_workers}")
    workers = {w: replica_partitions(w, num_partitions, replicas) for w in range(num_workers)}
    return cover(workers, num_partitions)


def uncovered(workers: Mapping[int, frozenset[int]], num_partitions: int) -> list[int]:
    """Partitions no worker holds, ascending."""
    held: set[int] = set()
    for parts in workers.values():
        held |= parts
    return [q for q in range(num_partitions) if q not in held]


def cover(workers: Mapping[int, frozenset[int]], num_partitions: int
          ) -> dict[int, frozenset[int]]:
    """``workers`` with every partition nobody holds given to the worker holding fewest
    (ties: lowest id); unchanged when every partition is held or no worker is left."""
    out = {w: frozenset(p) for w, p in workers.items()}
    if not out:
        return out
    for q in uncovered(out, num_partitions):
        w = min(out, key=lambda k: (len(out[k]), k))
        out[w] = out[w] | {q}
    return out


def home_partitions(workers: Mapping[int, frozenset[int]], num_partitions: int
                    ) -> dict[int, frozenset[int]]:
    """worker -> its home partitions. A worker beyond the first ``num_partitions`` (one that
    joined a running fit) is at home on every partition it holds. Each partition held by
    one of the first ``num_partitions`` workers is the home of one of them: worker ``q`` for
    partition ``q`` when it holds it, else the holder at index ``q mod holders`` in
    ascending order. Without replicas every held partition is its holder's home."""
    holders: dict[int, list[int]] = {}
    for w in sorted(workers):
        if w < num_partitions:
            for q in workers[w]:
                holders.setdefault(q, []).append(w)
    home = {w: set(workers[w]) if w >= num_partitions else set() for w in workers}
    for q, ws in holders.items():
        home[q if q in ws else ws[q % len(ws)]].add(q)
    return {w: frozenset(v) for w, v in home.items()}


def auto_replicas(num_partitions: int, data_bytes: int | None, budget: int) -> int:
    """The replication factor a fit gets by default: ``num_partitions`` (every worker holds
    every partition) when the decoded data of all partitions, training and validation
    (``data_bytes``), fits one worker's cache budget, else 1; 1 when the size is unknown."""
    if num_partitions < 1:
        raise SchedulingError(f"num_partitions must be at least 1, got {num_partitions}")
    if data_bytes is None or data_bytes > budget:
        return 1
    return num_partitions
