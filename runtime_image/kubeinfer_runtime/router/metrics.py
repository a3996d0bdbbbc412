"""The router's own per-track metrics: the canary analysis reads requests, errors, TTFT and E2E from here.

`kubeinfer_router_requests_total{track, code}` is what the client got; `code` is the status the router
attributes to the request: the backend's status, 502 when no replica
answered or a stream was cut after it started (the client saw 200 headers but a truncated body), 499 when
the client went away, 503 when no track had endpoints. `kubeinfer_router_upstream_attempts_total{track, code}`
counts every attempt at a replica under that replica's track, retried or not (code `transport` when no
HTTP answer came or a stream was cut): the canary analysis reads error rates from it. Retries are counted
by the track whose attempt failed, and retries the budget refused separately.
Latency is measured from the start of the attempt that served the request, so a retry's wait on a failed
canary replica is not charged to the stable replica that answered.

The router sees SSE chunks, not tokens: TTFT is the time to the first body chunk of a streamed response
and inter-token latency the gap between chunks. Servers flush one event per token, so this matches
what a client sees. Non-streamed responses count towards requests and E2E only.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class RouterMetrics:
    def __init__(self) -> None:
        # A registry per router instance, so tests can run several routers in one process.
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kubeinfer_router_requests",
            "Requests the router finished, by track and status code.",
            ["track", "code"],
            registry=self.registry,
        )
        self.attempts = Counter(
            "kubeinfer_router_upstream_attempts",
            "Attempts sent to replicas, by the replica's track and the outcome (HTTP status, or transport).",
            ["track", "code"],
            registry=self.registry,
        )
        self.retries = Counter(
            "kubeinfer_router_retries",
            "Failed attempts retried on another replica, by the failed attempt's track and outcome.",
            ["track", "reason"],
            registry=self.registry,
        )
        self.retries_denied = Counter(
            "kubeinfer_router_retries_denied",
            "Failed attempts not retried because the retry budget was spent, by track.",
            ["track"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "kubeinfer_router_time_to_first_token_seconds",
            "Time from the router receiving a streamed request to forwarding its first chunk.",
            ["track"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "kubeinfer_router_inter_token_latency_seconds",
            "Gap between consecutive chunks of a streamed response.",
            ["track"],
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "kubeinfer_router_e2e_request_latency_seconds",
            "Time from the router receiving a request to forwarding the last byte of its response.",
            ["track"],
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
