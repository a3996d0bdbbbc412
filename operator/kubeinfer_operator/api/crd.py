"""Generate the InferenceService CRD from the pydantic models.

    python -m kubeinfer_operator.api.crd           # write crds/serving.kubeinfer.dev_inferenceservices.yaml
    python -m kubeinfer_operator.api.crd --check   # exit 1 when the committed file is stale

Pydantic's JSON schema becomes a structural OpenAPI v3 schema for apiextensions.k8s.io/v1:
$refs inlined, titles dropped, Optional turned into "may be omitted", nested objects defaulted
to their fields' defaults, docstrings reflowed for `kubectl explain`, and a
description required on every field.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, NoDefault
from pydantic_core import core_schema

from .resource import CATEGORIES, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, InferenceService
from .spec import InferenceServiceSpec
from .status import InferenceServiceStatus

CRD_FILE = f"{GROUP}_{PLURAL}.yaml"
DEFAULT_OUTPUT = Path(__file__).resolve().parents[3] / "crds" / CRD_FILE
HEADER = "# Generated from kubeinfer_operator/api by `python -m kubeinfer_operator.api.crd`. Do not edit.\n"

PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the service is serving traffic.",
    },
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".status.readyReplicas",
        "description": "Replicas serving traffic.",
    },
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".status.desiredReplicas",
        "description": "Replicas the operator wants.",
    },
    {
        "name": "Canary",
        "type": "integer",
        "jsonPath": ".status.canaryWeight",
        "description": "Percent of traffic on the canary.",
    },
    {
        "name": "TTFT-P95",
        "type": "string",
        "jsonPath": ".status.signals.ttftP95",
        "description": "p95 time to first token over slo.window.",
    },
    {
        "name": "KV",
        "type": "number",
        "jsonPath": ".status.signals.kvCacheUsage",
        "description": "Average KV-cache usage, 0-1.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Model",
        "type": "string",
        "jsonPath": ".spec.model.name",
        "priority": 1,
        "description": "Served model name.",
    },
    {
        "name": "Phase",
        "type": "string",
        "jsonPath": ".status.rolloutPhase",
        "priority": 1,
        "description": "Rollout phase.",
    },
]


class _KubeJsonSchema(GenerateJsonSchema):
    """Pydantic's generator with Kubernetes' idea of optional fields and defaults."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        # An Optional field is one that may be omitted; null is never a value users write.
        return self.generate_inner(schema["schema"])

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None:
            # A nested object defaults to its fields' defaults written out in full: the apiserver
            # checks a default against the CEL rules before (not after) applying nested defaults.
            value = factory()
            if isinstance(value, BaseModel):
                return _without_empty(value.model_dump(by_alias=True, exclude_none=True, mode="json"))
            return NoDefault  # an empty list or map: absent already means empty
        default = schema.get("default", NoDefault)
        return NoDefault if default is None else default


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v not in ([], {})}
    return value


def _reflow(text: str) -> str:
    """Docstrings wrap at the source's line length; kubectl explain wraps for the terminal."""
    return " ".join(text.split())


def _structural(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        # The field's docstring says what it is for here; the model's, what it is.
        descriptions = [d for d in (node.get("description"), target.get("description")) if d]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        node["description"] = " ".join(descriptions)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "additionalProperties" and value is False):
            continue
        if key == "description":
            out[key] = _reflow(value)
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out[key] = {name: _structural(prop, defs, f"{path}.{name}") for name, prop in value.items()}
            for name, prop in out[key].items():
                if not prop.get("description"):
                    raise ValueError(f"{path}.{name} has no description: add a docstring under the field")
        elif key == "items":
            out[key] = _structural(value, defs, f"{path}[]")
        elif key == "additionalProperties" and isinstance(value, dict):
            out[key] = _structural(value, defs, f"{path}{{}}")
        else:
            out[key] = value
    default = out.get("default")
    if "description" in out and default not in (None, "") and not isinstance(default, dict):
        # kubectl explain does not print defaults, so the description says it.
        out["description"] += f" Default: {json.dumps(default) if isinstance(default, bool) else default}."
    return out


def openapi_schema(model: type[BaseModel], path: str) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model."""
    schema = model.model_json_schema(by_alias=True, schema_generator=_KubeJsonSchema)
    defs = schema.pop("$defs", {})
    return _structural(schema, defs, path)


def crd_manifest() -> dict[str, Any]:
    root = {
        "type": "object",
        "description": _reflow(InferenceService.__doc__ or ""),
        "properties": {
            "apiVersion": {"type": "string", "description": "serving.kubeinfer.dev/v1alpha1."},
            "kind": {"type": "string", "description": "InferenceService."},
            "metadata": {"type": "object"},  # the apiserver owns its schema and refuses a description
            "spec": openapi_schema(InferenceServiceSpec, "spec"),
            "status": openapi_schema(InferenceServiceStatus, "status"),
        },
        "required": ["spec"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        # kubectl scale (and HPA/KEDA) pin spec.replicas; see its description.
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render() -> str:
    return HEADER + yaml.safe_dump(crd_manifest(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="CRD file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the models")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run `make crds`", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
