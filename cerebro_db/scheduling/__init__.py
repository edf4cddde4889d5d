"""Scheduling policies for model hopper parallelism (MOP), pure and database-free.

- :mod:`.base`: :class:`Snapshot` (what a policy sees), :class:`Assignment` (what it
  returns), the :class:`Policy` contract;
- :mod:`.randomized`: Cerebro's randomized asynchronous MOP, the default (``'mop'``);
- :mod:`.ring`: Apache MADlib's ring of hops with a barrier per hop (``'ring'``);
- :mod:`.registry`: :func:`get_policy` from the names SQL uses;
- :mod:`.replicas`: which worker holds which partitions (replication factor, cover);
- :mod:`.progress`: the bookkeeping shared by the coordinator and the simulator;
- :mod:`.invariants`: the invariant checks and the makespan lower bound (the simulations
  that run a policy through the fit loop on a fake executor are in
  :mod:`cerebro_db.simulation`).
"""
from __future__ import annotations

from .base import (
    EVAL,
    TRAIN,
    Assignment,
    EvalUnit,
    Policy,
    RunningUnit,
    SchedulingError,
    Snapshot,
    evaluation_epochs,
)
from .invariants import (
    InvariantError,
    UnitRecord,
    check_invariants,
    find_violations,
    lower_bound,
    partition_bound,
)
from .progress import Progress
from .randomized import RandomizedMOP
from .registry import DEFAULT_POLICY, POLICIES, get_policy, policy_class, policy_names
from .replicas import (
    auto_replicas,
    cover,
    home_partitions,
    initial_workers,
    replica_partitions,
    uncovered,
)
from .ring import RingPolicy

__all__ = [
    "DEFAULT_POLICY",
    "EVAL",
    "POLICIES",
    "TRAIN",
    "Assignment",
    "EvalUnit",
    "InvariantError",
    "Policy",
    "Progress",
    "RandomizedMOP",
    "RingPolicy",
    "RunningUnit",
    "SchedulingError",
    "Snapshot",
    "UnitRecord",
    "auto_replicas",
    "check_invariants",
    "cover",
    "evaluation_epochs",
    "find_violations",
    "get_policy",
    "home_partitions",
    "initial_workers",
    "lower_bound",
    "partition_bound",
    "policy_class",
    "policy_names",
    "replica_partitions",
    "uncovered",
]
