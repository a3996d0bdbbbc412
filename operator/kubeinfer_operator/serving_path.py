"""What the InferenceService's Service sends traffic to, and when a change of that is safe to finish.

The Service (the URL in status.url) selects either the per-service router's pods (Canary through the
router) or the replicas themselves (RollingUpdate, or Canary through Gateway API). Changing the strategy
or the traffic routing moves it from one to the other. Done naively (point the Service at the new pods,
delete the old path's objects in the same reconcile), clients are refused while the new router pods start
and while the cluster's proxies (kube-proxy) still send to pods that are gone. So:

1. The Service keeps selecting the old path until the new one has Ready pods.
2. The old path's objects (router, its ConfigMap and RBAC, the HTTPRoute and track Services) are deleted
   only once the URL answers from the new path: the operator's probe through the Service URL reads
   which component answered (`x-kubeinfer-component`: router or runtime).

The same probe gates Ready: Ready=True means a request to status.url is answered now, not merely that
some replica passed its readiness probe (the router may still be starting, or the proxies not programmed).
Pure: the probe's answer comes in as a value (url_probe.py does the I/O).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.gateway_render import track_service_name
from kubeinfer_operator.names import LABEL_APP
from kubeinfer_operator.router_render import ROUTER_APP, router_binding_name, router_name

Path = Literal["router", "replicas"]
Routing = Literal["router", "gateway", "none"]  # which traffic objects the spec runs besides the Service
# The RoleBinding named like the router is what operators before the router ClusterRole wrote.
ROUTER_KINDS = frozenset({"Deployment", "ConfigMap", "ServiceAccount", "RoleBinding"})
# What each path's pods say they are in the probe's answer header.
COMPONENT: dict[Path, str] = {"router": "router", "replicas": "runtime"}


def desired_path(spec: InferenceServiceSpec) -> Path:
    routed = spec.rollout.strategy == "Canary" and spec.rollout.gateway_api is None
    return "router" if routed else "replicas"


def desired_routing(spec: InferenceServiceSpec) -> Routing:
    if spec.rollout.strategy != "Canary":
        return "none"
    return "router" if spec.rollout.gateway_api is None else "gateway"


def routing_of(kind: str, name: str, isvc: str) -> Routing | None:
    """Which routing an owned traffic object belongs to; None for the Service itself."""
    if kind in ROUTER_KINDS and name == router_name(isvc):
        return "router"
    if kind == "RoleBinding" and name == router_binding_name(isvc):
        return "router"
    if kind == "HTTPRoute" or (
        kind == "Service" and name in (track_service_name(isvc, "stable"), track_service_name(isvc, "canary"))
    ):
        return "gateway"
    return None


def current_path(service: dict[str, Any] | None) -> Path | None:
    """What the existing Service selects; None when there is no Service yet."""
    if service is None:
        return None
    selector = (service.get("spec") or {}).get("selector") or {}
    return "router" if selector.get(LABEL_APP) == ROUTER_APP else "replicas"


@dataclass(frozen=True)
class PathState:
    desired: Path
    selected: Path  # what the Service is to select after this reconcile
    ready_pods: int  # Ready pods behind the selected path

    @property
    def switching(self) -> bool:
        return self.selected != self.desired


def choose_path(current: Path | None, desired: Path, ready: dict[Path, int]) -> PathState:
    """Move the Service to the desired path once that path has Ready pods (at once when there is no
    Service yet: nothing can be lost)."""
    move = current is None or current == desired or ready.get(desired, 0) > 0
    selected = desired if move else current
    return PathState(desired, selected, ready.get(selected, 0))


@dataclass(frozen=True)
class ProbeResult:
    """The answers of a few requests to the URL's /ready, each on a new connection."""

    components: tuple[str | None, ...]  # per request: the header's value, None when it failed
    error: str | None = None  # the last failure, if any

    def all_from(self, component: str) -> bool:
        return bool(self.components) and all(c == component for c in self.components)


def probe_needed(state: PathState, was_ready: bool, stale: bool, probing: bool) -> bool:
    """Probe when it decides something: Ready is to turn True, or old objects wait for the new path."""
    return probing and state.ready_pods > 0 and (not was_ready or stale or state.switching)


def url_answers(state: PathState, probe: ProbeResult | None, probing: bool) -> bool:
    """The URL answers from the selected path. Without probing (an operator outside the cluster cannot
    reach Service URLs), Ready pods behind the selected path are taken as the answer."""
    if state.ready_pods == 0:
        return False
    if not probing or probe is None:
        return True
    return probe.all_from(COMPONENT[state.selected])


def may_prune(state: PathState, probe: ProbeResult | None, probing: bool) -> bool:
    """The old path's objects may go: the Service selects the desired path and the URL answers from it."""
    if state.switching:
        return False
    if not probing:
        return True
    return probe is not None and probe.all_from(COMPONENT[state.desired])


@dataclass(frozen=True)
class Serving:
    """What the reconcile knows of the URL: the path the Service selects and whether the URL answers."""

    path: PathState
    answers: bool
    error: str | None = None  # why it does not, from the probe

    @classmethod
    def of_replicas(cls, ready: int) -> Serving:
        """No router, no probe: the URL answers when a replica is Ready (plans made without a cluster)."""
        return cls(PathState("replicas", "replicas", ready), ready > 0)
