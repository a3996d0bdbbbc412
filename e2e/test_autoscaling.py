"""The autoscaler on the local cluster: real Prometheus scraping real runtime pods under real load.

A replica is slowed by fault injection (100 ms per decode step, 2 sequences at a time), so that a few
concurrent clients from this process overload it deterministically on a 2-core machine. The tests run
in order: scale-up under load, scale-down after the load stops, Prometheus going away and coming back,
and GPU capacity running out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from demo import TINY_EXAMPLE, endpoint_addresses, service_urls
from e2e_support import get, gpu_hog, operator_release, wait_for

pytestmark = pytest.mark.cluster

RELEASE = "as-e2e"
OPERATOR_NAMESPACE = "as-e2e-system"
NAMESPACE = "as-e2e"
ISVC_LABEL = "serving.kubeinfer.dev/inferenceservice"
INTERVAL = 3.0  # spec.scaling.interval
SCALE_DOWN_WINDOW = 30.0
TOLERANCE = 0.1
WAITING_TARGET = 2  # per replica
QUEUE_TIME_TARGET = 0.5  # the oldest-wait target is twice this


def isvc(cluster: Any, name: str) -> dict[str, Any]:
    return get(cluster, "infsvc", name, "-n", NAMESPACE)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def replicas(cluster: Any, name: str) -> int:
    """The replica count the operator wrote to the Deployment it owns."""
    deployments = get(cluster, "deployments", "-n", NAMESPACE, "-l", f"{ISVC_LABEL}={name}")["items"]
    return sum(d["spec"]["replicas"] for d in deployments)


def events(cluster: Any, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={name}"
    return get(cluster, "events", "-n", NAMESPACE, "--field-selector", selector)["items"]


def prometheus_shows(cluster: Any, promql: str) -> bool:
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": promql}, timeout=5)
    return bool(response.json()["data"]["result"])


def pod_metric(ip: str, name: str) -> float:
    """The sum of a metric's samples, read from the pod itself."""
    text = httpx.get(f"http://{ip}:8000/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def manifest(name: str, gpus: int = 0, max_replicas: int = 2, cpu: str | None = None) -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    runtime = obj["spec"]["runtime"]
    runtime["resources"]["gpus"] = gpus
    if cpu is not None:
        runtime["resources"]["cpu"] = cpu
    runtime["maxNumSeqs"] = 2
    runtime["faults"] = {"tokenLatency": "100ms"}
    obj["spec"]["scaling"] = {
        "minReplicas": 1,
        "maxReplicas": max_replicas,
        "interval": f"{INTERVAL:g}s",
        "queueTimeTarget": f"{QUEUE_TIME_TARGET * 1000:g}ms",
        "waitingPerReplicaTarget": WAITING_TARGET,
        "kvCacheTarget": 0.9,
        "tolerance": TOLERANCE,
        "scaleUpWindow": "0s",
        "scaleDownWindow": f"{SCALE_DOWN_WINDOW:g}s",
    }
    return obj


class Load:
    """`clients` threads each sending one completion after another, each on a new connection so that
    kube-proxy spreads them over the replicas as they come."""

    def __init__(self, url: str, model: str, clients: int) -> None:
        self.url, self.model, self.clients = url, model, clients
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.answered = 0

    def start(self) -> Load:
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def _client(self) -> None:
        body = {"model": self.model, "prompt": "Hello", "max_tokens": 16, "ignore_eos": True}
        while not self.stopping.is_set():
            try:
                if httpx.post(f"{self.url}/v1/completions", json=body, timeout=60).status_code == 200:
                    self.answered += 1
            except httpx.HTTPError:
                time.sleep(0.2)  # a replica going away mid-request: the next one goes elsewhere

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=90)


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    values = {"replicaCount": 1, "resyncSeconds": 10}
    with operator_release(
        cluster, release=RELEASE, operator_namespace=OPERATOR_NAMESPACE, namespace=NAMESPACE, values=values
    ):
        try:
            yield cluster
        finally:
            cluster.start_prometheus()  # whatever a failed test left


