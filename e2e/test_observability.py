"""The tools SREs already run, against the local cluster with the chart's operator, real runtime pods, real
load and the real Prometheus:

- the Prometheus Operator CRDs (v0.85.0, from the Go module proxy) applied to the apiserver: the chart's
  PodMonitors and the operator's PrometheusRule are objects those schemas accept, field for field;
- the PrometheusRule the operator writes for a service, loaded into Prometheus as Prometheus Operator would,
  pages (14.4x over 1h and 5m) during a real overload (the runtime refusing requests with 429);
- every panel of the chart's Grafana dashboard returns series from live data;
- `kubeinfer status` and `kubectl infsvc status` print the one screen for a live service;
- Argo CD's health (the chart's Lua) and kstatus (Flux) of live objects through loading, serving, failing,
  a paused canary and scaled to zero; `kubectl wait` on Ready, Reconciling and Stalled. With
  KUBEINFER_RECORD_FIXTURES=1 the objects are written to tests/operator/fixtures/inferenceservice/.

One operator release and three services (busy, broken, canary) for the module; the tests run in order.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from demo import CHART, TINY_EXAMPLE
from e2e_support import get, operator_release, wait_for
from gitops_health import FIXTURES, argocd_health, as_recorded, kstatus

from kubeinfer_operator import dashboard
from kubeinfer_operator.slo_alerts import ALERT

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "obs-e2e"
OPERATOR_NAMESPACE = "obs-e2e-system"
NAMESPACE = "obs-e2e"
EXPECTED = yaml.safe_load((FIXTURES / "expected.yaml").read_text())
CRDS = ("podmonitors", "servicemonitors", "prometheusrules")
SLO = {
    "ttft": {"p95": "2s", "p99": "5s"},
    "tpot": {"p95": "250ms"},
    "e2e": {"p95": "30s"},
    "errorRate": 0.05,
    "window": "1m",
}
REQUEST = {"model": "tiny", "prompt": "Hello there", "max_tokens": 8, "stream": True}


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    obj["spec"]["slo"] = SLO
    obj["spec"].pop("scaling", None)
    for key, value in spec.items():
        obj["spec"][key] = value
    return obj


def runtime(**extra: Any) -> dict[str, Any]:
    base = yaml.safe_load(TINY_EXAMPLE.read_text())["spec"]["runtime"]
    return {**base, **extra}


# busy: one batch slot and one queue place, so a handful of clients overload it for real (429s).
BUSY = manifest(
    "busy",
    # 8 tokens at 150 ms: the waiting request ages up to ~1.2 s behind the running one whatever else the
    # machine is doing (at 20 ms the oldest wait stayed under its 0.4 s target on a quiet machine, and the
    # policy never asks for more replicas than the live queue does).
    runtime=runtime(maxNumSeqs=1, maxQueue=1, faults={"tokenLatency": "150ms"}),
    # queue time is what scales it: a request waits behind the one running (~0.6 s on average)
    scaling={
        "minReplicas": 1,
        "maxReplicas": 2,
        "interval": "3s",
        "scaleDownWindow": "10m",
        "queueTimeTarget": "200ms",
    },
)
BROKEN = manifest("broken", runtime=runtime(faults={"failLoad": True}), replicas=1)
CANARY_ROLLOUT = {
    "strategy": "Canary",
    "steps": [{"weight": 50}],  # no pause: held until the promote annotation
    "analysis": {"interval": "10s", "minRequests": 5, "failureLimit": 3},
    "progressDeadline": "5m",
}
CANARY = manifest("canary", replicas=1, rollout=CANARY_ROLLOUT)


def apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def isvc(cluster: Any, name: str) -> dict[str, Any]:
    return get(cluster, "infsvc", name, "-n", NAMESPACE)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def observed(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"].get("generation")


def check_and_record(name: str, obj: dict[str, Any]) -> None:
    """Argo CD's and kstatus' verdicts on a live object are the expected ones; recorded on request."""
    want = EXPECTED[name]
    recorded = as_recorded(obj)
    assert argocd_health(recorded)["status"] == want["argocd"], (name, argocd_health(recorded), obj["status"])
    assert kstatus(recorded) == want["kstatus"], (name, obj["status"])
    if os.environ.get("KUBEINFER_RECORD_FIXTURES"):
        (FIXTURES / name).write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


def prometheus(cluster: Any, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


@dataclass
class Load:
    url: str
    codes: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self) -> None:
        with httpx.Client(timeout=60, trust_env=False) as client:
            while not self.stop.is_set():
                try:
                    with client.stream("POST", f"{self.url}/v1/completions", json=REQUEST) as response:
                        response.read()
                    self.codes.append(response.status_code)
                    if response.status_code == 429:
                        time.sleep(0.05)  # a client backing off, a little
                except httpx.HTTPError:
                    self.codes.append(0)
                    time.sleep(0.2)


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    crd_dir = subprocess.run(
        ["bash", str(ROOT / "e2e" / "fetch_prometheus_operator_crds.sh")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for plural in CRDS:
        cluster.install_crd(
            f"{crd_dir}/monitoring.coreos.com_{plural}.yaml", f"{plural}.monitoring.coreos.com"
        )
    values = {"replicaCount": 1, "leaderElection": False, "resyncSeconds": 5}
    with operator_release(
        cluster, release=RELEASE, operator_namespace=OPERATOR_NAMESPACE, namespace=NAMESPACE, values=values
    ):
        for obj in (BUSY, BROKEN, CANARY):
            apply(cluster, obj)
        yield cluster
        cluster.load_rules(RELEASE, [])


def test_a_service_loading_its_model_is_progressing(operator: Any) -> None:
    def loading() -> dict[str, Any] | None:
        obj = isvc(operator, "busy")
        starting = condition(obj, "Ready").get("reason") in ("Creating", "Loading")
        return obj if observed(obj) and starting else None

    obj = wait_for("busy to be observed while its replica loads", loading, timeout=60, interval=0.2)
    assert condition(obj, "Reconciling")["status"] == "True"
    check_and_record("progressing-loading.json", obj)
    operator.kubectl("wait", "infsvc/busy", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s")


def test_the_chart_and_operator_objects_are_what_the_prometheus_operator_schemas_accept(
    operator: Any,
) -> None:
    rendered = subprocess.run(
        [operator.helm_path, "template", RELEASE, str(CHART), f"--namespace={OPERATOR_NAMESPACE}",
         "--kube-version=1.34.4", "--set", "monitoring.prometheusOperator=true",
         "--set-json", f'watchNamespaces=["{NAMESPACE}"]'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    monitors = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PodMonitor"]
    assert len(monitors) == 3
    for monitor in monitors:  # strict: an unknown field is an error, not silently pruned
        operator.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-n", OPERATOR_NAMESPACE, "-f", "-",
            input=yaml.safe_dump(monitor),
        )  # fmt: skip
    # The operator wrote busy's rules as an owned PrometheusRule; the apiserver kept every field of it.
    from kubeinfer_operator.api import InferenceServiceSpec
    from kubeinfer_operator.slo_alerts import rule_groups

    stored = wait_for(
        "busy's PrometheusRule",
        lambda: get(
            operator, "prometheusrules", "-n", NAMESPACE, "-l", "serving.kubeinfer.dev/inferenceservice=busy"
        )["items"],
    )[0]
    assert stored["metadata"]["ownerReferences"][0]["name"] == "busy"
    expected = rule_groups(
        NAMESPACE, "busy", InferenceServiceSpec.model_validate(isvc(operator, "busy")["spec"])
    )
    assert stored["spec"]["groups"] == expected
    strict = {k: stored[k] for k in ("apiVersion", "kind", "spec")} | {
        "metadata": {"name": "strict-check", "namespace": NAMESPACE}
    }
    operator.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-f", "-", input=yaml.safe_dump(strict)
    )


@pytest.fixture(scope="module")
def overload(operator: Any) -> Iterator[Load]:
    ip = operator.kubectl(
        "get", "service", "busy", "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}"
    ).stdout
    load = Load(f"http://{ip.strip()}:80")
    threads = [threading.Thread(target=load.send, daemon=True) for _ in range(10)]
    for thread in threads:
        thread.start()
    yield load
    load.stop.set()
    for thread in threads:
        thread.join(timeout=70)


def test_an_overload_pages_through_the_operators_burn_rate_rules(operator: Any, overload: Load) -> None:
    (rule,) = get(
        operator, "prometheusrules", "-n", NAMESPACE, "-l", "serving.kubeinfer.dev/inferenceservice=busy"
    )["items"]
    operator.load_rules(RELEASE, rule["spec"]["groups"])  # what Prometheus Operator does with it

    def paging() -> list[dict[str, Any]]:
        alerts = httpx.get(f"{operator.prometheus_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [
            a
            for a in alerts
            if a["labels"].get("alertname") == ALERT
            and a["labels"].get("inferenceservice") == "busy"
            and a["labels"].get("slo") == "error-rate"
            and a["labels"].get("burn_rate") == "14.4"
            and a["state"] == "firing"
        ]

    (page,) = wait_for("the 14.4x error-budget page for busy", paging, timeout=180, interval=2)
    assert page["labels"]["severity"] == "page"
    # What the page claims, seen from the clients: more than 14.4 x 5% of their requests were refused.
    refused = overload.codes.count(429)
    assert refused > 0.72 * len(overload.codes), f"{refused} of {len(overload.codes)} requests refused"
    # The service that is not overloaded does not page.
    quiet = prometheus(operator, f'ALERTS{{alertname="{ALERT}",inferenceservice="canary"}}')
    assert quiet == []


def panel_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard.dashboard()["panels"] for t in p["targets"]]


def substitute(expr: str, service: str) -> str:
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("$service", service)
        .replace("$revision", ".*")
        .replace("$__rate_interval", "1m")
    )


def test_every_dashboard_panel_returns_series_from_live_data(operator: Any, overload: Load) -> None:
    wait_for(
        "a scaling decision for busy",
        lambda: (isvc(operator, "busy").get("status") or {}).get("scalingDecisions"),
        timeout=120,
    )

    def empty_panels() -> list[str]:
        return [
            f"{title}: {expr}"
            for title, expr in panel_queries()
            if not prometheus(operator, substitute(expr, "busy"))
        ]

    try:
        wait_for("every panel to return series", lambda: not empty_panels(), timeout=90, interval=3)
    except AssertionError:
        raise AssertionError("panels without series:\n" + "\n".join(empty_panels())) from None


def _plugin_path(tmp_path: Path) -> dict[str, str]:
    """PATH with a `kubectl-infsvc` for kubectl to find: the console script where installed, else a shim."""
    installed = Path(sys.executable).parent / "kubectl-infsvc"
    shim = tmp_path / "kubectl-infsvc"
    if installed.exists():
        shim.symlink_to(installed)
    else:
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m kubeinfer_operator.kubectl_plugin "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    pythonpath = os.pathsep.join([str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": pythonpath}


def test_status_screen_for_a_live_service(operator: Any, overload: Load, tmp_path: Path) -> None:
    env = {**_plugin_path(tmp_path), "KUBECONFIG": operator.kubeconfig, "COLUMNS": "100"}
    direct = subprocess.run(
        [sys.executable, "-m", "kubeinfer_operator.cli", "status", "busy", "-n", NAMESPACE,
         "--prometheus", operator.prometheus_url],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert direct.returncode == 0, direct.stderr
    screen = direct.stdout.splitlines()
    assert len(screen) <= 40 and all(len(line) <= 100 for line in screen), direct.stdout
    text = direct.stdout
    for wanted in ("InferenceService obs-e2e/busy", "TTFT p95", "2s", "error rate", "Replicas: desired",
                   "Scaling decisions", "Rollout: RollingUpdate", "burn 1h / 5m",
                   "Alerts firing:", "error-rate page (14.4x over 1h)"):  # fmt: skip
        assert wanted in text, f"{wanted!r} not in:\n{text}"
    (p99,) = [line.split() for line in screen if line.strip().startswith("TTFT p99")]
    assert p99[2] == "5s" and p99[4] in ("ok", "MISSED"), p99  # read from Prometheus: status has p95 only
    plugin = subprocess.run(
        ["kubectl", "infsvc", "status", "canary", "-n", NAMESPACE], capture_output=True, text=True, env=env
    )
    assert plugin.returncode == 0, plugin.stderr
    assert "InferenceService obs-e2e/canary" in plugin.stdout and "Rollout: Canary" in plugin.stdout


def test_a_replica_that_cannot_load_is_degraded_and_stalled(operator: Any) -> None:
    operator.kubectl("wait", "infsvc/broken", "-n", NAMESPACE, "--for=condition=Stalled", "--timeout=180s")
    obj = isvc(operator, "broken")
    assert condition(obj, "Degraded")["status"] == "True"
    check_and_record("degraded-fail-load.json", obj)
    operator.kubectl(
        "patch", "infsvc/broken", "-n", NAMESPACE, "--type=merge", "-p", '{"spec":{"replicas":0}}'
    )

    def parked() -> dict[str, Any] | None:
        obj = isvc(operator, "broken")
        zero = condition(obj, "Ready").get("reason") == "ScaledToZero"
        return obj if observed(obj) and zero and condition(obj, "Stalled").get("status") == "False" else None

    check_and_record("suspended-scaled-to-zero.json", wait_for("broken scaled to zero", parked, timeout=60))


def test_a_canary_held_for_promotion_or_paused_is_suspended(operator: Any) -> None:
    operator.kubectl("wait", "infsvc/canary", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s")
    changed = json.loads(json.dumps(CANARY))
    changed["spec"]["runtime"]["env"] = [{"name": "E2E_REVISION", "value": "2"}]
    apply(operator, changed)

    def reason_is(reason: str) -> Any:
        def probe() -> dict[str, Any] | None:
            obj = isvc(operator, "canary")
            return obj if observed(obj) and condition(obj, "Progressing").get("reason") == reason else None

        return probe

    held = wait_for("the canary step to wait for the promote", reason_is("WaitingForPromote"), timeout=240)
    assert held["status"]["canaryWeight"] == 50
    check_and_record("suspended-waiting-for-promote.json", held)
    weight_query = substitute(next(e for t, e in panel_queries() if t == "Canary weight"), "canary")

    def weight_in_prometheus() -> bool:
        found = prometheus(operator, weight_query)
        return bool(found) and float(found[0]["value"][1]) == 50.0

    wait_for("the dashboard's canary weight to read 50%", weight_in_prometheus, timeout=30, interval=1)
    paused = json.loads(json.dumps(changed))
    paused["spec"]["rollout"]["paused"] = True
    apply(operator, paused)
    check_and_record("suspended-paused.json", wait_for("the rollout paused", reason_is("Paused"), timeout=60))


def test_a_service_that_serves_with_nothing_under_way_is_healthy(operator: Any, overload: Load) -> None:
    overload.stop.set()

    def settled() -> dict[str, Any] | None:
        obj = isvc(operator, "busy")
        done = (
            condition(obj, "Ready").get("status") == "True"
            and condition(obj, "Reconciling").get("status") == "False"
        )
        return obj if observed(obj) and done else None

    obj = wait_for("busy to settle after the load", settled, timeout=240, interval=1)
    operator.kubectl(
        "wait", "infsvc/busy", "-n", NAMESPACE, "--for=condition=Reconciling=False", "--timeout=10s"
    )
    check_and_record("healthy-serving.json", obj)
