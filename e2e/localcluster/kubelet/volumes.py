"""Pod volumes made on the host under the pod's directory, then bind-mounted at each container's
mountPath inside the pod's own mount namespace (so the host's paths stay as they were).

API-backed volumes (configMap, secret, downwardAPI, projected with a service-account token) are
rewritten on every refresh, each file replaced atomically, as a kubelet keeps them current."""

from __future__ import annotations

import base64
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api import ApiError, KubeApi, path
from .podenv import ConfigError, PodFacts, container_for, field_ref, resource_field_ref

log = logging.getLogger(__name__)
Obj = dict[str, Any]
API_BACKED = ("configMap", "secret", "downwardAPI", "projected")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def get_data(api: KubeApi, kind: str, namespace: str, name: str) -> dict[str, bytes] | None:
    """A ConfigMap's or Secret's data as bytes; None when it does not exist."""
    try:
        obj = api.get(path("api", "v1", "namespaces", namespace, kind + "s", name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in obj.get("data", {}).items()}
    out = {k: v.encode() for k, v in obj.get("data", {}).items()}
    out.update({k: base64.b64decode(v) for k, v in obj.get("binaryData", {}).items()})
    return out


class PodVolumes:
    def __init__(self, api: KubeApi, pod_dir: Path) -> None:
        self.api = api
        self.root = pod_dir / "volumes"
        self._tokens: dict[str, tuple[bytes, float]] = {}  # file path -> (token, refresh after)

    def materialize(self, facts: PodFacts, first: bool) -> None:
        """Create every volume (first call) and refresh the API-backed ones (every call)."""
        for volume in facts.pod["spec"].get("volumes", []):
            kind = next((k for k in volume if k != "name"), "emptyDir")
            target = self.root / volume["name"]
            if kind in API_BACKED:
                files = self._files(facts, kind, volume[kind])
                _write_files(target, files, int(volume[kind].get("defaultMode", 0o644)))
            elif first and kind == "hostPath":
                _ensure_host_path(volume["hostPath"])
            elif first:
                if kind not in ("emptyDir", "persistentVolumeClaim"):
                    log.warning(
                        "volume %s: %s is not supported; an empty directory stands in", volume["name"], kind
                    )
                target.mkdir(parents=True, exist_ok=True)

    def mounts(self, facts: PodFacts, container: Obj) -> list[Mount]:
        volumes = {v["name"]: v for v in facts.pod["spec"].get("volumes", [])}
        out = []
        for vm in container.get("volumeMounts", []):
            volume = volumes.get(vm["name"])
            if volume is None:
                raise ConfigError(f"volumeMount {vm['name']!r} names no volume of the pod")
            source = self._source(facts, volume)
            if vm.get("subPath"):
                source = os.path.join(source, vm["subPath"])
                if not os.path.exists(source):
                    os.makedirs(source, exist_ok=True)  # as the kubelet does for a missing subPath
            out.append(Mount(source=source, target=vm["mountPath"], read_only=bool(vm.get("readOnly"))))
        return out

    def _source(self, facts: PodFacts, volume: Obj) -> str:
        if "hostPath" in volume:
            return volume["hostPath"]["path"]
        if "persistentVolumeClaim" in volume:
            return self._claim_path(facts, volume["persistentVolumeClaim"]["claimName"])
        return str(self.root / volume["name"])

    def _claim_path(self, facts: PodFacts, claim: str) -> str:
        """A bound claim whose volume is hostPath or local is that directory; other kinds are not run here."""
        pvc = self.api.get(
            path(
                "api", "v1", "namespaces", facts.pod["metadata"]["namespace"], "persistentvolumeclaims", claim
            )
        )
        pv_name = pvc["spec"].get("volumeName")
        if not pv_name:
            raise ConfigError(f"persistentVolumeClaim {claim!r} is not bound")
        pv = self.api.get(path("api", "v1", "persistentvolumes", pv_name))["spec"]
        source = (pv.get("hostPath") or pv.get("local") or {}).get("path")
        if not source:
            raise ConfigError(
                f"persistentVolume {pv_name!r}: only hostPath and local volumes can be mounted here"
            )
        os.makedirs(source, exist_ok=True)
        return source

    def _files(self, facts: PodFacts, kind: str, spec: Obj) -> dict[str, tuple[bytes, int | None]]:
        """relative path -> (content, mode or None for the volume default)."""
        namespace = facts.pod["metadata"]["namespace"]
        if kind in ("configMap", "secret"):
            name = spec.get("name") or spec.get("secretName", "")
            data = get_data(self.api, kind.lower(), namespace, name)
            if data is None:
                if spec.get("optional"):
                    return {}
                raise ConfigError(f"{kind} {name!r} not found in namespace {namespace!r}")
            if not spec.get("items"):
                return {k: (v, None) for k, v in data.items()}
            out = {}
            for item in spec["items"]:
                if item["key"] not in data:
                    if spec.get("optional"):
                        continue
                    raise ConfigError(f"{kind} {name!r} has no key {item['key']!r}")
                out[item["path"]] = (data[item["key"]], item.get("mode"))
            return out
        if kind == "downwardAPI":
            return {
                item["path"]: (self._downward(facts, item).encode(), item.get("mode"))
                for item in spec["items"]
            }
        out = {}
        for source in spec.get("sources", []):
            if "serviceAccountToken" in source:
                out[source["serviceAccountToken"]["path"]] = (
                    self._token(facts, source["serviceAccountToken"]),
                    0o600,
                )
            else:
                ((sub_kind, sub_spec),) = (
                    (k, v) for k, v in source.items() if k in ("configMap", "secret", "downwardAPI")
                )
                out.update(self._files(facts, sub_kind, sub_spec))
        return out

    @staticmethod
    def _downward(facts: PodFacts, item: Obj) -> str:
        if "fieldRef" in item:
            return field_ref(facts, item["fieldRef"]["fieldPath"])
        ref = item["resourceFieldRef"]
        return resource_field_ref(facts, container_for(facts.pod, ref.get("containerName")), ref)

    def _token(self, facts: PodFacts, spec: Obj) -> bytes:
        """A bound service-account token, requested again once 80% of its lifetime has passed."""
        key = f"{spec.get('audience', '')}/{spec['path']}"
        cached = self._tokens.get(key)
        if cached and time.monotonic() < cached[1]:
            return cached[0]
        meta = facts.pod["metadata"]
        expiration = int(spec.get("expirationSeconds", 3607))
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [spec["audience"]] if spec.get("audience") else [],  # []: the apiserver's own
                "expirationSeconds": expiration,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        sa = facts.pod["spec"].get("serviceAccountName", "default")
        result = self.api.post(
            path("api", "v1", "namespaces", meta["namespace"], "serviceaccounts", sa, "token"), request
        )
        token = result["status"]["token"].encode()
        self._tokens[key] = (token, time.monotonic() + 0.8 * expiration)
        return token

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _write_files(target: Path, files: dict[str, tuple[bytes, int | None]], default_mode: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for rel, (content, mode) in files.items():
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and dest.read_bytes() == content:
            continue
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_bytes(content)
        tmp.chmod(mode if mode is not None else default_mode)
        os.replace(tmp, dest)  # atomic: a reader sees the old or the new file, never half of one


def _ensure_host_path(spec: Obj) -> None:
    kind, host = spec.get("type", ""), spec["path"]
    if kind == "DirectoryOrCreate":
        os.makedirs(host, exist_ok=True)
    elif kind == "FileOrCreate" and not os.path.exists(host):
        os.makedirs(os.path.dirname(host), exist_ok=True)
        Path(host).touch()
