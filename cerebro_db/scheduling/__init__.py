"""Scheduling policies for model hopper parallelism (MOP), pure and database-free.

- :mod:`.base`: :class:`Snapshot` (what a policy sees), :class:`Assignment` (what it
  returns), the :class:`Policy` contract;
- :mod:`.randomized`: Cerebro's randomized asynchronous MOP, the default (``'mop'``);
- :mod:`.ring`: Apache MADlib's ring of hops with a barrier per hop (``'ring'``);
- :mod:`.registry`: :func:`get_policy` from the names SQL uses;
- :mod:`.replicas`: which worker holds which partitions (replication factor, cover);
- :mod:`.progress`: the bookkeeping shared by the coordinator and the simulator;
- :mod:`.simulate` and :mod:`.invariants`: a fake executor, the invariant checks and the
  makespan lower bound.
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
)
from .progress import Progress
from .randomized import RandomizedMOP
from .registry import DEFAULT_POLICY, POLICIES, get_policy, policy_class, policy_names
from .replicas import cover, initial_workers, replica_partitions, uncovered
from .ring import RingPolicy
from .simulate import SimulationResult, WorkerChange, random_failures, simulate

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
    "SimulationResult",
    "Snapshot",
    "UnitRecord",
    "WorkerChange",
    "check_invariants",
    "cover",
    "evaluation_epochs",
    "find_violations",
    "get_policy",
    "initial_workers",
    "lower_bound",
    "policy_class",
    "policy_names",
    "random_failures",
    "replica_partitions",
    "simulate",
    "uncovered",
]
