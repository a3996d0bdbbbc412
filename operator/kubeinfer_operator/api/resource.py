"""The InferenceService object as a whole: its identity and offline validation of a manifest."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from .base import KubeModel, field_errors
from .spec import InferenceServiceSpec
from .status import InferenceServiceStatus

GROUP = "serving.kubeinfer.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("infsvc", "infer")
CATEGORIES = ("kubeinfer", "all")


class InferenceService(KubeModel):
    """An LLM served to an SLO. kubeinfer runs replicas of an inference engine for the model, rolls
    out changes as canaries judged against the SLO, and scales on queue time and KV-cache usage."""

    api_version: Literal["serving.kubeinfer.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    """serving.kubeinfer.dev/v1alpha1."""
    kind: Literal["InferenceService"] = KIND
    """InferenceService."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Standard object metadata."""
    spec: InferenceServiceSpec
    """What the user wants."""
    status: InferenceServiceStatus | None = None
    """What the operator observed."""


class InvalidManifest(ValueError):
    """A manifest the apiserver would refuse; `problems` holds one line per field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid InferenceService:\n  " + "\n  ".join(problems))
        self.problems = problems


def parse_manifest(manifest: dict[str, Any]) -> InferenceService:
    """Validate a manifest as the apiserver would, naming each offending field."""
    try:
        return InferenceService.model_validate(manifest, by_name=False)
    except ValidationError as error:
        raise InvalidManifest(field_errors(error)) from None
