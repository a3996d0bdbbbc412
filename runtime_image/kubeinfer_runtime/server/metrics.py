"""The runtime's Prometheus metrics: exactly the names of the metric contract, every series labelled `model`.

Per-request histograms and counters are fed by the async engine as outputs arrive; the engine's own
gauges and cumulative counters are read from its latest stats snapshot at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeinfer_runtime.engine.types import EngineStats

OUTCOMES = ("success", "rejected", "cancelled", "error", "timeout")

# Seconds. Wide ends: a CPU pod and a GPU pod share one dashboard.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)


@dataclass(frozen=True)
class StatsSnapshot:
    stats: EngineStats
    taken_at: float  # time.monotonic()


class _EngineStatsCollector(Collector):
    """Gauges and engine-cumulative counters, rendered from the latest snapshot at scrape time."""

    def __init__(self, model: str, snapshot: Callable[[], StatsSnapshot | None]) -> None:
        self._model = model
        self._snapshot = snapshot
        # Warm-up traffic is no client's: counters start from the snapshot taken once it is done.
        self.baseline: EngineStats | None = None

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        stats = snap.stats if snap else None
        base = self.baseline

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model"])
            family.add_metric([self._model], value)
            return family

        def counter(name: str, doc: str, attr: str) -> CounterMetricFamily:
            value = getattr(stats, attr) - getattr(base, attr) if stats and base else 0
            family = CounterMetricFamily(name, doc, labels=["model"])
            family.add_metric([self._model], max(0, value))
            return family

        waiting = stats.num_waiting if stats else 0
        # The snapshot is from the last engine step; the oldest waiting request has aged since.
        oldest_age = (
            stats.oldest_waiting_age_s + (time.monotonic() - snap.taken_at) if snap and waiting else 0.0
        )
        yield gauge("kubeinfer_requests_waiting", "Requests admitted and not running.", waiting)
        yield gauge(
            "kubeinfer_requests_running", "Requests in the running batch.", stats.num_running if stats else 0
        )
        yield gauge(
            "kubeinfer_oldest_waiting_request_age_seconds", "Age of the oldest waiting request.", oldest_age
        )
        yield gauge(
            "kubeinfer_kv_cache_usage_ratio",
            "Used KV-cache blocks / total, 0..1.",
            stats.kv_usage if stats else 0,
        )
        yield counter(
            "kubeinfer_prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            "prefix_cache_queries_total",
        )
        yield counter(
            "kubeinfer_prefix_cache_hits",
            "Prompt tokens found in the prefix cache.",
            "prefix_cache_hits_total",
        )
        yield counter("kubeinfer_preemptions", "Requests preempted (recomputed later).", "preemptions_total")
        yield counter(
            "kubeinfer_spec_decode_draft_tokens",
            "Speculative decoding: draft tokens verified.",
            "spec_draft_tokens_total",
        )
        yield counter(
            "kubeinfer_spec_decode_accepted_tokens",
            "Speculative decoding: draft tokens accepted.",
            "spec_accepted_tokens_total",
        )
        drafted = stats.spec_draft_tokens_total - base.spec_draft_tokens_total if stats and base else 0
        accepted = stats.spec_accepted_tokens_total - base.spec_accepted_tokens_total if stats and base else 0
        yield gauge(
            "kubeinfer_spec_decode_acceptance_ratio",
            "Speculative decoding: accepted / verified draft tokens since start (0 before any draft).",
            accepted / drafted if drafted > 0 else 0.0,
        )


class RuntimeMetrics:
    def __init__(self, model: str, snapshot: Callable[[], StatsSnapshot | None]) -> None:
        self.registry = CollectorRegistry()
        self.engine_stats = _EngineStatsCollector(model, snapshot)
        self.registry.register(self.engine_stats)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model"], registry=self.registry, buckets=buckets).labels(
                model=model
            )

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model"], registry=self.registry).labels(model=model)

        self.queue_time = histogram(
            "kubeinfer_request_queue_time_seconds",
            "Arrival to first scheduled (observed then).",
            _LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            "kubeinfer_time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram(
            "kubeinfer_inter_token_latency_seconds", "Time between output tokens.", _TOKEN_BUCKETS
        )
        self.tpot = histogram(
            "kubeinfer_time_per_output_token_seconds",
            "Per request: (e2e - ttft) / (output tokens - 1).",
            _TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "kubeinfer_e2e_request_latency_seconds", "Arrival to last token.", _LATENCY_BUCKETS
        )
        self.prompt_tokens = counter("kubeinfer_prompt_tokens_total", "Prompt tokens prefilled.")
        self.generation_tokens = counter("kubeinfer_generation_tokens_total", "Output tokens generated.")
        requests = Counter(
            "kubeinfer_requests_total", "Requests by outcome.", ["model", "outcome"], registry=self.registry
        )
        self.requests = {outcome: requests.labels(model=model, outcome=outcome) for outcome in OUTCOMES}

    def count_request(self, outcome: str) -> None:
        self.requests[outcome].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
