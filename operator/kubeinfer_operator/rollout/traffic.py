"""What carries the canary weight to the router: its config (the Gateway API route is gateway_render.py)."""

from __future__ import annotations

from collections.abc import Sequence


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
