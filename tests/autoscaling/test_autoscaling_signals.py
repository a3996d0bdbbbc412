"""PromQL per engine; fetch_signals against a stand-in Prometheus HTTP API (real client, real HTTP)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from kubeinfer_operator.autoscaling import MetricsUnavailable, engine_metrics, fetch_signals
from kubeinfer_operator.autoscaling.policy import KV_USAGE, OLDEST_WAIT, QUEUE_TIME, SERVED, WAITING
from kubeinfer_operator.autoscaling.signals import arrivals_query, fetch_arrivals_history, queries

Answer = Callable[[str], tuple[int, list[dict]]]  # as the prometheus fixture (conftest.py) takes it


def test_builtin_queries_select_the_service_by_relabelled_labels() -> None:
    q = queries(engine_metrics("builtin"), "team-a", "chat", track="canary")
    sel = '{namespace="team-a",inferenceservice="chat",track="canary"}'
    assert q[QUEUE_TIME] == (
        f"histogram_quantile(0.95, sum by (le) (rate(kubeinfer_request_queue_time_seconds_bucket{sel}[1m])))"
    )
    assert q[OLDEST_WAIT] == f"max(kubeinfer_oldest_waiting_request_age_seconds{sel})"
    assert q[KV_USAGE] == f"avg(avg_over_time(kubeinfer_kv_cache_usage_ratio{sel}[1m]))"
    assert q[WAITING] == f"sum(kubeinfer_requests_waiting{sel})"
    # Requests a replica worked on: all outcomes but those turned away at admission.
    served = '{namespace="team-a",inferenceservice="chat",track="canary",outcome!="rejected"}'
    assert q[SERVED] == f"sum(rate(kubeinfer_requests_total{served}[1m]))"


def test_vllm_queries_use_vllm_names_and_have_no_age_gauge() -> None:
    q = queries(engine_metrics("vllm"), "team-a", "chat")
    assert set(q) == {QUEUE_TIME, KV_USAGE, WAITING, SERVED}
    assert (
        'vllm:request_queue_time_seconds_bucket{namespace="team-a",inferenceservice="chat"}' in q[QUEUE_TIME]
    )
    assert "vllm:kv_cache_usage_perc" in q[KV_USAGE]
    assert "vllm:num_requests_waiting" in q[WAITING]
    assert (
        q[SERVED] == 'sum(rate(vllm:request_success_total{namespace="team-a",inferenceservice="chat"}[1m]))'
    )
    assert all("track" not in promql for promql in q.values())


def test_unknown_engine_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec\.runtime\.engine"):
        engine_metrics("tgi")


def sample(value: str) -> list[dict]:
    return [{"metric": {}, "value": [1700000000.0, value]}]


def test_fetch_reads_every_signal(prometheus: Callable[[Answer], PrometheusConnect]) -> None:
    values = {
        "histogram_quantile": "0.42",
        "oldest_waiting": "1.5",
        "kv_cache": "0.61",
        "requests_waiting": "7",
        "requests_total": "3.5",
    }
    prom = prometheus(lambda q: (200, next(sample(v) for k, v in values.items() if k in q)))
    signals = fetch_signals(prom, engine_metrics("builtin"), "team-a", "chat")
    assert signals == {QUEUE_TIME: 0.42, OLDEST_WAIT: 1.5, KV_USAGE: 0.61, WAITING: 7.0, SERVED: 3.5}


def test_a_percentile_without_requests_is_left_out(prometheus: Callable[[Answer], PrometheusConnect]) -> None:
    prom = prometheus(lambda q: (200, sample("NaN" if "histogram_quantile" in q else "0")))
    signals = fetch_signals(prom, engine_metrics("vllm"), "team-a", "chat")
    assert signals == {KV_USAGE: 0.0, WAITING: 0.0, SERVED: 0.0}
    assert not any(math.isnan(v) for v in signals.values())

    never_observed = prometheus(lambda q: (200, [] if "histogram_quantile" in q else sample("0")))
    assert fetch_signals(never_observed, engine_metrics("vllm"), "team-a", "chat") == signals


def test_a_served_rate_before_any_request_finished_is_left_out(
    prometheus: Callable[[Answer], PrometheusConnect],
) -> None:
    prom = prometheus(lambda q: (200, [] if "requests_total" in q else sample("1")))
    signals = fetch_signals(prom, engine_metrics("builtin"), "team-a", "chat")
    assert SERVED not in signals and signals[WAITING] == 1.0


def test_no_series_means_metrics_unavailable(prometheus: Callable[[Answer], PrometheusConnect]) -> None:
    prom = prometheus(lambda q: (200, []))
    with pytest.raises(MetricsUnavailable, match="no series for kv_usage of team-a/chat"):
        fetch_signals(prom, engine_metrics("builtin"), "team-a", "chat")


def test_prometheus_errors_mean_metrics_unavailable(
    prometheus: Callable[[Answer], PrometheusConnect],
) -> None:
    prom = prometheus(lambda q: (400, []))
    with pytest.raises(MetricsUnavailable, match=r"Prometheus query for \w+ failed"):
        fetch_signals(prom, engine_metrics("builtin"), "team-a", "chat")

    unreachable = PrometheusConnect("http://127.0.0.1:9", retry=Retry(total=0))  # discard port: refused
    with pytest.raises(MetricsUnavailable, match="failed"):
        fetch_signals(unreachable, engine_metrics("builtin"), "team-a", "chat")


def test_slo_readings_are_queried_per_service_over_the_slo_window() -> None:
    from kubeinfer_operator.autoscaling.signals import slo_queries

    builtin = slo_queries(engine_metrics("builtin"), "prod", "chat", "5m")
    assert set(builtin) == {"ttftP95", "tpotP95", "e2eP95", "errorRate"}
    assert "kubeinfer_time_to_first_token_seconds_bucket" in builtin["ttftP95"]
    assert "[5m]" in builtin["tpotP95"] and 'inferenceservice="chat"' in builtin["e2eP95"]
    assert 'outcome=~"error|timeout|rejected"' in builtin["errorRate"]  # refusals count, as the SLO says
    # vLLM exports no failure counter: no error rate is made up for it.
    vllm = slo_queries(engine_metrics("vllm"), "prod", "chat", "5m")
    assert "errorRate" not in vllm and "vllm:time_to_first_token_seconds_bucket" in vllm["ttftP95"]


def test_the_forecast_history_is_the_served_rate_of_every_track() -> None:
    query = arrivals_query(engine_metrics("builtin"), "team-a", "chat")
    assert query == (
        'sum(rate(kubeinfer_requests_total{namespace="team-a",inferenceservice="chat",'
        'outcome!="rejected"}[1m]))'
    )
    assert "track" not in query


def test_the_history_is_one_value_per_step_with_gaps_as_nan(
    prometheus: Callable[[Answer], PrometheusConnect],
) -> None:
    asked: list[str] = []
    now = 1_700_000_600.0
    # Prometheus leaves out the steps where the series had no sample (here the third of five).
    series = [[now - 120, "4"], [now - 90, "5"], [now - 30, "7"], [now, "8"]]

    def answer(query: str) -> tuple[int, list[dict]]:
        asked.append(query)
        return 200, [{"metric": {}, "values": series}]

    history = fetch_arrivals_history(
        prometheus(answer), engine_metrics("builtin"), "team-a", "chat", now, 120, 30
    )
    assert asked == [arrivals_query(engine_metrics("builtin"), "team-a", "chat")]
    assert history[:2] == [4.0, 5.0] and math.isnan(history[2]) and history[3:] == [7.0, 8.0]
