"""Specs and observed objects the operator unit tests share."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.names import LABEL_ISVC, LABEL_REVISION
from kubeinfer_operator.render import Owner

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner("tiny", "default", "0b8c7e4e-uid")


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def spec_of(manifest: dict[str, Any], **runtime: Any) -> InferenceServiceSpec:
    raw = copy.deepcopy(manifest["spec"])
    raw.setdefault("runtime", {}).update(runtime)
    return InferenceServiceSpec.model_validate(raw)


def isvc(
    manifest: dict[str, Any], status: dict[str, Any] | None = None, generation: int = 1
) -> dict[str, Any]:
    obj = copy.deepcopy(manifest)
    obj["metadata"] = {
        "name": OWNER.name,
        "namespace": OWNER.namespace,
        "uid": OWNER.uid,
        "generation": generation,
    }
    if status is not None:
        obj["status"] = status
    return obj


def deployment(revision: str, replicas: int, ready: int, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"tiny-{revision}",
            "uid": f"uid-{revision}",
            "generation": generation,
            "labels": {LABEL_ISVC: "tiny", LABEL_REVISION: revision},
        },
        "spec": {"replicas": replicas},
        "status": {
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": replicas,
        },
    }


def pod(name: str, revision: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {LABEL_ISVC: "tiny", LABEL_REVISION: revision},
        },
        "status": status,
    }
