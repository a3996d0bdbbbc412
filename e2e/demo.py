"""`make demo`: from a fresh machine to a chat answer served through the operator.

    PYTHONPATH=e2e .venv/bin/python e2e/demo.py

Steps: start the local cluster (left running: `make cluster-down` stops it), write the tiny model
into the PersistentVolume of examples/tiny-model-volume.yaml and apply it, install the chart, apply
examples/tiny-cpu.yaml in a namespace enforcing the `restricted` Pod Security Standard, wait for
Ready, send one chat request to the InferenceService, print the answer and `kubectl get infsvc`.
The helpers here are also what e2e/test_operator.py uses to install and talk to the operator.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kubeinfer"
TINY_EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"
MODEL_VOLUME = ROOT / "examples" / "tiny-model-volume.yaml"
RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"
OPERATOR_NAMESPACE = "kubeinfer-system"
RELEASE = "kubeinfer"


def step(number: int, text: str) -> None:
    print(f"\n[{number}/6] {text}", flush=True)


def tiny_model_dir() -> Path:
    """The directory of the PersistentVolume the example's claim is bound to."""
    volume = next(d for d in yaml.safe_load_all(MODEL_VOLUME.read_text()) if d["kind"] == "PersistentVolume")
    return Path(volume["spec"]["local"]["path"])


def model_volume(namespace: str) -> list[dict[str, Any]]:
    """examples/tiny-model-volume.yaml for a claim in `namespace`: the PersistentVolume is cluster-wide
    and binds one claim, so each namespace's gets a volume of its own (same directory, read-only)."""
    volume, claim = list(yaml.safe_load_all(MODEL_VOLUME.read_text()))
    if namespace != claim["metadata"]["namespace"]:
        volume["metadata"]["name"] = claim["spec"]["volumeName"] = f"tiny-model-{namespace}"
        volume["spec"]["claimRef"]["namespace"] = claim["metadata"]["namespace"] = namespace
    return [volume, claim]


def restrict(cluster: Any, namespace: str) -> None:
    """Create `namespace` (if need be) enforcing the restricted Pod Security Standard."""
    if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, RESTRICTED, "--overwrite")


def ensure_tiny_model(directory: Path) -> None:
    if (directory / "config.json").exists():
        return
    runtime = shutil.which("kubeinfer-runtime") or str(Path(sys.executable).parent / "kubeinfer-runtime")
    subprocess.run([runtime, "make-tiny-model", str(directory), "--preset", "llama-gqa"], check=True)
    # The runtime runs as a non-root user: the weights must be readable by anyone.
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def helm_install(
    cluster: Any, values: dict[str, Any], release: str = RELEASE, namespace: str = OPERATOR_NAMESPACE
) -> None:
    """Install (or upgrade) the chart and wait for the operator Deployment to be available."""
    sets = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
    installed = subprocess.run(
        [
            cluster.helm_path, "upgrade", "--install", release, str(CHART),
            f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}", "--create-namespace",
            "--wait", "--timeout=3m", *sets,
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        raise RuntimeError(f"helm install {release} failed:\n{installed.stderr}")


def endpoint_addresses(cluster: Any, namespace: str, service: str) -> list[str]:
    """Ready pod IPs behind a Service, from its EndpointSlices."""
    slices = json.loads(
        cluster.kubectl(
            "get",
            "endpointslices",
            "-n",
            namespace,
            "-l",
            f"kubernetes.io/service-name={service}",
            "-o",
            "json",
        ).stdout
    )["items"]
    return [
        address
        for piece in slices
        for endpoint in piece.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    ]


def service_urls(cluster: Any, namespace: str, service: str) -> list[str]:
    """Ways to reach the service from this machine: its ClusterIP (kube-proxy), then each ready pod."""
    cluster_ip = cluster.kubectl(
        "get", "service", service, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}"
    )
    pods = [f"http://{ip}:8000" for ip in endpoint_addresses(cluster, namespace, service)]
    return [f"http://{cluster_ip.stdout.strip()}:80", *pods]


def chat(base_urls: list[str], model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    """One chat completion through the first URL that answers; (url used, response JSON)."""
    request = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
    errors = []
    for url in base_urls:
        try:
            response = httpx.post(f"{url}/v1/chat/completions", json=request, timeout=30)
            response.raise_for_status()
            return url, response.json()
        except httpx.HTTPError as error:
            errors.append(f"{url}: {error}")
    raise RuntimeError("no endpoint answered:\n  " + "\n  ".join(errors))


def main() -> int:
    from localcluster.cluster import Cluster, up
    from localcluster.config import load_config

    began = time.monotonic()
    step(1, "Starting the local Kubernetes cluster (etcd, apiserver, controllers, process kubelet)")
    config = load_config()
    cluster = Cluster.from_state(config, up(config, started_by="cli"))
    print(f"      apiserver {cluster.server}; nodes {', '.join(cluster.node_names)}")

    model_dir = tiny_model_dir()
    step(2, f"Writing the tiny model into the PersistentVolume of {MODEL_VOLUME.name}: {model_dir}")
    ensure_tiny_model(model_dir)
    restrict(cluster, "default")
    print(cluster.kubectl("apply", "-f", str(MODEL_VOLUME)).stdout.rstrip())

    step(3, f"helm install {RELEASE} charts/kubeinfer (namespace {OPERATOR_NAMESPACE})")
    restrict(cluster, OPERATOR_NAMESPACE)
    helm_install(cluster, {})  # the chart's defaults: Prometheus by its DNS name in `monitoring`
    print(cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide").stdout.rstrip())

    step(4, f"kubectl apply -f examples/{TINY_EXAMPLE.name}; waiting for condition Ready")
    print(cluster.kubectl("apply", "-f", str(TINY_EXAMPLE)).stdout.rstrip())
    name = yaml.safe_load(TINY_EXAMPLE.read_text())["metadata"]["name"]
    waited = cluster.kubectl("wait", "--for=condition=Ready", f"infsvc/{name}", "--timeout=300s", check=False)
    if waited.returncode != 0:
        print(cluster.kubectl("describe", "infsvc", name).stdout)
        print("The InferenceService did not become Ready; its conditions and events are above.")
        return 1
    print(waited.stdout.rstrip())

    step(5, "Sending a chat request to the InferenceService")
    model = yaml.safe_load(TINY_EXAMPLE.read_text())["spec"]["model"]["name"]
    prompt = "Say hello to Kubernetes."
    url, answer = chat(service_urls(cluster, "default", name), model, prompt)
    print(f"      POST {url}/v1/chat/completions  model={model!r}")
    print(f"      user:      {prompt}")
    print(f"      assistant: {answer['choices'][0]['message']['content']!r}")
    print(f"      usage:     {answer['usage']}")
    print("      (the tiny model has random weights: the words are noise, the serving path is real)")

    step(6, f"kubectl get infsvc {name}")
    print(cluster.kubectl("get", "infsvc", name, "-o", "wide").stdout.rstrip())
    print(
        f"\nDone in {time.monotonic() - began:.0f}s. The cluster keeps running: `make cluster-down` stops it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