def create(cluster: Any, obj: dict[str, Any]) -> str:
    name = obj["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
    cluster.kubectl("wait", "--for=condition=Ready", f"infsvc/{name}", "-n", NAMESPACE, "--timeout=180s")
    # The autoscaler is watching once it has read the signals of the ready replica.
    wait_for(
        f"the autoscaler to read {name}'s signals",
        lambda: condition(isvc(cluster, name), "MetricsAvailable").get("status") == "True",
        timeout=60,
    )
    return name


@pytest.fixture(scope="module")
def burst(operator: Any) -> Iterator[tuple[str, Load]]:
    name = create(operator, manifest("burst"))
    load = Load(service_urls(operator, NAMESPACE, name)[0], "tiny", clients=8)
    yield name, load
    load.stop()


def selector(name: str) -> str:
    return f'{{namespace="{NAMESPACE}",inferenceservice="{name}"}}'


def breach(name: str, ready: int) -> str:
    """PromQL that returns a series while a live load signal is over its target beyond the tolerance."""
    waiting = WAITING_TARGET * ready * (1 + TOLERANCE)
    oldest = 2 * QUEUE_TIME_TARGET * (1 + TOLERANCE)
    return (
        f"(sum(kubeinfer_requests_waiting{selector(name)}) > {waiting:g})"
        f" or (max(kubeinfer_oldest_waiting_request_age_seconds{selector(name)}) > {oldest:g})"
    )


def test_load_above_one_replica_scales_up_and_the_new_pod_serves(
    operator: Any, burst: tuple[str, Load]
) -> None:
    name, load = burst
    assert replicas(operator, name) == 1
    (first,) = endpoint_addresses(operator, NAMESPACE, name)
    load.start()
    breached = wait_for(
        "Prometheus to show the overload", lambda: prometheus_shows(operator, breach(name, 1)), 60
    )
    breached_at = time.monotonic()
    wait_for("the Deployment to scale up", lambda: replicas(operator, name) == 2, timeout=4 * INTERVAL)
    rose_after = time.monotonic() - breached_at
    print(f"replicas rose {rose_after:.1f}s after Prometheus showed the breach (interval {INTERVAL:g}s)")
    assert breached and rose_after <= 2 * INTERVAL + 1  # + the poll period and two kubectl calls

    addresses = wait_for(
        "the new replica to become Ready",
        lambda: (found := endpoint_addresses(operator, NAMESPACE, name)) and len(found) == 2 and found,
        timeout=120,
    )
    (new,) = set(addresses) - {first}
    served = 'kubeinfer_requests_total{model="tiny",outcome="success"}'
    wait_for("the new replica to serve requests", lambda: pod_metric(new, served) > 0, timeout=30)
    decision = isvc(operator, name)["status"]["scalingDecisions"][-1]
    assert (decision["fromReplicas"], decision["toReplicas"]) == (1, 2)
    assert decision["reason"].startswith("scale up 1->2")
    assert any(e["reason"] == "ScaledUp" for e in events(operator, name))


def test_when_the_load_stops_replicas_return_to_min_after_the_window(
    operator: Any, burst: tuple[str, Load]
) -> None:
    name, load = burst
    assert replicas(operator, name) == 2
    load.stop()
    stopped_at = time.monotonic()
    assert load.answered > 0
    wait_for("the scale-down to 1 replica", lambda: replicas(operator, name) == 1, timeout=180, interval=1)
    took = time.monotonic() - stopped_at
    print(f"replicas returned to min {took:.0f}s after the load stopped (window {SCALE_DOWN_WINDOW:g}s)")
    assert took >= SCALE_DOWN_WINDOW
    status = isvc(operator, name)["status"]
    assert status["desiredReplicas"] == 1
    assert status["scalingDecisions"][-1]["reason"].startswith("scale down 2->1")
    assert any(e["reason"] == "ScaledDown" for e in events(operator, name))


def test_without_prometheus_replicas_hold_and_resume_when_it_returns(
    operator: Any, burst: tuple[str, Load]
) -> None:
    name, load = burst
    assert replicas(operator, name) == 1
    (ip,) = endpoint_addresses(operator, NAMESPACE, name)
    operator.stop_prometheus()
    try:
        metrics = wait_for(
            "MetricsAvailable=False",
            lambda: (c := condition(isvc(operator, name), "MetricsAvailable")).get("status") == "False" and c,
            timeout=3 * INTERVAL,
        )
        assert metrics["reason"] == "MetricsUnavailable" and "Prometheus" in metrics["message"]
        load.start()
        wait_for("the replica to be overloaded", lambda: pod_metric(ip, "kubeinfer_requests_waiting") > 3, 30)
        held_until = time.monotonic() + 4 * INTERVAL
        while time.monotonic() < held_until:  # overloaded, but no reading: hold, never guess
            assert replicas(operator, name) == 1
            assert isvc(operator, name)["status"]["desiredReplicas"] == 1
            time.sleep(1)
    finally:
        operator.start_prometheus()
    try:
        wait_for(
            "MetricsAvailable=True",
            lambda: condition(isvc(operator, name), "MetricsAvailable").get("status") == "True",
            timeout=60,
        )
        wait_for("the scale-up to resume", lambda: replicas(operator, name) == 2, timeout=60)
    finally:
        load.stop()
    reasons = [e["reason"] for e in events(operator, name)]
    assert "MetricsUnavailable" in reasons and "SignalsRead" in reasons


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


def test_scale_up_stops_at_the_gpus_that_fit(operator: Any, burst: tuple[str, Load]) -> None:
    operator.kubectl("delete", "infsvc", burst[0], "-n", NAMESPACE, "--wait=false")  # frees the CPUs
    # Another workload holds 2 of the cluster's GPUs: what is left fits fewer replicas than the load wants.
    operator.kubectl("apply", "-f", "-", input=yaml.safe_dump(gpu_hog("gpu-hog", NAMESPACE, 2)))
    operator.kubectl("wait", "--for=condition=PodScheduled", "pod/gpu-hog", "-n", NAMESPACE, "--timeout=30s")
    fits = free_gpus(operator)
    assert fits >= 1
    # A quarter CPU each: a real node has 2 CPUs, and the GPUs, not the CPUs, are to run out first.
    name = create(operator, manifest("gpu", gpus=1, max_replicas=fits + 3, cpu="250m"))
    load = Load(service_urls(operator, NAMESPACE, name)[0], "tiny", clients=6 * fits + 2).start()
    try:

        def limited() -> dict[str, Any]:
            found = condition(isvc(operator, name), "ScalingLimited")
            return found if found.get("reason") == "InsufficientNvidiaComGpu" else {}

        found = wait_for("ScalingLimited=InsufficientNvidiaComGpu", limited, timeout=90)
        assert found["status"] == "True" and "Insufficient nvidia.com/gpu" in found["message"]
        assert "scale-up stopped" in found["message"]
        wait_for(
            f"the {fits} replicas that fit to be Ready",
            lambda: len(endpoint_addresses(operator, NAMESPACE, name)) == fits,
            timeout=120,
        )
        # Still overloaded, with pods pending: the count stays where the GPUs ran out.
        held = isvc(operator, name)["status"]["desiredReplicas"]
        assert fits < held <= fits + 3
        for _ in range(4):
            time.sleep(INTERVAL)
            status = isvc(operator, name)["status"]
            assert status["desiredReplicas"] == held
            assert condition(isvc(operator, name), "ScalingLimited")["reason"] == "InsufficientNvidiaComGpu"
        assert prometheus_shows(operator, breach(name, fits))
        assert any(
            e["reason"] == "InsufficientNvidiaComGpu" and e["type"] == "Warning"
            for e in events(operator, name)
        )
    finally:
        load.stop()
