"""The harness's pure decisions, without a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from localcluster.cluster import _terminated_as_exit, may_reuse
from localcluster.config import load_config
from localcluster.kubelet.container import backoff_delay
from localcluster.kubelet.launcher import Mount, hosts_file, launch_argv, service_names
from localcluster.kubelet.podenv import PodFacts, container_env, expand, resource_field_ref
from localcluster.kubelet.status import ContainerView, Termination, conditions, phase
from localcluster.network import IpAllocator
from localcluster.prometheus import scrape_config


def view(state: str, code: int | None = None, ready: bool = False) -> ContainerView:
    term = Termination(code, "Error", "c1", "t0", "t1") if code is not None else None
    return ContainerView("c", "img", "c1", state, 0, ready, state == "running", termination=term)


def test_phase_follows_the_kubelet() -> None:
    assert phase("Always", True, False, [view("waiting")]) == "Pending"
    assert phase("Always", False, False, [view("waiting")]) == "Pending"
    assert phase("Always", True, False, [view("running"), view("terminated", 1)]) == "Running"
    assert phase("Always", True, False, [view("terminated", 0)]) == "Running"  # will be restarted
    assert phase("Never", True, False, [view("terminated", 0)]) == "Succeeded"
    assert phase("Never", True, False, [view("terminated", 0), view("terminated", 2)]) == "Failed"
    assert phase("OnFailure", True, False, [view("terminated", 2)]) == "Running"
    assert phase("Never", False, True, [view("waiting")]) == "Failed"


def test_conditions_keep_transition_times_and_foreign_conditions() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}
    first = conditions([scheduled], "Running", True, True, [], [view("running", ready=False)], "t1")
    ready = next(c for c in first if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"
    assert scheduled in first
    second = conditions(first, "Running", True, True, [], [view("running", ready=True)], "t2")
    third = conditions(second, "Running", True, True, [], [view("running", ready=True)], "t3")
    assert next(c for c in third if c["type"] == "Ready")["lastTransitionTime"] == "t2"


def test_crash_loop_back_off() -> None:
    assert [backoff_delay(n) for n in range(7)] == [0, 10, 20, 40, 80, 160, 300]


def test_env_expansion_and_downward_api() -> None:
    assert expand("$(A)-$(MISSING)-$$(A)", {"A": "x"}) == "x-$(MISSING)-$(A)"
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "web"}},
           "spec": {"nodeName": "n1", "containers": []}}  # fmt: skip
    facts = PodFacts(pod, "10.244.1.2", "10.244.0.1", {"cpu": "16", "memory": "64Gi"})
    container = {"env": [
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "URL", "value": "http://$(MY_IP):8000"},
        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "URL2", "value": "http://$(MY_IP):8000"},
    ], "resources": {"limits": {"memory": "1Gi"}}}  # fmt: skip
    env = container_env(facts, container, {"PATH": "/bin"}, lambda *_: None, lambda *_: None)
    assert (
        env["APP"] == "web"
        and env["URL"] == "http://$(MY_IP):8000"
        and env["URL2"] == "http://10.244.1.2:8000"
    )
    assert resource_field_ref(facts, container, {"resource": "limits.memory", "divisor": "1Mi"}) == "1024"
    assert resource_field_ref(facts, container, {"resource": "limits.cpu"}) == "16"  # no limit: the node's


def test_ip_allocation_is_round_robin() -> None:
    ips = IpAllocator("10.244.1.0/24")
    first, second = ips.allocate(), ips.allocate()
    assert (first, second) == ("10.244.1.2", "10.244.1.3")
    ips.release(first)
    assert ips.allocate() == "10.244.1.4"  # a freed address is not handed out again at once


def test_launch_mounts_parents_first_from_open_descriptors() -> None:
    mounts = [Mount("/src/b", "/work/sub", True), Mount("/src/a", "/work", False)]
    argv = launch_argv("/run/netns/x", "pod", mounts, "/tmp", ["python3", "-V"])
    script = argv[argv.index("-c") + 1]
    assert script.index("exec 10</src/a") < script.index("exec 11</src/b")
    assert "mount --no-canonicalize --bind /proc/self/fd/10 /work\n" in script
    assert "mount -o remount,bind,ro /work/sub" in script
    assert argv[:3] == ["nsenter", "--net=/run/netns/x", "--"] and argv[-2:] == ["python3", "-V"]


def test_a_volume_over_a_parent_of_the_image_does_not_hide_it(tmp_path: Path) -> None:
    # CI may clone the project under /tmp, and the operator's pod mounts an emptyDir at /tmp: the
    # checkout (standing for the container image) must stay visible inside the pod.
    image = tmp_path / "scratch" / "checkout"
    image.mkdir(parents=True)
    (image / "marker").write_text("image\n")
    volume = tmp_path / "emptydir"
    volume.mkdir()
    argv = launch_argv(
        None,
        "pod",
        [Mount(str(volume), str(tmp_path / "scratch"), False)],
        "/",
        ["bash", "-c", f"cat {image / 'marker'}; ls -A {tmp_path / 'scratch'}"],
        image_paths=(str(image),),
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["image", "checkout"]  # the image is back; nothing else of the host's dir shows


def test_hosts_file_names_services() -> None:
    text = hosts_file("10.244.1.2", "p", [], [("10.96.0.10", service_names("web", "ns", "ns"))])
    assert "10.244.1.2\tp" in text
    assert "10.96.0.10\tweb.ns.svc.cluster.local web.ns.svc web.ns web" in text
    assert service_names("web", "other", "ns").split()[-1] == "web.other"


def test_prometheus_relabels_kubeinfer_pod_labels() -> None:
    relabel = scrape_config(Path("/k"))["scrape_configs"][0]["relabel_configs"]  # type: ignore[index]
    targets = {r.get("target_label"): r["source_labels"][0] for r in relabel}
    assert targets["track"] == "__meta_kubernetes_pod_label_serving_kubeinfer_dev_track"
    assert (
        targets["pod"] == "__meta_kubernetes_pod_name"
        and targets["namespace"] == "__meta_kubernetes_namespace"
    )


def test_config_reads_node_capacity() -> None:
    cfg = load_config({"KUBEINFER_NODES": "3", "KUBEINFER_NODE_CAPACITY": '{"nvidia.com/gpu": 8}'})
    assert [n.name for n in cfg.nodes] == ["kubeinfer-node-1", "kubeinfer-node-2", "kubeinfer-node-3"]
    assert cfg.nodes[2].capacity["nvidia.com/gpu"] == "8" and cfg.nodes[2].pod_cidr == "10.244.3.0/24"
    assert cfg.kubernetes_service_ip == "10.96.0.1"


def test_a_test_session_joins_another_session_but_not_the_demo_cluster() -> None:
    assert may_reuse("fixture", "fixture", reuse_cli=False)  # parallel test sessions share one cluster
    assert not may_reuse("cli", "fixture", reuse_cli=False)  # `make demo` then `make test`
    assert may_reuse("cli", "fixture", reuse_cli=True)  # KUBEINFER_TEST_REUSE_CLUSTER=1
    assert may_reuse("fixture", "cli", reuse_cli=False)  # `make cluster` adopts a session's cluster


def test_sigterm_while_a_cluster_starts_raises_so_it_is_taken_down() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited, _terminated_as_exit():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at the next bytecode: never reached
    assert exited.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
