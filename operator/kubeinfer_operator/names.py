"""Label keys, API coordinates and object names shared by rendering, reconciling and watching."""

from __future__ import annotations

GROUP = "serving.kubeinfer.dev"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"

FIELD_MANAGER = "kubeinfer-operator"

LABEL_APP = "app.kubernetes.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_ISVC = f"{GROUP}/inferenceservice"
LABEL_REVISION = f"{GROUP}/revision"
LABEL_TRACK = f"{GROUP}/track"
APP_NAME = "kubeinfer-runtime"

CONTAINER_NAME = "runtime"
HTTP_PORT = 8000
SERVICE_PORT = 80


def deployment_name(isvc: str, revision: str) -> str:
    return f"{isvc}-{revision}"


def owned_labels(isvc: str) -> dict[str, str]:
    """Labels every owned object carries; the operator's watches select on LABEL_ISVC."""
    return {LABEL_APP: APP_NAME, LABEL_ISVC: isvc, LABEL_MANAGED_BY: FIELD_MANAGER}


def service_url(isvc: str, namespace: str) -> str:
    return f"http://{isvc}.{namespace}.svc.cluster.local"
