"""The operator's only door to the Kubernetes API: plain JSON in and out, server-side apply under
one field manager. Everything else in the operator works on dicts and never sees a client."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kubeinfer_operator.metrics import API_REQUESTS
from kubeinfer_operator.names import FIELD_MANAGER, GROUP, PLURAL, VERSION

# kind -> (API path prefix, plural); the kinds the operator reads or writes, nothing more.
_PATHS = {
    "InferenceService": (f"/apis/{GROUP}/{VERSION}", PLURAL),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "Service": ("/api/v1", "services"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),  # only where Gateway API is installed
    "PrometheusRule": ("/apis/monitoring.coreos.com/v1", "prometheusrules"),  # only with Prometheus Operator
}
REQUEST_TIMEOUT_SECONDS = 30
WRITE_VERBS = frozenset({"apply", "scale", "delete", "patch_status", "create", "annotate"})


class NotLeading(Exception):
    """A write refused before it was sent: this replica's leadership term has ended (leader.py)."""


class StatusConflict(Exception):
    """The object changed since the version a status patch was computed from."""

    def __init__(self, kind: str, namespace: str, name: str, resource_version: str | None) -> None:
        super().__init__(f"{kind} {namespace}/{name} is no longer at resourceVersion {resource_version}")


def load_client() -> client.ApiClient:
    """In a pod: its ServiceAccount; elsewhere: the current kubeconfig context."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        # Asked before every write: a replica whose leadership has ended sends none (reads go on).
        self.may_write: Callable[[], bool] = lambda: True

    def _request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        kind: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        if verb in WRITE_VERBS and not self.may_write():
            raise NotLeading(f"not the leader: {verb} of a {kind} not sent")
        API_REQUESTS.labels(verb=verb, kind=kind).inc()
        url = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, full_url, headers, _, _ = self.api.param_serialize(
            method, url, header_params=headers, auth_settings=["BearerToken"]
        )
        # The client JSON-encodes bodies of JSON content types itself; apply-patch+yaml goes as text.
        payload = json.dumps(body) if body is not None and content_type.endswith("yaml") else body
        response = self.api.call_api(
            method, full_url, header_params=headers, body=payload, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
        data = response.read()
        text = data.decode() if data else ""
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return json.loads(text) if text else {}

    @staticmethod
    def _path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        prefix, plural = _PATHS[kind]
        path = f"{prefix}/namespaces/{namespace}/{plural}"
        return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", self._path(kind, namespace, name), verb="get", kind=kind)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_with_version(
        self, kind: str, namespace: str | None, labels: dict[str, str | None] | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The items and the resourceVersion the list was read at. A label whose value is None selects
        objects that carry the label at all."""
        prefix, plural = _PATHS[kind]
        path = self._path(kind, namespace) if namespace else f"{prefix}/{plural}"
        terms = [k if v is None else f"{k}={v}" for k, v in (labels or {}).items()]
        query = {"labelSelector": ",".join(terms)} if terms else None
        body = self._request("GET", path, verb="list", kind=kind, query=query)
        return body.get("items", []), (body.get("metadata") or {}).get("resourceVersion")

    def list(
        self, kind: str, namespace: str | None, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        return self.list_with_version(kind, namespace, dict(labels or {}))[0]

    def list_if_served(
        self, kind: str, namespace: str, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]] | None:
        """As `list`, but None where the cluster does not serve the kind (a CRD not installed)."""
        try:
            return self.list_with_version(kind, namespace, dict(labels or {}))[0]
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: the fields in `obj` become ours (force: an edit by someone else is
        drift to repair); an apply that changes nothing writes nothing."""
        meta = obj["metadata"]
        return self._request(
            "PATCH",
            self._path(obj["kind"], meta["namespace"], meta["name"]),
            verb="apply",
            kind=obj["kind"],
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the object observed (uid precondition): never a same-named successor."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        try:
            self._request("DELETE", self._path(kind, namespace, name), verb="delete", kind=kind, body=body)
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        """Set only the replica count, through the scale subresource: for a Deployment whose template the
        current spec no longer renders (a canary's stable revision), which an apply would have to restate."""
        self._request(
            "PATCH",
            self._path(kind, namespace, name, "scale"),
            verb="scale",
            kind=kind,
            query={"fieldManager": FIELD_MANAGER},
            body={"spec": {"replicas": replicas}},
            content_type="application/merge-patch+json",
        )

    def annotate(
        self, kind: str, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any] | None:
        """Merge-patch annotations onto an object the operator does not own the whole of (a Deployment's
        pod); None when it is gone already."""
        try:
            return self._request(
                "PATCH",
                self._path(kind, namespace, name),
                verb="annotate",
                kind=kind,
                query={"fieldManager": FIELD_MANAGER},
                body={"metadata": {"annotations": annotations}},
                content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def get_latest(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """GET from the apiserver itself, never from a cache: after a conflict, what is there now."""
        return Kube.get(self, kind, namespace, name)

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch the status subresource: fields this patch omits (set by other writers,
        such as the autoscaler) stay as they are. Returns the object as written.

        With `resource_version` (that of the object the patch was computed from), the apiserver
        writes only if the object is still at that version, else answers 409 Conflict
        (StatusConflict here): a decision made from a stale read never overwrites a newer status."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self._request(
                "PATCH",
                self._path(kind, namespace, name, "status"),
                verb="patch_status",
                kind=kind,
                query={"fieldManager": FIELD_MANAGER},
                body=body,
                content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == 409:
                raise StatusConflict(kind, namespace, name, resource_version) from error
            raise

    def post_event(self, involved: dict[str, Any], event_type: str, reason: str, message: str) -> None:
        meta = involved["metadata"]
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
        }
        self._request("POST", self._path("Event", meta["namespace"]), verb="create", kind="Event", body=event)
