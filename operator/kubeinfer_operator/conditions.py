"""Status conditions as the Kubernetes API conventions define them, merged without losing history.

`lastTransitionTime` moves only when a condition's status flips, so re-reconciling an unchanged
object produces the identical list (and no status write).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    type: str
    status: ConditionStatus
    reason: str  # CamelCase, machine-readable
    message: str  # a sentence a user can act on


@dataclass(frozen=True)
class Transition:
    """A condition whose status or reason changed; each one becomes a Kubernetes Event."""

    condition: Condition
    previous_status: str | None


def merge(
    previous: list[dict[str, Any]], desired: list[Condition], now: str, generation: int
) -> list[dict[str, Any]]:
    """The new conditions list: desired conditions in their given order, keeping each one's
    lastTransitionTime while its status is unchanged, then the other writers' conditions as they were."""
    before = {c.get("type"): c for c in previous}
    merged = []
    for condition in desired:
        old = before.get(condition.type)
        keep_time = (
            old is not None and old.get("status") == condition.status and old.get("lastTransitionTime")
        )
        merged.append(
            {
                "type": condition.type,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": old["lastTransitionTime"] if keep_time else now,
                "observedGeneration": generation,
            }
        )
    desired_types = {c.type for c in desired}
    return merged + [c for c in previous if c.get("type") not in desired_types]


def transitions(previous: list[dict[str, Any]], desired: list[Condition]) -> list[Transition]:
    before = {c.get("type"): c for c in previous}
    changed = []
    for condition in desired:
        old = before.get(condition.type)
        if old is None or old.get("status") != condition.status or old.get("reason") != condition.reason:
            changed.append(Transition(condition, old.get("status") if old else None))
    return changed


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
