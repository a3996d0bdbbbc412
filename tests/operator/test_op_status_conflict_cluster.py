"""The operator's status write on a real apiserver: planned from a version someone has since changed, it is
refused (409) and what the other writer set stays; planned from the current version, it is written."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeinfer_operator.kube import Kube, StatusConflict
from kubeinfer_operator.names import KIND

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "serving.kubeinfer.dev_inferenceservices.yaml"


@pytest.fixture(scope="module")
def namespace(cluster: Any) -> Iterator[str]:
    cluster.install_crd(str(CRD_PATH), "inferenceservices.serving.kubeinfer.dev")
    name = f"status-rv-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def stored(cluster: Any, namespace: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "-n", namespace, "infsvc", "tiny", "-o", "json").stdout)


def test_a_status_write_from_a_stale_read_is_refused_and_overwrites_nothing(
    cluster: Any, namespace: str
) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    read = stored(cluster, namespace)  # what the operator planned from
    other = {"status": {"desiredReplicas": 3}}  # the autoscaler writes meanwhile
    patch = ["patch", "-n", namespace, "infsvc", "tiny", "--subresource=status", "--type=merge"]
    cluster.kubectl(*patch, "-p", json.dumps(other))
    kube = Kube(cluster.api_client())
    stale = read["metadata"]["resourceVersion"]
    with pytest.raises(StatusConflict):
        kube.patch_status(KIND, namespace, "tiny", {"desiredReplicas": 1, "replicas": 0}, stale)
    after = stored(cluster, namespace)
    assert after["status"] == {"desiredReplicas": 3}

    current = after["metadata"]["resourceVersion"]
    written = kube.patch_status(KIND, namespace, "tiny", {"replicas": 0}, current)
    assert written["status"] == {"desiredReplicas": 3, "replicas": 0}
