"""Replica autoscaling from LLM load: the pure policy (policy.py) and its Prometheus signals (signals.py)."""

from kubeinfer_operator.autoscaling.policy import (
    Condition,
    Decision,
    Observation,
    Predictive,
    ScalingConfig,
    ScalingState,
    Targets,
    Term,
    decide,
)
from kubeinfer_operator.autoscaling.signals import MetricsUnavailable, Signals, engine_metrics, fetch_signals

__all__ = [
    "Condition",
    "Decision",
    "MetricsUnavailable",
    "Observation",
    "Predictive",
    "ScalingConfig",
    "ScalingState",
    "Signals",
    "Targets",
    "Term",
    "decide",
    "engine_metrics",
    "fetch_signals",
]
