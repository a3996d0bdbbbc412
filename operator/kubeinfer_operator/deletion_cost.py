"""Which replica a scale-down removes: the one with the least work.

The ReplicaSet controller removes, among Ready pods, those with the lowest
`controller.kubernetes.io/pod-deletion-cost` first. Just before the operator lowers a Deployment's replica
count, each of its Ready pods gets as its cost the requests it is working on (running + waiting, from
Prometheus through the engine's metric adapter), so the pod dropped is the one whose requests the others
have least to absorb. Set only then, not on every tick: Kubernetes advises against updating the annotation
often, and the apiserver would see a pod write per replica per interval for nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import requests
from prometheus_api_client import PrometheusApiClientException

from kubeinfer_operator.engine_metrics import EngineMetrics
from kubeinfer_operator.prometheus import MetricsUnavailable, connect

log = logging.getLogger(__name__)

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MAX_COST = 2**31 - 1  # the annotation is an int32


def work_query(metrics: EngineMetrics, namespace: str, name: str) -> str:
    """PromQL: requests running plus waiting, per pod of one InferenceService."""
    names = f"{metrics.running}|{metrics.waiting}"
    labels = f'namespace="{_escape(namespace)}",inferenceservice="{_escape(name)}"'
    return f'sum by (pod) ({{__name__=~"{names}",{labels}}})'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def fetch_work(url: str, metrics: EngineMetrics, namespace: str, name: str) -> dict[str, float]:
    """Requests in flight per pod name; MetricsUnavailable when Prometheus cannot say."""
    try:
        result = connect(url).custom_query(work_query(metrics, namespace, name))
    except (requests.RequestException, PrometheusApiClientException) as error:
        raise MetricsUnavailable(f"Prometheus query failed: {error}") from error
    return {r["metric"]["pod"]: float(r["value"][1]) for r in result if "pod" in r.get("metric", {})}


def cost_of(work: float) -> int:
    return min(MAX_COST, max(0, math.ceil(work))) if math.isfinite(work) else MAX_COST


def cost_updates(pods: list[dict[str, Any]], work: Mapping[str, float]) -> tuple[tuple[str, str], ...]:
    """(pod, annotation value) for each live pod with a reading whose annotation says otherwise. A pod
    without a reading keeps what it has: not-Ready pods, which have none yet, go first regardless."""
    updates = []
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or meta["name"] not in work:
            continue
        value = str(cost_of(work[meta["name"]]))
        if (meta.get("annotations") or {}).get(ANNOTATION) != value:
            updates.append((meta["name"], value))
    return tuple(updates)


def scaling_down(
    deployments: list[dict[str, Any]], apply: tuple[dict[str, Any], ...], scale: tuple[tuple[str, int], ...]
) -> bool:
    """Whether the plan lowers the replica count of a Deployment that keeps running (a retired one goes
    whole, and which of its pods goes first does not matter)."""
    planned = dict(scale) | {
        o["metadata"]["name"]: o["spec"]["replicas"] for o in apply if o["kind"] == "Deployment"
    }
    return any(
        0 < planned[d["metadata"]["name"]] < (d.get("spec") or {}).get("replicas", 1)
        for d in deployments
        if d["metadata"]["name"] in planned
    )
