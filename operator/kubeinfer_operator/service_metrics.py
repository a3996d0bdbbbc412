"""The operator's own /metrics: what status says about each InferenceService, as Prometheus series, so a
dashboard can draw desired against ready replicas, the canary weight and the scaling decisions.

Every operator replica exports what it watches (the standby as well as the leader: the values come from
the objects, not from who acts), so dashboards aggregate with max. The label is `inferenceservice_namespace`,
not `namespace`: a scrape attaches the operator pod's own `namespace`, which would rename ours.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LABELS = ("inferenceservice_namespace", "inferenceservice")
GAUGES = {
    # status field -> (metric, help)
    "desiredReplicas": ("kubeinfer_inferenceservice_desired_replicas", "Replicas the operator wants."),
    "replicas": ("kubeinfer_inferenceservice_replicas", "Replica pods that exist, all revisions."),
    "readyReplicas": ("kubeinfer_inferenceservice_ready_replicas", "Replicas serving traffic."),
    "canaryWeight": ("kubeinfer_inferenceservice_canary_weight_percent", "Traffic percent on the canary."),
}


class ServiceMetrics(Collector):
    """Holds the last status seen per InferenceService; rendered at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[tuple[str, str], dict[str, Any]] = {}
        # (namespace, name) -> decisions counted, by (signal, direction); and the decision times seen
        self._decisions: dict[tuple[str, str], dict[tuple[str, str], int]] = {}
        self._seen: dict[tuple[str, str], set[str]] = {}

    def observe(self, namespace: str, name: str, status: dict[str, Any] | None) -> None:
        key = (namespace, name)
        status = status or {}
        with self._lock:
            self._status[key] = status
            seen = self._seen.setdefault(key, set())
            counts = self._decisions.setdefault(key, {})
            for decision in status.get("scalingDecisions") or []:
                stamp = f"{decision.get('time')}|{decision.get('signal')}|{decision.get('toReplicas')}"
                if stamp in seen:
                    continue
                seen.add(stamp)
                label = (str(decision.get("signal", "")), direction(decision))
                counts[label] = counts.get(label, 0) + 1
            # status keeps the last 20 decisions: remembering more than those would only grow
            live = {
                f"{d.get('time')}|{d.get('signal')}|{d.get('toReplicas')}"
                for d in status.get("scalingDecisions") or []
            }
            seen.intersection_update(live)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        with self._lock:
            for table in (self._status, self._decisions, self._seen):
                table.pop(key, None)

    def collect(self) -> list[Metric]:
        with self._lock:
            statuses = dict(self._status)
            decisions = {k: dict(v) for k, v in self._decisions.items()}
        families: list[Metric] = []
        for field, (metric, doc) in GAUGES.items():
            family = GaugeMetricFamily(metric, doc, labels=list(LABELS))
            for (namespace, name), status in sorted(statuses.items()):
                value = status.get(field)
                # No canary: weight 0, so the panel shows a line at 0 rather than "no data".
                if value is None and field == "canaryWeight":
                    value = 0
                if isinstance(value, int | float):
                    family.add_metric([namespace, name], float(value))
            families.append(family)
        ready = GaugeMetricFamily(
            "kubeinfer_inferenceservice_condition",
            "1 for each condition's current status, as kube-state-metrics reports conditions.",
            labels=[*LABELS, "condition", "status", "reason"],
        )
        for (namespace, name), status in sorted(statuses.items()):
            for condition in status.get("conditions") or []:
                ready.add_metric(
                    [namespace, name, condition.get("type", ""), condition.get("status", ""),
                     condition.get("reason", "")],
                    1.0,
                )  # fmt: skip
        families.append(ready)
        counter = CounterMetricFamily(
            "kubeinfer_inferenceservice_scaling_decisions",
            "Autoscaler decisions recorded in status.scalingDecisions, by signal and direction.",
            labels=[*LABELS, "signal", "direction"],
        )
        for (namespace, name), counts in sorted(decisions.items()):
            for (signal, way), count in sorted(counts.items()):
                counter.add_metric([namespace, name, signal, way], float(count))
        families.append(counter)
        return families


def direction(decision: dict[str, Any]) -> str:
    before, after = decision.get("fromReplicas", 0), decision.get("toReplicas", 0)
    return "up" if after > before else "down" if after < before else "hold"


def serve(port: int, registry: CollectorRegistry = REGISTRY) -> ServiceMetrics:
    """Start the /metrics endpoint on `port` (a daemon thread) and return the collector it renders. The
    default registry also holds the operator's own counters (metrics.py) and the process metrics."""
    metrics = ServiceMetrics()
    registry.register(metrics)
    start_http_server(port, registry=registry)
    return metrics
