"""Command lines of the control-plane components, as pure functions of where things are.  Every
listener is on 127.0.0.1 or the bridge address, on a port chosen at `up`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    proxy_healthz: int
    proxy_metrics: int
    kubelet: int
    prometheus: int


def etcd(bin_dir: Path, data_dir: Path, ports: Ports) -> list[str]:
    client, peer = f"http://127.0.0.1:{ports.etcd_client}", f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=kubeinfer",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=kubeinfer={peer}",
        "--unsafe-no-fsync=true",  # a throwaway test store: durability costs seconds on a small disk
        "--log-level=warn",
    ]


def apiserver(bin_dir: Path, pki: Path, ports: Ports, bridge_ip: str, service_cidr: str) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--bind-address={bridge_ip}",
        f"--advertise-address={bridge_ip}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={service_cidr}",
        "--allow-privileged=true",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--profiling=false",
        "--v=1",
    ]


def _component_auth(kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


def controller_manager(bin_dir: Path, pki: Path, ports: Ports, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        *_component_auth(kubeconfig),
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def scheduler(bin_dir: Path, ports: Ports, kubeconfig: Path) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        *_component_auth(kubeconfig),
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def kube_proxy(
    bin_dir: Path, ports: Ports, kubeconfig: Path, node: str, bridge_ip: str, cluster_cidr: str
) -> list[str]:
    return [
        str(bin_dir / "kube-proxy"),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}",
        "--proxy-mode=iptables",
        f"--cluster-cidr={cluster_cidr}",
        f"--healthz-bind-address=127.0.0.1:{ports.proxy_healthz}",
        f"--metrics-bind-address=127.0.0.1:{ports.proxy_metrics}",
        f"--nodeport-addresses={bridge_ip}/32",
        # leave the host's conntrack table sizes and localhost routing as they are
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
        "--iptables-localhost-nodeports=false",
        "--v=1",
    ]


def kube_proxy_cleanup(bin_dir: Path) -> list[str]:
    return [str(bin_dir / "kube-proxy"), "--cleanup"]
