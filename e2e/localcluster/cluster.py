"""Bringing the whole cluster up and down, and the handle tests use to talk to it.

`up` is idempotent (a live cluster is reused) and serialized by a file lock, so parallel test sessions
share one cluster.  State (daemons with their pids, ports, paths) is written to `state.json` in the
state dir; `down` works from that file alone, and also from a half-written one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import components, network, pki, procs, prometheus, realcluster
from .config import E2E_DIR, ClusterConfig, load_config
from .kubelet.launcher import remove_mountpoints
from .kubelet.logs import log_file

Obj = dict[str, Any]
KUBERNETES_VERSION = "v1.34.4"  # keep in step with e2e/build_binaries.sh
STOP_ORDER = (
    "kubelet",
    "prometheus",
    "kube-proxy",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
    "watchdog",
)


# --- state ---------------------------------------------------------------------------------------


def state_file(cfg: ClusterConfig) -> Path:
    return cfg.state_dir / "state.json"


def read_state(cfg: ClusterConfig) -> Obj | None:
    try:
        return json.loads(state_file(cfg).read_text())
    except (OSError, ValueError):
        return None


def write_state(cfg: ClusterConfig, state: Obj) -> None:
    tmp = state_file(cfg).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, state_file(cfg))


def daemons(state: Obj) -> dict[str, procs.Daemon]:
    return {d["name"]: procs.Daemon(**d) for d in state.get("daemons", [])}


@contextmanager
def locked(cfg: ClusterConfig) -> Iterator[None]:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.state_dir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- health checks -------------------------------------------------------------------------------


def _get(url: str, context: ssl.SSLContext | None = None, timeout: float = 2) -> str:
    with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
        return resp.read().decode()


def admin_context(pki_dir: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    context.load_cert_chain(pki_dir / "admin.crt", pki_dir / "admin.key")
    return context


def apiserver_ready(state: Obj) -> bool:
    try:
        return _get(state["server"] + "/readyz", admin_context(Path(state["pki"]))) == "ok"
    except (OSError, KeyError):
        return False


def _running(state: Obj) -> bool:
    return all(procs.alive(d) for name, d in daemons(state).items() if name != "watchdog")


def is_up(cfg: ClusterConfig) -> bool:
    state = read_state(cfg)
    return bool(state and state.get("ready")) and apiserver_ready(state)  # type: ignore[arg-type]


# --- up --------------------------------------------------------------------------------------------


def binaries() -> Path:
    """The version-keyed binary cache; built on first use (it takes a long while: progress on stderr).
    KUBEINFER_BIN_DIR points at a directory of prebuilt binaries instead."""
    if os.environ.get("KUBEINFER_BIN_DIR"):
        return Path(os.environ["KUBEINFER_BIN_DIR"])
    out = subprocess.run(
        ["bash", str(E2E_DIR / "build_binaries.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def make_pki(cfg: ClusterConfig, pki_dir: Path) -> None:
    pki_dir.mkdir(parents=True)
    pki.make_ca(pki_dir)
    svc_ip = cfg.kubernetes_service_ip
    requests = [
        pki.CertRequest(
            "apiserver",
            "kube-apiserver",
            client=False,
            server=True,
            sans=(
                f"IP:{cfg.bridge_ip}",
                "IP:127.0.0.1",
                f"IP:{svc_ip}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ),
        ),
        pki.CertRequest("admin", "kubernetes-admin", "system:masters"),
        pki.CertRequest("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
        pki.CertRequest("controller-manager", "system:kube-controller-manager"),
        pki.CertRequest("scheduler", "system:kube-scheduler"),
        pki.CertRequest("kube-proxy", "system:kube-proxy"),
        pki.CertRequest(
            "kubelet-serving", "kubelet", client=False, server=True, sans=(f"IP:{cfg.bridge_ip}",)
        ),
        *(pki.CertRequest(f"node-{n.name}", f"system:node:{n.name}", "system:nodes") for n in cfg.nodes),
    ]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: pki.issue(pki_dir, r), requests))
        pool.submit(pki.make_service_account_key, pki_dir).result()


REUSE_ENV = "KUBEINFER_TEST_REUSE_CLUSTER"


def may_reuse(running_started_by: str, started_by: str, reuse_cli: bool) -> bool:
    """Whether a caller joins the cluster that is up. A test session joins another session's cluster, but
    not one `make cluster` or `make demo` started (unless asked to): the demo's operator would reconcile
    the tests' objects, and the tests would change what the user is looking at."""
    return started_by == "cli" or running_started_by != "cli" or reuse_cli


