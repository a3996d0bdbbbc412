"""Each engine's metric names: the one adapter the autoscaler and the canary analysis both read through,
so a service on vLLM is scaled and judged on vLLM's series exactly as one on the builtin engine is on
kubeinfer's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineMetrics:
    waiting: str  # gauge: requests waiting to be scheduled
    running: str  # gauge: requests in the running batch
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
        running="kubeinfer_requests_running",
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
        running="vllm:num_requests_running",
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
