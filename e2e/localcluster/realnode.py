"""A real node: containerd (CRI, runc, the bridge and host-local CNI plugins), a kubelet of the control
plane's version and the fake GPU device plugin, all three in one private mount namespace per node.

Why a mount namespace: containerd's shims write under /run/containerd and the kubelet always uses
/var/lib/kubelet/device-plugins, whatever their configs say, so two nodes on one machine would share
them; and the kubelet refuses to start unless three kernel sysctls have the values it wants (and would
otherwise set them for the whole machine), so the namespace gets small files with those values bound
over the three /proc/sys entries.  The machine's own sysctls and cgroup mounts are never changed.

Inside the namespace each node has the standard paths, bound to its own directories:
    /var/lib/kubelet  -> <node>/kubelet      /run/containerd -> <node>/run   (socket: run/containerd.sock)
    /var/lib/cni      -> <node>/cni-cache    /run/netns      -> <node>/netns
containerd's image store is per machine (~/.cache/kubeinfer/nodes/<node>/containerd) so imported images
survive between clusters, as a node's image cache does.

Pure renderers (config files, argv) first; the side effects (spawn, stop, clean up) after."""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import cgroups, procs

CONTAINERD_SOCKET_IN_NS = "/run/containerd/containerd.sock"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
# What the kubelet's container manager insists on (it would write them machine-wide otherwise).
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
# In-namespace path -> the node directory bound over it.
NODE_BINDS = {
    "/var/lib/kubelet": "kubelet",
    "/run/containerd": "run",
    "/var/lib/cni": "cni-cache",
    "/run/netns": "netns",
}
# Chains the kubelet makes to notice iptables being flushed; removed at teardown.
KUBELET_CANARY = "KUBE-KUBELET-CANARY"


@dataclass(frozen=True)
class NodePlan:
    """Everything about one node that the renderers need; paths are host paths."""

    name: str
    index: int
    dir: Path  # <state>/nodes/<name>
    containerd_root: Path  # per machine, survives the cluster
    cgroup_root: str  # e.g. /process_api/<id>/kubeinfer-kubeinfer-node-1
    node_ip: str
    kubelet_port: int
    healthz_port: int
    range_start: str
    range_end: str
    gpus: int

    @property
    def host_socket(self) -> Path:
        return self.dir / "run" / "containerd.sock"


def containerd_config(plan: NodePlan, pause_image: str) -> str:
    """containerd 1.6 (config version 2): own root/state/sockets, overlayfs, runc with cgroupfs, and
    `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE: without it every sandbox fails with
    "can't get final child's PID from pipe")."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{plan.containerd_root}"
state = "/run/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{CONTAINERD_SOCKET_IN_NS}"
[ttrpc]
  address = "{CONTAINERD_SOCKET_IN_NS}.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{plan.containerd_root}/opt"

[{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  enable_selinux = false
  max_container_log_line_size = 16384
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{plan.dir / "cni" / "net.d"}"
    max_conf_num = 1
"""


def cni_config(plan: NodePlan, bridge: str, cluster_cidr: str, gateway: str, service_cidr: str) -> dict:
    """The bridge plugin on the harness's bridge (the host holds the gateway address), host-local IPAM
    over this node's slice of the cluster range.  Pods are on-link to the whole cluster range (every
    node's pods share the bridge), reach Services through the host (kube-proxy), and have no default
    route: nothing beyond the cluster."""
    return {
        "cniVersion": "1.0.0",
        "name": "kubeinfer",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,  # a pod reaching itself through its own Service
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(plan.dir / "ipam"),
                    "ranges": [
                        [
                            {
                                "subnet": cluster_cidr,
                                "rangeStart": plan.range_start,
                                "rangeEnd": plan.range_end,
                                "gateway": gateway,
                            }
                        ]
                    ],
                    "routes": [{"dst": service_cidr, "gw": gateway}],
                },
            }
        ],
    }


