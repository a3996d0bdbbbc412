"""The objects of an InferenceService's router (Canary strategy): its Deployment, the ServiceAccount and
the RoleBinding to the chart's router ClusterRole that let it read its ConfigMap, the ConfigMap carrying
the tracks, and the Service, which then selects the router pods instead of the replicas.

The operator creates no Role: it may only bind the one ClusterRole the chart installs (RBAC `bind` with
resourceNames), so whoever controls an InferenceService cannot have the operator grant anything else.

The router reads its ConfigMap through the API (kubeinfer_runtime.router.configmap_source) rather than
from a mounted volume: a kubelet refreshes mounted ConfigMaps only every minute or so, and a rollback
must take the canary's weight to 0 within seconds.
"""

from __future__ import annotations

import json
from typing import Any

from kubeinfer_operator.api.spec import EnvVar
from kubeinfer_operator.names import FIELD_MANAGER, LABEL_APP, LABEL_ISVC, LABEL_MANAGED_BY, SERVICE_PORT
from kubeinfer_operator.render import PRE_STOP_SECONDS, Owner, _render, render_service
from kubeinfer_operator.settings import Settings

ROUTER_APP = "kubeinfer-router"
ROUTER_PORT = 8080
ROUTER_REPLICAS = 2  # the router is the service's front door: one may restart while the other serves
ROUTER_CONFIG_KEY = "router.json"  # kubeinfer_runtime.router.configmap_source.CONFIG_KEY
ROUTER_GRACE_SECONDS = 60


def router_name(isvc: str) -> str:
    return f"{isvc}-router"


def router_binding_name(isvc: str) -> str:
    """Not the router's own name: RoleBindings of that name (roleRef a per-service Role, before the
    ClusterRole) cannot change their roleRef, so the new binding is a new object and the old one pruned."""
    return f"{router_name(isvc)}-config-reader"


def router_labels(isvc: str) -> dict[str, str]:
    """Carries the InferenceService label (the operator's watches and Prometheus' `inferenceservice`
    label need it), but neither revision nor track."""
    return {LABEL_APP: ROUTER_APP, LABEL_ISVC: isvc, LABEL_MANAGED_BY: FIELD_MANAGER}


def tracing_env(runtime_env: list[EnvVar]) -> list[dict[str, Any]]:
    """The OpenTelemetry settings of spec.runtime.env (OTEL_*), which the router shares with the replicas
    so that its spans reach the same collector; the service name stays the router's own."""
    return [
        e.model_dump(by_alias=True, exclude_none=True)
        for e in runtime_env
        if e.name.startswith("OTEL_") and e.name != "OTEL_SERVICE_NAME"
    ]


def render_router(
    owner: Owner, settings: Settings, config: dict[str, Any], env: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Everything the router needs, in the order to apply it (access before the pods that use it); the
    Service in front of it is render_router_service's. `env` goes into the router's container."""
    name, labels = router_name(owner.name), router_labels(owner.name)
    common = {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels,
        "owner_reference": owner.reference(),
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "data": {ROUTER_CONFIG_KEY: json.dumps(config, sort_keys=True)},
    }
    deployment = _render(
        "router-deployment.yaml.j2",
        **common,
        replicas=ROUTER_REPLICAS,
        image=settings.runtime_image,
        port=ROUTER_PORT,
        args=["--configmap", f"{owner.namespace}/{name}", "--port", str(ROUTER_PORT)],
        scrape_annotations=settings.scrape_annotations,
        grace_seconds=ROUTER_GRACE_SECONDS,
        pre_stop_seconds=PRE_STOP_SECONDS,
        env=env or [],
    )
    access = _render(
        "router-access.yaml.j2",
        **common,
        binding_name=router_binding_name(owner.name),
        cluster_role=settings.router_cluster_role,
    )
    return [*access, config_map, deployment]


def render_router_service(owner: Owner) -> dict[str, Any]:
    """The InferenceService's Service while it routes through the router: it selects the router pods."""
    labels = router_labels(owner.name)
    return _render(
        "service.yaml.j2",
        name=owner.name,
        namespace=owner.namespace,
        labels=labels,
        owner_reference=owner.reference(),
        selector=labels,
        service_port=SERVICE_PORT,
    )


def render_front_service(owner: Owner, selects_router: bool) -> dict[str, Any]:
    """The Service behind status.url, selecting the router's pods or the replicas (serving_path.py)."""
    return render_router_service(owner) if selects_router else render_service(owner)
