"""The local cluster behaves as Kubernetes does: API and RBAC, Deployments whose pods really serve,
Services, restarts, garbage collection, GPU scheduling, Prometheus discovery."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localcluster import Cluster

pytestmark = pytest.mark.cluster
Obj = dict[str, Any]

# A small HTTP server for pods: / answers with the pod's name, /metrics with one Prometheus gauge.
HTTP_SERVER = textwrap.dedent("""
    import http.server, os
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (b"demo_up 1\\n" if self.path == "/metrics" else os.environ["POD_NAME"].encode())
            self.send_response(200); self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.ThreadingHTTPServer(("", 8000), H).serve_forever()
""")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def get_json(cluster: Cluster, *args: str) -> Obj:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def http_get(
    url: str, timeout: float = 3, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # refused or unreachable: not serving (yet)
        return 0, str(exc)


def server_pod_spec(image: str, extra: Obj | None = None) -> Obj:
    container = {
        "name": "web",
        "image": image,
        "command": ["python3", "-c", HTTP_SERVER],
        "ports": [{"name": "http", "containerPort": 8000}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 2},
    }
    return {"containers": [container], "terminationGracePeriodSeconds": 5, **(extra or {})}


def ready_pods(cluster: Cluster, namespace: str, selector: str) -> list[Obj]:
    pods = get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        "the default ServiceAccount",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_crud_through_the_apiserver(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api_client())
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data={"mode": "fast"})
    core.create_namespaced_config_map(namespace, body)
    assert core.read_namespaced_config_map("settings", namespace).data == {"mode": "fast"}
    core.patch_namespaced_config_map("settings", namespace, {"data": {"mode": "slow"}})
    assert core.read_namespaced_config_map("settings", namespace).data == {"mode": "slow"}
    core.delete_namespaced_config_map("settings", namespace)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("settings", namespace)
    assert missing.value.status == 404


def test_rbac_denies_a_service_account_without_a_role(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    token = cluster.kubectl("create", "token", "reader", "-n", namespace).stdout.strip()
    context = ssl.create_default_context(cadata=_ca_pem(cluster))
    url = f"{cluster.server}/api/v1/namespaces/{namespace}/pods"
    headers = {"Authorization": f"Bearer {token}"}
    status, body = http_get(url, headers=headers, context=context)
    assert status == 403, body
    assert f"system:serviceaccount:{namespace}:reader" in body

    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "reader",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:reader",
        "-n",
        namespace,
    )
    wait_for("the role to take effect", lambda: http_get(url, headers=headers, context=context)[0] == 200, 15)
    status, _ = http_get(f"{url.rsplit('/', 1)[0]}/secrets", headers=headers, context=context)
    assert status == 403  # the role grants pods, nothing else


def _ca_pem(cluster: Cluster) -> str:
    kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    return base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]).decode()


def test_deployment_serves_restarts_and_is_garbage_collected(cluster: Cluster, namespace: str) -> None:
    labels = {"app": "web"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": server_pod_spec(cluster.python_image)},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8000}]},
    }
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [deployment, service]}),
    )

    pods = wait_for(
        "2 ready pods",
        lambda: (
            len(ready_pods(cluster, namespace, "app=web")) == 2 and ready_pods(cluster, namespace, "app=web")
        ),
        60,
    )
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 2
    for pod in pods:
        assert http_get(f"http://{pod['status']['podIP']}:8000/") == (200, pod["metadata"]["name"])
        assert pod["spec"]["nodeName"] in cluster.node_names
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and status["started"] and "running" in status["state"]

    def endpoint_ips() -> set[str]:
        slices = get_json(cluster, "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=web")
        return {
            a
            for s in slices["items"]
            for e in s.get("endpoints") or []
            if e["conditions"].get("ready")
            for a in e["addresses"]
        }

    wait_for("the EndpointSlice to list both pods", lambda: endpoint_ips() == ips, 30)
    endpoints = get_json(cluster, "endpoints", "web", "-n", namespace)
    assert {a["ip"] for s in endpoints["subsets"] for a in s["addresses"]} == ips

    cluster_ip = get_json(cluster, "service", "web", "-n", namespace)["spec"]["clusterIP"]
    names = {p["metadata"]["name"] for p in pods}
    # kube-proxy spreads over both, once its iptables sync has caught up with the EndpointSlice
    # (seconds behind it on a loaded machine).
    wait_for(
        "the ClusterIP to answer from both pods",
        lambda: {http_get(f"http://{cluster_ip}/")[1] for _ in range(20)} == names,
        30,
    )

    # a deleted pod is replaced
    victim = pods[0]["metadata"]["name"]
    cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    replaced = wait_for(
        "a replacement pod",
        lambda: (
            (names := {p["metadata"]["name"] for p in ready_pods(cluster, namespace, "app=web")})
            and len(names) == 2
            and victim not in names
            and names
        ),
        60,
    )

    # a killed container process is restarted in place, restartCount counts it
    target = get_json(cluster, "pod", sorted(replaced)[0], "-n", namespace)
    pids = cluster.container_pids(namespace, target["metadata"]["name"])
    assert pids
    subprocess.run(["kill", "-KILL", *map(str, pids)], check=True)

    def restarted() -> Obj | None:
        pod = get_json(cluster, "pod", target["metadata"]["name"], "-n", namespace)
        status = pod["status"]["containerStatuses"][0]
        return pod if status["restartCount"] == 1 and status["ready"] else None

    pod = wait_for("the container to be restarted", restarted, 60)
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == 137 and last["reason"] == "Error"
    assert http_get(f"http://{pod['status']['podIP']}:8000/")[0] == 200

    # deleting the Deployment garbage-collects its ReplicaSet and pods
    cluster.kubectl("delete", "deployment", "web", "-n", namespace, "--wait=false")
    wait_for(
        "the ReplicaSet and pods to be collected",
        lambda: not get_json(cluster, "rs,pods", "-n", namespace, "-l", "app=web")["items"],
        60,
    )


def test_pod_sees_its_env_volumes_and_the_apiserver(cluster: Cluster, namespace: str) -> None:
    """Downward API, configMap and emptyDir volumes at their mountPath, the service-account token, an
    in-cluster client reaching the apiserver, and SIGTERM on deletion."""
    cluster.kubectl("create", "configmap", "app-config", "--from-literal=greeting=hello", "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "view",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:default",
        "-n",
        namespace,
    )
    script = textwrap.dedent("""
        import os, signal, socket, sys, time
        from kubernetes import client, config
        print("greeting", open("/etc/app/greeting").read(), flush=True)
        print("env", os.environ["MY_NS"], os.environ["MY_IP"], os.environ["GREETING"], flush=True)
        print("hostname", socket.gethostname(), flush=True)
        open("/scratch/x", "w").write("ok")
        config.load_incluster_config()
        pods = client.CoreV1Api().list_namespaced_pod(os.environ["MY_NS"]).items
        print("apiserver sees", [p.metadata.name for p in pods], flush=True)
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(0)))
        while True:
            time.sleep(0.1)
    """)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "main",
                    "image": cluster.python_image,
                    "command": ["python3", "-c", script],
                    "env": [
                        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {
                            "name": "GREETING",
                            "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "greeting"}},
                        },
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/app"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    log = wait_for(
        "the pod to reach the apiserver",
        lambda: "apiserver sees" in (text := cluster.pod_log(namespace, "probe")) and text,
        60,
    )
    ip = get_json(cluster, "pod", "probe", "-n", namespace)["status"]["podIP"]
    assert "greeting hello" in log
    assert f"env {namespace} {ip} hello" in log
    assert "hostname probe" in log
    assert "apiserver sees ['probe']" in log
    assert "greeting hello" in cluster.kubectl("logs", "probe", "-n", namespace).stdout  # via the kubelet API
    # followed from before the deletion: a deleted pod's logs go with it
    follow = subprocess.Popen(
        ["kubectl", f"--kubeconfig={cluster.kubeconfig}", "logs", "-f", "probe", "-n", namespace],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(1)
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "probe", "-n", namespace, "--timeout=30s")
    assert time.monotonic() - started < 8  # ended by SIGTERM, not by SIGKILL after the 10 s grace
    followed, _ = follow.communicate(timeout=30)
    assert "got SIGTERM" in followed


def test_gpu_requests_beyond_any_node_stay_unschedulable(cluster: Cluster, namespace: str) -> None:
    def gpu_pod(name: str, gpus: int) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": cluster.python_image,
                        "command": ["sleep", "600"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        }

    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [gpu_pod("fits", 2), gpu_pod("too-big", 3)]}
        ),
    )

    def condition(pod: str) -> Obj | None:
        conditions = get_json(cluster, "pod", pod, "-n", namespace)["status"].get("conditions", [])
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    scheduled = wait_for("the scheduler's verdict", lambda: (c := condition("too-big")) and c, 30)
    assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
    assert "nvidia.com/gpu" in scheduled["message"]
    wait_for(
        "the 2-GPU pod to run",
        lambda: get_json(cluster, "pod", "fits", "-n", namespace)["status"].get("phase") == "Running",
        30,
    )
    assert get_json(cluster, "pod", "too-big", "-n", namespace)["status"]["phase"] == "Pending"


def test_prometheus_scrapes_annotated_pods(cluster: Cluster, namespace: str) -> None:
    labels = {
        "serving.kubeinfer.dev/inferenceservice": "demo",
        "serving.kubeinfer.dev/revision": "abc123",
        "serving.kubeinfer.dev/track": "canary",
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "metrics",
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8000",
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": server_pod_spec(cluster.python_image),
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def query(promql: str) -> list[Obj]:
        url = f"{cluster.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        status, body = http_get(url)
        return json.loads(body)["data"]["result"] if status == 200 else []

    selector = f'up{{namespace="{namespace}",pod="metrics"}}'
    result = wait_for(
        "Prometheus to scrape the pod", lambda: [r for r in query(selector) if r["value"][1] == "1"], 90
    )
    series = result[0]["metric"]
    assert (series["inferenceservice"], series["revision"], series["track"]) == ("demo", "abc123", "canary")
    assert query(f'demo_up{{namespace="{namespace}",pod="metrics"}}')

    cluster.stop_prometheus()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{cluster.prometheus_url}/-/ready", timeout=2)
    cluster.start_prometheus()
    assert query(f"{selector}[5m]") or query(selector)  # same data directory: the series is still there
