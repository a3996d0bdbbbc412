"""RollingUpdate within the GPU budget on the local cluster: a service of 1-GPU replicas rolls out a new
revision on a cluster whose free GPUs are exactly what the budget allows (another workload holds the rest),
and the replicas its Deployments ask for, watched through the rollout, never exceed desired + maxSurge."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from demo import TINY_EXAMPLE
from e2e_support import get, gpu_hog, operator_release, wait_for
from kubernetes import client, watch

pytestmark = pytest.mark.cluster

RELEASE = "ru-e2e"
OPERATOR_NAMESPACE = "ru-e2e-system"
NAMESPACE = "ru-e2e"
ISVC_LABEL = "serving.kubeinfer.dev/inferenceservice"
REPLICAS = 2
COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    values = {"replicaCount": 1, "resyncSeconds": 10}
    with operator_release(
        cluster, release=RELEASE, operator_namespace=OPERATOR_NAMESPACE, namespace=NAMESPACE, values=values
    ):
        yield cluster


def free_gpus(cluster: Any) -> int:
    nodes = get(cluster, "nodes")["items"]
    total = sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes)
    pods = get(cluster, "pods", "-A", "--field-selector=status.phase!=Succeeded,status.phase!=Failed")[
        "items"
    ]
    used = sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for p in pods
        if p["spec"].get("nodeName")
        for c in p["spec"]["containers"]
    )
    return total - used


def leave_free(cluster: Any, gpus: int) -> None:
    """Occupy GPUs with hog pods until exactly `gpus` are free."""
    cluster.kubectl("delete", "pods", "-l", "app=gpu-hog", "-n", NAMESPACE, "--wait=true", check=False)
    wait_for(  # an earlier test's replicas hold GPUs until they are gone
        "the replicas of earlier tests to go",
        lambda: (
            not get(cluster, "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=kubeinfer-runtime")[
                "items"
            ]
        ),
        timeout=120,
    )
    extra = free_gpus(cluster) - gpus
    assert extra >= 0, f"the cluster has fewer than {gpus} free GPUs"
    for i in range(extra):
        pod = gpu_hog(f"gpu-hog-{i}", NAMESPACE, 1, labels={"app": "gpu-hog"})
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        cluster.kubectl(
            "wait", "--for=condition=PodScheduled", f"pod/gpu-hog-{i}", "-n", NAMESPACE, "--timeout=30s"
        )
    assert free_gpus(cluster) == gpus


class DeploymentWatch:
    """Every version of the service's Deployments the apiserver hands out, in order: the replicas they ask
    for and the replicas Ready, summed over revisions after each change."""

    def __init__(self, cluster: Any, name: str) -> None:
        self.api = client.AppsV1Api(cluster.api_client())
        self.name = name
        self.watch = watch.Watch()
        self.requested: list[int] = []
        self.ready: list[int] = []
        self.deployments = 0  # how many Deployments the service has, as last seen
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = threading.Event()
        self.stopping = False
        self.failure: BaseException | None = None  # the watch broke while it was needed

    def __enter__(self) -> DeploymentWatch:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping = True
        self.watch.stop()
        assert self.failure is None, f"the watch broke mid-rollout: {self.failure!r}"

    def settled(self, replicas: int) -> bool:
        """The watch has seen one Deployment left, asking for and serving `replicas`."""
        return self.deployments == 1 and self.requested[-1] == replicas and self.ready[-1] == replicas

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as error:  # a watch cut by the session's end is no finding
            if not self.stopping:
                self.failure = error

    def _follow(self) -> None:
        selector = f"{ISVC_LABEL}={self.name},app.kubernetes.io/name=kubeinfer-runtime"
        listed = self.api.list_namespaced_deployment(NAMESPACE, label_selector=selector)
        current = {d.metadata.name: d for d in listed.items}
        self._record(current)
        self.started.set()
        for event in self.watch.stream(
            self.api.list_namespaced_deployment,
            NAMESPACE,
            label_selector=selector,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=600,
        ):
            deployment = event["object"]
            if event["type"] == "DELETED":
                current.pop(deployment.metadata.name, None)
            else:
                current[deployment.metadata.name] = deployment
            self._record(current)

    def _record(self, current: dict[str, Any]) -> None:
        self.deployments = len(current)
        self.requested.append(sum(d.spec.replicas or 0 for d in current.values()))
        self.ready.append(sum((d.status.ready_replicas or 0) for d in current.values()))


def service(name: str, max_surge: int) -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    obj["spec"]["runtime"]["resources"]["gpus"] = 1
    obj["spec"]["replicas"] = REPLICAS
    obj["spec"]["rollout"] = {"strategy": "RollingUpdate", "maxSurge": max_surge}
    return obj


def condition(isvc: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in isvc.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def roll_out(cluster: Any, name: str, max_surge: int) -> DeploymentWatch:
    """Create the service on a cluster with REPLICAS + max_surge free GPUs, change its model revision, and
    watch its Deployments until the new revision serves alone on every replica."""
    leave_free(cluster, REPLICAS + max_surge)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(service(name, max_surge)))
    cluster.kubectl("wait", "--for=condition=Ready", f"infsvc/{name}", "-n", NAMESPACE, "--timeout=180s")
    first = get(cluster, "infsvc", name, "-n", NAMESPACE)["status"]["stableRevision"]
    wait_for(
        f"{REPLICAS} replicas of {name} Ready",
        lambda: get(cluster, "infsvc", name, "-n", NAMESPACE)["status"].get("readyReplicas") == REPLICAS,
        timeout=180,
    )
    with DeploymentWatch(cluster, name) as watched:
        patch = '{"spec":{"model":{"revision":"v2"}}}'
        cluster.kubectl("patch", "infsvc", name, "-n", NAMESPACE, "--type=merge", "-p", patch)

        def rolled_out() -> bool:
            isvc = get(cluster, "infsvc", name, "-n", NAMESPACE)
            status = isvc["status"]
            deployments = get(cluster, "deployments", "-n", NAMESPACE, "-l", f"{ISVC_LABEL}={name}")["items"]
            return (
                status.get("observedGeneration") == isvc["metadata"]["generation"]
                and status.get("stableRevision") not in (None, first)
                and condition(isvc, "Progressing").get("reason") == "Complete"
                and len(deployments) == 1
                and deployments[0]["status"].get("readyReplicas") == REPLICAS
            )

        wait_for(f"{name} to roll out its new revision", rolled_out, timeout=300, interval=1)
        wait_for("the watch to see the rollout's end", lambda: watched.settled(REPLICAS), timeout=30)
    return watched


def test_with_no_spare_gpu_a_rollout_completes_one_replica_at_a_time(operator: Any) -> None:
    watched = roll_out(operator, "surge0", max_surge=0)
    assert max(watched.requested) == REPLICAS, watched.requested
    # One replica unavailable at a time, and the service never without a Ready replica.
    assert min(watched.ready) == REPLICAS - 1, watched.ready
    operator.kubectl("delete", "infsvc", "surge0", "-n", NAMESPACE, "--wait=true")


def test_with_one_spare_gpu_a_new_replica_is_ready_before_an_old_one_goes(operator: Any) -> None:
    watched = roll_out(operator, "surge1", max_surge=1)
    assert max(watched.requested) == REPLICAS + 1, watched.requested
    assert min(watched.ready) == REPLICAS, watched.ready


def test_a_scale_down_first_marks_each_replica_with_its_work(operator: Any) -> None:
    """Before a Deployment's count is lowered its Ready pods carry pod-deletion-cost from their requests
    in flight, read from Prometheus (idle here: 0 each)."""
    selector = f"{ISVC_LABEL}=surge1,app.kubernetes.io/name=kubeinfer-runtime"
    pods = get(operator, "pods", "-n", NAMESPACE, "-l", selector)["items"]
    wait_for(
        "Prometheus to have the replicas' request gauges",
        lambda: all(has_series(operator, p["metadata"]["name"]) for p in pods),
        timeout=60,
    )
    operator.kubectl(
        "patch", "infsvc", "surge1", "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"replicas":1}}'
    )

    def one_left() -> list[dict[str, Any]]:
        left = get(operator, "pods", "-n", NAMESPACE, "-l", selector)["items"]
        return left if len(left) == 1 and not left[0]["metadata"].get("deletionTimestamp") else []

    (kept,) = wait_for("one replica to be left", one_left, timeout=120)
    assert kept["metadata"]["annotations"][COST_ANNOTATION] == "0"
    operator.kubectl("delete", "infsvc", "surge1", "-n", NAMESPACE, "--wait=true")


def has_series(cluster: Any, pod: str) -> bool:
    query = f'kubeinfer_requests_running{{namespace="{NAMESPACE}",pod="{pod}"}}'
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    return bool(response.json()["data"]["result"])
