"""What carries the canary weight to the data path: the router's config file, or a Gateway API HTTPRoute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def router_config(
    canary_weight: int, stable_endpoints: Sequence[str], canary_endpoints: Sequence[str]
) -> dict:
    """The router's config (see kubeinfer_runtime.router.config). List only Ready pods' URLs: the router
    sends a track's share elsewhere while the track has no endpoint, so a loading canary gets nothing."""
    return {
        "tracks": {
            "stable": {"weight": 100 - canary_weight, "endpoints": sorted(stable_endpoints)},
            "canary": {"weight": canary_weight, "endpoints": sorted(canary_endpoints)},
        }
    }


def http_route(
    name: str,
    namespace: str,
    gateway: str,
    port: int,
    stable_service: str,
    canary_service: str | None,
    canary_weight: int,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An HTTPRoute splitting /v1 between the per-track Services, for clusters with Gateway API. The
    gateway balances within a track its own way; the router does it by load."""
    backends = [{"name": stable_service, "port": port, "weight": 100 - canary_weight}]
    if canary_service is not None:
        backends.append({"name": canary_service, "port": port, "weight": canary_weight})
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "parentRefs": [{"name": gateway}],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": backends}
            ],
        },
    }
