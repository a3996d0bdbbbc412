"""The operator's /metrics: status fields as gauges, scaling decisions counted once each, served over HTTP."""

from __future__ import annotations

import socket

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from kubeinfer_operator.service_metrics import ServiceMetrics, serve

DECISION = {"time": "2026-12-01T10:00:00Z", "signal": "queueTime", "fromReplicas": 1, "toReplicas": 2}
STATUS = {
    "desiredReplicas": 2,
    "readyReplicas": 1,
    "replicas": 2,
    "conditions": [{"type": "Ready", "status": "True", "reason": "Serving"}],
    "scalingDecisions": [DECISION],
}


def exposition(metrics: ServiceMetrics) -> str:
    registry = CollectorRegistry()
    registry.register(metrics)
    return generate_latest(registry).decode()


def test_status_becomes_series_labelled_by_service() -> None:
    metrics = ServiceMetrics()
    metrics.observe("llm", "chat", STATUS)
    text = exposition(metrics)
    labels = 'inferenceservice="chat",inferenceservice_namespace="llm"'
    assert f"kubeinfer_inferenceservice_desired_replicas{{{labels}}} 2.0" in text
    assert f"kubeinfer_inferenceservice_ready_replicas{{{labels}}} 1.0" in text
    assert f"kubeinfer_inferenceservice_canary_weight_percent{{{labels}}} 0.0" in text  # no canary: 0
    assert 'condition="Ready",' in text and 'status="True"' in text


def test_each_decision_counts_once_however_often_status_is_seen() -> None:
    metrics = ServiceMetrics()
    metrics.observe("llm", "chat", STATUS)
    metrics.observe("llm", "chat", STATUS)
    down = {**DECISION, "time": "2026-12-01T10:05:00Z", "fromReplicas": 2, "toReplicas": 1}
    metrics.observe("llm", "chat", {**STATUS, "scalingDecisions": [DECISION, down]})
    counts = {
        line.split('direction="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition(metrics).splitlines()
        if line.startswith("kubeinfer_inferenceservice_scaling_decisions_total")
    }
    assert counts == {"up": 1.0, "down": 1.0}


def test_a_deleted_service_leaves_no_series() -> None:
    metrics = ServiceMetrics()
    metrics.observe("llm", "chat", STATUS)
    metrics.forget("llm", "chat")
    assert 'inferenceservice="chat"' not in exposition(metrics)


def test_served_over_http() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = serve(port)
    metrics.observe("llm", "chat", STATUS)
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "kubeinfer_inferenceservice_desired_replicas" in body
