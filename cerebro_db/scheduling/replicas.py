"""Replicated partitions: which worker holds which partitions (pure).

With a replication factor ``r`` worker ``w`` (``w < p``) holds partitions
``{w, w+1, ..., w+r-1} mod p``, so every partition is held by ``r`` workers and a lost
worker's partitions are still served by the others. A worker that joins beyond the first
``p`` (elasticity) holds every partition: on a single PostgreSQL server any worker session can
read any partition, and "holding" only says what the worker may train (and caches).
"""
from __future__ import annotations

from collections.abc import Mapping

from .base import SchedulingError

__all__ = ["cover", "initial_workers", "replica_partitions", "uncovered"]


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
