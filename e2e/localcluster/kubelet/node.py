"""One Node: registered with its capacity, its Lease renewed every 10 s and its status every minute (so
node lifecycle never taints it), and a PodWorker for each pod bound to it."""

from __future__ import annotations

import logging
import platform
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..network import IpAllocator
from .api import ApiError, KubeApi, now, now_micro, path, run_informer
from .pod_worker import PodWorker

if TYPE_CHECKING:
    from .main import Kubelet

log = logging.getLogger(__name__)
Obj = dict[str, Any]
LEASE_SECONDS, LEASE_RENEW_SECONDS, STATUS_SECONDS = 40, 10.0, 60.0


def node_object(name: str, pod_cidr: str) -> Obj:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
    }


def node_status(name: str, capacity: dict[str, str], host_ip: str, port: int, version: str) -> Obj:
    stamp = now()

    def condition(ctype: str, ok: bool, reason: str, message: str) -> Obj:
        return {
            "type": ctype,
            "status": "True" if ok else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }

    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [
            condition(
                "MemoryPressure",
                False,
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            condition("DiskPressure", False, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition(
                "PIDPressure", False, "KubeletHasSufficientPID", "kubelet has sufficient PID available"
            ),
            condition("Ready", True, "KubeletReady", "process kubelet is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "kubeletVersion": version,
            "kubeProxyVersion": version,
            "operatingSystem": "linux",
            "architecture": node_object(name, "")["metadata"]["labels"]["kubernetes.io/arch"],
            "containerRuntimeVersion": "process://kubeinfer",
            "osImage": platform.platform(),
            "kernelVersion": platform.release(),
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


class NodeAgent:
    def __init__(self, cfg: Obj, spec: Obj, kubelet: Kubelet) -> None:
        self.cfg, self.spec, self.kubelet, self.name = cfg, spec, kubelet, spec["name"]
        self.api = KubeApi(cfg["server"], cfg["ca"], spec["cert"], spec["key"])
        self.root = Path(cfg["root_dir"])
        self.host_ip = cfg["bridge_ip"]
        self.allocator = IpAllocator(spec["pod_cidr"])
        self.stopping = kubelet.stopping
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()

    def start(self) -> None:
        self._register()
        threading.Thread(target=self._heartbeat, name=f"lease-{self.name}", daemon=True).start()
        pods = path("api", "v1", "pods")
        query = {"fieldSelector": f"spec.nodeName={self.name}"}
        threading.Thread(
            target=run_informer,
            name=f"pods-{self.name}",
            daemon=True,
            args=(self.api, pods, query, self._on_list, self._on_event, self.stopping),
        ).start()

    # --- registration and heartbeats ------------------------------------------------------------

    def _register(self) -> None:
        while not self.stopping.is_set():
            try:
                try:
                    self.api.post(path("api", "v1", "nodes"), node_object(self.name, self.spec["pod_cidr"]))
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                self._post_status()
                self._renew_lease()
                return
            except Exception as exc:
                log.warning("registering node %s: %s", self.name, exc)
                self.stopping.wait(1.0)

    def _post_status(self) -> None:
        body = node_status(
            self.name, self.spec["capacity"], self.host_ip, self.cfg["port"], self.cfg["version"]
        )
        self.api.patch(path("api", "v1", "nodes", self.name, "status"), {"status": body})

    def _renew_lease(self) -> None:
        lease_path = path(
            "apis", "coordination.k8s.io", "v1", "namespaces", "kube-node-lease", "leases", self.name
        )
        try:
            self.api.patch(lease_path, {"spec": {"renewTime": now_micro(), "holderIdentity": self.name}})
        except ApiError as exc:
            if exc.status != 404:
                raise
            node = self.api.get(path("api", "v1", "nodes", self.name))
            self.api.post(
                lease_path.rsplit("/", 1)[0],
                {
                    "metadata": {
                        "name": self.name,
                        "namespace": "kube-node-lease",
                        "ownerReferences": [
                            {
                                "apiVersion": "v1",
                                "kind": "Node",
                                "name": self.name,
                                "uid": node["metadata"]["uid"],
                            }
                        ],
                    },
                    "spec": {
                        "holderIdentity": self.name,
                        "leaseDurationSeconds": LEASE_SECONDS,
                        "renewTime": now_micro(),
                    },
                },
            )

    def _heartbeat(self) -> None:
        since_status = 0.0
        while not self.stopping.wait(LEASE_RENEW_SECONDS):
            since_status += LEASE_RENEW_SECONDS
            try:
                self._renew_lease()
                if since_status >= STATUS_SECONDS:
                    self._post_status()
                    since_status = 0.0
            except Exception as exc:
                log.warning("heartbeat of node %s: %s", self.name, exc)

    # --- pods -----------------------------------------------------------------------------------

    def _on_list(self, pods: list[Obj]) -> None:
        seen = {p["metadata"]["uid"] for p in pods}
        for pod in pods:
            self._on_pod(pod)
        with self.lock:
            vanished = [w for uid, w in self.workers.items() if uid not in seen]
        for worker in vanished:
            worker.deleted()

    def _on_event(self, kind: str, pod: Obj) -> None:
        if kind == "DELETED":
            with self.lock:
                worker = self.workers.get(pod["metadata"]["uid"])
            if worker:
                worker.deleted()
        else:
            self._on_pod(pod)

    def _on_pod(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if worker is None and not self.stopping.is_set():
                if pod["metadata"].get("deletionTimestamp"):
                    worker = None  # nothing of it runs here any more: finish its deletion below
                elif pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                    worker = self.workers[uid] = PodWorker(self, pod)
                    worker.start()
                    return
        if worker:
            worker.update(pod)
        elif pod["metadata"].get("deletionTimestamp"):
            try:
                meta = pod["metadata"]
                self.api.delete(
                    path("api", "v1", "namespaces", meta["namespace"], "pods", meta["name"]),
                    {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                )
            except ApiError:
                pass

    def forget(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)

    def all_workers(self) -> list[PodWorker]:
        with self.lock:
            return list(self.workers.values())

    # --- what pods ask of their node ------------------------------------------------------------

    def service_env(self) -> dict[str, str]:
        return self.kubelet.service_env

    def services(self) -> list[tuple[str, str, str]]:
        return self.kubelet.services()

    def image_entrypoint(self, image: str) -> list[str]:
        """The configured stand-in for an image's entrypoint, by repository (registry/name, no tag)."""
        name = image.split("@")[0]
        repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        return list(self.cfg.get("image_entrypoints", {}).get(repo, []))

    def image_env(self) -> dict[str, str]:
        """The stand-in for the image's ENV: one set for every image (they all run the checkout)."""
        return dict(self.cfg.get("image_env", {}))

    def event(self, pod: Obj, reason: str, message: str, warning: bool) -> None:
        meta, stamp = pod["metadata"], now()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.name},
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "reportingComponent": "kubelet",
            "reportingInstance": self.name,
        }
        try:
            self.api.post(path("api", "v1", "namespaces", meta["namespace"], "events"), body)
        except Exception as exc:  # events are best effort, as in a real kubelet
            log.debug("event %s for %s: %s", reason, meta["name"], exc)
