"""Manifests shared by the offline and the cluster tests: the examples, and invalid variants of
the tiny example, each with the one field both pydantic and the apiserver must name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The InferenceService manifests (examples/ also holds the volume they mount).
EXAMPLES = sorted(
    p for p in (ROOT / "examples").glob("*.yaml") if "\nkind: InferenceService\n" in p.read_text()
)
CRD_PATH = ROOT / "crds" / "serving.kubeinfer.dev_inferenceservices.yaml"
DELETE = object()


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def names_field(text: str, path: str) -> bool:
    """Whether an error text names `path` itself (followed by ': ' or a closing quote), not a child."""
    return re.search(re.escape(path) + r'(: |")', text) is not None


def tiny(name: str) -> dict[str, Any]:
    """The tiny CPU example under another name: a valid manifest to start from."""
    manifest = load(ROOT / "examples" / "tiny-cpu.yaml")
    manifest["metadata"]["name"] = name
    return manifest


@dataclass(frozen=True)
class Invalid:
    id: str
    edits: dict[str, Any]  # dotted path in the tiny example -> new value (DELETE removes it)
    field: str

    def manifest(self, name: str) -> dict[str, Any]:
        manifest = tiny(name)
        for dotted, value in self.edits.items():
            *parents, leaf = dotted.split(".")
            node = manifest
            for key in parents:
                node = node.setdefault(key, {})
            if value is DELETE:
                del node[leaf]
            else:
                node[leaf] = value
        return manifest


INVALID = [
    Invalid("unknown-slo-class", {"spec.slo.class": "fast"}, "spec.slo.class"),
    Invalid("min-above-max", {"spec.scaling.minReplicas": 4}, "spec.scaling.minReplicas"),
    Invalid(
        "weights-not-increasing",
        {"spec.rollout": {"strategy": "Canary", "steps": [{"weight": 50}, {"weight": 20}]}},
        "spec.rollout.steps",
    ),
    Invalid(
        "weights-repeated",
        {"spec.rollout": {"strategy": "Canary", "steps": [{"weight": 20}, {"weight": 20}]}},
        "spec.rollout.steps",
    ),
    Invalid(
        "weight-above-100",
        {"spec.rollout": {"strategy": "Canary", "steps": [{"weight": 50}, {"weight": 150}]}},
        "spec.rollout.steps[1].weight",
    ),
    Invalid("canary-without-steps", {"spec.rollout.strategy": "Canary"}, "spec.rollout.steps"),
    Invalid(
        "steps-with-rolling-update",
        {"spec.rollout": {"strategy": "RollingUpdate", "steps": [{"weight": 10}]}},
        "spec.rollout.steps",
    ),
    Invalid("fractional-gpus", {"spec.runtime.resources.gpus": 1.5}, "spec.runtime.resources.gpus"),
    Invalid("negative-gpus", {"spec.runtime.resources.gpus": -1}, "spec.runtime.resources.gpus"),
    Invalid("builtin-on-two-gpus", {"spec.runtime.resources.gpus": 2}, "spec.runtime.resources.gpus"),
    Invalid(
        "bad-gpu-resource",
        {"spec.runtime.resources.gpuResource": "gpu"},
        "spec.runtime.resources.gpuResource",
    ),
    Invalid("cpu-not-a-quantity", {"spec.runtime.resources.cpu": "lots"}, "spec.runtime.resources.cpu"),
    Invalid("vllm-without-image", {"spec.runtime.engine": "vllm"}, "spec.runtime.image"),
    Invalid(
        "faults-on-vllm",
        {
            "spec.runtime.engine": "vllm",
            "spec.runtime.image": "vllm/vllm-openai:v0.11.0",
            "spec.runtime.faults": {"failLoad": True},
        },
        "spec.runtime.faults",
    ),
    Invalid("both-kv-budgets", {"spec.runtime.kvCacheFraction": 0.5}, "spec.runtime.kvCacheTokens"),
    Invalid("kv-tokens-below-context", {"spec.runtime.kvCacheTokens": 256}, "spec.runtime.kvCacheTokens"),
    Invalid(
        "toleration-exists-with-value",
        {"spec.runtime.tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]},
        "spec.runtime.tolerations[0].value",
    ),
    Invalid(
        "env-value-and-secret",
        {
            "spec.runtime.env": [
                {"name": "HF_TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}
            ]
        },
        "spec.runtime.env[0].valueFrom",
    ),
    Invalid("duration-in-words", {"spec.slo.window": "5 minutes"}, "spec.slo.window"),
    Invalid("window-too-short", {"spec.slo.window": "10s"}, "spec.slo.window"),
    Invalid("error-rate-above-one", {"spec.slo.errorRate": 2}, "spec.slo.errorRate"),
    Invalid("p50-above-p95", {"spec.slo.ttft": {"p50": "3s", "p95": "2s"}}, "spec.slo.ttft.p50"),
    Invalid("latency-without-targets", {"spec.slo.tpot": {}}, "spec.slo.tpot"),
    Invalid("kv-target-above-one", {"spec.scaling.kvCacheTarget": 1.5}, "spec.scaling.kvCacheTarget"),
    Invalid(
        "queue-target-above-ttft", {"spec.scaling.queueTimeTarget": "3s"}, "spec.scaling.queueTimeTarget"
    ),
    Invalid("misspelled-field", {"spec.scaling.maxReplica": 3}, "spec.scaling.maxReplica"),
    Invalid("snake-case-field", {"spec.scaling.min_replicas": 2}, "spec.scaling.min_replicas"),
    Invalid("pinned-above-max", {"spec.replicas": 5}, "spec.replicas"),
    Invalid("missing-model", {"spec.model": DELETE}, "spec.model"),
    Invalid("two-model-sources", {"spec.model.source.hostPath": {"path": "/models"}}, "spec.model.source"),
    Invalid("builtin-with-uri", {"spec.model.source": {"uri": "hf://org/model"}}, "spec.model.source.uri"),
    Invalid("unknown-quantization", {"spec.model.quantization": "int4"}, "spec.model.quantization"),
    Invalid(
        "vllm-with-quantization",
        {
            "spec.model.quantization": "int8",
            "spec.runtime.engine": "vllm",
            "spec.runtime.image": "vllm/vllm-openai:v0.11.0",
        },
        "spec.model.quantization",
    ),
    Invalid(
        "relative-host-path",
        {"spec.model.source.hostPath.path": "models/tiny"},
        "spec.model.source.hostPath.path",
    ),
]
