"""Names and user strings YAML would re-type (`on` is true, `null` is None, `2024` an int) reach the
objects the operator writes as the strings they are, in every template."""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from typing import Any

import pytest
from op_fixtures import example, spec_of

from kubeinfer_operator.api.spec import GatewayAPIRouting
from kubeinfer_operator.data_templates import TemplateValueError, environment, render_data
from kubeinfer_operator.gateway_render import render_http_route, render_track_service
from kubeinfer_operator.render import (
    Owner,
    render_deployment,
    render_pdb,
    render_pod_template,
    render_service,
)
from kubeinfer_operator.router_render import render_router, render_router_service, router_labels
from kubeinfer_operator.settings import Settings

YAML_LOOKALIKES = ["on", "null", "true", "yes", "2024", "1e3"]
# Reference names no other string of a rendered object contains, so each can be swapped for the tested one.
REF_NAME, REF_NAMESPACE = "refisvc", "refns"
SETTINGS = Settings(runtime_image="registry.example/kubeinfer-runtime:1.2.3")
ROUTING = GatewayAPIRouting.model_validate({"parentRefs": [{"name": "inference", "namespace": "gateways"}]})


def _pod_and_deployment(owner: Owner) -> list[dict[str, Any]]:
    spec = spec_of(example("tiny-cpu.yaml"))
    pod = render_pod_template(owner, spec, SETTINGS)
    return [pod.template, render_deployment(owner, spec, pod, replicas=2, track="canary")]


# Every template under kubeinfer_operator/templates, with what renders it (HTTPRoute is built as a dict).
RENDERERS: dict[str, Callable[[Owner], list[dict[str, Any]]]] = {
    "pod.yaml.j2": _pod_and_deployment,
    "deployment.yaml.j2": _pod_and_deployment,
    "service.yaml.j2": lambda owner: [
        render_service(owner),
        render_router_service(owner),
        render_track_service(owner, "stable", "abc123"),
    ],
    "pdb.yaml.j2": lambda owner: [render_pdb(owner)],
    "router-access.yaml.j2": lambda owner: render_router(owner, SETTINGS, {"tracks": {}}),
    "router-deployment.yaml.j2": lambda owner: render_router(owner, SETTINGS, {"tracks": {}}),
    "HTTPRoute": lambda owner: [render_http_route(owner, ROUTING, {"stable": 90, "canary": 10})],
}


def test_every_template_is_covered_here() -> None:
    templates = {p.name for p in files("kubeinfer_operator").joinpath("templates").iterdir()}
    assert templates == set(RENDERERS) - {"HTTPRoute"}


def _leaves(node: Any, path: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in _leaves(value, f"{path}/{key}").items()}
    if isinstance(node, list):
        return {k: v for i, item in enumerate(node) for k, v in _leaves(item, f"{path}[{i}]").items()}
    return {path: node}


def _revisions(objects: list[dict[str, Any]]) -> list[str]:
    """Pod-template hashes differ with the name (it is in the labels); they are swapped too."""
    return sorted(
        {v for path, v in _leaves(objects).items() if path.endswith("serving.kubeinfer.dev/revision")}
    )


@pytest.mark.parametrize("template", sorted(RENDERERS))
@pytest.mark.parametrize("name", YAML_LOOKALIKES)
@pytest.mark.parametrize("namespace", YAML_LOOKALIKES)
def test_lookalike_names_and_namespaces_render_as_strings(template: str, name: str, namespace: str) -> None:
    render = RENDERERS[template]
    reference = render(Owner(REF_NAME, REF_NAMESPACE, "uid-1"))
    rendered = render(Owner(name, namespace, "uid-1"))
    swaps = [
        (REF_NAME, name),
        (REF_NAMESPACE, namespace),
        *zip(_revisions(reference), _revisions(rendered), strict=True),
    ]

    def expected(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for old, new in swaps:
            value = value.replace(old, new)
        return value

    # Same paths, and every leaf the reference rendering had, with only the names changed: `on` stays "on".
    ref_leaves, leaves = _leaves(reference), _leaves(rendered)
    assert leaves.keys() == ref_leaves.keys()
    assert leaves == {path: expected(value) for path, value in ref_leaves.items()}
    for obj in rendered:
        if "kind" in obj:  # the bare pod template has no metadata of its own
            assert obj["metadata"]["namespace"] == namespace
            assert isinstance(obj["metadata"]["name"], str) and obj["metadata"]["name"].startswith(name)


def test_a_router_named_on_in_namespace_null_is_bound_and_reads_its_own_config_map() -> None:
    objects = {o["kind"]: o for o in render_router(Owner("on", "null", "uid-1"), SETTINGS, {"tracks": {}})}
    assert objects["RoleBinding"]["metadata"] == {
        "name": "on-router-config-reader",
        "namespace": "null",
        "labels": {**router_labels("on")},
        "ownerReferences": [Owner("on", "null", "uid-1").reference()],
    }
    assert objects["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "on-router", "namespace": "null"}
    ]
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["--configmap", "null/on-router"]


FREE_TEXT = [
    "a: b\n- c",
    "{x: [y]}",
    "'quoted' \"twice\"",
    "# not a comment",
    "é😀\u2028",
    "--- !!python/none",
]


@pytest.mark.parametrize("text", YAML_LOOKALIKES)
def test_lookalike_model_name_image_and_node_selector_reach_the_pod_as_strings(text: str) -> None:
    manifest = example("tiny-cpu.yaml")
    manifest["spec"]["model"]["name"] = text
    spec = spec_of(manifest, image=f"registry.example/runtime:{text}", nodeSelector={"pool": text})
    pod = render_pod_template(Owner("on", "2024", "uid-1"), spec, SETTINGS).template
    (container,) = pod["spec"]["containers"]
    assert container["image"] == f"registry.example/runtime:{text}"
    assert container["args"][container["args"].index("--served-model-name") + 1] == text
    assert pod["spec"]["nodeSelector"] == {"pool": text}


@pytest.mark.parametrize("text", YAML_LOOKALIKES + FREE_TEXT)
def test_env_values_and_args_reach_the_pod_verbatim(text: str) -> None:
    spec = spec_of(example("tiny-cpu.yaml"), env=[{"name": "USER_VALUE", "value": text}], args=[text])
    pod = render_pod_template(Owner("on", "2024", "uid-1"), spec, SETTINGS).template
    (container,) = pod["spec"]["containers"]
    assert {"name": "USER_VALUE", "value": text} in container["env"]
    assert container["args"][-1] == text


def _template(source: str) -> Any:
    return environment("kubeinfer_operator", "templates").from_string(source)


def test_an_expression_inside_a_longer_string_is_refused() -> None:
    with pytest.raises(TemplateValueError, match="whole string"):
        render_data(_template('args: ["{{ namespace }}/{{ name }}"]'), namespace="on", name="null")


def test_an_expression_as_a_mapping_key_is_refused() -> None:
    with pytest.raises(TemplateValueError, match="mapping key"):
        render_data(_template("labels:\n  {{ key }}: x"), key="on")


def test_one_value_rendered_twice_is_two_independent_copies() -> None:
    labels = {"app": "on"}
    obj = render_data(_template("a: {{ labels }}\nb: {{ labels }}"), labels=labels)
    obj["a"]["app"] = "changed"
    assert obj["b"] == {"app": "on"} and labels == {"app": "on"}
