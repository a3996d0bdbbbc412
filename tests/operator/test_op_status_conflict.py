"""Status writes carry the resourceVersion they were planned from: a reconcile that read a stale object
(its cache behind the apiserver) reconciles again from what is there instead of overwriting it."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from kubernetes.client.exceptions import ApiException
from op_fixtures import example, isvc

from kubeinfer_operator.cached_kube import CachedKube
from kubeinfer_operator.names import KIND
from kubeinfer_operator.reconcile import CONFLICT_ATTEMPTS, CONFLICT_RETRY_S, reconcile
from kubeinfer_operator.settings import Settings


class ApiServer(CachedKube):
    """CachedKube over an in-memory apiserver that holds the InferenceService and honours a merge patch's
    metadata.resourceVersion as the apiserver does (409 Conflict when the object has moved on)."""

    def __init__(self, obj: dict[str, Any]) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.versions = itertools.count(1)
        obj["metadata"]["resourceVersion"] = str(next(self.versions))
        self.stored = copy.deepcopy(obj)
        self.cache.upsert(KIND, obj)
        self.applied: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.conflicts = 0
        self.writer_between_reads: dict[str, Any] | None = None  # status another writer sets after each GET

    def write_status(self, fields: dict[str, Any]) -> None:
        """Another writer (the autoscaler, a user) patches the status, unseen by the operator's watch."""
        self.stored["status"] = {**(self.stored.get("status") or {}), **fields}
        self.stored["metadata"]["resourceVersion"] = str(next(self.versions))

    def _request(self, method: str, path: str, *, verb: str, kind: str, **kwargs: Any) -> dict[str, Any]:
        body = kwargs.get("body")
        if verb == "get" and kind == KIND:
            latest = copy.deepcopy(self.stored)
            if self.writer_between_reads is not None:
                self.write_status(self.writer_between_reads)
            return latest
        if verb == "patch_status":
            expected = (body.get("metadata") or {}).get("resourceVersion")
            if expected is not None and expected != self.stored["metadata"]["resourceVersion"]:
                self.conflicts += 1
                raise ApiException(status=409, reason="Conflict")
            self.write_status(body["status"])
            return copy.deepcopy(self.stored)
        if verb == "apply":
            self.applied.append(copy.deepcopy(body))
            meta = {
                **body["metadata"],
                "resourceVersion": str(next(self.versions)),
                "uid": f"uid-{len(self.applied)}",
            }
            return {**copy.deepcopy(body), "metadata": meta}
        if verb == "create" and kind == "Event":
            self.events.append(body["reason"])
            return {}
        return {}


def service() -> dict[str, Any]:
    manifest = example("tiny-cpu.yaml")
    obj = isvc(manifest)
    obj["metadata"]["name"] = "tiny"
    return obj


def replicas_applied(api: ApiServer) -> list[int]:
    return [o["spec"]["replicas"] for o in api.applied if o["kind"] == "Deployment"]


def test_a_stale_read_never_overwrites_the_autoscalers_decision() -> None:
    api = ApiServer(service())
    api.write_status({"desiredReplicas": 3})  # the autoscaler; the operator's cache still has no status
    reconcile(api, Settings(), "default", "tiny")
    assert api.conflicts == 1
    assert api.stored["status"]["desiredReplicas"] == 3  # not the stale read's minReplicas (1)
    assert replicas_applied(api)[-1] == 3  # the reconcile that wrote status acted on what it saw
    assert (
        api.cache.get(KIND, "default", "tiny")["metadata"]["resourceVersion"]
        == (api.stored["metadata"]["resourceVersion"])
    )


def test_events_go_out_once_for_the_write_that_succeeded() -> None:
    api = ApiServer(service())
    api.write_status({"desiredReplicas": 2})
    reconcile(api, Settings(), "default", "tiny")
    assert api.conflicts == 1
    assert sorted(api.events) == sorted(set(api.events)), api.events
    assert "Creating" in api.events


def test_an_object_that_keeps_changing_is_retried_later_not_overwritten() -> None:
    api = ApiServer(service())
    api.write_status({"desiredReplicas": 2})
    api.writer_between_reads = {"desiredReplicas": 2}  # every fresh read is stale again at once
    assert reconcile(api, Settings(), "default", "tiny") == CONFLICT_RETRY_S
    assert api.conflicts == CONFLICT_ATTEMPTS
    assert api.events == []
    assert api.stored["status"] == {"desiredReplicas": 2}


def test_an_unchanged_object_is_written_at_once() -> None:
    api = ApiServer(service())
    reconcile(api, Settings(), "default", "tiny")
    assert api.conflicts == 0 and api.stored["status"]["observedGeneration"] == 1
