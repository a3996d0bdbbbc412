"""Canary through Gateway API on the local cluster: the chart's operator writes an HTTPRoute with the step
weights and one Service per track, instead of running the router; checked in the objects the apiserver
stores (the cluster runs no Gateway implementation), and by real requests through each track's Service.

Then the routing changes under a running service: Gateway -> router -> RollingUpdate, and each change
deletes the objects the previous one left.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from demo import TINY_EXAMPLE
from e2e_support import get, operator_release, wait_for

pytestmark = pytest.mark.cluster

RELEASE = "gateway-e2e"
NAMESPACE = "gateway-e2e"
NAME = "chat"
GROUP = "serving.kubeinfer.dev"
HTTPROUTE_CRD = "httproutes.gateway.networking.k8s.io"
PARENT = {"name": "inference", "namespace": "gateways", "sectionName": "http"}
STEP_PAUSE_S = 20
STEPS = [{"weight": 25, "pause": f"{STEP_PAUSE_S}s"}, {"weight": 60}]  # the last waits for a promote
REQUEST = {"model": "tiny", "prompt": "Hello", "max_tokens": 3}


def manifest(marker: str, routing: str = "gateway") -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    spec = obj["spec"]
    spec["replicas"] = 1
    spec.pop("scaling", None)
    spec["runtime"]["env"] = [{"name": "E2E_REVISION", "value": marker}]
    if routing == "rolling":
        spec["rollout"] = {"strategy": "RollingUpdate"}
        return obj
    # minRequests 0: with no traffic through a Gateway here, an analysis passes instead of waiting.
    spec["rollout"] = {
        "strategy": "Canary",
        "steps": STEPS,
        "analysis": {"interval": "10s", "minRequests": 0},
    }
    if routing == "gateway":
        spec["rollout"]["trafficRouting"] = {"gatewayAPI": {"parentRefs": [PARENT]}}
    return obj


def apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def status(cluster: Any) -> dict[str, Any]:
    return get(cluster, "infsvc", NAME, "-n", NAMESPACE).get("status") or {}


def condition(cluster: Any, type_: str) -> dict[str, Any]:
    return next((c for c in status(cluster).get("conditions", []) if c["type"] == type_), {})


def found(cluster: Any, kind: str, name: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json", check=False)
    return yaml.safe_load(result.stdout) if result.returncode == 0 else None


def backends(route: dict[str, Any] | None) -> tuple[tuple[str, int], ...]:
    if route is None:
        return ()
    return tuple((b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"])


def selected_revision(cluster: Any, service: str) -> str | None:
    obj = found(cluster, "service", service)
    return obj["spec"]["selector"].get(f"{GROUP}/revision") if obj else None


def answer_through(cluster: Any, service: str) -> str:
    """A completion through the Service's cluster IP (kube-proxy to a replica it selects). A Service just
    created is programmed into kube-proxy's rules within a second or so: a refused connection is retried
    for a while; an error status is not."""

    def attempt() -> str | None:
        ip = (found(cluster, "service", service) or {})["spec"]["clusterIP"]
        try:
            response = httpx.post(f"http://{ip}:80/v1/completions", json=REQUEST, timeout=60, trust_env=False)
        except httpx.TransportError:
            return None
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    return wait_for(f"an answer through Service {service}", attempt, timeout=30)


class SteadyLoad:
    """One client sending completions back to back to a Service's cluster IP until stopped (or 10 min),
    recording every failure: a refused connection counts like an error status."""

    def __init__(self, url: str) -> None:
        self.url, self.sent, self.failures = url, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 600
        with httpx.Client(timeout=30, trust_env=False) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                self.sent += 1
                try:
                    response = client.post(f"{self.url}/v1/completions", json=REQUEST)
                    if response.status_code != 200:
                        self.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))
                time.sleep(0.05)

    def __enter__(self) -> SteadyLoad:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def remove_httproute_crd(cluster: Any) -> None:
    cluster.kubectl("delete", "crd", HTTPROUTE_CRD, "--ignore-not-found", "--wait=true")


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    remove_httproute_crd(cluster)  # left by an interrupted run: this test starts without Gateway API
    with operator_release(
        cluster, release=RELEASE, operator_namespace=f"{RELEASE}-system", namespace=NAMESPACE,
        values={"resyncSeconds": 5},
    ):  # fmt: skip
        yield cluster
    remove_httproute_crd(cluster)


@pytest.fixture(scope="module")
def httproute_crd() -> str:
    fetched = subprocess.run(
        ["bash", str(Path(__file__).parent / "fetch_gateway_api.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return str(Path(fetched.stdout.strip()) / "gateway.networking.k8s.io_httproutes.yaml")


def test_the_canary_weights_reach_the_httproute_and_routing_changes_clean_up(
    operator: Any, httproute_crd: str
) -> None:
    cluster = operator
    # No Gateway API in the cluster yet: the service serves, and Degraded says why nothing is routed.
    apply(cluster, manifest("1"))
    wait_for("Ready", lambda: condition(cluster, "Ready").get("status") == "True", timeout=180)
    degraded = wait_for(
        "Degraded to name the missing API",
        lambda: (c := condition(cluster, "Degraded")).get("reason") == "GatewayAPIUnavailable" and c,
        timeout=30,
    )
    assert "spec.rollout.trafficRouting.gatewayAPI" in degraded["message"]

    cluster.install_crd(httproute_crd, HTTPROUTE_CRD)
    route = wait_for("the HTTPRoute", lambda: found(cluster, "httproute", NAME), timeout=30)
    first = status(cluster)["stableRevision"]
    defaults = {"group": "gateway.networking.k8s.io", "kind": "Gateway"}  # what the CRD fills in
    assert route["spec"]["parentRefs"] == [{**PARENT, **defaults}]
    assert route["metadata"]["ownerReferences"][0]["name"] == NAME
    assert backends(route) == (("chat-stable", 100),)
    assert selected_revision(cluster, "chat-stable") == first
    assert found(cluster, "deployment", f"{NAME}-router") is None
    wait_for("Degraded to clear", lambda: condition(cluster, "Degraded").get("status") == "False", timeout=30)
    assert answer_through(cluster, "chat-stable")

    # A new revision: the route follows the steps, read every half second while it runs.
    seen: list[tuple[tuple[str, int], ...]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            current = backends(found(cluster, "httproute", NAME))
            if not seen or seen[-1] != current:
                seen.append(current)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        apply(cluster, manifest("2"))
        second = wait_for("the canary", lambda: status(cluster).get("canaryRevision"), timeout=30)
        wait_for("step 2", lambda: status(cluster).get("canaryWeight") == 60, timeout=STEP_PAUSE_S + 90)
        assert selected_revision(cluster, "chat-canary") == second
        assert answer_through(cluster, "chat-canary")
        promote = f"{GROUP}/promote={second}"
        cluster.kubectl("annotate", "infsvc", NAME, "-n", NAMESPACE, promote, "--overwrite")
        wait_for("Promoted", lambda: status(cluster).get("rolloutPhase") == "Promoted", timeout=90)
        wait_for("the route to settle", lambda: seen and seen[-1] == (("chat-stable", 100),), timeout=15)
    finally:
        stop.set()
        watcher.join(timeout=5)
    print(f"\nroute backends over the rollout: {seen}")
    step_1 = (("chat-stable", 75), ("chat-canary", 25))
    step_2 = (("chat-stable", 40), ("chat-canary", 60))
    assert step_1 in seen and step_2 in seen and seen.index(step_1) < seen.index(step_2), seen
    assert selected_revision(cluster, "chat-stable") == second
    wait_for("the canary Service to go", lambda: found(cluster, "service", "chat-canary") is None, timeout=30)

    # The routing changes under steady load through the service's own URL: Gateway -> router ->
    # RollingUpdate -> router. Each old path goes only once the new one answers: nothing is refused.
    ip = (found(cluster, "service", NAME) or {})["spec"]["clusterIP"]
    with SteadyLoad(f"http://{ip}:80") as load:
        # Gateway -> the router: the route and track Services go, the router comes.
        apply(cluster, manifest("2", routing="router"))
        wait_for("the router", lambda: found(cluster, "deployment", f"{NAME}-router"), timeout=30)
        wait_for("the HTTPRoute to go", lambda: found(cluster, "httproute", NAME) is None, timeout=90)
        assert found(cluster, "service", "chat-stable") is None
        assert (found(cluster, "service", NAME) or {})["spec"]["selector"]["app.kubernetes.io/name"] == (
            "kubeinfer-router"
        )

        # Canary -> RollingUpdate: every router object goes; the Service selects the replicas again.
        apply(cluster, manifest("2", routing="rolling"))
        router_objects = [(kind, f"{NAME}-router") for kind in ("deployment", "configmap", "serviceaccount")]
        router_objects.append(("rolebinding", f"{NAME}-router-config-reader"))
        wait_for(
            "the router's objects to go",
            lambda: all(found(cluster, kind, name) is None for kind, name in router_objects),
            timeout=90,
        )
        selector = (found(cluster, "service", NAME) or {})["spec"]["selector"]
        assert selector == {"app.kubernetes.io/name": "kubeinfer-runtime", f"{GROUP}/inferenceservice": NAME}

        # ... and back to the router.
        apply(cluster, manifest("2", routing="router"))
        wait_for(
            "the Service to select the router again",
            lambda: (
                (found(cluster, "service", NAME) or {})["spec"]["selector"].get("app.kubernetes.io/name")
                == "kubeinfer-router"
            ),
            timeout=90,
        )
        time.sleep(5)  # requests keep flowing past the switch
    print(f"\n{load.sent} requests through the switches, {len(load.failures)} failed")
    assert load.sent >= 20 and load.failures == [], load.failures[:5]
