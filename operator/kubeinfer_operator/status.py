"""What the owned Deployments and pods say about the service, as conditions a user can act on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.names import LABEL_REVISION
from kubeinfer_operator.pod_diagnosis import Diagnosis
from kubeinfer_operator.serving_path import Serving

# Ready=False for these reasons is the normal way up, not a failure: their events are Normal.
STARTING_REASONS = frozenset({"Creating", "Loading", "ScaledToZero", "RouterStarting", "URLNotAnswering"})


@dataclass(frozen=True)
class RevisionView:
    """One revision's Deployment as last observed."""

    revision: str
    name: str
    uid: str
    spec_replicas: int
    replicas: int
    ready: int
    updated: int
    synced: bool  # the Deployment controller has seen the latest spec
    deadline_exceeded: bool

    @classmethod
    def of(cls, deployment: dict[str, Any]) -> RevisionView:
        meta, spec, status = deployment["metadata"], deployment.get("spec", {}), deployment.get("status", {})
        progressing = next((c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {})
        return cls(
            revision=meta.get("labels", {}).get(LABEL_REVISION, ""),
            name=meta["name"],
            uid=meta["uid"],
            spec_replicas=spec.get("replicas", 1),
            replicas=status.get("replicas", 0),
            ready=status.get("readyReplicas", 0),
            updated=status.get("updatedReplicas", 0),
            synced=status.get("observedGeneration", 0) >= meta.get("generation", 1),
            deadline_exceeded=progressing.get("reason") == "ProgressDeadlineExceeded",
        )

    def serves(self, desired: int) -> bool:
        """All `desired` replicas are up to date and ready: older revisions can go."""
        return self.synced and self.spec_replicas == desired and min(self.updated, self.ready) >= desired


@dataclass(frozen=True)
class Observation:
    desired: int
    revision: str  # the revision the spec renders to
    current: RevisionView | None  # its Deployment; None until created
    older: tuple[RevisionView, ...]
    diagnosis: Diagnosis | None
    url: str
    serving: Serving | None = None  # None: taken as answering once a replica is Ready

    @property
    def ready(self) -> int:
        return sum(v.ready for v in self._all())

    @property
    def replicas(self) -> int:
        return sum(v.replicas for v in self._all())

    def _all(self) -> tuple[RevisionView, ...]:
        return (*self.older, self.current) if self.current else self.older


def ready_condition(o: Observation) -> Condition:
    if o.desired == 0:
        return Condition(
            "Ready",
            "False",
            "ScaledToZero",
            "spec.replicas is 0, so no replica runs; remove it or raise it to serve.",
        )
    serving = o.serving or Serving.of_replicas(o.ready)
    if o.ready > 0 and serving.answers:
        return Condition("Ready", "True", "Serving", f"{o.ready}/{o.desired} replicas ready at {o.url}.")
    if o.ready > 0 and serving.path.selected == "router" and serving.path.ready_pods == 0:
        return Condition(
            "Ready",
            "False",
            "RouterStarting",
            f"{o.ready}/{o.desired} replicas ready; waiting for the router in front of them to be ready.",
        )
    if o.ready > 0:
        why = f" ({serving.error})" if serving.error else ""
        return Condition(
            "Ready",
            "False",
            "URLNotAnswering",
            f"{o.ready}/{o.desired} replicas ready, but {o.url} does not answer from the "
            f"{serving.path.selected} yet{why}.",
        )
    if o.diagnosis:
        return Condition("Ready", "False", o.diagnosis.reason, o.diagnosis.message)
    if o.current is None or o.replicas == 0:
        return Condition("Ready", "False", "Creating", "Creating the replicas.")
    return Condition(
        "Ready", "False", "Loading", f"0/{o.desired} replicas ready: loading the model and warming up."
    )


def progressing_condition(o: Observation) -> Condition:
    current = o.current
    if current is not None and current.deadline_exceeded:
        return Condition(
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            f"Revision {current.revision} made no progress within spec.rollout.progressDeadline.",
        )
    if current is not None and current.serves(o.desired) and not o.older:
        return Condition(
            "Progressing",
            "False",
            "Complete",
            f"Revision {current.revision} runs {o.desired}/{o.desired} replicas.",
        )
    ready = current.ready if current else 0
    if o.older:
        old = ", ".join(v.revision for v in o.older)
        message = (
            f"Rolling out revision {o.revision}: {ready}/{o.desired} ready; {old} keeps running until then."
        )
        return Condition("Progressing", "True", "RollingOut", message)
    return Condition(
        "Progressing", "True", "ScalingReplicas", f"Revision {o.revision}: {ready}/{o.desired} ready."
    )


def degraded_condition(o: Observation) -> Condition:
    if o.diagnosis:
        return Condition("Degraded", "True", o.diagnosis.reason, o.diagnosis.message)
    if o.current is not None and o.current.deadline_exceeded:
        return Condition(
            "Degraded",
            "True",
            "ProgressDeadlineExceeded",
            f"Revision {o.current.revision} did not become ready in time; see its pods' events and logs.",
        )
    return Condition("Degraded", "False", "AsExpected", "No replica is failing.")


def invalid_spec_conditions(problems: list[str]) -> list[Condition]:
    message = "The spec is invalid, so nothing was changed: " + "; ".join(problems)
    return [
        Condition("Ready", "False", "InvalidSpec", message),
        Condition("Degraded", "True", "InvalidSpec", message),
    ]


def is_warning(condition: Condition) -> bool:
    if condition.type == "Ready":
        return condition.status == "False" and condition.reason not in STARTING_REASONS
    if condition.type == "Progressing":
        return condition.reason == "ProgressDeadlineExceeded"
    if condition.type == "Degraded":
        return condition.status == "True"
    return condition.status == "False"


def kstatus_conditions(conditions: list[Condition]) -> tuple[Condition, Condition]:
    """Reconciling and Stalled, the abnormal-true conditions of the kstatus conventions (what Flux's
    health checks, `kubectl wait` and cli-utils read), derived from this reconcile's own conditions:

    - Stalled=True while Degraded is True (pods that cannot schedule or start, a rolled-back canary, an
      invalid spec): the operator cannot reach the spec without someone acting. kstatus: Failed.
    - Reconciling=True while a rollout or scaling is under way (Progressing=True) or the replicas are
      still coming up (Ready=False for a starting reason), and nothing is stalled. kstatus: InProgress.
    - Neither: kstatus reads the service as Current (Ready, or parked at spec.replicas 0).
    """
    by_type = {c.type: c for c in conditions}
    degraded, progressing, ready = by_type.get("Degraded"), by_type.get("Progressing"), by_type.get("Ready")
    if degraded is not None and degraded.status == "True":
        stalled = Condition("Stalled", "True", degraded.reason, degraded.message)
        return Condition("Reconciling", "False", "Stalled", "Stalled: " + degraded.message), stalled
    not_stalled = Condition("Stalled", "False", "AsExpected", "Nothing blocks the rollout or the replicas.")
    if progressing is not None and progressing.status == "True":
        return Condition("Reconciling", "True", progressing.reason, progressing.message), not_stalled
    if ready is not None and ready.status != "True" and ready.reason in STARTING_REASONS - {"ScaledToZero"}:
        return Condition("Reconciling", "True", ready.reason, ready.message), not_stalled
    return Condition("Reconciling", "False", "Reconciled", "The replicas match the spec."), not_stalled
