"""What only real nodes show (KUBEINFER_NODE_KIND=real): the kernel enforces memory limits, the
securityContext holds inside the container, images carry what the Dockerfiles put there, cluster DNS
resolves Services, `kubectl exec` reaches the container.  On the process kubelet these are skipped
(its pods are host processes: it cannot show any of this)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import get, wait_for

from localcluster import Cluster

pytestmark = pytest.mark.cluster
Obj = dict[str, Any]

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    if not cluster.real_nodes:
        pytest.skip(
            "needs real nodes (KUBEINFER_NODE_KIND=real): the process kubelet runs pods as host processes"
        )
    name = f"real-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def pod(name: str, image: str, command: list[str], **container: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": command,
                 "securityContext": RESTRICTED, **container}
            ],
        },
    }  # fmt: skip


def apply(cluster: Cluster, namespace: str, obj: Obj) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def running(cluster: Cluster, namespace: str, name: str) -> bool:
    return get(cluster, "pod", name, "-n", namespace)["status"].get("phase") == "Running"


def test_a_container_over_its_memory_limit_is_oom_killed_by_the_kernel(
    cluster: Cluster, namespace: str
) -> None:
    hog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    apply(cluster, namespace, pod("hog", cluster.python_image, ["python3", "-c", hog],
                                  resources={"limits": {"memory": "64Mi"}}))  # fmt: skip

    def terminated() -> Obj | None:
        status = get(cluster, "pod", "hog", "-n", namespace)["status"].get("containerStatuses") or [{}]
        return status[0].get("state", {}).get("terminated")

    state = wait_for("the container to be killed", terminated, timeout=90)
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled")


def test_the_container_runs_as_its_uid_on_a_read_only_root(cluster: Cluster, namespace: str) -> None:
    as_4321 = {**RESTRICTED, "runAsUser": 4321, "runAsGroup": 4321}
    apply(cluster, namespace, pod("secure", cluster.python_image, ["sleep", "600"], securityContext=as_4321))
    wait_for("the pod to run", lambda: running(cluster, namespace, "secure"), timeout=60)
    ids = cluster.kubectl("exec", "secure", "-n", namespace, "--", "id", "-u").stdout.strip()
    assert ids == "4321"
    caps = cluster.kubectl(
        "exec", "secure", "-n", namespace, "--", "grep", "CapEff", "/proc/self/status"
    ).stdout
    assert caps.split()[-1] == "0000000000000000"
    write = cluster.kubectl("exec", "secure", "-n", namespace, "--", "touch", "/usr/x", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr


def test_pods_resolve_services_by_name_through_cluster_dns(cluster: Cluster, namespace: str) -> None:
    apply(cluster, namespace, pod("dns", cluster.python_image, ["sleep", "600"]))
    wait_for("the pod to run", lambda: running(cluster, namespace, "dns"), timeout=60)
    lookup = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
    for name in ("kubernetes.default", "kubernetes.default.svc.cluster.local", "kube-dns.kube-system.svc"):
        out = cluster.kubectl("exec", "dns", "-n", namespace, "--", "python3", "-c", lookup, name).stdout
        expected = get(cluster, "service", name.split(".")[0], "-n", name.split(".")[1])["spec"]["clusterIP"]
        assert out.strip() == expected


def test_the_runtime_image_loads_its_prebuilt_kernels_as_non_root_on_a_read_only_root(
    cluster: Cluster, namespace: str
) -> None:
    """As the operator runs it (pod.yaml.j2): uid 10001, read-only root, /tmp an emptyDir."""
    check = (
        "import logging; logging.basicConfig(level=logging.INFO)\n"
        "from kubeinfer_runtime.models import fused_ops\n"
        "print('kernels on:', fused_ops.use_cpu_kernels(True))"
    )
    spec = pod("kernels", cluster.images["runtime"], ["python", "-c", check],
               volumeMounts=[{"name": "tmp", "mountPath": "/tmp"}])  # fmt: skip
    spec["spec"]["securityContext"] |= {"runAsUser": 10001, "runAsGroup": 10001}
    spec["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    apply(cluster, namespace, spec)

    def finished() -> str | None:
        phase = get(cluster, "pod", "kernels", "-n", namespace)["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    wait_for("the check to finish", finished, timeout=180)
    log = cluster.kubectl("logs", "kernels", "-n", namespace).stdout
    assert "kernels on: True" in log, log
    assert "CPU kernels on (avx2, /opt/kubeinfer/kernels/kubeinfer_cpu_ops.so)" in log, log  # not rebuilt
