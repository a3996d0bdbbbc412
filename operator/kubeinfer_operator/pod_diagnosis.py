"""Why pods are not serving, in words a user can act on: read from pod status alone (the scheduler
writes its verdict into the PodScheduled condition; the kubelet into container states)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kubeinfer_operator.names import CONTAINER_NAME

_IMAGE_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
_CONFIG_FAILURES = {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


@dataclass(frozen=True)
class Diagnosis:
    reason: str  # condition reason: Unschedulable, ImagePullFailed, CrashLoop, OutOfMemory, ...
    message: str
    pod: str


@dataclass(frozen=True)
class ResourceAsk:
    """What each pod asks for, to name the exact spec field to change."""

    gpus: int
    gpu_resource: str


def _scheduler_hint(message: str, ask: ResourceAsk) -> str:
    hints = []
    if f"Insufficient {ask.gpu_resource}" in message:
        hints.append(
            f"each pod asks for {ask.gpus} {ask.gpu_resource}: lower spec.runtime.resources.gpus "
            f"or add nodes with more {ask.gpu_resource}"
        )
    if "Insufficient cpu" in message or "Insufficient memory" in message:
        hints.append("lower spec.runtime.resources.cpu/memory or add larger nodes")
    if "node affinity/selector" in message:
        hints.append("no node matches spec.runtime.nodeSelector: check the node labels")
    if "untolerated taint" in message:
        hints.append("the nodes are tainted: add matching spec.runtime.tolerations")
    return "; ".join(hints)


def _unschedulable(pod: dict[str, Any], ask: ResourceAsk) -> Diagnosis | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            # The part after "preemption:" repeats the verdict for preemption; it only confuses.
            verdict = re.split(r"\s*preemption:", condition.get("message", ""), maxsplit=1)[0].strip()
            hint = _scheduler_hint(verdict, ask)
            message = f"Pods cannot be scheduled: {verdict}" + (f" Fix: {hint}." if hint else "")
            return Diagnosis("Unschedulable", message, pod["metadata"]["name"])
    return None


def _container_failure(pod: dict[str, Any]) -> Diagnosis | None:
    name = pod["metadata"]["name"]
    namespace = pod["metadata"].get("namespace", "")
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") != CONTAINER_NAME:
            continue
        waiting = (status.get("state") or {}).get("waiting") or {}
        last = (status.get("lastState") or {}).get("terminated") or {}
        restarts = status.get("restartCount", 0)
        if waiting.get("reason") in _IMAGE_FAILURES:
            detail = waiting.get("message", "")
            return Diagnosis(
                "ImagePullFailed", f"Cannot pull the runtime image: {detail} Check spec.runtime.image.", name
            )
        if waiting.get("reason") in _CONFIG_FAILURES:
            detail = waiting.get("message", "")
            return Diagnosis("ContainerConfigError", f"The runtime container cannot start: {detail}", name)
        if last.get("reason") == "OOMKilled":
            return Diagnosis(
                "OutOfMemory",
                f"The runtime was killed for running out of memory ({restarts} restarts). "
                "Raise spec.runtime.resources.memory, or lower spec.model.maxModelLen or "
                "spec.runtime.maxNumSeqs.",
                name,
            )
        if restarts > 0 and (waiting.get("reason") == "CrashLoopBackOff" or last.get("exitCode", 0) != 0):
            exit_code = last.get("exitCode", "unknown")
            return Diagnosis(
                "CrashLoop",
                f"The runtime keeps exiting ({restarts} restarts, last exit code {exit_code}). "
                f"See `kubectl logs -n {namespace} {name} --previous`.",
                name,
            )
    return None


def diagnose(pods: list[dict[str, Any]], ask: ResourceAsk) -> Diagnosis | None:
    """The most actionable problem among the pods, or None when they are merely starting or fine.
    Scheduling problems come first: a pod that never ran cannot also crash."""
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    for pod in live:
        if found := _unschedulable(pod, ask):
            return found
    for pod in live:
        if found := _container_failure(pod):
            return found
    return None
