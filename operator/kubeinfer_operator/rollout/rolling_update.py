"""RollingUpdate within a GPU budget: the replica count of each revision's Deployment, reconcile by reconcile.

The same rules as the Kubernetes Deployment controller's RollingUpdate, applied across the one Deployment per
revision that the operator owns (a Deployment per revision, because a rollout of an LLM is judged per revision
and its pods are told apart by revision in PromQL):

- the replicas requested across all revisions never exceed `desired + maxSurge` (what the GPUs allow), so the
  new revision grows only into the room that old replicas have already given up;
- ready replicas never drop below `desired - maxUnavailable`: an old replica goes only once a Ready replica
  (model loaded and warmed) stands in for it, or, with maxSurge 0, one at a time within maxUnavailable;
- old replicas that are not Ready go first (they serve nothing), as far as the budget needs.

A new pod that never becomes Ready therefore stops the rollout where it is: the old revision keeps all but
maxUnavailable of its replicas. Level-triggered: the counts depend only on what is observed now, so a lost or
repeated reconcile changes nothing. The requested replicas are what is bounded; a replica being removed keeps
its GPU until its pod is gone, and the scheduler holds its successor Pending until then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RevisionReplicas:
    """One revision's Deployment as observed: replicas it asks for, and how many of its pods are Ready."""

    revision: str
    spec: int
    ready: int

    @property
    def serving(self) -> int:
        # Pods of a Deployment just scaled down may still show Ready until they are deleted.
        return min(self.ready, self.spec)


def unavailable_allowed(max_surge: int, max_unavailable: int | None) -> int:
    """maxUnavailable unset: none with a surge to replace into, else one replica at a time."""
    if max_unavailable is not None:
        return max_unavailable
    return 0 if max_surge > 0 else 1


def next_replicas(
    desired: int,
    max_surge: int,
    max_unavailable: int,
    new: RevisionReplicas,
    old: Sequence[RevisionReplicas],
) -> dict[str, int]:
    """Replicas for each revision's Deployment (the new one and every old one; 0: retire it) this step."""
    if max_surge < 0 or max_unavailable < 0 or desired < 0:
        raise ValueError("desired, maxSurge and maxUnavailable must not be negative")
    if max_surge == 0 and max_unavailable == 0 and any(o.spec for o in old):
        raise ValueError("maxSurge and maxUnavailable must not both be 0: the rollout could never move")
    counts = {o.revision: o.spec for o in old}
    if not any(counts.values()):
        return {new.revision: desired, **counts}

    # Scale the new revision up into the room under the budget.
    requested = new.spec + sum(counts.values())
    room = max(0, desired + max_surge - requested)
    new_count = min(desired, new.spec + room)

    # Scale old revisions down as far as availability allows.
    min_available = max(0, desired - max_unavailable)
    new_ready = min(new.ready, new_count)
    removable = new_count + sum(counts.values()) - min_available - (new_count - new_ready)
    for o in old:  # not-Ready old replicas first: removing them costs no serving capacity
        drop = max(0, min(o.spec - o.serving, removable))
        counts[o.revision] -= drop
        removable -= drop
    available = new_ready + sum(min(o.serving, counts[o.revision]) for o in old)
    to_drop = max(0, min(available - min_available, removable))
    for o in old:
        drop = min(counts[o.revision], to_drop)
        counts[o.revision] -= drop
        to_drop -= drop
    return {new.revision: new_count, **counts}
