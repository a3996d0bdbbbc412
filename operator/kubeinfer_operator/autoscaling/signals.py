"""Scaling signals from Prometheus: the PromQL over an engine's metric names (engine_metrics.py), and the
one function that queries it.

Series are selected by the labels the scrape config relabels from pod labels onto every series:
`namespace`, `inferenceservice` and `track`.
"""

from __future__ import annotations

import math

from prometheus_api_client import PrometheusConnect

from kubeinfer_operator.autoscaling.policy import KV_USAGE, OLDEST_WAIT, QUEUE_TIME, SERVED, WAITING
from kubeinfer_operator.engine_metrics import EngineMetrics, engine_metrics
from kubeinfer_operator.prometheus import MetricsUnavailable, instant, range_values

__all__ = ["EngineMetrics", "MetricsUnavailable", "Signals", "engine_metrics", "fetch_signals"]

Signals = dict[str, float]


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
            value = instant(prom, promql)
        except MetricsUnavailable:
            continue
        if value is not None and math.isfinite(value):
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
            value = instant(prom, promql)
        except MetricsUnavailable as e:
            raise MetricsUnavailable(f"Prometheus query for {signal} failed: {e.__cause__ or e}") from e
        if value is None:
            if signal in (QUEUE_TIME, SERVED):
                continue
            raise MetricsUnavailable(f"no series for {signal} of {namespace}/{name}: {promql}")
        if math.isfinite(value):
            signals[signal] = value
    return signals


def arrivals_query(metrics: EngineMetrics, namespace: str, name: str) -> str:
    """PromQL of the requests per second a service serves, over all tracks: the forecaster's history. It
    is the arrival rate while the replicas keep up (the floor is for exactly that: keeping up)."""
    return queries(metrics, namespace, name)[SERVED]


def fetch_arrivals_history(
    prom: PrometheusConnect,
    metrics: EngineMetrics,
    namespace: str,
    name: str,
    now: float,
    history_s: float,
    step_s: float = 30,
) -> list[float]:
    """Requests per second at each step_s over the last history_s (NaN in gaps), oldest first."""
    start = now - history_s
    return range_values(prom, arrivals_query(metrics, namespace, name), start, now, step_s)


def _with(selector: str, matcher: str) -> str:
    """A label selector with one more matcher: '{a="b"}' + 'c!="d"' -> '{a="b",c!="d"}'."""
    return selector[:-1] + "," + matcher + "}" if matcher else selector


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
