"""What the cluster administrator lets an InferenceService ask for: host paths and images.

The operator creates pods with its own permissions, so without this anyone allowed to create an
InferenceService could have it mount any directory of the node (`spec.model.source.hostPath`: /etc,
the kubelet's credentials, the container runtime's socket) or run any image — the operator a confused
deputy. The chart's `security.allowedHostPaths` (default: none) and `security.allowedImagePrefixes`
(default: any) say what is allowed; a refused spec gets a condition naming the setting and no pods.

Pure: the decision is made here from the spec and the settings; reconcile.py acts on it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.settings import Settings

HOST_PATHS_SETTING = "security.allowedHostPaths"
IMAGES_SETTING = "security.allowedImagePrefixes"
# Characters that end a registry/repository component in an image reference: a prefix must stop at one,
# so "registry.corp" allows "registry.corp/ml/x:1" but not "registry.corp.evil.example/x".
IMAGE_SEPARATORS = "/:@"


@dataclass(frozen=True)
class Refusal:
    field: str  # the spec field refused, as a user writes it
    setting: str  # the chart value that refuses it
    message: str


def normalize_host_path(path: str) -> str:
    """The directory the kubelet mounts: `..` and `.` resolved, repeated and trailing slashes dropped (the
    kernel resolves them the same way; a symlink on the node is the administrator's to keep out of the
    allowed directories)."""
    return posixpath.normpath("/" + path.lstrip("/"))


def host_path_allowed(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `path` is one of the allowed directories or under one (whole components only)."""
    wanted = normalize_host_path(path)
    for prefix in map(normalize_host_path, prefixes):
        if wanted == prefix or wanted.startswith(prefix.rstrip("/") + "/"):
            return True
    return False


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `image` starts with an allowed prefix that ends at a component boundary; no prefixes: any."""
    if not prefixes:
        return True
    for prefix in prefixes:
        if image == prefix:
            return True
        if image.startswith(prefix) and (
            prefix[-1] in IMAGE_SEPARATORS or image[len(prefix)] in IMAGE_SEPARATORS
        ):
            return True
    return False


def refusals(spec: InferenceServiceSpec, settings: Settings) -> list[Refusal]:
    """What in the spec the administrator's settings do not allow; empty when all is allowed."""
    found = []
    host_path = spec.model.source.host_path
    if host_path is not None and not host_path_allowed(host_path.path, settings.allowed_host_paths):
        allowed = ", ".join(settings.allowed_host_paths) or "none"
        found.append(
            Refusal(
                "spec.model.source.hostPath.path",
                HOST_PATHS_SETTING,
                f"spec.model.source.hostPath.path {host_path.path!r} is not under a directory the cluster "
                f"administrator allows (chart value {HOST_PATHS_SETTING}: {allowed}); use a pvc source, or "
                "ask for the directory to be allowed",
            )
        )
    image = spec.runtime.image
    if image is not None and not image_allowed(image, settings.allowed_image_prefixes):
        found.append(
            Refusal(
                "spec.runtime.image",
                IMAGES_SETTING,
                f"spec.runtime.image {image!r} does not start with an image prefix the cluster administrator "
                f"allows (chart value {IMAGES_SETTING}: {', '.join(settings.allowed_image_prefixes)}); "
                "unset it to run the operator's runtime image",
            )
        )
    return found


def refusal_conditions(refused: list[Refusal]) -> list[Condition]:
    """Ready=False and Degraded=True (kstatus: Stalled) until the spec or the setting changes."""
    reason = "NotAllowedBySettings"
    message = "Not allowed, so no pod was created or changed: " + "; ".join(r.message for r in refused)
    return [Condition("Ready", "False", reason, message), Condition("Degraded", "True", reason, message)]
