"""Where the cluster lives and what it is made of: paths, address ranges and node shapes, read from the
environment once so every part of the harness agrees."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = REPO_ROOT / "e2e"
NODE_NAME_PREFIX = "kubeinfer-node-"
NODE_KINDS = ("process", "real")
DEFAULT_NODE_CAPACITY = {
    "cpu": "16",
    "memory": "64Gi",
    "pods": "110",
    "nvidia.com/gpu": "2",
    "ephemeral-storage": "100Gi",
}


@dataclass(frozen=True)
class NodeSpec:
    name: str
    capacity: dict[str, str]
    pod_cidr: str  # a /24 out of the cluster CIDR; this node's pods get their IPs from it


@dataclass(frozen=True)
class ClusterConfig:
    state_dir: Path
    bridge: str
    bridge_ip: str
    cluster_cidr: str
    service_cidr: str
    nodes: tuple[NodeSpec, ...] = field(default_factory=tuple)
    # "process": the Python process kubelet (localcluster.kubelet); "real": a kubelet, containerd, runc
    # and CNI per node (localcluster.realnode), running the images built from the repo's Dockerfiles.
    node_kind: str = "process"

    @property
    def kubernetes_service_ip(self) -> str:
        """The first address of the service range: the apiserver's own `kubernetes` Service."""
        base = self.service_cidr.split("/")[0].rsplit(".", 1)[0]
        return f"{base}.1"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"


def node_capacity(env: dict[str, str]) -> dict[str, str]:
    """Default node capacity, overridden per resource by KUBEINFER_NODE_CAPACITY (JSON object)."""
    capacity = dict(DEFAULT_NODE_CAPACITY)
    raw = env.get("KUBEINFER_NODE_CAPACITY")
    if raw:
        extra = json.loads(raw)
        if not isinstance(extra, dict):
            raise ValueError('KUBEINFER_NODE_CAPACITY must be a JSON object like {"nvidia.com/gpu": "4"}')
        capacity.update({str(k): str(v) for k, v in extra.items()})
    return capacity


def load_config(env: dict[str, str] | None = None) -> ClusterConfig:
    env = dict(os.environ if env is None else env)
    state_dir = Path(env.get("KUBEINFER_CLUSTER_DIR", REPO_ROOT / ".cluster")).resolve()
    count = int(env.get("KUBEINFER_NODES", "2"))
    if count < 1 or count > 200:
        raise ValueError(f"KUBEINFER_NODES must be between 1 and 200, got {count}")
    # 10.244/16 for pods and 10.96/16 for services, as kubeadm-made clusters use; the bridge holds .0.1.
    prefix = env.get("KUBEINFER_POD_NET_PREFIX", "10.244")
    capacity = node_capacity(env)
    nodes = tuple(
        NodeSpec(name=f"{NODE_NAME_PREFIX}{i}", capacity=capacity, pod_cidr=f"{prefix}.{i}.0/24")
        for i in range(1, count + 1)
    )
    node_kind = env.get("KUBEINFER_NODE_KIND", "process")
    if node_kind not in NODE_KINDS:
        raise ValueError(f"KUBEINFER_NODE_KIND must be one of {', '.join(NODE_KINDS)}, got {node_kind!r}")
    return ClusterConfig(
        state_dir=state_dir,
        node_kind=node_kind,
        bridge=env.get("KUBEINFER_BRIDGE", "kubeinfer0"),
        bridge_ip=f"{prefix}.0.1",
        cluster_cidr=f"{prefix}.0.0/16",
        service_cidr=env.get("KUBEINFER_SERVICE_CIDR", "10.96.0.0/16"),
        nodes=nodes,
    )
