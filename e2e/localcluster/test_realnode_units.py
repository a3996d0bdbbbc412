"""The real-node harness's pure decisions (configs, cgroup paths, image lists), without a cluster."""

from __future__ import annotations

import ipaddress
import os
import tomllib
from pathlib import Path

import pytest

from localcluster import cgroups, realcluster, realnode
from localcluster.config import load_config

PROC_CGROUP = """9:name=systemd:/
4:memory:/process_api/f5a2533d
3:cpuset:/
1:cpu:/
0::/
"""


def plan(tmp_path: Path, index: int = 1) -> realnode.NodePlan:
    cfg = load_config({"KUBEINFER_CLUSTER_DIR": str(tmp_path), "KUBEINFER_NODES": "2"})
    return realcluster.plan_nodes(cfg, [10250, 10251], [20250, 20251])[index - 1]


def test_node_cgroups_go_below_the_process_own_cgroup() -> None:
    assert cgroups.own_path(PROC_CGROUP) == "/process_api/f5a2533d"
    assert cgroups.node_root("n1", PROC_CGROUP) == "/process_api/f5a2533d/kubeinfer-n1"
    assert cgroups.own_path("0::/\n") == "/"


def test_node_plans_split_the_cluster_range_without_overlap(tmp_path: Path) -> None:
    first, second = plan(tmp_path, 1), plan(tmp_path, 2)
    assert (first.range_start, first.range_end) == ("10.244.1.2", "10.244.1.254")
    assert (second.range_start, second.range_end) == ("10.244.2.2", "10.244.2.254")
    assert first.dir != second.dir and first.containerd_root != second.containerd_root
    assert first.cgroup_root != second.cgroup_root
    assert first.gpus == 2  # the default node capacity's nvidia.com/gpu


def test_containerd_config_keeps_the_node_apart_and_restricts_oom_score(tmp_path: Path) -> None:
    p = plan(tmp_path)
    conf = tomllib.loads(realnode.containerd_config(p, "localhost/kubeinfer/pause:3.10"))
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert conf["root"] == str(p.containerd_root)
    assert conf["grpc"]["address"] == "/run/containerd/containerd.sock"  # bound to the node's run/ dir
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "localhost/kubeinfer/pause:3.10"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"].startswith(str(p.dir))


def test_cni_config_gives_pods_the_node_slice_and_only_the_service_route(tmp_path: Path) -> None:
    p = plan(tmp_path, 2)
    conf = realnode.cni_config(p, "kubeinfer0", "10.244.0.0/16", "10.244.0.1", "10.96.0.0/16")
    bridge = conf["plugins"][0]
    (rng,) = bridge["ipam"]["ranges"][0]
    assert bridge["bridge"] == "kubeinfer0" and bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert ipaddress.ip_address(rng["rangeStart"]) in ipaddress.ip_network("10.244.2.0/24")
    assert bridge["ipam"]["routes"] == [{"dst": "10.96.0.0/16", "gw": "10.244.0.1"}]  # no default route
    assert bridge["ipam"]["dataDir"].startswith(str(p.dir))


def test_kubelet_config_uses_the_node_cgroup_and_never_protects_kernel_defaults(tmp_path: Path) -> None:
    p = plan(tmp_path)
    conf = realnode.kubelet_config(p, tmp_path / "pki", "10.96.0.10")
    assert conf["cgroupRoot"] == p.cgroup_root and conf["cgroupDriver"] == "cgroupfs"
    assert conf["failCgroupV1"] is False and conf["oomScoreAdj"] == 0
    assert conf["protectKernelDefaults"] is False
    assert conf["clusterDNS"] == ["10.96.0.10"]
    assert conf["imageGCHighThresholdPercent"] == 100  # imported images cannot be pulled again


def test_namespace_script_binds_node_dirs_and_sysctl_files_then_runs_containerd(tmp_path: Path) -> None:
    p = plan(tmp_path)
    lines = realnode.namespace_script(p).splitlines()
    assert f"mount --bind {p.dir / 'kubelet'} /var/lib/kubelet" in lines
    assert f"mount --bind {p.dir / 'run'} /run/containerd" in lines
    assert f"mount --bind {p.dir / 'sysctl' / 'vm.overcommit_memory'} /proc/sys/vm/overcommit_memory" in lines
    assert lines[-1].startswith("exec containerd --config ")
    assert not any("sysctl -w" in line or "> /proc/sys" in line for line in lines)


def test_image_list_always_has_the_sandbox_image_first() -> None:
    assert realcluster.image_names({}) == ("pause", "coredns", "operator", "runtime")
    assert realcluster.image_names({"KUBEINFER_NODE_IMAGES": "coredns"}) == ("pause", "coredns")
    with pytest.raises(ValueError, match="unknown"):
        realcluster.image_names({"KUBEINFER_NODE_IMAGES": "nginx"})


def test_build_output_lines_become_images() -> None:
    out = "noise\nghcr.io/kubeinfer/runtime:0.1.0 /c/oci/runtime sha256:abc\n"
    (image,) = realcluster.parse_build_output(out)
    assert image.ref == "ghcr.io/kubeinfer/runtime:0.1.0" and image.digest == "sha256:abc"


def test_node_kind_is_checked() -> None:
    assert load_config({}).node_kind == "process"
    assert load_config({"KUBEINFER_NODE_KIND": "real"}).node_kind == "real"
    with pytest.raises(ValueError, match="KUBEINFER_NODE_KIND"):
        load_config({"KUBEINFER_NODE_KIND": "docker"})


def test_cri_log_lines_become_the_container_output() -> None:
    raw = (
        "2026-12-01T16:00:00.1Z stdout F hello\n"
        "2026-12-01T16:00:00.2Z stderr P part one, \n"
        "2026-12-01T16:00:00.3Z stderr F part two\n"
        "2026-12-01T16:00:00.4Z stdout F \n"
    )
    assert realcluster.cri_log_text(raw) == "hello\npart one, part two\n\n"


def test_the_newest_pod_of_a_name_gives_its_latest_restart_log(tmp_path: Path) -> None:
    logs = tmp_path / "node" / "pod-logs"
    old, new = logs / "ns_web_uid-old" / "main", logs / "ns_web_uid-new" / "main"
    for d in (old, new):
        d.mkdir(parents=True)
    (old / "0.log").write_text("old")
    for n in (0, 1, 10):
        (new / f"{n}.log").write_text(str(n))
    os.utime(logs / "ns_web_uid-old", (1, 1))
    state = {"real_nodes": [{"dir": str(tmp_path / "node")}]}
    assert realcluster.pod_log_file(state, "ns", "web") == new / "10.log"
    assert realcluster.pod_log_file(state, "ns", "web", "sidecar") is None
    assert realcluster.pod_log_file(state, "ns", "other") is None
