"""PromQL for one track's side of a canary analysis, and turning the answers into a TrackMeasurement.

Requests and errors come from the router's count of attempts (`kubeinfer_router_upstream_attempts_total
{track}`): every attempt at a replica, under that replica's track, including the ones a retry on the other
track then hid from the client and the ones no HTTP answer came back for. A canary that fails is judged on
its failures, not on what the retries made of them. TTFT and E2E come from the router's histograms of the
attempt that served each request. TPOT is per request and only the engine knows
the token count, so it comes from the runtime pods' histogram (named by the engine's adapter,
engine_metrics.py), selected by `revision`: a pod keeps its
revision for life, while which track a revision is changes when it is promoted. When a Gateway splits
the traffic instead of the router (source "replicas"), everything comes from the replicas' own metrics by
revision, through the engine's adapter; a request the Gateway failed before any replica saw it is then
not counted, and an engine that counts no failures (vLLM) leaves the error rate unjudged (Inconclusive).

Both tracks are queried with the same range, evaluated at the same instant (the window's end), so they
are compared over exactly the same span. Labels `namespace`, `inferenceservice` and `revision` are
the scrape config's relabelling of pod labels. The router pods must not carry the track label themselves:
Prometheus would then rename the router's own `track` to `exported_track`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from kubeinfer_operator.engine_metrics import ENGINES, EngineMetrics
from kubeinfer_operator.rollout.analysis import LatencyMetric, SLOTargets, TrackMeasurement

ROUTER_ATTEMPTS = "kubeinfer_router_upstream_attempts_total"
ROUTER_RETRIES = "kubeinfer_router_retries_total"
ROUTER_HISTOGRAMS: dict[LatencyMetric, str] = {
    "ttft": "kubeinfer_router_time_to_first_token_seconds",
    "e2e": "kubeinfer_router_e2e_request_latency_seconds",
}
# 429s count: a canary that sheds load the stable track absorbs is worse. 499 (client left) does not;
# `transport` (refused, reset, a stream cut mid-way) does.
ERROR_CODES = "5..|429|transport"
RUNTIME_ERROR_OUTCOMES = "error|timeout|rejected"  # the replicas' words for 5xx, 504 and 429
Source = Literal["router", "replicas"]


def track_queries(
    namespace: str,
    inferenceservice: str,
    track: str,
    revision: str,
    window_s: float,
    slo: SLOTargets,
    source: Source = "router",
    engine: EngineMetrics = ENGINES["builtin"],
) -> dict[str, str]:
    """Queries keyed "requests", "errors" (absent where nothing counts failures) and each latency
    objective's key (e.g. "ttft_p95"); `engine` names the replicas' series."""
    service = f'namespace="{namespace}",inferenceservice="{inferenceservice}"'
    replicas = f'{service},revision="{revision}"'
    window = f"{max(1, round(window_s))}s"
    errors: str | None
    if source == "router":
        selector = f'{service},track="{track}"'
        errors = f'{ROUTER_ATTEMPTS}{{{selector},code=~"{ERROR_CODES}"}}'
        requests, histograms = f"{ROUTER_ATTEMPTS}{{{selector}}}", ROUTER_HISTOGRAMS
    else:
        selector = replicas
        histograms = {"ttft": engine.ttft, "e2e": engine.e2e}
        if engine.outcomes:
            requests = f"{engine.outcomes}{{{selector}}}"
            errors = f'{engine.outcomes}{{{selector},outcome=~"{RUNTIME_ERROR_OUTCOMES}"}}'
        else:  # every finished request is in the E2E histogram; failures are counted nowhere
            requests, errors = f"{engine.e2e}_count{{{selector}}}", None
    queries = {"requests": f"sum(increase({requests}[{window}]))"}
    if errors is not None:
        queries["errors"] = f"sum(increase({errors}[{window}]))"
    if source == "router":  # failed attempts of this track that a retry hid from the client
        queries["retried"] = f"sum(increase({ROUTER_RETRIES}{{{selector}}}[{window}]))"
    for objective in slo.latency:
        if objective.metric == "tpot":
            series = f"{engine.tpot}_bucket{{{replicas}}}"
        else:
            series = f"{histograms[objective.metric]}_bucket{{{selector}}}"
        queries[objective.key] = (
            f"histogram_quantile({objective.quantile:g}, sum by (le) (increase({series}[{window}])))"
        )
    return queries


def measurement(results: Mapping[str, float | None], slo: SLOTargets, replicas: int = 1) -> TrackMeasurement:
    """Answers to `track_queries` -> TrackMeasurement. An empty result or NaN (histogram_quantile over no
    samples) is "no data": zero for counts, None for percentiles."""

    def value(key: str) -> float | None:
        v = results.get(key)
        return None if v is None or math.isnan(v) else float(v)

    return TrackMeasurement(
        requests=value("requests") or 0.0,
        errors=(value("errors") or 0.0) if "errors" in results else None,
        latency={o.key: value(o.key) for o in slo.latency},
        replicas=replicas,
        retried=value("retried") or 0.0,
    )
