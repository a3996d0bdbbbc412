"""The operator's object cache and the cached client: a reconcile of an unchanged world sends nothing."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from kubernetes.client.exceptions import ApiException

from kubeinfer_operator.cache import ObjectCache
from kubeinfer_operator.cached_kube import APPLIED_ANNOTATION, CachedKube, contains, unchanged, with_hash


def obj(name: str, version: str, namespace: str = "ns", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "resourceVersion": version, "labels": labels}}


def test_an_older_version_never_replaces_a_newer_one() -> None:
    cache = ObjectCache(["Deployment"])
    cache.upsert("Deployment", obj("a", "10"))
    cache.upsert("Deployment", obj("a", "9"))  # a late watch event after the operator's own write
    assert cache.get("Deployment", "ns", "a")["metadata"]["resourceVersion"] == "10"
    cache.remove("Deployment", "ns", "a", version="9")  # a DELETED event older than what is kept
    assert cache.get("Deployment", "ns", "a") is not None
    cache.remove("Deployment", "ns", "a", version="11")
    assert cache.get("Deployment", "ns", "a") is None


def test_reads_are_copies_and_lists_filter_by_namespace_and_labels() -> None:
    cache = ObjectCache(["Pod"])
    cache.upsert("Pod", obj("p1", "1", app="x"))
    cache.upsert("Pod", obj("p2", "2", app="y"))
    cache.upsert("Pod", obj("p3", "3", namespace="other", app="x"))
    assert [p["metadata"]["name"] for p in cache.list("Pod", "ns", {"app": "x"})] == ["p1"]
    assert len(cache.list("Pod", None, {"app": "x"})) == 2
    got = cache.get("Pod", "ns", "p1")
    got["metadata"]["labels"]["app"] = "changed"
    assert cache.get("Pod", "ns", "p1")["metadata"]["labels"]["app"] == "x"


def test_a_resync_list_drops_what_it_no_longer_has_unless_newer() -> None:
    cache = ObjectCache(["Service"])
    for name, version in (("gone", "5"), ("kept", "6"), ("born-after", "30"), ("elsewhere", "1")):
        cache.upsert("Service", obj(name, version, namespace="other" if name == "elsewhere" else "ns"))
    cache.replace("Service", "ns", [obj("kept", "6")], version="20")
    names = {s["metadata"]["name"] for s in cache.list("Service", None)}
    # A deletion the watch missed goes; an object created after the list was read, and other
    # namespaces' objects, stay.
    assert names == {"kept", "born-after", "elsewhere"}


def test_contains_is_a_subset_match_that_sees_drift() -> None:
    rendered = {"spec": {"replicas": 2, "template": {"args": ["--a", "1"]}}}
    live = {"spec": {"replicas": 2, "template": {"args": ["--a", "1"]}, "progressDeadlineSeconds": 600}}
    assert contains(live, rendered)
    assert not contains({**live, "spec": {**live["spec"], "replicas": 3}}, rendered)  # kubectl scale
    assert not contains({"spec": {"replicas": 2, "template": {"args": ["--a"]}}}, rendered)


def test_an_apply_is_skipped_only_for_the_same_rendering_with_no_drift() -> None:
    rendered = {"kind": "Service", "metadata": {"name": "s", "namespace": "ns"}, "spec": {"port": 80}}
    live = {**copy.deepcopy(with_hash(rendered)), "status": {}}
    assert unchanged(live, rendered)
    assert not unchanged(live, {**rendered, "spec": {"port": 81}})
    # The same fields but another rendering (a field the operator no longer sets): applied again.
    stale = copy.deepcopy(live)
    stale["metadata"]["annotations"][APPLIED_ANNOTATION] = "0" * 16
    assert not unchanged(stale, rendered)
    assert not unchanged(None, rendered)
    # As a LIST (the resync's) returns it: no apiVersion, no kind. Still the same object.
    listed = {k: v for k, v in live.items() if k not in ("apiVersion", "kind")}
    assert unchanged(listed, rendered)


class FakeAPI(CachedKube):
    """CachedKube over an in-memory apiserver: server-side apply stores the object and bumps the
    resourceVersion; every request is recorded."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.store: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.versions = itertools.count(1)
        self.missing_kinds: set[str] = set()  # kinds whose CRD the fake apiserver lacks

    def _request(self, method: str, path: str, *, verb: str, kind: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append((verb, kind))
        if verb == "apply":
            body = copy.deepcopy(kwargs["body"])
            body["metadata"]["resourceVersion"] = str(next(self.versions))
            self.store[(kind, body["metadata"]["name"])] = body
            return copy.deepcopy(body)
        if verb == "list" and kind in self.missing_kinds:
            raise ApiException(status=404, reason="Not Found")
        if verb == "list":
            items = [copy.deepcopy(o) for (k, _), o in self.store.items() if k == kind]
            return {"items": items, "metadata": {"resourceVersion": str(next(self.versions))}}
        return {}


def test_reapplying_an_unchanged_object_sends_no_request_and_drift_is_repaired() -> None:
    api = FakeAPI()
    service = {"kind": "Service", "metadata": {"name": "s", "namespace": "ns"}, "spec": {"ports": [80]}}
    api.apply(service)
    api.apply(copy.deepcopy(service))
    assert api.requests == [("apply", "Service")]
    # Someone edits the object: the watch brings the edit into the cache; the next apply repairs it.
    edited = copy.deepcopy(api.store[("Service", "s")])
    edited["spec"]["ports"] = [81]
    edited["metadata"]["resourceVersion"] = str(next(api.versions))
    api.cache.upsert("Service", edited)
    api.apply(copy.deepcopy(service))
    assert api.requests == [("apply", "Service")] * 2
    assert api.get("Service", "ns", "s")["spec"]["ports"] == [80]
    assert api.requests == [("apply", "Service")] * 2  # the read came from the cache


def test_a_resync_seeds_every_cached_kind_with_one_list_each() -> None:
    api = FakeAPI()
    api.resync(["ns"])
    assert sorted(kind for verb, kind in api.requests) == sorted(api.cache.kinds)
    assert {verb for verb, _ in api.requests} == {"list"}


def test_a_kind_the_cluster_does_not_serve_is_known_from_the_resync() -> None:
    api = FakeAPI()
    api.missing_kinds.add("HTTPRoute")
    api.resync(["ns"])
    api.requests.clear()
    assert api.list_if_served("HTTPRoute", "ns") is None  # no such kind here (a 404 at the resync)
    assert api.list_if_served("PrometheusRule", "ns") == []  # served, nothing of it yet
    assert api.requests == []  # both answered from what the resync learnt