def kubelet_config(plan: NodePlan, pki_dir: Path, cluster_dns: str) -> dict:
    """KubeletConfiguration for cgroup v1 under our own cgroup, with the cgroupfs driver."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": plan.node_ip,
        "port": plan.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": plan.healthz_port,
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        "clusterDNS": [cluster_dns],
        "resolvConf": str(plan.dir / "resolv.conf"),  # no host nameservers or search domains in pods
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET_IN_NS}",
        "imageServiceEndpoint": f"unix://{CONTAINERD_SOCKET_IN_NS}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": plan.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": [],
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,  # negative values are refused here (no CAP_SYS_RESOURCE)
        "protectKernelDefaults": False,
        "podLogsDir": str(plan.dir / "pod-logs"),
        "volumePluginDir": str(plan.dir / "volume-plugins"),
        "serializeImagePulls": False,
        # the images are imported, not pulled: they must never be garbage-collected away
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "nodeStatusReportFrequency": "1m",
        "shutdownGracePeriod": "0s",
    }


def kubelet_argv(kubelet: Path, plan: NodePlan) -> list[str]:
    return [
        str(kubelet),
        f"--config={plan.dir / 'kubelet.json'}",
        f"--kubeconfig={plan.dir / 'kubelet.kubeconfig'}",
        f"--hostname-override={plan.name}",
        f"--node-ip={plan.node_ip}",
        "--root-dir=/var/lib/kubelet",
        "--cert-dir=/var/lib/kubelet/pki",
        "--v=1",
    ]


def namespace_script(plan: NodePlan) -> str:
    """sh run by `unshare --mount --propagation private`: bind the node's directories and the sysctl
    files, then exec containerd (whose pid then names the namespace)."""
    lines = ["set -e"]
    for target, source in NODE_BINDS.items():
        lines.append(f"mount --bind {plan.dir / source} {target}")
    for key in KUBELET_SYSCTLS:
        lines.append(f"mount --bind {plan.dir / 'sysctl' / key.replace('/', '.')} /proc/sys/{key}")
    lines.append(f"exec containerd --config {plan.dir / 'containerd.toml'} --log-level warn")
    return "\n".join(lines)


def in_namespace(holder_pid: int, argv: list[str]) -> list[str]:
    """argv run in the mount namespace of the node's containerd."""
    return ["nsenter", f"--mount=/proc/{holder_pid}/ns/mnt", "--", *argv]


# --- side effects --------------------------------------------------------------------------------


def prepare(plan: NodePlan, files: dict[str, str]) -> list[str]:
    """Make the node's directories, write its files, make host mountpoints that are missing (returned,
    to be removed at teardown) and the node's cgroup root (made dirs go to cgroup_made)."""
    for sub in (*NODE_BINDS.values(), "cni/net.d", "ipam", "pod-logs", "volume-plugins", "sysctl"):
        (plan.dir / sub).mkdir(parents=True, exist_ok=True)
    plan.containerd_root.mkdir(parents=True, exist_ok=True)
    for key, value in KUBELET_SYSCTLS.items():
        (plan.dir / "sysctl" / key.replace("/", ".")).write_text(value + "\n")
    (plan.dir / "resolv.conf").write_text("# pods get the cluster DNS from the kubelet\n")
    for name, text in files.items():
        (plan.dir / name).parent.mkdir(parents=True, exist_ok=True)
        (plan.dir / name).write_text(text)
    made = []
    for target in NODE_BINDS:
        if not Path(target).exists():
            Path(target).mkdir(parents=True)
            made.append(target)
    return made


def ctr(plan: NodePlan, *args: str) -> subprocess.CompletedProcess[str]:
    """containerd's own client on the node's socket, in the CRI's namespace."""
    argv = ["ctr", f"--address={plan.host_socket}", "--namespace=k8s.io", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)


def namespace_id(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def processes_in_namespace(ns: str) -> list[int]:
    """Every process whose mount namespace is `ns` (containerd, kubelet, plugin, shims)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and namespace_id(int(entry.name)) == ns:
            pids.append(int(entry.name))
    return pids


def remove_sandboxes(crictl: Path, socket: Path) -> None:
    """Stop and remove every pod sandbox through the CRI, so the CNI plugin releases each pod's address,
    veth and network namespace as a drained node would."""
    if socket.exists():
        subprocess.run(
            [str(crictl), f"--runtime-endpoint=unix://{socket}", "--timeout=30s", "rmp", "-fa"],
            capture_output=True,
            check=False,
            timeout=120,
        )


def kill_namespace(ns: str | None) -> None:
    if not ns:
        return
    pids = processes_in_namespace(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    procs.wait_until("node processes to exit", lambda: not processes_in_namespace(ns), 15)


def cleanup(node: dict, crictl: Path | None) -> None:
    """Undo one node from its state record; safe on a half-started or already removed node."""
    if crictl is not None and node.get("namespace"):
        with contextlib.suppress(subprocess.TimeoutExpired):
            remove_sandboxes(crictl, Path(node["dir"]) / "run" / "containerd.sock")
    kill_namespace(node.get("namespace"))
    cgroups.remove(node["cgroup_root"])
