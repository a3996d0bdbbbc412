"""The objects of a Gateway API traffic split (Canary with spec.rollout.trafficRouting.gatewayAPI):
one Service per track, each selecting exactly one revision's pods, and the HTTPRoute that weights them.

Track Services select by revision, not by the pods' track label: a pod keeps the track it was created
with, and promotion turns the canary revision into the stable one without restarting it. The route
lists a track only while that track's Service has Ready pods behind it: Gateway API answers 500 for
the share of a backend without endpoints, and a loading canary must get nothing.
"""

from __future__ import annotations

from typing import Any

from kubeinfer_operator.api.spec import GatewayAPIRouting
from kubeinfer_operator.names import LABEL_REVISION, SERVICE_PORT, owned_labels
from kubeinfer_operator.render import Owner, _render, pod_selector

HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
TRACKS = ("stable", "canary")


def track_service_name(isvc: str, track: str) -> str:
    return f"{isvc}-{track}"


def render_track_service(owner: Owner, track: str, revision: str) -> dict[str, Any]:
    return _render(
        "service.yaml.j2",
        name=track_service_name(owner.name, track),
        namespace=owner.namespace,
        labels=owned_labels(owner.name),
        owner_reference=owner.reference(),
        selector={**pod_selector(owner.name), LABEL_REVISION: revision},
        service_port=SERVICE_PORT,
    )


def render_http_route(owner: Owner, routing: GatewayAPIRouting, weights: dict[str, int]) -> dict[str, Any]:
    """`weights`: percent by track, for the tracks that have Ready pods (their Services exist)."""
    backends = [
        {"name": track_service_name(owner.name, track), "port": SERVICE_PORT, "weight": weight}
        for track, weight in weights.items()
    ]
    spec: dict[str, Any] = {
        "parentRefs": [ref.model_dump(by_alias=True, exclude_none=True) for ref in routing.parent_refs],
        # No matches: the route's default, every path, so /v1/* and /health alike reach the replicas.
        "rules": [{"backendRefs": backends}],
    }
    if routing.hostnames:
        spec["hostnames"] = list(routing.hostnames)
    return {
        "apiVersion": HTTPROUTE_API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": owned_labels(owner.name),
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    }


def route_weights(canary_weight: int, stable_ready: int, canary_ready: int) -> dict[str, int]:
    """The machine's canary weight, moved to the track that can take it while the other has no Ready pod;
    a track at weight 0 is left out of the route."""
    if canary_ready == 0:
        return {"stable": 100}
    if stable_ready == 0:
        return {"canary": 100}
    weights = {"stable": 100 - canary_weight, "canary": canary_weight}
    return {track: weight for track, weight in weights.items() if weight > 0}


def render_gateway_split(
    owner: Owner,
    routing: GatewayAPIRouting,
    revisions: dict[str, str | None],
    ready: dict[str, int],
    canary_weight: int,
) -> list[dict[str, Any]]:
    """Track Services for the revisions in play and the HTTPRoute over them. `revisions` and `ready`
    are keyed by track (stable, canary)."""
    services = [
        render_track_service(owner, track, revision)
        for track in TRACKS
        if (revision := revisions.get(track)) is not None
    ]
    weights = route_weights(
        canary_weight if revisions.get("canary") else 0, ready.get("stable", 0), ready.get("canary", 0)
    )
    return [*services, render_http_route(owner, routing, weights)]
