"""Requests to an InferenceService's own URL, as a client in the cluster would send them (the I/O half of
serving_path.py)."""

from __future__ import annotations

import httpx

from kubeinfer_operator.serving_path import ProbeResult

COMPONENT_HEADER = "x-kubeinfer-component"
PROBES = 3  # the cluster's proxies pick a backend per connection: a few fresh ones sample them
TIMEOUT_S = 2.0


def probe_url(url: str, probes: int = PROBES, timeout_s: float = TIMEOUT_S) -> ProbeResult:
    """GET url/ready up to `probes` times, each on a new connection; which component answered each (None
    for a failure or a non-200 answer). The first failure ends it: one unanswered probe already says
    "not yet", and a blackholed URL then holds the reconcile for one timeout, not `probes` of them."""
    components: list[str | None] = []
    error: str | None = None
    for _ in range(probes):
        try:
            # A client per request: a pooled keep-alive connection would stay on one backend.
            with httpx.Client(timeout=timeout_s, trust_env=False) as client:
                response = client.get(f"{url}/ready")
        except httpx.HTTPError as exc:
            components.append(None)
            error = f"{type(exc).__name__}: {exc}"
            break
        if response.status_code != 200:
            components.append(None)
            error = f"HTTP {response.status_code} from /ready"
            break
        components.append(response.headers.get(COMPONENT_HEADER))
    return ProbeResult(tuple(components), error)
