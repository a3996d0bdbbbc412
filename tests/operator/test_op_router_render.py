"""The router objects a Canary InferenceService gets."""

from __future__ import annotations

import json

from op_fixtures import OWNER

from kubeinfer_operator.api.spec import EnvVar
from kubeinfer_operator.names import LABEL_ISVC, LABEL_TRACK
from kubeinfer_operator.router_render import render_router, render_router_service, tracing_env
from kubeinfer_operator.settings import Settings

CONFIG = {"tracks": {"stable": {"weight": 90, "endpoints": ["http://10.0.0.1:8000"]}}}


def _by_kind() -> dict[str, dict]:
    objects = [
        *render_router(
            OWNER, Settings(runtime_image="img:1", router_cluster_role="kubeinfer-e2e-router"), CONFIG
        ),
        render_router_service(OWNER),
    ]
    return {o["kind"]: o for o in objects}


def test_access_objects_come_before_the_pods_that_use_them() -> None:
    kinds = [o["kind"] for o in render_router(OWNER, Settings(), CONFIG)]
    assert kinds == ["ServiceAccount", "RoleBinding", "ConfigMap", "Deployment"]


def test_the_router_gets_the_charts_cluster_role_bound_and_no_role_of_its_own() -> None:
    objs = _by_kind()
    assert "Role" not in objs
    binding = objs["RoleBinding"]
    assert binding["metadata"]["name"] == "tiny-router-config-reader"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "kubeinfer-e2e-router",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tiny-router", "namespace": "default"}]
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tiny-router"
    assert pod["containers"][0]["args"] == ["--configmap", "default/tiny-router", "--port", "8080"]
    assert pod["containers"][0]["image"] == "img:1"


def test_the_config_map_carries_the_tracks_as_json() -> None:
    assert json.loads(_by_kind()["ConfigMap"]["data"]["router.json"]) == CONFIG


def test_the_service_selects_the_router_pods_which_prometheus_scrapes_without_a_track_label() -> None:
    objs = _by_kind()
    template = objs["Deployment"]["spec"]["template"]
    assert objs["Service"]["metadata"]["name"] == "tiny"
    assert objs["Service"]["spec"]["selector"] == template["metadata"]["labels"]
    assert template["metadata"]["labels"][LABEL_ISVC] == "tiny"
    assert LABEL_TRACK not in template["metadata"]["labels"]  # else the router's own `track` is renamed
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "8080"
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid for o in objs.values())


def test_the_router_shares_the_replicas_opentelemetry_settings_but_not_their_service_name() -> None:
    runtime_env = [
        EnvVar(name="OTEL_EXPORTER_OTLP_ENDPOINT", value="http://jaeger.observability:4318"),
        EnvVar(name="OTEL_SERVICE_NAME", value="chat-runtime"),
        EnvVar(
            name="OTEL_EXPORTER_OTLP_HEADERS", value_from={"secretKeyRef": {"name": "otlp", "key": "headers"}}
        ),
        EnvVar(name="HF_TOKEN", value="secret"),
    ]
    env = tracing_env(runtime_env)
    assert env == [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://jaeger.observability:4318"},
        {
            "name": "OTEL_EXPORTER_OTLP_HEADERS",
            "valueFrom": {"secretKeyRef": {"name": "otlp", "key": "headers"}},
        },
    ]
    deployment = render_router(OWNER, Settings(), CONFIG, env)[-1]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["env"] == env
    # Without any, the container has no env at all (the router's pods are not rolled for nothing).
    assert "env" not in _by_kind()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
