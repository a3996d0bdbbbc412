"""Scaling signals from Prometheus: the PromQL per engine, and the one function that queries it.

Series are selected by the labels the scrape config relabels from pod labels onto every series:
`namespace`, `inferenceservice` and `track`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect

from kubeinfer_operator.autoscaling.policy import KV_USAGE, OLDEST_WAIT, QUEUE_TIME, SERVED, WAITING

Signals = dict[str, float]


class MetricsUnavailable(Exception):
    """Prometheus could not be reached or has no series for the service: hold, do not guess."""


@dataclass(frozen=True)
class EngineMetrics:
    waiting: str  # gauge: requests waiting to be scheduled
    kv_usage: str  # gauge: KV-cache usage 0..1
    queue_time: str  # histogram: seconds from arrival to scheduling
    # Gauge: age of the oldest waiting request. A histogram only sees a request once it is scheduled,
    # so a queue that has stalled shows up late in the percentile; this gauge shows it at once. vLLM has
    # none (and observes queue time only when a request finishes): its waiting gauge is the prompt signal.
    oldest_wait: str | None
    # Counter of requests finished, and the label matcher that keeps those a replica worked on: how many
    # requests per second replicas serve, which sizes a scale-up for a backlog.
    served: str
    served_matcher: str
    # The SLO's own histograms, read for status (and `kubectl get`): the SLO as users see it.
    ttft: str
    tpot: str
    e2e: str
    # Counter with an `outcome` label, or None where the engine exports no failure count.
    outcomes: str | None


ENGINES: dict[str, EngineMetrics] = {
    "builtin": EngineMetrics(
        waiting="kubeinfer_requests_waiting",
        kv_usage="kubeinfer_kv_cache_usage_ratio",
        queue_time="kubeinfer_request_queue_time_seconds",
        oldest_wait="kubeinfer_oldest_waiting_request_age_seconds",
        served="kubeinfer_requests_total",
        served_matcher='outcome!="rejected"',
        ttft="kubeinfer_time_to_first_token_seconds",
        tpot="kubeinfer_time_per_output_token_seconds",
        e2e="kubeinfer_e2e_request_latency_seconds",
        outcomes="kubeinfer_requests_total",
    ),
    "vllm": EngineMetrics(
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",  # a 0..1 fraction despite the name
        queue_time="vllm:request_queue_time_seconds",
        oldest_wait=None,
        served="vllm:request_success_total",
        served_matcher="",
        ttft="vllm:time_to_first_token_seconds",
        tpot="vllm:request_time_per_output_token_seconds",
        e2e="vllm:e2e_request_latency_seconds",
        outcomes=None,  # vllm:request_success_total counts successes only
    ),
}


def engine_metrics(engine: str) -> EngineMetrics:
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValueError(
            f"spec.runtime.engine: unknown engine {engine!r} (known: {sorted(ENGINES)})"
        ) from None


def queries(
    metrics: EngineMetrics, namespace: str, name: str, track: str | None = None, window: str = "1m"
) -> dict[str, str]:
    """PromQL per signal for one InferenceService (and track)."""
    labels = {"namespace": namespace, "inferenceservice": name} | ({"track": track} if track else {})
    sel = "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"
    out = {
        QUEUE_TIME: (
            f"histogram_quantile(0.95, sum by (le) (rate({metrics.queue_time}_bucket{sel}[{window}])))"
        ),
        # A point sample of KV usage swings with the batch; the operating level is its short-window mean.
        KV_USAGE: f"avg(avg_over_time({metrics.kv_usage}{sel}[{window}]))",
        WAITING: f"sum({metrics.waiting}{sel})",
        SERVED: f"sum(rate({metrics.served}{_with(sel, metrics.served_matcher)}[{window}]))",
    }
    if metrics.oldest_wait:
        out[OLDEST_WAIT] = f"max({metrics.oldest_wait}{sel})"
    return out


def slo_queries(metrics: EngineMetrics, namespace: str, name: str, window: str) -> dict[str, str]:
    """PromQL for the SLO readings shown in status.signals: p95 TTFT / TPOT / E2E and the error rate."""
    sel = f'{{namespace="{_escape(namespace)}",inferenceservice="{_escape(name)}"}}'

    def p95(histogram: str) -> str:
        return f"histogram_quantile(0.95, sum by (le) (rate({histogram}_bucket{sel}[{window}])))"

    out = {"ttftP95": p95(metrics.ttft), "tpotP95": p95(metrics.tpot), "e2eP95": p95(metrics.e2e)}
    if metrics.outcomes:
        # As spec.slo.errorRate counts them (and the canary analysis, and the burn-rate alerts): 429s too.
        failed = _with(sel, 'outcome=~"error|timeout|rejected"')
        out["errorRate"] = (
            f"sum(rate({metrics.outcomes}{failed}[{window}])) / sum(rate({metrics.outcomes}{sel}[{window}]))"
        )
    return out


def fetch_slo_readings(
    prom: PrometheusConnect, metrics: EngineMetrics, namespace: str, name: str, window: str
) -> dict[str, float]:
    """The SLO readings that have data: with no request in the window a percentile is NaN and is left
    out (the status then shows none, not zero). A failed query leaves its reading out too: these
    readings inform people, the scaling decision never depends on them."""
    readings: dict[str, float] = {}
    for key, promql in slo_queries(metrics, namespace, name, window).items():
        try:
            result = prom.custom_query(promql)
        except (requests.RequestException, PrometheusApiClientException):
            continue
        if result and math.isfinite(value := float(result[0]["value"][1])):
            readings[key] = value
    return readings


def fetch_signals(
    prom: PrometheusConnect, metrics: EngineMetrics, namespace: str, name: str, track: str | None = None
) -> Signals:
    """Current value of each signal; raises MetricsUnavailable rather than return a partial guess.

    A percentile with no request scheduled in its window is NaN (or has no series before the first
    request), and the served rate has no series before the first request finishes: such a signal is left
    out, which the policy reads as "no data", not as zero.
    """
    signals: Signals = {}
    for signal, promql in queries(metrics, namespace, name, track).items():
        try:
            result = prom.custom_query(promql)
        except (requests.RequestException, PrometheusApiClientException) as e:
            raise MetricsUnavailable(f"Prometheus query for {signal} failed: {e}") from e
        if not result:
            if signal in (QUEUE_TIME, SERVED):
                continue
            raise MetricsUnavailable(f"no series for {signal} of {namespace}/{name}: {promql}")
        value = float(result[0]["value"][1])
        if math.isfinite(value):
            signals[signal] = value
    return signals


def _with(selector: str, matcher: str) -> str:
    """A label selector with one more matcher: '{a="b"}' + 'c!="d"' -> '{a="b",c!="d"}'."""
    return selector[:-1] + "," + matcher + "}" if matcher else selector


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
