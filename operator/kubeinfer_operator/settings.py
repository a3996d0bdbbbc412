"""Operator configuration, read once from the environment the chart sets."""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kubeinfer/runtime:0.1.0"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class Settings:
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """Image of the builtin engine, for InferenceServices that name none."""
    prometheus_url: str = "http://prometheus-server.monitoring.svc:9090"
    namespaces: tuple[str, ...] = ()
    """Namespaces watched; empty means all."""
    log_level: str = "INFO"
    resync_seconds: float = 60.0
    """Every InferenceService is reconciled at least this often, whatever the watches missed."""
    leader_election: bool = True
    lease_name: str = "kubeinfer-operator"
    lease_namespace: str = "default"
    identity: str = ""
    workers: int = 4
    slo_alerts: bool = True
    """Write a PrometheusRule with the SLO's burn-rate alerts per InferenceService, where the cluster
    serves the PrometheusRule kind (Prometheus Operator)."""
    scrape_annotations: bool = True
    """prometheus.io/scrape annotations on runtime and router pods; off when PodMonitors select them."""
    monitoring_labels: tuple[tuple[str, str], ...] = ()
    """Labels for the PrometheusRules, e.g. the release label a Prometheus' ruleSelector matches."""
    metrics_port: int = 0
    """Port of the operator's own /metrics (API requests, reconciles, memory; replica counts, canary
    weight, scaling decisions); 0: off. The chart sets 8081."""
    probe_service_url: bool = False
    """Probe each InferenceService's URL (its Service, through the cluster's proxies) before calling it
    Ready and before deleting the objects of a routing it left. Needs the operator inside the cluster;
    off, Ready pods behind the Service are taken as the URL answering."""
    allowed_host_paths: tuple[str, ...] = ()
    """Directories (and what is under them) a hostPath model source may name; empty: none
    (serving_policy.py)."""
    allowed_image_prefixes: tuple[str, ...] = ()
    """Prefixes spec.runtime.image must start with; empty: any image."""
    router_cluster_role: str = "kubeinfer-router"
    """The chart's ClusterRole for router pods, the only role the operator may bind."""


def _flag(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes"):
        return True
    if lowered in ("0", "false", "no"):
        return False
    raise ValueError(f"{name}={value!r}: expected true or false")


def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    """Settings from KUBEINFER_* variables; a bad value raises ValueError naming the variable."""
    defaults = Settings()
    level = env.get("KUBEINFER_LOG_LEVEL", defaults.log_level).upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"KUBEINFER_LOG_LEVEL={level!r}: expected one of {', '.join(LOG_LEVELS)}")
    try:
        resync = float(env.get("KUBEINFER_RESYNC_SECONDS", defaults.resync_seconds))
        workers = int(env.get("KUBEINFER_WORKERS", defaults.workers))
    except ValueError as error:
        raise ValueError(f"KUBEINFER_RESYNC_SECONDS / KUBEINFER_WORKERS: {error}") from None
    if resync <= 0 or workers < 1:
        raise ValueError("KUBEINFER_RESYNC_SECONDS must be > 0 and KUBEINFER_WORKERS >= 1")
    pod = env.get("POD_NAME") or socket.gethostname()
    labels = _labels("KUBEINFER_MONITORING_LABELS", env.get("KUBEINFER_MONITORING_LABELS", ""))
    try:
        metrics_port = int(env.get("KUBEINFER_METRICS_PORT", defaults.metrics_port))
    except ValueError:
        raise ValueError(
            f"KUBEINFER_METRICS_PORT={env['KUBEINFER_METRICS_PORT']!r}: expected a port"
        ) from None
    return Settings(
        runtime_image=env.get("KUBEINFER_RUNTIME_IMAGE", defaults.runtime_image),
        prometheus_url=env.get("KUBEINFER_PROMETHEUS_URL", defaults.prometheus_url),
        namespaces=tuple(ns.strip() for ns in env.get("KUBEINFER_NAMESPACES", "").split(",") if ns.strip()),
        log_level=level,
        resync_seconds=resync,
        leader_election=_flag("KUBEINFER_LEADER_ELECTION", env.get("KUBEINFER_LEADER_ELECTION", "true")),
        lease_name=env.get("KUBEINFER_LEASE_NAME", defaults.lease_name),
        lease_namespace=env.get("POD_NAMESPACE", defaults.lease_namespace),
        # Unique per process: a restarted pod with the same name must not inherit the old lease.
        identity=f"{pod}_{uuid.uuid4().hex[:8]}",
        workers=workers,
        slo_alerts=_flag("KUBEINFER_SLO_ALERTS", env.get("KUBEINFER_SLO_ALERTS", "true")),
        scrape_annotations=_flag(
            "KUBEINFER_SCRAPE_ANNOTATIONS", env.get("KUBEINFER_SCRAPE_ANNOTATIONS", "true")
        ),
        monitoring_labels=labels,
        metrics_port=metrics_port,
        # In a pod the cluster's Service addresses are reachable: probe there unless told not to.
        router_cluster_role=env.get("KUBEINFER_ROUTER_CLUSTER_ROLE", defaults.router_cluster_role),
        allowed_host_paths=_strings("KUBEINFER_ALLOWED_HOST_PATHS", env, absolute=True),
        allowed_image_prefixes=_strings("KUBEINFER_ALLOWED_IMAGE_PREFIXES", env),
        probe_service_url=_flag(
            "KUBEINFER_PROBE_SERVICE_URL",
            env.get("KUBEINFER_PROBE_SERVICE_URL", "true" if env.get("KUBERNETES_SERVICE_HOST") else "false"),
        ),
    )


def _labels(name: str, value: str) -> tuple[tuple[str, str], ...]:
    """A JSON object of string labels (the chart writes it with toJson); empty means none."""
    if not value.strip():
        return ()
    parsed = _json(name, value)
    if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
        raise ValueError(f"{name}={value!r}: expected a JSON object of string values")
    return tuple(sorted(parsed.items()))


def _strings(name: str, env: Mapping[str, str], absolute: bool = False) -> tuple[str, ...]:
    """A JSON list of non-empty strings (the chart writes it with toJson); unset or empty means none."""
    value = env.get(name, "")
    if not value.strip():
        return ()
    parsed = _json(name, value)
    if not isinstance(parsed, list) or not all(isinstance(v, str) and v for v in parsed):
        raise ValueError(f"{name}={value!r}: expected a JSON list of non-empty strings")
    if absolute and not all(v.startswith("/") for v in parsed):
        raise ValueError(f"{name}={value!r}: every entry must be an absolute path")
    return tuple(parsed)


def _json(name: str, value: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"{name}: not JSON: {error}") from None
