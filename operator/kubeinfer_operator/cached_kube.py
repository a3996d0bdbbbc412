"""The Kube client the operator runs with: reads from the watch cache (cache.py), writes to the API.

A reconcile of an InferenceService whose world has not changed then makes no API request at all:
- GET and LIST of cached kinds are answered from memory;
- an apply is skipped when the live object (as cached) already holds every field the rendered object
  sets and carries the hash of exactly that rendering (the `applied` annotation): the first catches an
  edit by someone else (drift, repaired by applying again), the second a field the operator stopped
  rendering (which only an apply removes);
- the status is patched only where it differs (reconcile.execute), events only on transitions.
What the operator writes is put into the cache at once, from the API's answer, so the next reconcile
does not act again on what it just did.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubeinfer_operator.cache import ObjectCache
from kubeinfer_operator.kube import Kube
from kubeinfer_operator.names import GROUP, KIND, LABEL_ISVC

log = logging.getLogger(__name__)
APPLIED_ANNOTATION = f"{GROUP}/applied"
# Watched by kopf (handlers.py) and re-listed at every resync.
WATCHED_KINDS = (
    "InferenceService",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "Pod",
    "ConfigMap",
    "ServiceAccount",
    "RoleBinding",
)
# Not watched (their CRDs may be absent or come later): kept from resync LISTs and the operator's own
# writes; whether the cluster serves them at all is also learnt at each resync.
POLLED_KINDS = ("HTTPRoute", "PrometheusRule")


def rendering_hash(obj: Mapping[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def contains(live: Any, wanted: Any) -> bool:
    """Every field `wanted` sets has that value in `live` (which may hold more: defaults, status)."""
    if isinstance(wanted, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and contains(live[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(live, list)
            and len(live) == len(wanted)
            and all(contains(a, b) for a, b in zip(live, wanted, strict=True))
        )
    return live == wanted


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    annotations = {**(meta.get("annotations") or {}), APPLIED_ANNOTATION: rendering_hash(obj)}
    return {**obj, "metadata": {**meta, "annotations": annotations}}


def unchanged(live: Mapping[str, Any] | None, rendered: Mapping[str, Any]) -> bool:
    if live is None:
        return False
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    # A LIST's items carry no apiVersion and kind (watch events do): the cache's key says the kind.
    stamped = {k: v for k, v in with_hash(dict(rendered)).items() if k not in ("apiVersion", "kind")}
    return annotations.get(APPLIED_ANNOTATION) == rendering_hash(rendered) and contains(live, stamped)


class CachedKube(Kube):
    def __init__(self, api: client.ApiClient, cache: ObjectCache | None = None) -> None:
        super().__init__(api)
        self.cache = cache or ObjectCache((*WATCHED_KINDS, *POLLED_KINDS))
        self.served: dict[str, bool] = {}  # polled kinds: does the cluster serve them (last resync)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind in self.cache.kinds:
            return self.cache.get(kind, namespace, name)
        return super().get(kind, namespace, name)

    def list(
        self, kind: str, namespace: str | None, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        if kind in self.cache.kinds:
            return self.cache.list(kind, namespace, labels)
        return super().list(kind, namespace, labels)

    def list_if_served(
        self, kind: str, namespace: str, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]] | None:
        """From the cache; None for a polled kind the cluster did not serve at the last resync (a CRD
        installed since is found at the next one)."""
        if kind in POLLED_KINDS and not self.served.get(kind, False):
            return None
        if kind in self.cache.kinds:
            return self.cache.list(kind, namespace, labels)
        return super().list_if_served(kind, namespace, labels)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, meta = obj["kind"], obj["metadata"]
        live = self.cache.get(kind, meta["namespace"], meta["name"]) if kind in self.cache.kinds else None
        if live is not None and unchanged(live, obj):
            return live
        written = super().apply(with_hash(obj))
        if kind in self.cache.kinds:
            self.cache.upsert(kind, written)
        return written

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        super().delete(kind, namespace, name, uid)
        if kind in self.cache.kinds:
            self.cache.remove(kind, namespace, name)

    def annotate(
        self, kind: str, namespace: str, name: str, annotations: dict[str, str]
    ) -> dict[str, Any] | None:
        written = super().annotate(kind, namespace, name, annotations)
        if kind in self.cache.kinds and written:
            self.cache.upsert(kind, written)
        return written

    def get_latest(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        latest = super().get_latest(kind, namespace, name)
        if kind in self.cache.kinds and latest is not None:
            self.cache.upsert(kind, latest)  # the watch brings the same version, or a newer one
        return latest

    def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        written = super().patch_status(kind, namespace, name, status, resource_version)
        if kind in self.cache.kinds and written:
            self.cache.upsert(kind, written)
        return written

    def resync(self, namespaces: Iterable[str]) -> None:
        """One LIST per kind and namespace (or cluster-wide): what the watches may have missed."""
        for kind in self.cache.kinds:
            for namespace in tuple(namespaces) or (None,):
                # Only what the operator owns: the watches keep nothing else either.
                labels = None if kind == KIND else {LABEL_ISVC: None}
                try:
                    items, version = self.list_with_version(kind, namespace, labels)
                except ApiException as error:
                    if error.status == 404 and kind in POLLED_KINDS:
                        self.served[kind] = False  # the CRD is not installed: nothing of it to know
                        self.cache.replace(kind, namespace, [], None)
                        continue
                    raise
                self.served[kind] = True
                self.cache.replace(kind, namespace, items, version)
        log.debug("cache resynced: %s", {k: self.cache.count(k) for k in sorted(self.cache.kinds)})
