"""Replica hand-off between stable and canary under a GPU budget.

GPU clusters cannot hold two full copies of a service during a rollout. The budget is
`desired + maxSurge` requested replicas across both revisions, at every moment:

- During a step the canary gets ceil(weight% x desired) replicas (at least one) and stable keeps as
  many as still fit in the budget, so with maxSurge >= the canary's size stable stays whole and an
  abort has its full capacity at hand; a smaller surge trades abort headroom for GPUs.
- Stable gives up a replica only once a ready canary replica has replaced it, so serving capacity
  does not drop while models load. Only when the budget leaves no slot at all (maxSurge 0) does
  stable give up one replica first.
- Promotion moves replicas across one slot at a time the same way, until the canary has them all.

Requested replicas are what is bounded; a pod being replaced still holds its GPU while it drains, and
the scheduler keeps its successor Pending until the GPU is free, so the physical GPU count stays bounded too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Replicas:
    stable: int
    canary: int


def canary_replicas_for(weight: int, desired: int) -> int:
    return 0 if weight <= 0 else max(1, math.ceil(weight * desired / 100))


def step_target(weight: int, desired: int, surge: int) -> Replicas:
    canary = canary_replicas_for(weight, desired)
    return Replicas(stable=max(0, min(desired, desired + surge - canary)), canary=canary)


def hand_off(desired: int, surge: int, target: Replicas, current: Replicas, canary_ready: int) -> Replicas:
    """One move from `current` towards `target` that keeps stable + canary <= desired + surge."""
    budget = desired + surge
    if target.stable >= current.stable:
        # Growing stable back (rollback) fits beside whatever canary replicas are staying.
        stable = min(target.stable, budget - min(current.canary, target.canary))
    else:
        stable = max(target.stable, min(current.stable, desired - canary_ready))
        no_free_slot = stable + current.canary >= budget
        if no_free_slot and current.canary < target.canary and canary_ready >= current.canary:
            stable = max(target.stable, budget - current.canary - 1)
    canary = min(target.canary, budget - stable) if target.canary > current.canary else target.canary
    return Replicas(stable=stable, canary=max(0, canary))
