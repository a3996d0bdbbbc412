"""The generated CRD on a real apiserver: examples accepted with the models' defaults, invalid
manifests refused naming the field, kubectl explain / get / scale as a user would run them."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kubeinfer_operator.api import (
    Condition,
    InferenceServiceStatus,
    Signals,
    format_duration,
    parse_manifest,
)

from .cases import CRD_PATH, EXAMPLES, INVALID, Invalid, load, names_field, tiny

pytestmark = pytest.mark.cluster

CRD_NAME = "inferenceservices.serving.kubeinfer.dev"
SELECTOR = "serving.kubeinfer.dev/inferenceservice=scaled"


@pytest.fixture(scope="module")
def namespace(cluster: Any) -> Iterator[str]:
    cluster.install_crd(str(CRD_PATH), CRD_NAME)
    name = f"api-test-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def _create(cluster: Any, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def _get(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "-n", namespace, "infsvc", name, "-o", "json").stdout)


def _set_status(cluster: Any, namespace: str, name: str, status: InferenceServiceStatus) -> None:
    patch = {"status": status.model_dump(by_alias=True, exclude_none=True, mode="json")}
    cluster.kubectl(
        "patch",
        "-n",
        namespace,
        "infsvc",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )


def _without_empty(value: Any) -> Any:
    """Drop empty lists and maps: pydantic fills them in, the apiserver leaves them out."""
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v not in ([], {})}
    return value


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_stored_with_the_same_defaults_as_the_models(
    cluster: Any, namespace: str, path: Path
) -> None:
    manifest = load(path)
    manifest["metadata"].pop("namespace", None)
    _create(cluster, namespace, manifest)
    stored = _get(cluster, namespace, manifest["metadata"]["name"])["spec"]
    expected = parse_manifest(manifest).spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert stored == _without_empty(expected)
    assert stored["scaling"]["tolerance"] == 0.1  # a default the manifest never mentions


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_manifest_is_refused_naming_the_field(cluster: Any, namespace: str, case: Invalid) -> None:
    refused = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(case.manifest(case.id)),
        check=False,
    )
    assert refused.returncode != 0, f"accepted: {case.id}"
    assert names_field(refused.stderr, case.field), refused.stderr


def test_explain_prints_the_descriptions(cluster: Any, namespace: str) -> None:
    text = " ".join(cluster.kubectl("explain", "inferenceservice.spec.slo").stdout.split())
    assert "kubeinfer compiles it into PromQL and uses it twice" in text
    for field in ("class <string>", "ttft <Object>", "errorRate <number>", "window <string>"):
        assert field in text
    p95 = " ".join(cluster.kubectl("explain", "infsvc.spec.slo.ttft.p95").stdout.split())
    assert "Canaries and scaling judge this one first" in p95


def test_get_shows_the_printer_columns_under_both_short_names(cluster: Any, namespace: str) -> None:
    _create(cluster, namespace, tiny("columns"))
    ready = Condition(
        type="Ready",
        status="True",
        reason="Serving",
        message="2 of 3 ready",
        last_transition_time=datetime.now(UTC),
    )
    status = InferenceServiceStatus(
        conditions=[ready],
        replicas=3,
        ready_replicas=2,
        desired_replicas=3,
        canary_weight=25,
        rollout_phase="Progressing",
        signals=Signals(ttft_p95=format_duration(0.2123), kv_cache_usage=0.63),
    )
    _set_status(cluster, namespace, "columns", status)

    header, row = cluster.kubectl("get", "-n", namespace, "infsvc", "columns").stdout.splitlines()
    assert header.split() == ["NAME", "READY", "REPLICAS", "DESIRED", "CANARY", "TTFT-P95", "KV", "AGE"]
    assert row.split()[:7] == ["columns", "True", "2", "3", "25", "212ms", "0.63"]
    wide = cluster.kubectl("get", "-n", namespace, "infer", "columns", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-2:] == ["MODEL", "PHASE"] and wide[1].split()[-2:] == ["tiny", "Progressing"]
    category = cluster.kubectl("get", "-n", namespace, "kubeinfer", "-o", "name").stdout.split()
    assert "inferenceservice.serving.kubeinfer.dev/columns" in category


def test_kubectl_scale_pins_spec_replicas_up_to_max(cluster: Any, namespace: str) -> None:
    _create(cluster, namespace, tiny("scaled"))  # scaling.maxReplicas: 3
    _set_status(cluster, namespace, "scaled", InferenceServiceStatus(replicas=1, selector=SELECTOR))

    cluster.kubectl("scale", "-n", namespace, "infsvc/scaled", "--replicas=2")
    assert _get(cluster, namespace, "scaled")["spec"]["replicas"] == 2
    path = f"/apis/serving.kubeinfer.dev/v1alpha1/namespaces/{namespace}/inferenceservices/scaled/scale"
    scale = json.loads(cluster.kubectl("get", "--raw", path).stdout)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 1)
    assert scale["status"]["selector"] == SELECTOR

    refused = cluster.kubectl("scale", "-n", namespace, "infsvc/scaled", "--replicas=5", check=False)
    assert refused.returncode != 0
    assert names_field(refused.stderr, "spec.replicas"), refused.stderr
