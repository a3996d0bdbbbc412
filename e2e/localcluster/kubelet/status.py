"""Pod status as a kubelet writes it, computed from a snapshot of the pod's containers: phase,
conditions (keeping their transition times while their status holds), containerStatuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclass(frozen=True)
class Termination:
    exit_code: int
    reason: str  # Completed | Error
    container_id: str
    started_at: str
    finished_at: str
    signal: int | None = None

    def to_api(self) -> Obj:
        out: Obj = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.signal:
            out["signal"] = self.signal
        return out


@dataclass(frozen=True)
class ContainerView:
    name: str
    image: str
    container_id: str
    state: str  # waiting | running | terminated
    restart_count: int
    ready: bool
    started: bool
    waiting_reason: str = "ContainerCreating"
    waiting_message: str | None = None
    started_at: str | None = None
    termination: Termination | None = None  # the current one, when state == terminated
    last_termination: Termination | None = None

    def to_api(self) -> Obj:
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated" and self.termination:
            state = {"terminated": self.termination.to_api()}
        else:
            state = {"waiting": {"reason": self.waiting_reason}}
            if self.waiting_message:
                state["waiting"]["message"] = self.waiting_message
        last = {"terminated": self.last_termination.to_api()} if self.last_termination else {}
        out: Obj = {
            "name": self.name,
            "image": self.image,
            "imageID": self.image,
            "state": state,
            "lastState": last,
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.started,
        }
        if self.state != "waiting" or self.last_termination:
            out["containerID"] = self.container_id
        return out

    @property
    def exited_ok(self) -> bool:
        return self.state == "terminated" and self.termination is not None and self.termination.exit_code == 0


def phase(restart_policy: str, init_done: bool, init_failed: bool, containers: list[ContainerView]) -> str:
    """The kubelet's getPhase: Pending until every container has run once; Succeeded/Failed only when
    nothing will be restarted any more."""
    if init_failed:
        return "Failed"
    if not init_done:
        return "Pending"
    running = sum(c.state == "running" for c in containers)
    stopped = [
        c for c in containers if c.state == "terminated" or (c.state == "waiting" and c.last_termination)
    ]
    waiting = len(containers) - running - len(stopped)
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always":
        return "Running"  # all exited, restarts pending
    if all(c.exited_ok for c in stopped):
        return "Succeeded"
    return "Running" if restart_policy == "OnFailure" else "Failed"


def _condition(
    ctype: str, ok: bool, now: str, previous: dict[str, Obj], reason: str = "", message: str = ""
) -> Obj:
    status = "True" if ok else "False"
    old = previous.get(ctype)
    since = old["lastTransitionTime"] if old and old.get("status") == status else now
    out: Obj = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": since}
    if not ok and reason:
        out["reason"] = reason
        if message:
            out["message"] = message
    return out


def conditions(
    existing: list[Obj],
    pod_phase: str,
    sandbox_ready: bool,
    init_done: bool,
    init_pending: list[str],
    containers: list[ContainerView],
    now: str,
) -> list[Obj]:
    """This kubelet's conditions, plus every condition someone else owns (PodScheduled, DisruptionTarget,
    readiness gates) carried over as it is."""
    previous = {c["type"]: c for c in existing}
    unready = [c.name for c in containers if not c.ready]
    terminal = pod_phase in ("Succeeded", "Failed")
    reason, message = (
        ("PodCompleted", "")
        if terminal
        else ("ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]")
    )
    containers_ready = not unready and not terminal and init_done
    own = [
        _condition("PodReadyToStartContainers", sandbox_ready and not terminal, now, previous),
        _condition(
            "Initialized",
            init_done,
            now,
            previous,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(init_pending)}]",
        ),
        _condition("ContainersReady", containers_ready, now, previous, reason, message),
        _condition("Ready", containers_ready, now, previous, reason, message),
    ]
    others = [c for c in existing if c["type"] not in OWN_CONDITIONS]
    return own + others
