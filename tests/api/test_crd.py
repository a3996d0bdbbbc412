"""The committed CRD is what the models generate, and it is a structural schema kubectl can explain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from kubeinfer_operator.api import crd
from kubeinfer_operator.api.base import KubeModel

from .cases import CRD_PATH


def _schema() -> dict[str, Any]:
    return crd.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, prop in node.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_is_current() -> None:
    assert CRD_PATH.read_text() == crd.render(), "crds/ is stale: run `make crds`"


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    target = tmp_path / "crd.yaml"
    assert crd.main(["--check", "--output", str(target)]) == 1
    assert crd.main(["--output", str(target)]) == 0
    assert crd.main(["--check", "--output", str(target)]) == 0
    target.write_text(target.read_text().replace("infsvc", "isvc"))
    assert crd.main(["--check", "--output", str(target)]) == 1


def test_schema_is_structural_with_a_description_on_every_field() -> None:
    for path, node in _walk(_schema(), "root"):
        assert not {"$ref", "$defs", "title", "const", "allOf", "oneOf"} & node.keys(), path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is None, path
            for name, prop in node["properties"].items():
                assert prop.get("description") or f"{path}.{name}" == "root.metadata", f"{path}.{name}"


def test_rules_defaults_and_bounds_reach_the_crd() -> None:
    spec = _schema()["properties"]["spec"]
    scaling = spec["properties"]["scaling"]
    assert scaling["default"]["kvCacheTarget"] == scaling["properties"]["kvCacheTarget"]["default"] == 0.7
    rules = [validation["rule"] for validation in scaling["x-kubernetes-validations"]]
    assert "self.minReplicas <= self.maxReplicas" in rules
    gpus = spec["properties"]["runtime"]["properties"]["resources"]["properties"]["gpus"]
    assert (gpus["type"], gpus["minimum"]) == ("integer", 0)
    assert spec["properties"]["slo"]["properties"]["class"]["enum"] == ["interactive", "batch", "agent"]
    window = spec["properties"]["slo"]["properties"]["window"]
    assert window["pattern"] and window["maxLength"] == 32


def test_names_subresources_and_columns() -> None:
    manifest = yaml.safe_load(CRD_PATH.read_text())
    names = manifest["spec"]["names"]
    assert "isvc" not in names["shortNames"] and "infsvc" in names["shortNames"]
    version = manifest["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:7] == ["Ready", "Replicas", "Desired", "Canary", "TTFT-P95", "KV", "Age"]


def test_generator_refuses_an_undocumented_field() -> None:
    class Undocumented(KubeModel):
        """A model whose field lacks a docstring."""

        replicas: int = Field(1)

    with pytest.raises(ValueError, match=r"spec\.replicas has no description"):
        crd.openapi_schema(Undocumented, "spec")
