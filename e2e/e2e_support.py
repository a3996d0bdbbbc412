"""What the operator's cluster tests share: polling, `kubectl get` as JSON, and an operator release
of their own (serving only the test's namespace, so releases of different test files never fight)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from demo import ensure_tiny_model, helm_install, model_volume, restrict, tiny_model_dir


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 90, interval: float = 0.5) -> Any:
    """The probe's first truthy result; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if result := probe():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def get(cluster: Any, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


@contextmanager
def operator_release(
    cluster: Any, *, release: str, operator_namespace: str, namespace: str, values: dict[str, Any]
) -> Iterator[None]:
    """The chart installed as `release`, watching only `namespace` (created fresh), both namespaces
    enforcing the restricted Pod Security Standard, with the tiny model on disk behind the claim
    `tiny-model` in `namespace`; on exit the namespace, its volume, the release and the operator's
    Lease go."""
    ensure_tiny_model(tiny_model_dir())
    volume, claim = model_volume(namespace)
    cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--ignore-not-found")  # an interrupted run's
    # A namespace left terminating by an earlier session cannot take new objects: wait it out.
    wait_for(
        f"namespace {namespace} from an earlier run to go",
        lambda: cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0,
        timeout=120,
    )
    restrict(cluster, namespace)
    restrict(cluster, operator_namespace)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([volume, claim]))
    helm_install(
        cluster,
        {"watchNamespaces": [namespace], **values},  # Prometheus: the chart's default URL, by DNS name
        release=release,
        namespace=operator_namespace,
    )
    try:
        yield
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", volume["metadata"]["name"], "--wait=false", check=False)
        subprocess.run(
            [cluster.helm_path, "uninstall", release, f"--kubeconfig={cluster.kubeconfig}",
             f"--namespace={operator_namespace}", "--wait"],
            check=False, capture_output=True,
        )  # fmt: skip
        # The operator's Lease is its own, not the chart's: it outlives an uninstall.
        cluster.kubectl("delete", "lease", f"{release}-operator", "-n", operator_namespace, check=False)


def gpu_hog(name: str, namespace: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of another workload holding `gpus` GPUs, with the securityContext a namespace enforcing the
    restricted Pod Security Standard admits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **({"labels": labels} if labels else {})},
        "spec": {
            "containers": [
                {
                    "name": "hog",
                    "image": "busybox",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": gpus}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "terminationGracePeriodSeconds": 1,
        },
    }
