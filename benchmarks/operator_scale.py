"""How the operator scales with the number of InferenceServices, on the local cluster.

N InferenceServices that need no pods (`spec.replicas: 0`) are created at once in one namespace served by
one operator pod installed by the chart. Measured, from the operator's own /metrics and the apiserver:
- time until all N have converged (status.observedGeneration == generation and Progressing=Complete,
  Deployment + Service + PDB each exist);
- the operator's resident memory once converged;
- the API requests it makes while nothing changes, per minute, by verb (reads and writes);
- how long a spec change to one of them takes to be applied (patch -> status.observedGeneration), p50/p95,
  while the others sit.

    PYTHONPATH=e2e .venv/bin/python benchmarks/operator_scale.py --services 1000 \
        --json benchmarks/results/operator-scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))

from demo import TINY_EXAMPLE  # noqa: E402
from e2e_support import get, operator_release  # noqa: E402

RELEASE = "scale-bench"
NAMESPACE = "scale-bench"
WRITE_VERBS = ("apply", "patch_status", "delete", "create", "scale")


def manifest(i: int) -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": f"svc-{i:04d}", "namespace": NAMESPACE}
    obj["spec"]["replicas"] = 0
    return obj


def operator_metrics(cluster: Any) -> dict[str, float]:
    pods = get(cluster, "pods", "-n", f"{RELEASE}-system", "-l", f"app.kubernetes.io/instance={RELEASE}")
    (pod,) = [p for p in pods["items"] if p["status"].get("phase") == "Running"]
    text = httpx.get(f"http://{pod['status']['podIP']}:8081/metrics", timeout=10).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kubeinfer_operator_api_requests_total":
                values[f"requests:{sample.labels['verb']}"] = (
                    values.get(f"requests:{sample.labels['verb']}", 0.0) + sample.value
                )
            elif sample.name in ("process_resident_memory_bytes", "kubeinfer_operator_reconciles_total"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def requests_between(before: dict[str, float], after: dict[str, float], per: float = 1.0) -> dict[str, float]:
    """API requests by verb between two readings, scaled by `per` (e.g. to a per-minute rate)."""
    verbs = {k.split(":", 1)[1] for k in after if k.startswith("requests:")}
    return {
        v: round((after[f"requests:{v}"] - before.get(f"requests:{v}", 0)) * per, 1) for v in sorted(verbs)
    }


def converged(cluster: Any, n: int) -> int:
    isvcs = get(cluster, "infsvc", "-n", NAMESPACE)["items"]

    def settled(obj: dict[str, Any]) -> bool:
        """The operator has seen this generation and its Deployment reports back (Progressing Complete):
        no write is still due."""
        status = obj.get("status") or {}
        progressing = next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})
        return status.get("observedGeneration") == obj["metadata"].get("generation") and (
            progressing.get("reason") == "Complete"
        )

    done = {o["metadata"]["name"] for o in isvcs if settled(o)}
    owned = {}
    for kind in ("deployments", "services", "poddisruptionbudgets"):
        items = get(cluster, kind, "-n", NAMESPACE, "-l", "serving.kubeinfer.dev/inferenceservice")["items"]
        owned[kind] = {o["metadata"]["labels"]["serving.kubeinfer.dev/inferenceservice"] for o in items}
    return len(done & owned["deployments"] & owned["services"] & owned["poddisruptionbudgets"])


def spec_change_latency(cluster: Any, name: str, value: int) -> float:
    from kubernetes import client, config

    config.load_kube_config(str(cluster.kubeconfig))
    api = client.CustomObjectsApi()
    args = ("serving.kubeinfer.dev", "v1alpha1", NAMESPACE, "inferenceservices", name)
    began = time.perf_counter()
    patched = api.patch_namespaced_custom_object(*args, {"spec": {"runtime": {"maxNumSeqs": value}}})
    generation = patched["metadata"]["generation"]
    while True:
        current = api.get_namespaced_custom_object(*args)
        if (current.get("status") or {}).get("observedGeneration") == generation:
            return time.perf_counter() - began
        if time.perf_counter() - began > 60:
            raise RuntimeError(f"{name}: spec change not applied within 60 s")
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up converging after this")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from localcluster.cluster import Cluster, release, up
    from localcluster.config import load_config

    cfg = load_config()
    state = up(cfg, started_by="operator_scale", owner_pid=__import__("os").getpid())
    cluster = Cluster.from_state(cfg, state)
    result: dict[str, Any] = {"services": args.services}
    try:
        values = {"replicaCount": 1, "leaderElection": False}
        namespaces = {"operator_namespace": f"{RELEASE}-system", "namespace": NAMESPACE}
        with operator_release(cluster, release=RELEASE, values=values, **namespaces):
            time.sleep(5)  # the operator's watches are up
            base = operator_metrics(cluster)
            began = time.monotonic()
            for start in tqdm(range(0, args.services, 100), desc="creating", unit="x100"):
                docs = [manifest(i) for i in range(start, min(start + 100, args.services))]
                cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
            created = time.monotonic() - began
            with tqdm(total=args.services, desc="converged") as bar:
                while (done := converged(cluster, args.services)) < args.services:
                    bar.update(done - bar.n)
                    if time.monotonic() - began > args.timeout:
                        raise RuntimeError(f"only {done}/{args.services} converged in {args.timeout:.0f}s")
                    time.sleep(1)
                bar.update(done - bar.n)
            result["create_s"] = round(created, 1)
            result["converge_s"] = round(time.monotonic() - began, 1)
            result["requests_to_converge"] = requests_between(base, operator_metrics(cluster))
            print(f"converged: {result}", flush=True)
            time.sleep(10)  # let the tail of the convergence settle before measuring idle
            idle_start = operator_metrics(cluster)
            time.sleep(args.idle_seconds)
            idle_end = operator_metrics(cluster)
            per_minute = requests_between(idle_start, idle_end, 60 / args.idle_seconds)
            result["idle_requests_per_minute"] = per_minute
            result["idle_requests_per_minute_total"] = round(sum(per_minute.values()), 1)
            result["idle_writes_per_minute"] = round(sum(per_minute.get(v, 0) for v in WRITE_VERBS), 1)
            reconciles = "kubeinfer_operator_reconciles_total"
            result["idle_reconciles_per_minute"] = round(
                (idle_end.get(reconciles, 0) - idle_start.get(reconciles, 0)) * 60 / args.idle_seconds, 1
            )
            result["rss_mb"] = round(idle_end["process_resident_memory_bytes"] / 2**20, 1)
            print(f"idle: {result}", flush=True)  # the spec changes can take long on a slow operator
            latencies = [
                spec_change_latency(cluster, f"svc-{(i * 37) % args.services:04d}", 2 + i % 6)
                for i in tqdm(range(args.changes), desc="spec changes")
            ]
            result["spec_change_s"] = {
                "p50": round(statistics.median(latencies), 3),
                "p95": round(sorted(latencies)[max(0, round(0.95 * len(latencies)) - 1)], 3),
                "max": round(max(latencies), 3),
            }
    finally:
        release(cfg, __import__("os").getpid())
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
