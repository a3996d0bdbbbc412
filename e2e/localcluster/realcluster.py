"""The real nodes of a cluster (KUBEINFER_NODE_KIND=real): their binaries and images, bringing every
node up after the control plane, and taking them down again.  One node is localcluster.realnode."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cgroups, coredns, pki, procs, realnode
from .config import E2E_DIR, REPO_ROOT, ClusterConfig

Obj = dict[str, Any]
CACHE = Path(os.environ.get("KUBEINFER_CACHE", Path.home() / ".cache" / "kubeinfer"))
DEFAULT_IMAGES = ("pause", "coredns", "operator", "runtime")
PAUSE = "pause"


@dataclass(frozen=True)
class Image:
    ref: str
    layout: Path  # OCI layout directory
    digest: str  # manifest digest


def node_binaries() -> Path:
    """kubelet, crictl, CoreDNS and the fake device plugin (built once per machine, progress on stderr);
    KUBEINFER_NODE_BIN_DIR names a directory of prebuilt ones instead."""
    if os.environ.get("KUBEINFER_NODE_BIN_DIR"):
        return Path(os.environ["KUBEINFER_NODE_BIN_DIR"])
    out = subprocess.run(
        ["bash", str(E2E_DIR / "build_node_binaries.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def image_names(env: dict[str, str]) -> tuple[str, ...]:
    """The images every node gets: KUBEINFER_NODE_IMAGES (comma-separated) or all; pause always."""
    raw = env.get("KUBEINFER_NODE_IMAGES")
    names = tuple(n.strip() for n in raw.split(",") if n.strip()) if raw else DEFAULT_IMAGES
    unknown = set(names) - set(DEFAULT_IMAGES)
    if unknown:
        raise ValueError(
            f"KUBEINFER_NODE_IMAGES: unknown {sorted(unknown)}; known: {', '.join(DEFAULT_IMAGES)}"
        )
    return (PAUSE, *[n for n in names if n != PAUSE])


def parse_build_output(stdout: str) -> list[Image]:
    images = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith("sha256:"):
            images.append(Image(parts[0], Path(parts[1]), parts[2]))
    return images


def build_images(names: tuple[str, ...]) -> dict[str, Image]:
    """images/build.sh (cached by a hash of each image's inputs; build times and sizes on stderr)."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "images" / "build.sh"), *names],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    built = parse_build_output(out.stdout)
    if len(built) != len(names):
        raise RuntimeError(f"images/build.sh built {len(built)} of {len(names)} images:\n{out.stdout}")
    return dict(zip(names, built, strict=True))


def plan_nodes(
    cfg: ClusterConfig, kubelet_ports: list[int], healthz_ports: list[int]
) -> list[realnode.NodePlan]:
    plans = []
    for i, node in enumerate(cfg.nodes):
        base = node.pod_cidr.split("/")[0].rsplit(".", 1)[0]
        plans.append(
            realnode.NodePlan(
                name=node.name,
                index=i + 1,
                dir=cfg.state_dir / "nodes" / node.name,
                containerd_root=CACHE / "nodes" / node.name / "containerd",
                cgroup_root=cgroups.node_root(node.name),
                node_ip=cfg.bridge_ip,
                kubelet_port=kubelet_ports[i],
                healthz_port=healthz_ports[i],
                range_start=f"{base}.2",
                range_end=f"{base}.254",
                gpus=int(node.capacity.get("nvidia.com/gpu", "0")),
            )
        )
    return plans


def cluster_dns_ip(service_cidr: str) -> str:
    """The tenth address of the service range, as kubeadm picks it (10.96.0.10)."""
    base = service_cidr.split("/")[0].rsplit(".", 1)[0]
    return f"{base}.10"


def import_image(plan: realnode.NodePlan, image: Image) -> bool:
    """Import into the node's containerd unless it already holds this digest under this name; returns
    whether it imported."""
    listed = realnode.ctr(plan, "images", "ls", f"name=={image.ref}").stdout
    if image.digest in listed:
        return False
    if image.ref in listed:
        # An earlier build under the same name: removed first (and its layers collected, --sync), or every
        # rebuild of the runtime image leaves ~9 GB behind in each node (image GC is off on the nodes).
        realnode.ctr(plan, "images", "rm", "--sync", image.ref)
    tar = subprocess.Popen(["tar", "-C", str(image.layout), "-cf", "-", "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    result = subprocess.run(
        ["ctr", f"--address={plan.host_socket}", "--namespace=k8s.io", "images", "import", "-"],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    tar.stdout.close()
    tar.wait()
    if (
        result.returncode != 0
        or image.digest not in realnode.ctr(plan, "images", "ls", f"name=={image.ref}").stdout
    ):
        raise RuntimeError(f"importing {image.ref} into {plan.name}: {result.stderr or result.stdout}")
    return True


@dataclass(frozen=True)
class Artifacts:
    node_bin: Path
    images: dict[str, Image]


def build_artifacts(log: Callable[[str], None]) -> Artifacts:
    """The node binaries and images, built (or found in the cache) before anything on the machine is
    touched, so a failed build leaves nothing to undo."""
    began = time.monotonic()
    node_bin = node_binaries()
    images = build_images(image_names(dict(os.environ)))
    log(f"node binaries and images ready in {time.monotonic() - began:.0f} s")
    return Artifacts(node_bin, images)


def start_nodes(
    cfg: ClusterConfig,
    state: Obj,
    pki_dir: Path,
    artifacts: Artifacts,
    start: Callable[[str, list[str]], procs.Daemon],
    save: Callable[[], None],
    log: Callable[[str], None],
) -> None:
    """Import the images into each node's containerd, then start its kubelet and device plugin.
    Each node's record (state["real_nodes"]) is saved before anything of it runs, so `down` can undo
    a half-started node."""
    node_bin, images = artifacts.node_bin, artifacts.images
    state["node_bin_dir"] = str(node_bin)
    state["images"] = {name: image.ref for name, image in images.items()}
    plans = plan_nodes(
        cfg,
        [procs.free_port(cfg.bridge_ip) for _ in cfg.nodes],
        [procs.free_port() for _ in cfg.nodes],
    )
    state["real_nodes"] = []
    holders: list[tuple[realnode.NodePlan, int]] = []
    for plan in plans:
        record: Obj = {
            "name": plan.name,
            "dir": str(plan.dir),
            "cgroup_root": plan.cgroup_root,
            "gpus": plan.gpus,
            "started_at": time.time(),
        }
        state["real_nodes"].append(record)
        save()
        files = {
            "containerd.toml": realnode.containerd_config(plan, images[PAUSE].ref),
            "cni/net.d/10-kubeinfer.conflist": json.dumps(
                realnode.cni_config(plan, cfg.bridge, cfg.cluster_cidr, cfg.bridge_ip, cfg.service_cidr),
                indent=2,
            ),
            "kubelet.json": json.dumps(
                realnode.kubelet_config(plan, pki_dir, cluster_dns_ip(cfg.service_cidr)), indent=2
            ),
        }
        record["mountpoints_made"] = realnode.prepare(plan, files)
        pki.write_kubeconfig(
            plan.dir / "kubelet.kubeconfig",
            state["server"],
            pki_dir,
            f"node-{plan.name}",
            f"system:node:{plan.name}",
        )
        record["cgroup_made"] = cgroups.create(plan.cgroup_root)
        save()
        holder = start(
            f"containerd-{plan.name}",
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                realnode.namespace_script(plan),
            ],
        )
        procs.wait_until(
            f"containerd of {plan.name}", lambda p=plan: realnode.ctr(p, "version").returncode == 0, 30
        )
        record["namespace"] = realnode.namespace_id(holder.pid)
        save()
        holders.append((plan, holder.pid))

    def import_all(plan: realnode.NodePlan) -> None:
        t0 = time.monotonic()
        imported = [img.ref for img in images.values() if import_image(plan, img)]
        if imported:
            log(f"{plan.name}: imported {', '.join(imported)} in {time.monotonic() - t0:.0f} s")

    # the nodes unpack in parallel (gunzip and the disk: the slow part of a cold start)
    with ThreadPoolExecutor(len(holders) or 1) as pool:
        list(pool.map(import_all, [plan for plan, _ in holders]))
    for plan, pid in holders:
        start(
            f"kubelet-{plan.name}",
            realnode.in_namespace(pid, realnode.kubelet_argv(node_bin / "kubelet", plan)),
        )
        plugin = [str(node_bin / "fake-device-plugin"), f"--count={plan.gpus}", "--resource=nvidia.com/gpu"]
        start(f"device-plugin-{plan.name}", realnode.in_namespace(pid, plugin))
    save()


def devices_advertised(node: Obj, gpus: int) -> bool:
    """Whether the node's allocatable shows the device plugin's GPUs (the kubelet reports them only
    after the plugin registered)."""
    allocatable = node.get("status", {}).get("allocatable", {})
    return gpus == 0 or allocatable.get("nvidia.com/gpu") == str(gpus)


def install_dns(kubectl: Callable[..., Any], state: Obj, service_cidr: str) -> None:
    docs = coredns.manifests(state["images"]["coredns"], cluster_dns_ip(service_cidr))
    kubectl("apply", "-f", "-", input="\n".join(json.dumps(d) for d in docs))


def stop_nodes(state: Obj) -> None:
    """Undo every node in the state (its pods through the CRI first, then its processes, cgroups and
    mountpoints) and the kubelet's iptables canary chains."""
    node_bin = state.get("node_bin_dir")
    crictl = Path(node_bin) / "crictl" if node_bin else None
    records = state.get("real_nodes", [])
    for record in records:
        realnode.cleanup(record, crictl if crictl and crictl.exists() else None)
    # what the nodes share goes once all of them are gone
    cgroups.remove_made([d for r in records for d in r.get("cgroup_made", [])])
    for target in sorted({m for r in records for m in r.get("mountpoints_made", [])}, reverse=True):
        with contextlib.suppress(OSError):
            Path(target).rmdir()
    if records:
        remove_kubelet_chains()


def remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        for table in ("mangle", "nat", "filter"):
            subprocess.run(
                [tool, "-t", table, "-F", realnode.KUBELET_CANARY], capture_output=True, check=False
            )
            subprocess.run(
                [tool, "-t", table, "-X", realnode.KUBELET_CANARY], capture_output=True, check=False
            )


# --- what tests read from the nodes ------------------------------------------------------------------


def cri_log_text(raw: str) -> str:
    """The container's output from a CRI log file (`<time> <stream> <P|F> <text>` per line; P marks a
    line the runtime split, continued by the next)."""
    out = []
    for line in raw.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        text = parts[3] if len(parts) == 4 else ""
        out.append(text if parts[2] == "P" else text + "\n")
    return "".join(out)


def pod_log_file(state: Obj, namespace: str, pod: str, container: str | None = None) -> Path | None:
    """The current log file of a pod's container (its first one by default) on whichever node ran it:
    <podLogsDir>/<ns>_<pod>_<uid>/<container>/<restart>.log, the newest pod of that name."""
    pod_dirs = [
        d
        for node in state.get("real_nodes", [])
        for d in (Path(node["dir"]) / "pod-logs").glob(f"{namespace}_{pod}_*")
        if d.is_dir()
    ]
    if not pod_dirs:
        return None
    pod_dir = max(pod_dirs, key=lambda d: d.stat().st_mtime)
    containers = sorted(d for d in pod_dir.iterdir() if d.is_dir())
    chosen = [d for d in containers if container is None or d.name == container]
    if not chosen:
        return None
    logs = sorted(chosen[0].glob("*.log"), key=lambda f: int(f.stem) if f.stem.isdigit() else -1)
    return logs[-1] if logs else None


def container_pids(state: Obj, namespace: str, pod: str) -> list[int]:
    """Host pids of the pod's running containers' first processes, through each node's CRI."""
    crictl = Path(state["node_bin_dir"]) / "crictl"
    pids = []
    for node in state.get("real_nodes", []):
        endpoint = f"--runtime-endpoint=unix://{Path(node['dir']) / 'run' / 'containerd.sock'}"

        def run(*args: str, endpoint: str = endpoint) -> str:
            return subprocess.run(
                [str(crictl), endpoint, *args], capture_output=True, text=True, check=True, timeout=30
            ).stdout

        for sandbox in run(
            "pods", "-q", "--namespace", namespace, "--name", f"^{pod}$", "--state", "ready"
        ).split():
            for container in run("ps", "-q", "--pod", sandbox, "--state", "running").split():
                pids.append(int(json.loads(run("inspect", container))["info"]["pid"]))
    return pids