def up(
    cfg: ClusterConfig | None = None,
    started_by: str = "cli",
    owner_pid: int | None = None,
    reuse_cli: bool = True,
) -> Obj:
    """Start the cluster unless it is already up (and may be joined); returns its state."""
    cfg = cfg or load_config()
    with locked(cfg):
        state = read_state(cfg)
        running = bool(state and state.get("ready") and _running(state))
        if state and running and not may_reuse(state["started_by"], started_by, reuse_cli):
            _say(
                "stopping the cluster `make cluster` / `make demo` left running: a test session gets a "
                f"cluster of its own ({REUSE_ENV}=1 joins it instead)"
            )
        elif state and running:
            # a loaded machine can keep /readyz waiting: a cluster whose processes all live is not torn down
            procs.wait_until("the running cluster's apiserver", lambda: apiserver_ready(state), 120)
            if started_by == "cli" and state["started_by"] != "cli":
                state["started_by"] = "cli"  # someone asked for it explicitly: no session takes it down now
                write_state(cfg, state)
            _add_user(cfg, owner_pid)
            return state
        _down(cfg)
        try:
            with _terminated_as_exit():
                state = _start(cfg, started_by)
        except BaseException:
            _down(cfg)
            raise
        _add_user(cfg, owner_pid)
        if started_by != "cli":
            log = cfg.state_dir / "logs" / "watchdog.log"
            argv = [sys.executable, "-m", "localcluster", "watchdog"]
            env = {**os.environ, "PYTHONPATH": str(E2E_DIR), "KUBEINFER_CLUSTER_DIR": str(cfg.state_dir)}
            state["daemons"].append(procs.spawn("watchdog", argv, log, env=env).to_json())
            write_state(cfg, state)
        return state


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM/SIGHUP while a cluster starts raise SystemExit, so the half-started cluster is taken down
    (no watchdog exists yet, and a process killed by the default action would leave it running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_now(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, exit_now) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start(cfg: ClusterConfig, started_by: str) -> Obj:
    began = time.monotonic()
    bin_dir = binaries()
    artifacts = realcluster.build_artifacts(_say) if cfg.node_kind == "real" else None
    for entry in cfg.state_dir.iterdir():
        if entry.name != "lock":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    pki_dir, logs, kubelet_root = cfg.state_dir / "pki", cfg.state_dir / "logs", cfg.state_dir / "kubelet"
    state: Obj = {
        "started_by": started_by,
        "ready": False,
        "pki": str(pki_dir),
        "bin_dir": str(bin_dir),
        "kubeconfig": str(cfg.kubeconfig),
        "node_names": [n.name for n in cfg.nodes],
        "kubelet_root": str(kubelet_root),
        "node_kind": cfg.node_kind,
        "daemons": [],
        "bridge": cfg.bridge,
        "service_cidr": cfg.service_cidr,
    }
    write_state(cfg, state)
    make_pki(cfg, pki_dir)
    state["sysctls"] = network.setup_host(cfg.bridge, cfg.bridge_ip, cfg.cluster_cidr, cfg.service_cidr)
    write_state(cfg, state)

    local = [procs.free_port() for _ in range(6)]
    bridged = [procs.free_port(cfg.bridge_ip) for _ in range(3)]
    ports = components.Ports(
        etcd_client=local[0],
        etcd_peer=local[1],
        controller_manager=local[2],
        scheduler=local[3],
        proxy_healthz=local[4],
        proxy_metrics=local[5],
        apiserver=bridged[0],
        kubelet=bridged[1],
        prometheus=bridged[2],
    )
    server = f"https://{cfg.bridge_ip}:{ports.apiserver}"
    prom_dir = cfg.state_dir / "prometheus"
    state |= {
        "server": server,
        "ports": ports.__dict__,
        "prometheus_url": f"http://{cfg.bridge_ip}:{ports.prometheus}",
        "prometheus_argv": prometheus.argv(bin_dir, prom_dir, cfg.bridge_ip, ports.prometheus),
    }
    kubeconfigs = {
        name: cfg.state_dir / f"{name}.kubeconfig"
        for name in ("controller-manager", "scheduler", "kube-proxy")
    }
    pki.write_kubeconfig(cfg.kubeconfig, server, pki_dir, "admin", "kubernetes-admin")
    for name, kc in kubeconfigs.items():
        pki.write_kubeconfig(kc, server, pki_dir, name, name)

    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> procs.Daemon:
        daemon = procs.spawn(name, argv, logs / f"{name}.log", env=env)
        state["daemons"].append(daemon.to_json())
        write_state(cfg, state)
        return daemon

    def wait(name: str, check: Any, timeout: float) -> None:
        try:
            procs.wait_until(name, check, timeout)
        except TimeoutError as exc:
            raise RuntimeError(
                f"{exc}; last lines of {logs / (name + '.log')}:\n{procs.tail(logs / (name + '.log'))}"
            ) from None

    start("etcd", components.etcd(bin_dir, cfg.state_dir / "etcd-data", ports))
    wait("etcd", lambda: "true" in _get(f"http://127.0.0.1:{ports.etcd_client}/health"), 30)
    start("kube-apiserver", components.apiserver(bin_dir, pki_dir, ports, cfg.bridge_ip, cfg.service_cidr))
    wait("kube-apiserver", lambda: apiserver_ready(state), 60)

    start(
        "kube-controller-manager",
        components.controller_manager(bin_dir, pki_dir, ports, kubeconfigs["controller-manager"]),
    )
    start("kube-scheduler", components.scheduler(bin_dir, ports, kubeconfigs["scheduler"]))
    if artifacts is not None:
        realcluster.start_nodes(cfg, state, pki_dir, artifacts, start, lambda: write_state(cfg, state), _say)
    else:
        kubelet_cfg = kubelet_config(cfg, state, pki_dir, kubelet_root, ports.kubelet)
        (cfg.state_dir / "kubelet.json").write_text(json.dumps(kubelet_cfg, indent=2))
        start(
            "kubelet",
            [sys.executable, "-m", "localcluster.kubelet", str(cfg.state_dir / "kubelet.json")],
            env={
                **os.environ,
                "PYTHONPATH": str(E2E_DIR),
                "PYTHONUNBUFFERED": "1",
                # pods inherit this PATH: the project's venv first, so its console scripts run in pods
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            },
        )
    start(
        "kube-proxy",
        components.kube_proxy(
            bin_dir, ports, kubeconfigs["kube-proxy"], cfg.nodes[0].name, cfg.bridge_ip, cfg.cluster_cidr
        ),
    )
    prometheus.write_config(prom_dir, cfg.kubeconfig)
    start("prometheus", state["prometheus_argv"])

    context = admin_context(pki_dir)
    insecure = ssl._create_unverified_context()  # the components' self-signed health endpoints
    wait(
        "kube-controller-manager",
        lambda: _get(f"https://127.0.0.1:{ports.controller_manager}/healthz", insecure) == "ok",
        30,
    )
    wait("kube-scheduler", lambda: _get(f"https://127.0.0.1:{ports.scheduler}/healthz", insecure) == "ok", 30)
    node_names = {n.name for n in cfg.nodes}
    if cfg.node_kind == "real":
        for node in state["real_nodes"]:
            name, gpus = node["name"], node["gpus"]
            wait(f"kubelet-{name}", lambda n=name, g=gpus: _real_node_ready(server, context, n, g), 120)
            took = time.time() - node["started_at"]
            _say(f"{name} Ready with {gpus} GPUs {took:.0f} s after its containerd started")
    else:
        wait("kubelet", lambda: _nodes_ready(server, context, node_names), 30)
    wait(
        "kube-controller-manager",
        lambda: bool(_get(f"{server}/api/v1/namespaces/default/serviceaccounts/default", context)),
        30,
    )
    wait(
        "kube-controller-manager",
        lambda: bool(_get(f"{server}/api/v1/namespaces/default/configmaps/kube-root-ca.crt", context)),
        30,
    )
    wait("kube-proxy", lambda: bool(_get(f"http://127.0.0.1:{ports.proxy_healthz}/healthz")), 30)
    wait("prometheus", lambda: "Ready" in _get(f"{state['prometheus_url']}/-/ready"), 30)
    handle = Cluster.from_state(cfg, state)
    in_cluster = prometheus.service_manifests(cfg.bridge_ip, ports.prometheus)
    handle.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": in_cluster})
    )
    if cfg.node_kind == "real":
        realcluster.install_dns(handle.kubectl, state, cfg.service_cidr)
        procs.wait_until("CoreDNS ready", lambda: _dns_ready(handle), 120)
    state |= {"ready": True, "up_seconds": round(time.monotonic() - began, 1)}
    write_state(cfg, state)
    return state


