"""The operator's one Prometheus client: one timeout, one error type, for the autoscaler and the canary
analysis alike (prometheus-api-client underneath)."""

from __future__ import annotations

import datetime as dt
import math

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


def range_values(prom: PrometheusConnect, expr: str, start: float, end: float, step_s: float) -> list[float]:
    """One range query over [start, end] (epoch seconds) at step_s: the first series' value at each step,
    NaN where it has no sample (a gap: the forecaster skips it); [] when the result is empty."""
    try:
        result = prom.custom_query_range(
            expr,
            start_time=dt.datetime.fromtimestamp(start, dt.UTC),
            end_time=dt.datetime.fromtimestamp(end, dt.UTC),
            step=f"{step_s:g}s",
        )
    except (requests.RequestException, PrometheusApiClientException) as error:
        raise MetricsUnavailable(f"Prometheus range query failed: {error}") from error
    if not result:
        return []
    steps = int((end - start) // step_s) + 1
    values = [math.nan] * steps
    for stamp, value in result[0]["values"]:
        index = round((float(stamp) - start) / step_s)
        if 0 <= index < steps:
            values[index] = float(value)
    return values
