"""One pod's life on a node: sandbox (network namespace and IP), volumes, init containers in order, then
the containers, restarted per restartPolicy; status written as a kubelet writes it; on deletion a
graceful stop (preStop, SIGTERM, grace period, SIGKILL) and the final delete."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import network
from . import launcher, status
from .api import ApiError, now, path
from .container import Container, Launch
from .podenv import ConfigError, Lookup, PodFacts, container_env, expand
from .probes import Target
from .volumes import PodVolumes, get_data

if TYPE_CHECKING:
    from .node import NodeAgent

log = logging.getLogger(__name__)
Obj = dict[str, Any]
VOLUME_REFRESH_SECONDS = 30.0


def should_restart(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


class PodWorker(threading.Thread):
    def __init__(self, node: NodeAgent, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.node, self.pod, self.uid = node, pod, meta["uid"]
        self.pod_dir = node.root / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid}"
        self.log_dir, self.procs_dir = self.pod_dir / "logs", node.root / "procs"
        spec = pod["spec"]
        self.grace = float(spec.get("terminationGracePeriodSeconds", 30))
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.init = [Container(c, self) for c in spec.get("initContainers", [])]
        self.main = [Container(c, self) for c in spec["containers"]]
        self.volumes = PodVolumes(node.api, self.pod_dir)
        self.wake, self.gone = threading.Event(), False
        self.pod_ip: str | None = None
        self.sandbox: network.Sandbox | None = None
        self.volumes_ready = False
        self.init_index, self.init_failed = 0, False
        self.start_time = now()
        self.own_conditions: list[Obj] = []
        self.last_status: Obj | None = None
        self.final_phase: str | None = None

    # --- inputs from the node's watch ----------------------------------------------------------

    def update(self, pod: Obj) -> None:
        self.pod = pod
        self.wake.set()

    def deleted(self) -> None:
        self.gone = True
        self.wake.set()

    def changed(self) -> None:
        self.wake.set()

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._live()
        except Exception:
            log.exception("pod %s failed in the kubelet", self.name)
        finally:
            self._stop_all(grace=0)
            self._teardown()
            self.node.forget(self.uid)

    def _live(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        self._setup_sandbox()
        last_refresh = 0.0
        while not self._deleting():
            stale = time.monotonic() - last_refresh > VOLUME_REFRESH_SECONDS or not self.volumes_ready
            if stale and not self.final_phase:
                self._refresh_volumes()
                last_refresh = time.monotonic()
            self._tick()
            self._sync_status()
            self.wake.wait(1.0)
            self.wake.clear()
        self._stop_all(self._deletion_grace())
        if not self.gone and not self.node.stopping.is_set():  # a stopping kubelet leaves its pods be
            views = [c.view() for c in self.main]
            self.final_phase = "Succeeded" if all(v.exited_ok for v in views) else "Failed"
            self._sync_status()
            self._final_delete()

    def _deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp")) or self.node.stopping.is_set()

    def _deletion_grace(self) -> float:
        if self.node.stopping.is_set():
            return min(self.grace, 3.0)
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        return float(grace) if grace is not None else self.grace

    def _setup_sandbox(self) -> None:
        if self.pod["spec"].get("hostNetwork"):
            self.pod_ip = self.node.host_ip
            return
        while not self._deleting():
            ip = self.node.allocator.allocate()
            try:
                cfg = self.node.cfg
                self.sandbox = network.create_sandbox(
                    self.uid, ip, cfg["bridge"], cfg["bridge_ip"], cfg["cluster_cidr"], cfg["service_cidr"]
                )
                self.pod_ip = ip
                self.write_hosts()
                return
            except Exception as exc:
                self.node.allocator.release(ip)
                self.event("FailedCreatePodSandBox", str(exc), warning=True)
                self.wake.wait(5.0)

    def _refresh_volumes(self) -> None:
        try:
            self.volumes.materialize(self.facts(), first=not self.volumes_ready)
            self.volumes_ready = True
        except (ConfigError, ApiError, OSError) as exc:
            if not self.volumes_ready:
                self.event("FailedMount", str(exc), warning=True)
            log.warning("pod %s volumes: %s", self.name, exc)

    def _tick(self) -> None:
        if not self.volumes_ready or self.pod_ip is None or self.final_phase:
            return
        if self.init_index < len(self.init):
            self._tick_init(self.init[self.init_index])
            return
        for c in self.main:
            ended = c.take_exit()
            if ended and should_restart(self.restart_policy, ended.exit_code):
                c.schedule_restart()
            if c.due():
                c.start()
        phase = self._phase()
        if phase in ("Succeeded", "Failed"):
            self.final_phase = phase
            self._teardown()  # a finished pod keeps its status, not its network

    def _tick_init(self, c: Container) -> None:
        ended = c.take_exit()
        if ended:
            if ended.exit_code == 0:
                self.init_index += 1
                self.wake.set()
                return
            if self.restart_policy == "Never":
                self.init_failed, self.final_phase = True, "Failed"
                self._teardown()
                return
            c.schedule_restart()
        if c.due():
            c.start()

    def _phase(self) -> str:
        if self.final_phase:
            return self.final_phase
        return status.phase(
            self.restart_policy,
            self.init_index >= len(self.init),
            self.init_failed,
            [c.view() for c in self.main],
        )

    # --- status ---------------------------------------------------------------------------------

    def _sync_status(self) -> None:
        pod_status = self.pod.get("status", {})
        phase = self._phase()
        main = [c.view() for c in self.main]
        init_done = self.init_index >= len(self.init)
        others = [c for c in pod_status.get("conditions", []) if c["type"] not in status.OWN_CONDITIONS]
        conditions = status.conditions(
            self.own_conditions + others,
            phase,
            self.pod_ip is not None,
            init_done,
            [c.name for c in self.init[self.init_index :]],
            main,
            now(),
        )
        self.own_conditions = [c for c in conditions if c["type"] in status.OWN_CONDITIONS]
        desired: Obj = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.node.host_ip,
            "hostIPs": [{"ip": self.node.host_ip}],
            "startTime": self.start_time,
            "containerStatuses": [v.to_api() for v in main],
        }
        if self.pod_ip:
            desired |= {"podIP": self.pod_ip, "podIPs": [{"ip": self.pod_ip}]}
        if self.init:
            desired["initContainerStatuses"] = [c.view().to_api() for c in self.init]
        if desired == self.last_status:
            return
        try:
            self.node.api.patch(self._api_path("status"), {"status": desired})
            self.last_status = desired
        except ApiError as exc:
            if exc.status != 404:
                log.warning("pod %s status: %s", self.name, exc)

    def _final_delete(self) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        try:
            self.node.api.delete(self._api_path(), body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s delete: %s", self.name, exc)

    # --- containers -----------------------------------------------------------------------------

    def _stop_all(self, grace: float) -> None:
        threads = [threading.Thread(target=c.stop, args=(grace,)) for c in self.init + self.main]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def facts(self) -> PodFacts:
        return PodFacts(
            pod=self.pod,
            pod_ip=self.pod_ip or "",
            host_ip=self.node.host_ip,
            node_allocatable=self.node.spec["capacity"],
        )

    def launch(self, spec: Obj) -> Launch:
        facts = self.facts()
        hostname = self.pod["spec"].get("hostname") or self.pod["metadata"]["name"]
        base = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            **self.node.image_env(),  # an image's ENV: the pod's own env may override it
            "HOSTNAME": hostname,
            **self.node.service_env(),
        }
        env = container_env(facts, spec, base, self._text_lookup("configmap"), self._text_lookup("secret"))
        command = spec.get("command") or self.node.image_entrypoint(spec.get("image", ""))
        if not command:
            raise ConfigError(
                f"container {spec['name']!r} has no command: the process kubelet does not run images, "
                "so every container must name its command"
            )
        argv = [expand(a, env) for a in [*command, *spec.get("args", [])]]
        mounts = self.volumes.mounts(facts, spec)
        if self.sandbox:
            mounts.append(launcher.Mount(str(self.pod_dir / "etc-hosts"), "/etc/hosts", False))
        launcher.ensure_mountpoints(mounts, self.node.root / "mountpoints")
        workdir = spec.get("workingDir") or str(self.pod_dir / "scratch")
        full = launcher.launch_argv(
            self.sandbox.netns_path if self.sandbox else None, hostname, mounts, workdir, argv
        )
        ports = {p["name"]: int(p["containerPort"]) for p in spec.get("ports", []) if p.get("name")}
        pod_ip = self.pod_ip or ""
        return Launch(
            argv=full, env=env, target=lambda pid: Target(pod_ip=pod_ip, pid=pid, env=env, ports=ports)
        )

    def _text_lookup(self, kind: str) -> Lookup:
        def lookup(namespace: str, name: str) -> dict[str, str] | None:
            data = get_data(self.node.api, kind, namespace, name)
            return None if data is None else {k: v.decode(errors="replace") for k, v in data.items()}

        return lookup

    def write_hosts(self) -> None:
        if not self.sandbox or not self.pod_ip:
            return
        meta, spec = self.pod["metadata"], self.pod["spec"]
        services = [
            (ip, launcher.service_names(n, ns, meta["namespace"])) for n, ns, ip in self.node.services()
        ]
        content = launcher.hosts_file(
            self.pod_ip, spec.get("hostname") or meta["name"], spec.get("hostAliases", []), services
        )
        hosts = self.pod_dir / "etc-hosts"
        # rewritten in place: a bind-mounted file keeps showing the inode it was mounted with
        with open(hosts, "a+") as out:
            out.seek(0)
            if out.read() != content:
                out.seek(0)
                out.truncate()
                out.write(content)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.node.event(self.pod, reason, message, warning)

    def _teardown(self) -> None:
        if self.sandbox:
            network.remove_sandbox(self.sandbox.netns)
            self.node.allocator.release(self.sandbox.ip)
            self.sandbox = None
        self.volumes.remove()

    def _api_path(self, *sub: str) -> str:
        meta = self.pod["metadata"]
        return path("api", "v1", "namespaces", meta["namespace"], "pods", meta["name"], *sub)

    @property
    def name(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"
