"""The objects the operator's watches deliver, kept in memory: what a reconcile reads instead of LISTs.

An informer's store, as client-go keeps one: kopf's watch events upsert and delete; a LIST per kind and
namespace seeds it at start and again at every resync (a watch that broke and resumed may have missed a
deletion). Older data never replaces newer: an object is replaced only by one with a resourceVersion at
least as new, so a late watch event cannot undo the response of the operator's own write.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Mapping
from typing import Any

ObjectKey = tuple[str, str]  # (namespace, name)


def _version(obj: Mapping[str, Any]) -> int | None:
    """resourceVersion as a number where it is one (etcd revisions are); None where it is not."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _newer_or_equal(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    if old is None:
        return True
    a, b = _version(new), _version(old)
    return a is None or b is None or a >= b


def matches(obj: Mapping[str, Any], namespace: str | None, labels: Mapping[str, str] | None) -> bool:
    meta = obj.get("metadata") or {}
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    own = meta.get("labels") or {}
    return all(own.get(k) == v for k, v in (labels or {}).items())


class ObjectCache:
    """Thread-safe: kopf's handlers write from the event loop, reconciles read from worker threads. Reads
    return copies, so a planner can never change what the next reconcile sees."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = frozenset(kinds)
        self._lock = threading.Lock()
        self._objects: dict[str, dict[ObjectKey, dict[str, Any]]] = {kind: {} for kind in self.kinds}

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> ObjectKey:
        meta = obj["metadata"]
        return meta.get("namespace", ""), meta["name"]

    def upsert(self, kind: str, obj: Mapping[str, Any]) -> None:
        stored = copy.deepcopy(dict(obj))
        # Who set which field is often the larger part of an object, and no planner reads it.
        (stored.get("metadata") or {}).pop("managedFields", None)
        with self._lock:
            objects = self._objects[kind]
            key = self._key(stored)
            if _newer_or_equal(stored, objects.get(key)):
                objects[key] = stored

    def remove(self, kind: str, namespace: str, name: str, version: str | None = None) -> None:
        """Forget an object; with `version` (a DELETED event's), only if what is kept is not newer."""
        with self._lock:
            objects = self._objects[kind]
            kept = objects.get((namespace, name))
            gone = {"metadata": {"resourceVersion": version}} if version else None
            if kept is not None and (gone is None or _newer_or_equal(gone, kept)):
                del objects[(namespace, name)]

    def replace(
        self, kind: str, namespace: str | None, items: list[dict[str, Any]], version: str | None
    ) -> None:
        """A LIST's answer (at resourceVersion `version`) for one namespace (None: all): its items are
        upserted and whatever it no longer has, and is not newer than it, is dropped."""
        listed = {self._key(o) for o in items}
        for obj in items:
            self.upsert(kind, obj)
        with self._lock:
            objects = self._objects[kind]
            for key in [k for k, o in objects.items() if namespace is None or k[0] == namespace]:
                if key not in listed and _newer_or_equal(
                    {"metadata": {"resourceVersion": version}}, objects[key]
                ):
                    del objects[key]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._objects[kind].get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def list(
        self, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        with self._lock:
            found = [o for o in self._objects[kind].values() if matches(o, namespace, labels)]
            return copy.deepcopy(sorted(found, key=self._key))

    def count(self, kind: str) -> int:
        with self._lock:
            return len(self._objects[kind])