def _say(message: str) -> None:
    print(f"localcluster: {message}", file=sys.stderr, flush=True)


def _dns_ready(handle: Cluster) -> bool:
    out = handle.kubectl(
        "get", "deploy", "coredns", "-n", "kube-system", "-o", "jsonpath={.status.readyReplicas}", check=False
    ).stdout
    return out.strip() not in ("", "0")


def _real_node_ready(server: str, context: ssl.SSLContext, name: str, gpus: int) -> bool:
    node = json.loads(_get(f"{server}/api/v1/nodes/{name}", context))
    return _nodes_ready(server, context, {name}) and realcluster.devices_advertised(node, gpus)


def _nodes_ready(server: str, context: ssl.SSLContext, names: set[str]) -> bool:
    nodes = json.loads(_get(f"{server}/api/v1/nodes", context))["items"]
    ready = {
        n["metadata"]["name"]
        for n in nodes
        if any(
            c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])
        )
        and not n["spec"].get("taints")
    }
    return names <= ready


def image_env() -> dict[str, str]:
    """What the runtime image's ENV carries (runtime_image/Dockerfile), for the checkout that stands in
    for it: where its prebuilt CPU kernels are. Pods set HOME to an emptyDir, so without this every
    runtime pod would compile them again (~16 s idle, ~40 s on a loaded machine)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or str(cache / "torch_extensions")}


def kubelet_config(cfg: ClusterConfig, state: Obj, pki_dir: Path, root: Path, port: int) -> Obj:
    entrypoints = json.loads(os.environ.get("KUBEINFER_IMAGE_ENTRYPOINTS", "{}"))
    return {
        "server": state["server"],
        "ca": str(pki_dir / "ca.crt"),
        "root_dir": str(root),
        "port": port,
        "bridge": cfg.bridge,
        "bridge_ip": cfg.bridge_ip,
        "cluster_cidr": cfg.cluster_cidr,
        "service_cidr": cfg.service_cidr,
        "kubernetes_service_ip": cfg.kubernetes_service_ip,
        "version": KUBERNETES_VERSION,
        "image_entrypoints": entrypoints,
        "image_env": image_env(),
        "serving_cert": str(pki_dir / "kubelet-serving.crt"),
        "serving_key": str(pki_dir / "kubelet-serving.key"),
        "nodes": [
            {
                "name": n.name,
                "capacity": n.capacity,
                "pod_cidr": n.pod_cidr,
                "cert": str(pki_dir / f"node-{n.name}.crt"),
                "key": str(pki_dir / f"node-{n.name}.key"),
            }
            for n in cfg.nodes
        ],
    }


# --- users: who is relying on a cluster that a test session started ------------------------------


def _add_user(cfg: ClusterConfig, pid: int | None) -> None:
    if pid is not None:
        (cfg.state_dir / "users").mkdir(exist_ok=True)
        (cfg.state_dir / "users" / str(pid)).write_text(str(procs.start_ticks(pid) or 0))


def live_users(cfg: ClusterConfig) -> list[int]:
    users = cfg.state_dir / "users"
    if not users.exists():
        return []
    live = []
    for f in users.iterdir():
        if procs.alive(procs.Daemon("user", int(f.name), int(f.read_text() or 0))):
            live.append(int(f.name))
        else:
            f.unlink(missing_ok=True)
    return live


def release(cfg: ClusterConfig, pid: int) -> None:
    """A test session is done with the cluster: take it down if a test session started it and nobody
    else is using it."""
    with locked(cfg):
        (cfg.state_dir / "users" / str(pid)).unlink(missing_ok=True)
        state = read_state(cfg)
        if state and state.get("started_by") != "cli" and not live_users(cfg):
            _down(cfg)


def watchdog(cfg: ClusterConfig) -> None:
    """Outlives a test session killed too hard to clean up: once no user is left, take the cluster down."""
    while True:
        time.sleep(2)
        state = read_state(cfg)
        if not state or state.get("started_by") == "cli":
            return
        if not live_users(cfg):
            with locked(cfg):
                if not live_users(cfg):
                    _down(cfg, keep_watchdog=True)
            return


# --- down ------------------------------------------------------------------------------------------


def down(cfg: ClusterConfig | None = None) -> None:
    cfg = cfg or load_config()
    with locked(cfg):
        _down(cfg)


def _down(cfg: ClusterConfig, keep_watchdog: bool = False) -> None:
    """Stop every recorded daemon (the kubelet first, so it ends its pods), then whatever pod processes
    are left, kube-proxy's rules, the network and the mountpoints."""
    state = read_state(cfg) or {}
    realcluster.stop_nodes(state)  # first: its pods, kubelets and containerds, while the network is there
    running = daemons(state)
    order = [n for n in STOP_ORDER if n in running and not (keep_watchdog and n == "watchdog")]
    for name in order:
        procs.stop([running[name]], grace=15 if name == "kubelet" else 5)
    kubelet_root = Path(state.get("kubelet_root", cfg.state_dir / "kubelet"))
    procs_dir = kubelet_root / "procs"
    if procs_dir.exists():
        leftovers = [procs.Daemon("pod", int(f.name), int(f.read_text() or 0)) for f in procs_dir.iterdir()]
        procs.stop(leftovers, grace=0)
        shutil.rmtree(procs_dir)
    proxy = Path(state.get("bin_dir", "/nonexistent")) / "kube-proxy"
    if proxy.exists():
        subprocess.run(components.kube_proxy_cleanup(proxy.parent), capture_output=True, check=False)
        network.remove_chain("KUBE-FIREWALL")
    # always: a cluster whose processes were killed without `down` (a session's end) leaves its network
    network.teardown_host(
        state.get("bridge", cfg.bridge),
        state.get("service_cidr", cfg.service_cidr),
        state.get("sysctls", {}),
    )
    remove_mountpoints(kubelet_root / "mountpoints")
    state_file(cfg).unlink(missing_ok=True)
    shutil.rmtree(cfg.state_dir / "users", ignore_errors=True)


