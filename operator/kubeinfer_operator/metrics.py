"""The operator's own metrics, served with the services' (service_metrics.py) on its metrics port: what
it asks of the apiserver and how often it reconciles, so its cost per InferenceService can be watched
(benchmarks/operator_scale.py reads them), beside the process metrics prometheus_client exports
(resident memory, CPU seconds)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

API_REQUESTS = Counter(
    "kubeinfer_operator_api_requests",
    "Requests the operator sent to the Kubernetes API, by verb (get, list, apply, patch, delete, create) "
    "and kind; the watches kopf holds open are not counted.",
    ["verb", "kind"],
)
RECONCILES = Counter("kubeinfer_operator_reconciles", "Reconciles run, by outcome.", ["outcome"])
RECONCILE_SECONDS = Histogram(
    "kubeinfer_operator_reconcile_duration_seconds",
    "Time one reconcile of one InferenceService took, API requests included.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
