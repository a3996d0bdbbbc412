"""Pod networking as a bridge CNI plugin does it: one Linux bridge on the host holding the gateway address,
and per pod a network namespace joined to the bridge by a veth pair, with its own address.

Pods get a route to the pod range (on the bridge) and to the service range (through the host, where
kube-proxy's rules translate ClusterIPs), and no default route: they reach each other, the host's
cluster services and nothing else.  The service range is routed onto the bridge on the host too, so a
ClusterIP packet that no rule translates stays on this machine."""

from __future__ import annotations

import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_PREFIX = "kubeinfer-"
FORWARD_CHAIN = "KUBEINFER-FORWARD"
SYSCTLS = ("/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/bridge/bridge-nf-call-iptables")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


# --- host side -----------------------------------------------------------------------------------


def setup_host(bridge: str, bridge_ip: str, cluster_cidr: str, service_cidr: str) -> dict[str, str]:
    """Create the bridge, routes and forwarding rules; returns the sysctl values to restore on teardown."""
    prefix = ipaddress.ip_network(cluster_cidr).prefixlen
    run("ip", "link", "add", bridge, "type", "bridge")
    run("ip", "addr", "add", f"{bridge_ip}/{prefix}", "dev", bridge)
    run("ip", "link", "set", bridge, "up")
    run("ip", "route", "replace", service_cidr, "dev", bridge)
    saved = {path: Path(path).read_text().strip() for path in SYSCTLS if Path(path).exists()}
    for path in saved:
        Path(path).write_text("1")  # ClusterIP traffic from pods is routed by the host, replies bridged
    run("iptables", "-N", FORWARD_CHAIN)
    run("iptables", "-A", FORWARD_CHAIN, "-i", bridge, "-o", bridge, "-j", "ACCEPT")
    run("iptables", "-A", FORWARD_CHAIN, "-i", bridge, "-j", "DROP")  # pods never reach beyond the bridge
    run("iptables", "-I", "FORWARD", "1", "-j", FORWARD_CHAIN)
    return saved


def teardown_host(bridge: str, service_cidr: str, saved_sysctls: dict[str, str]) -> None:
    """Undo setup_host and remove every pod namespace; safe to run on a half-made or absent network."""
    for ns in pod_namespaces():
        remove_sandbox(ns)
    run("ip", "route", "del", service_cidr, "dev", bridge, check=False)
    run("ip", "link", "del", bridge, check=False)
    remove_chain(FORWARD_CHAIN, ("FORWARD",))
    for path, value in saved_sysctls.items():
        Path(path).write_text(value)


def remove_chain(chain: str, parents: tuple[str, ...] = ("INPUT", "OUTPUT")) -> None:
    """Drop a filter chain and the jumps to it, in IPv4 and IPv6: kube-proxy's --cleanup leaves its
    (empty) KUBE-FIREWALL chain behind."""
    for tool in ("iptables", "ip6tables"):
        for parent in parents:
            while run(tool, "-D", parent, "-j", chain, check=False).returncode == 0:
                pass
        run(tool, "-F", chain, check=False)
        run(tool, "-X", chain, check=False)


def pod_namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NETNS_PREFIX)]


# --- pod side ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    netns: str
    ip: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


def sandbox_name(pod_uid: str) -> str:
    return NETNS_PREFIX + pod_uid.replace("-", "")[:12]


def create_sandbox(
    pod_uid: str, ip: str, bridge: str, gateway: str, cluster_cidr: str, service_cidr: str
) -> Sandbox:
    ns = sandbox_name(pod_uid)
    host_veth = "kiv" + pod_uid.replace("-", "")[:12]  # interface names are at most 15 characters
    prefix = ipaddress.ip_network(cluster_cidr).prefixlen
    remove_sandbox(ns)  # a half-made sandbox from an earlier try
    run("ip", "netns", "add", ns)
    try:
        run("ip", "link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", host_veth, "master", bridge, "up")
        # hairpin: a pod reaching itself through its own Service comes back over its own port
        run("ip", "link", "set", host_veth, "type", "bridge_slave", "hairpin", "on")
        run("ip", "-n", ns, "addr", "add", f"{ip}/{prefix}", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", ns, "route", "add", service_cidr, "via", gateway)
    except Exception:
        remove_sandbox(ns)
        raise
    return Sandbox(netns=ns, ip=ip)


def remove_sandbox(netns: str) -> None:
    """Kill whatever still runs in the namespace, then delete it (which deletes its veth pair)."""
    pids = run("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        run("kill", "-KILL", pid, check=False)
    run("ip", "netns", "del", netns, check=False)


class IpAllocator:
    """Hands out one node's pod CIDR round-robin from .2 (as host-local IPAM does), so a freed address is
    not handed out again at once to a pod that Prometheus or an Endpoints reader could mistake for the
    old one."""

    def __init__(self, cidr: str) -> None:
        self._hosts = [str(h) for h in list(ipaddress.ip_network(cidr).hosts())[1:]]
        self._used: set[str] = set()
        self._next = 0

    def allocate(self) -> str:
        for step in range(len(self._hosts)):
            ip = self._hosts[(self._next + step) % len(self._hosts)]
            if ip not in self._used:
                self._used.add(ip)
                self._next = (self._next + step + 1) % len(self._hosts)
                return ip
        raise RuntimeError("pod CIDR exhausted")

    def release(self, ip: str) -> None:
        self._used.discard(ip)