# --- the handle tests use ----------------------------------------------------------------------------


@dataclass
class Cluster:
    """A running cluster, as tests see it.  See the package docstring for what each member is for."""

    cfg: ClusterConfig
    kubeconfig: str
    server: str
    prometheus_url: str
    bin_dir: str
    node_names: list[str]
    _state: Obj = field(repr=False)

    @classmethod
    def from_state(cls, cfg: ClusterConfig, state: Obj) -> Cluster:
        return cls(
            cfg=cfg,
            kubeconfig=state["kubeconfig"],
            server=state["server"],
            prometheus_url=state["prometheus_url"],
            bin_dir=state["bin_dir"],
            node_names=list(state["node_names"]),
            _state=state,
        )

    @property
    def helm_path(self) -> str:
        return str(Path(self.bin_dir) / "helm")

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def install_crd(self, path: str, name: str, timeout: float = 60) -> None:
        """Apply a CRD and wait until the apiserver serves it. Polled, not `kubectl wait`: that fails
        outright ("accessor error") when asked before the CRD has any status conditions."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", path)
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        procs.wait_until(
            f"CRD {name} established",
            lambda: (
                self.kubectl("get", f"crd/{name}", "-o", f"jsonpath={jsonpath}", check=False).stdout == "True"
            ),
            timeout,
        )

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def stop_prometheus(self) -> None:
        with locked(self.cfg):
            state = read_state(self.cfg) or self._state
            prom = daemons(state).get("prometheus")
            if prom:
                procs.stop([prom], grace=10)
                state["daemons"] = [d for d in state["daemons"] if d["name"] != "prometheus"]
                write_state(self.cfg, state)

    def start_prometheus(self) -> None:
        """Start Prometheus again on the same port, with the same data."""
        with locked(self.cfg):
            state = read_state(self.cfg) or self._state
            if "prometheus" in daemons(state) and procs.alive(daemons(state)["prometheus"]):
                return
            log = self.cfg.state_dir / "logs" / "prometheus.log"
            state["daemons"].append(procs.spawn("prometheus", state["prometheus_argv"], log).to_json())
            write_state(self.cfg, state)
        procs.wait_until("prometheus", lambda: "Ready" in _get(f"{self.prometheus_url}/-/ready"), 60)

    def load_rules(self, name: str, groups: list[Obj]) -> None:
        """Load Prometheus rule groups (a rule file's `groups`, e.g. a PrometheusRule's spec.groups) as
        rules/<name>.yml, as Prometheus Operator would, and reload Prometheus; an empty list removes them.
        Raises when Prometheus refuses the file."""
        prom_dir = self.cfg.state_dir / "prometheus"
        prometheus.write_config(prom_dir, self.cfg.kubeconfig)  # a cluster from before rule_files gets it
        path = prometheus.rules_dir(prom_dir) / f"{name}.yml"
        if groups:
            path.write_text(json.dumps({"groups": groups}))  # JSON is YAML
        else:
            path.unlink(missing_ok=True)
        request = urllib.request.Request(f"{self.prometheus_url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise RuntimeError(f"Prometheus reload answered {response.status}")

    @property
    def real_nodes(self) -> bool:
        """Whether pods run on real kubelets (images, cgroups, securityContext) or the process kubelet."""
        return self._state.get("node_kind") == "real"

    @property
    def images(self) -> dict[str, str]:
        """On real nodes: image name -> the reference every node holds (pause, coredns, operator,
        runtime), as images/build.sh built them."""
        return dict(self._state.get("images", {}))

    @property
    def python_image(self) -> str:
        """An image with Python 3.11 and the kubernetes client for test pods: on real nodes the operator
        image (built from operator/Dockerfile); the process kubelet ignores images."""
        return self._state["images"]["operator"] if self.real_nodes else "python:3.11-slim"

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """The current log of a container (the pod's only or first one by default); "" when none."""
        if self.real_nodes:
            found = realcluster.pod_log_file(self._state, namespace, pod, container)
            return realcluster.cri_log_text(found.read_text(errors="replace")) if found else ""
        found = log_file(Path(self._state["kubelet_root"]), namespace, pod, container)
        return found.read_text(errors="replace") if found else ""

    def container_pids(self, namespace: str, pod: str) -> list[int]:
        """Host pids of the pod's container processes (to kill one as the kernel's OOM killer would)."""
        if self.real_nodes:
            return realcluster.container_pids(self._state, namespace, pod)
        uid = json.loads(self.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)["metadata"][
            "uid"
        ]
        out = subprocess.run(
            ["ip", "netns", "pids", network.sandbox_name(uid)], capture_output=True, text=True, check=True
        )
        return [int(p) for p in out.stdout.split()]


def handle(cfg: ClusterConfig | None = None) -> Cluster:
    cfg = cfg or load_config()
    state = read_state(cfg)
    if not state or not state.get("ready"):
        raise RuntimeError(f"no cluster is up in {cfg.state_dir}; run `make cluster`")
    return Cluster.from_state(cfg, state)
