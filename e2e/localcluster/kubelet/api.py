"""A small JSON client for the apiserver with one node's client certificate.  It works on the API's own
JSON (dicts with camelCase keys, as kubectl shows them), which is what a kubelet reads and writes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def path(*segments: str) -> str:
    return "/" + "/".join(quote(s, safe="") for s in segments)


class KubeApi:
    def __init__(self, server: str, ca: str, cert: str, key: str) -> None:
        self.server = server.rstrip("/")
        self._pool = urllib3.PoolManager(
            num_pools=2, maxsize=32, cert_reqs="CERT_REQUIRED", ca_certs=ca, cert_file=cert, key_file=key
        )

    def request(
        self,
        method: str,
        url_path: str,
        body: Obj | None = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> Obj:
        url = self.server + url_path + (f"?{urlencode(query)}" if query else "")
        resp = self._pool.request(
            method,
            url,
            body=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=timeout,
            retries=False,
        )
        if resp.status >= 300:
            raise ApiError(resp.status, resp.data.decode(errors="replace"))
        return json.loads(resp.data) if resp.data else {}

    def get(self, url_path: str, query: dict[str, str] | None = None) -> Obj:
        return self.request("GET", url_path, query=query)

    def post(self, url_path: str, body: Obj) -> Obj:
        return self.request("POST", url_path, body)

    def patch(self, url_path: str, body: Obj) -> Obj:
        return self.request("PATCH", url_path, body, content_type=MERGE_PATCH)

    def delete(self, url_path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", url_path, body)

    def watch(
        self, url_path: str, query: dict[str, str], timeout_seconds: int = 300
    ) -> Iterator[tuple[str, Obj]]:
        query = {**query, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        resp = self._pool.request(
            "GET",
            f"{self.server}{url_path}?{urlencode(query)}",
            preload_content=False,
            retries=False,
            timeout=urllib3.Timeout(connect=10, read=timeout_seconds + 30),
        )
        try:
            if resp.status >= 300:
                raise ApiError(resp.status, resp.read().decode(errors="replace"))
            buffer = b""
            for chunk in resp.stream(64 * 1024):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield event["type"], event["object"]
        finally:
            resp.release_conn()


def run_informer(
    api: KubeApi,
    url_path: str,
    query: dict[str, str],
    on_list: Callable[[list[Obj]], None],
    on_event: Callable[[str, Obj], None],
    stop: threading.Event,
) -> None:
    """List, then watch from the list's version; on any error (apiserver restart, 410 Gone) list again.
    A kubelet must outlive every API hiccup, so nothing here ends the loop but `stop`."""
    while not stop.is_set():
        try:
            listed = api.get(url_path, query)
            on_list(listed["items"])
            version = listed["metadata"]["resourceVersion"]
            while not stop.is_set():
                for kind, obj in api.watch(url_path, {**query, "resourceVersion": version}):
                    if kind == "ERROR":
                        raise ApiError(int(obj.get("code", 500)), obj.get("message", "watch error"))
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        on_event(kind, obj)
        except Exception as exc:
            log.warning("watch %s: %s; listing again", url_path, exc)
            stop.wait(1.0)
