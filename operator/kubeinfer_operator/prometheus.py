"""The operator's one Prometheus client: one timeout, one error type, for the autoscaler and the canary
analysis alike (prometheus-api-client underneath)."""

from __future__ import annotations

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

# A tick or an analysis holds its key's work item: never wait on Prometheus for long. One try: the next
# tick or analysis is the retry, and a blackholed Prometheus must not hold a worker for minutes.
TIMEOUT_S = 5.0


class MetricsUnavailable(Exception):
    """Prometheus could not be reached or answered with an error: hold, do not guess."""


def connect(url: str) -> PrometheusConnect:
    return PrometheusConnect(url, disable_ssl=True, timeout=TIMEOUT_S, retry=Retry(total=0))


def instant(prom: PrometheusConnect, expr: str, at: float | None = None) -> float | None:
    """One instant query (at `at`, epoch seconds, or now): its first value, None when the result is
    empty; NaN as Prometheus gives it (a percentile over no samples)."""
    params = {"time": f"{at:.3f}"} if at is not None else None
    try:
        result = prom.custom_query(expr, params=params)
    except (requests.RequestException, PrometheusApiClientException) as error:
        raise MetricsUnavailable(f"Prometheus query failed: {error}") from error
    return float(result[0]["value"][1]) if result else None
