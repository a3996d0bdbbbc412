"""The chart's security settings, rendered by the real helm."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from test_op_monitoring_chart import CHART, helm, template  # noqa: F401  (helm is the fixture the tests take)

from kubeinfer_operator.settings import load_settings

LOOKALIKES = ["on", "null", "true", "yes", "2024", "1e3"]


def test_namespaces_yaml_would_retype_render_as_strings(helm: Path) -> None:  # noqa: F811
    docs = template(helm, "--set-json", f"watchNamespaces={json.dumps(LOOKALIKES)}", namespace="on")
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert [b["metadata"]["namespace"] for b in bindings] == LOOKALIKES
    assert all(b["subjects"][0]["namespace"] == "on" for b in bindings)
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert namespaced and all(d["metadata"]["namespace"] == "on" for d in namespaced if d not in bindings)


def _operator_env(docs: list[dict]) -> dict[str, str]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_chart_allows_no_host_path_and_any_image_by_default(helm: Path) -> None:  # noqa: F811
    env = _operator_env(template(helm))
    assert json.loads(env["KUBEINFER_ALLOWED_HOST_PATHS"]) == []
    assert json.loads(env["KUBEINFER_ALLOWED_IMAGE_PREFIXES"]) == []
    assert load_settings(env).allowed_host_paths == ()


def test_the_security_values_reach_the_operator(helm: Path) -> None:  # noqa: F811
    security = {"allowedHostPaths": ["/var/lib/kubeinfer/models"], "allowedImagePrefixes": ["registry.corp/"]}
    docs = template(helm, "--set-json", f"security={json.dumps(security)}")
    settings = load_settings(_operator_env(docs))
    assert settings.allowed_host_paths == ("/var/lib/kubeinfer/models",)
    assert settings.allowed_image_prefixes == ("registry.corp/",)


def test_a_relative_host_path_is_refused_by_the_charts_schema(helm: Path) -> None:  # noqa: F811
    rendered = subprocess.run(
        [str(helm), "template", "k", str(CHART), "--set-json", 'security.allowedHostPaths=["models"]'],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode != 0 and "allowedHostPaths" in rendered.stderr


def _rules(docs: list[dict], name: str) -> list[dict]:
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    return role["rules"]


def test_the_operator_may_bind_only_the_routers_cluster_role_and_make_no_roles(helm: Path) -> None:  # noqa: F811
    docs = template(helm)
    rules = _rules(docs, "kubeinfer-operator")
    rbac = [r for r in rules if "rbac.authorization.k8s.io" in r["apiGroups"]]
    assert {(res, verb) for r in rbac for res in r["resources"] for verb in r["verbs"]} == {
        *(("rolebindings", verb) for verb in ("list", "watch", "create", "patch", "delete")),
        ("clusterroles", "bind"),
    }
    (bind,) = [r for r in rbac if "bind" in r["verbs"]]
    assert bind["resourceNames"] == ["kubeinfer-router"]
    assert not any("secrets" in r["resources"] for r in rules)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    assert _rules(docs, "kubeinfer-router") == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    ]
    env = _operator_env(docs)
    assert load_settings(env).router_cluster_role == "kubeinfer-router"
