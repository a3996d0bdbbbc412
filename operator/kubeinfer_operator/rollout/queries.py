"""PromQL for one track's side of a canary analysis, and turning the answers into a TrackMeasurement.

Requests, errors, TTFT and E2E come from the router (`kubeinfer_router_*{track}`): it sees every request
of both tracks, including the ones no replica answered. TPOT is per request and only the engine knows
the token count, so it comes from the runtime pods' histogram, selected by `revision`: a pod keeps its
revision for life, while which track a revision is changes when it is promoted.

Both tracks are queried with the same range, evaluated at the same instant (the window's end), so they
are compared over exactly the same span. Labels `namespace`, `inferenceservice` and `revision` are
the scrape config's relabelling of pod labels. The router pods must not carry the track label themselves:
Prometheus would then rename the router's own `track` to `exported_track`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kubeinfer_operator.rollout.analysis import LatencyMetric, SLOTargets, TrackMeasurement

ROUTER_REQUESTS = "kubeinfer_router_requests_total"
ROUTER_HISTOGRAMS: dict[LatencyMetric, str] = {
    "ttft": "kubeinfer_router_time_to_first_token_seconds",
    "e2e": "kubeinfer_router_e2e_request_latency_seconds",
}
RUNTIME_TPOT = "kubeinfer_time_per_output_token_seconds"
# 429s count: a canary that sheds load the stable track absorbs is worse. 499 (client left) does not.
ERROR_CODES = "5..|429"


def track_queries(
    namespace: str,
    inferenceservice: str,
    track: str,
    revision: str,
    window_s: float,
    slo: SLOTargets,
    tpot_metric: str = RUNTIME_TPOT,
) -> dict[str, str]:
    """Queries keyed "requests", "errors" and each latency objective's key (e.g. "ttft_p95").

    `tpot_metric` is the engine's per-request TPOT histogram (for vLLM, the adapter passes its name).
    """
    service = f'namespace="{namespace}",inferenceservice="{inferenceservice}"'
    selector = f'{service},track="{track}"'
    window = f"{max(1, round(window_s))}s"
    queries = {
        "requests": f"sum(increase({ROUTER_REQUESTS}{{{selector}}}[{window}]))",
        "errors": f'sum(increase({ROUTER_REQUESTS}{{{selector},code=~"{ERROR_CODES}"}}[{window}]))',
    }
    for objective in slo.latency:
        if objective.metric == "tpot":
            series = f'{tpot_metric}_bucket{{{service},revision="{revision}"}}'
        else:
            series = f"{ROUTER_HISTOGRAMS[objective.metric]}_bucket{{{selector}}}"
        queries[objective.key] = (
            f"histogram_quantile({objective.quantile:g}, sum by (le) (increase({series}[{window}])))"
        )
    return queries


def measurement(results: Mapping[str, float | None], slo: SLOTargets) -> TrackMeasurement:
    """Answers to `track_queries` -> TrackMeasurement. An empty result or NaN (histogram_quantile over no
    samples) is "no data": zero for counts, None for percentiles."""

    def value(key: str) -> float | None:
        v = results.get(key)
        return None if v is None or math.isnan(v) else float(v)

    return TrackMeasurement(
        requests=value("requests") or 0.0,
        errors=value("errors") or 0.0,
        latency={o.key: value(o.key) for o in slo.latency},
    )
