"""The chart's monitoring switches, rendered by the real helm: scrape annotations by default, PodMonitors
instead with monitoring.prometheusOperator, the dashboard ConfigMap; and the operator's side of the switch
(no annotations on the pods it renders)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer_operator import dashboard
from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.render import Owner, render_pod_template
from kubeinfer_operator.router_render import render_router
from kubeinfer_operator.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeinfer"


@pytest.fixture(scope="module")
def helm() -> Path:
    from localcluster.cluster import binaries

    return binaries() / "helm"


def template(helm: Path, *sets: str, namespace: str = "kubeinfer-system") -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "kubeinfer",
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version=1.34.4",
            *sets,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operator_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(docs, "Deployment")
    return deployment["spec"]["template"]


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in operator_pod(docs)["spec"]["containers"][0]["env"]}


@pytest.mark.slow  # helm: built with the cluster binaries on first use
def test_default_scrapes_by_annotation_and_writes_alert_rules(helm: Path) -> None:
    docs = template(helm)
    assert by_kind(docs, "PodMonitor") == []
    annotations = operator_pod(docs)["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8081"
    settings = load_settings(env(docs))
    assert (settings.scrape_annotations, settings.slo_alerts, settings.metrics_port) == (True, True, 8081)


@pytest.mark.slow  # helm: built with the cluster binaries on first use
def test_prometheus_operator_switch_renders_pod_monitors_instead(helm: Path) -> None:
    docs = template(
        helm,
        "--set",
        "monitoring.prometheusOperator=true",
        "--set",
        "monitoring.labels.release=kube-prometheus-stack",
        "--set-json",
        'watchNamespaces=["llm"]',
    )
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "PodMonitor")}
    assert set(monitors) == {"kubeinfer-operator", "kubeinfer-operator-runtime", "kubeinfer-operator-router"}
    runtime = monitors["kubeinfer-operator-runtime"]["spec"]
    assert runtime["selector"]["matchLabels"]["app.kubernetes.io/name"] == "kubeinfer-runtime"
    assert runtime["namespaceSelector"] == {"matchNames": ["llm"]}
    targets = {r["targetLabel"] for r in runtime["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {"inferenceservice", "revision", "track"}
    router = monitors["kubeinfer-operator-router"]["spec"]["podMetricsEndpoints"][0]
    assert {r["targetLabel"] for r in router["relabelings"]} == {"inferenceservice"}  # no exported_track
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors.values())
    assert "prometheus.io/scrape" not in (operator_pod(docs)["metadata"].get("annotations") or {})
    settings = load_settings(env(docs))
    assert settings.scrape_annotations is False
    assert dict(settings.monitoring_labels) == {"release": "kube-prometheus-stack"}


@pytest.mark.slow  # helm: built with the cluster binaries on first use
def test_the_operator_may_write_prometheus_rules(helm: Path) -> None:
    (role,) = [
        r for r in by_kind(template(helm), "ClusterRole") if r["metadata"]["name"] == "kubeinfer-operator"
    ]
    rule = next(r for r in role["rules"] if "monitoring.coreos.com" in r["apiGroups"])
    assert rule["resources"] == ["prometheusrules"]
    assert set(rule["verbs"]) == {"list", "create", "patch", "delete"}


@pytest.mark.slow  # helm: built with the cluster binaries on first use
def test_dashboard_configmap_carries_the_generated_dashboard(helm: Path) -> None:
    (config_map,) = by_kind(template(helm), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["kubeinfer.json"]) == dashboard.dashboard()
    assert by_kind(template(helm, "--set", "dashboards.enabled=false"), "ConfigMap") == []


def test_the_charts_dashboard_is_fresh() -> None:
    assert dashboard.main(["--check"]) == 0, "run `make dashboards`"


def test_every_panel_queries_prometheus_with_the_dashboard_variables() -> None:
    board = dashboard.dashboard()
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "namespace", "service", "revision"}
    titles = {p["title"] for p in board["panels"]}
    for wanted in ("Time to first token", "Queue time", "KV-cache usage", "Desired vs ready replicas"):
        assert wanted in titles
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert "$service" in target["expr"] and "$namespace" in target["expr"], target["expr"]


SPEC = InferenceServiceSpec.model_validate({"model": {"name": "m", "source": {"hostPath": {"path": "/m"}}}})
OWNER = Owner("svc", "ns", "uid")


def test_pods_carry_scrape_annotations_unless_pod_monitors_select_them() -> None:
    annotated = render_pod_template(OWNER, SPEC, Settings()).template["metadata"]
    assert annotated["annotations"]["prometheus.io/scrape"] == "true"
    plain = render_pod_template(OWNER, SPEC, Settings(scrape_annotations=False)).template["metadata"]
    assert "annotations" not in plain
    router = next(
        o for o in render_router(OWNER, Settings(scrape_annotations=False), {}) if o["kind"] == "Deployment"
    )
    assert "annotations" not in router["spec"]["template"]["metadata"]
