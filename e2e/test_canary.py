"""Canary rollouts on the local cluster: the chart's operator, real runtime pods, the per-service router
and real Prometheus judging canary against stable while this test sends load through the router.

One InferenceService goes through these rollouts in order (each starts from what the previous left):
a new model revision (nothing else changed) is promoted step by step; a slow one is rolled back on
analysis; one that cannot load is rolled back at the progress deadline; a good one survives the operator
being killed mid-step; one answering 500 to more requests than the SLO's error rate allows is rolled back
however many of its failures the router's retries hid; one failing well within it is promoted.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
import yaml
from demo import TINY_EXAMPLE
from e2e_support import get, operator_release
from e2e_support import wait_for as support_wait_for

pytestmark = pytest.mark.cluster

RELEASE = "canary-e2e"
OPERATOR_NAMESPACE = "canary-e2e-system"
OPERATOR_NAME = f"{RELEASE}-operator"  # Deployment, ServiceAccount and Lease
NAMESPACE = "canary-e2e"
NAME = "chat"
TRACK_HEADER = "x-kubeinfer-track"
STEPS = [{"weight": 30, "pause": "15s"}, {"weight": 70, "pause": "15s"}]
INTERVAL_S = 10
FAILURE_LIMIT = 2
PROGRESS_DEADLINE_S = 40
REQUEST = {"model": "tiny", "prompt": "Hello", "max_tokens": 3, "stream": True}
# Loose enough for a busy 2-core machine, where a canary on 70% of the load is slower than stable on 30%
# (the analysis fails a canary over 1.5x stable once it uses half the target); the injected token
# latency breaks TPOT by far.
SLO = {"ttft": {"p95": "5s"}, "tpot": {"p95": "2s"}, "e2e": {"p95": "30s"}, "errorRate": 0.05, "window": "1m"}
TOKEN_LATENCY = "1500ms"
SETTLE_S = 3  # after a weight change, the router picks up its ConfigMap within ~1 s: skip a margin


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 120, interval: float = 0.5) -> Any:
    return support_wait_for(what, probe, timeout, interval)


def isvc(cluster: Any) -> dict[str, Any]:
    return get(cluster, "infsvc", NAME, "-n", NAMESPACE)


def status(cluster: Any) -> dict[str, Any]:
    return isvc(cluster).get("status") or {}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def manifest(
    revision_marker: str,
    faults: dict[str, Any] | None = None,
    model_revision: str | None = None,
    slo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The tiny example under Canary; `revision_marker` (an env var) makes each rollout a new revision."""
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    spec = obj["spec"]
    spec["replicas"] = 1
    spec.pop("scaling", None)
    spec["slo"] = slo or SLO
    if model_revision:
        spec["model"]["revision"] = model_revision
    spec["runtime"]["env"] = [{"name": "E2E_REVISION", "value": revision_marker}]
    if faults:
        spec["runtime"]["faults"] = faults
    spec["rollout"] = {
        "strategy": "Canary",
        "steps": STEPS,
        "analysis": {"interval": f"{INTERVAL_S}s", "minRequests": 5, "failureLimit": FAILURE_LIMIT},
        "progressDeadline": f"{PROGRESS_DEADLINE_S}s",
    }
    return obj


def apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


def runtime_deployments(cluster: Any) -> dict[str, int]:
    selector = f"serving.kubeinfer.dev/inferenceservice={NAME},app.kubernetes.io/name=kubeinfer-runtime"
    items = get(cluster, "deployments", "-n", NAMESPACE, "-l", selector)["items"]
    return {d["metadata"]["labels"]["serving.kubeinfer.dev/revision"]: d["spec"]["replicas"] for d in items}


@dataclass
class Sample:
    sent: float
    track: str | None
    code: int


@dataclass
class Load:
    """Requests through the Service (kube-proxy -> a router pod), and the canary weight status showed."""

    url: str
    samples: list[Sample] = field(default_factory=list)
    weights: list[tuple[float, int, str]] = field(default_factory=list)  # (when, canaryWeight, phase)
    stop: threading.Event = field(default_factory=threading.Event)

    def send(self) -> None:
        with httpx.Client(timeout=60, trust_env=False) as client:
            while not self.stop.is_set():
                sent = time.time()
                try:
                    # Streamed, as chat clients do: the router measures TTFT on streams.
                    with client.stream("POST", f"{self.url}/v1/completions", json=REQUEST) as response:
                        response.read()
                    self.samples.append(
                        Sample(sent, response.headers.get(TRACK_HEADER), response.status_code)
                    )
                except httpx.HTTPError:
                    self.samples.append(Sample(sent, None, 0))
                    time.sleep(0.2)

    def watch(self, cluster: Any) -> None:
        while not self.stop.is_set():
            current = status(cluster)
            self.weights.append(
                (time.time(), current.get("canaryWeight") or 0, current.get("rolloutPhase", ""))
            )
            time.sleep(0.5)

    def by_weight(self) -> dict[int, list[Sample]]:
        """Samples sent while status held one weight, grouped by that weight. SETTLE_S is cut at both ends:
        the router switches within ~1 s of the ConfigMap, written just before status."""
        spans = []
        for (start, weight, _), (end, _, _) in zip(self.weights, self.weights[1:], strict=False):
            if spans and spans[-1][2] == weight:
                spans[-1][1] = end
            else:
                spans.append([start, end, weight])
        groups: dict[int, list[Sample]] = {}
        for start, end, weight in spans:
            groups.setdefault(weight, []).extend(
                s for s in self.samples if start + SETTLE_S <= s.sent < end - SETTLE_S
            )
        return groups


@pytest.fixture
def load(operator: Any) -> Iterator[Load]:
    ip = operator.kubectl("get", "service", NAME, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}").stdout
    running = Load(f"http://{ip.strip()}:80")
    threads = [threading.Thread(target=running.send, daemon=True) for _ in range(5)]
    threads.append(threading.Thread(target=running.watch, args=(operator,), daemon=True))
    for thread in threads:
        thread.start()
    yield running
    running.stop.set()
    for thread in threads:
        thread.join(timeout=70)


def leader_pod(cluster: Any) -> str:
    lease = get(cluster, "lease", OPERATOR_NAME, "-n", OPERATOR_NAMESPACE)
    return (lease["spec"].get("holderIdentity") or "").rsplit("_", 1)[0]


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    values = {"replicaCount": 2, "resyncSeconds": 5}
    with operator_release(
        cluster, release=RELEASE, operator_namespace=OPERATOR_NAMESPACE, namespace=NAMESPACE, values=values
    ):
        apply(cluster, manifest("1", model_revision="v1"))
        # Ready means the URL answers: a request sent the moment the wait returns goes through the router.
        cluster.kubectl("wait", "--for=condition=Ready", f"infsvc/{NAME}", "-n", NAMESPACE, "--timeout=180s")
        ip = cluster.kubectl("get", "service", NAME, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}")
        first = httpx.post(f"http://{ip.stdout.strip()}:80/v1/completions", json=REQUEST, timeout=60)
        assert first.status_code == 200 and first.headers[TRACK_HEADER] == "stable", first.text

        def both_routers_ready() -> bool:
            ready_routers = "jsonpath={.status.readyReplicas}"
            router = cluster.kubectl(
                "get", "deployment", f"{NAME}-router", "-n", NAMESPACE, "-o", ready_routers, check=False
            )
            return router.stdout.strip() == "2"

        wait_for("both router pods to be ready", both_routers_ready, timeout=60)
        yield cluster


def wait_phase(cluster: Any, phases: set[str], timeout: float) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        current = status(cluster)
        return current if current.get("rolloutPhase") in phases else None

    return wait_for(f"rollout phase in {sorted(phases)}", reached, timeout=timeout)


def start_rollout(cluster: Any, obj: dict[str, Any]) -> tuple[str, str]:
    """Apply a new revision; (stable revision, canary revision) once the rollout has started."""
    stable = status(cluster)["stableRevision"]
    apply(cluster, obj)
    started = wait_for(
        "the canary rollout to start", lambda: status(cluster).get("canaryRevision"), timeout=30
    )
    return stable, started


def within_sampling_error(samples: list[Sample], weight: int) -> tuple[float, float]:
    """(canary share measured, allowed deviation): 3 binomial standard deviations plus 2 points."""
    share = sum(s.track == "canary" for s in samples) / len(samples)
    p = weight / 100
    return share, 3 * math.sqrt(p * (1 - p) / len(samples)) + 0.02


def test_a_new_model_revision_goes_through_every_step_to_promoted(operator: Any, load: Load) -> None:
    began = time.monotonic()
    # Only spec.model.revision changes (weights on a volume): that alone is a new revision to roll out.
    old, new = start_rollout(operator, manifest("1", model_revision="v2"))
    done = wait_phase(operator, {"Promoted", "RolledBack"}, timeout=180)
    assert done["rolloutPhase"] == "Promoted", done.get("rollout")
    assert done["stableRevision"] == new and not done.get("canaryRevision")
    wait_for(
        "the old revision's Deployment to go", lambda: runtime_deployments(operator) == {new: 1}, timeout=60
    )
    time.sleep(SETTLE_S + 1)
    load.stop.set()
    groups = load.by_weight()
    for step in STEPS:
        samples = groups.get(step["weight"], [])
        assert len(samples) >= 20, f"too few requests at {step['weight']}%: {len(samples)}"
        share, allowed = within_sampling_error(samples, step["weight"])
        assert abs(share - step["weight"] / 100) <= allowed, (step, share, len(samples))
        print(
            f"\nstep {step['weight']}%: canary share {share:.1%} of {len(samples)} requests (+-{allowed:.1%})"
        )
    assert all(s.code == 200 for s in load.samples), [s for s in load.samples if s.code != 200][:5]
    after = [s for s in load.samples if s.sent > load.weights[-1][0] - 2]
    assert after and all(s.track == "stable" for s in after)  # the promoted revision is the stable track now
    decisions = [
        (d["action"], d["weight"]) for d in status(operator)["rolloutDecisions"] if d["revision"] == new
    ]
    steps = [d for d in decisions if d[0] in ("CanaryStep", "Promoting", "Promoted")]
    assert steps == [("CanaryStep", 30), ("CanaryStep", 70), ("Promoting", 70), ("Promoted", 0)], decisions
    print(f"\npromoted {new} over {old} in {time.monotonic() - began:.0f}s on {len(load.samples)} requests")


def test_a_slow_revision_is_rolled_back_on_analysis(operator: Any, load: Load) -> None:
    _, bad = start_rollout(operator, manifest("3", {"tokenLatency": TOKEN_LATENCY}))
    stepped = wait_for(
        "the canary to take traffic",
        lambda: status(operator).get("rollout", {}).get("stepStartedAt"),
        timeout=90,
    )
    done = wait_phase(operator, {"RolledBack", "Promoted"}, timeout=90)
    assert done["rolloutPhase"] == "RolledBack"
    took = time.time() - _epoch(stepped)
    assert took <= FAILURE_LIMIT * INTERVAL_S + 15, f"rolled back {took:.0f}s after the canary got traffic"
    print(f"\nslow canary rolled back {took:.0f}s after it got traffic")
    degraded = condition(isvc(operator), "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "AnalysisFailed"
    assert "tpot_p95" in degraded["message"] and "SLO 2000ms" in degraded["message"], degraded["message"]
    assert runtime_deployments(operator) == {done["stableRevision"]: 1}  # canary scaled away
    events = get(operator, "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={NAME}")
    assert any(e["reason"] == "RolledBack" and bad in e["message"] for e in events["items"])
    time.sleep(SETTLE_S)
    load.stop.set()
    stable = [s for s in load.samples if s.track == "stable"]
    assert stable and all(s.code == 200 for s in stable)
    assert all(s.code == 200 for s in load.samples)
    assert any(s.track == "canary" for s in load.samples)
    late = [s for s in load.samples if s.sent > time.time() - SETTLE_S + 0.5]
    assert all(s.track == "stable" for s in late)


def test_a_revision_that_cannot_load_never_gets_traffic(operator: Any, load: Load) -> None:
    began = time.time()
    _, broken = start_rollout(operator, manifest("4", {"failLoad": True}))
    done = wait_phase(operator, {"RolledBack", "Promoted"}, timeout=PROGRESS_DEADLINE_S + 60)
    took = time.time() - began
    assert done["rolloutPhase"] == "RolledBack"
    assert PROGRESS_DEADLINE_S <= took <= PROGRESS_DEADLINE_S + 20, f"rolled back after {took:.0f}s"
    print(f"\nunloadable canary rolled back {took:.0f}s after the change (deadline {PROGRESS_DEADLINE_S}s)")
    assert done["rollout"]["failure"]["reason"] == "ProgressDeadlineExceeded"
    assert done["rollout"]["rolledBackRevision"] == broken
    load.stop.set()
    assert load.samples and all(s.track == "stable" and s.code == 200 for s in load.samples)
    assert runtime_deployments(operator) == {done["stableRevision"]: 1}


def test_the_rollout_resumes_at_the_same_step_after_the_operator_is_killed(operator: Any, load: Load) -> None:
    obj = manifest("5")
    obj["spec"]["rollout"]["steps"] = [{"weight": 30, "pause": "45s"}, {"weight": 70, "pause": "10s"}]
    _, new = start_rollout(operator, obj)
    stepped = wait_for(
        "step 1 to start", lambda: status(operator).get("rollout", {}).get("stepStartedAt"), timeout=90
    )
    before = status(operator)["rollout"]
    killed = leader_pod(operator)
    operator.kubectl("delete", "pod", killed, "-n", OPERATOR_NAMESPACE, "--grace-period=0", "--force")
    wait_for(
        "another operator pod to take the lease",
        lambda: leader_pod(operator) not in ("", killed),
        timeout=60,
    )
    print(f"\nnew leader after {time.time() - _epoch(stepped):.0f}s into the step")
    time.sleep(3)  # a few reconciles by the new leader
    after = status(operator)["rollout"]
    assert after["canaryRevision"] == new
    assert after["stepIndex"] == before["stepIndex"] == 0
    assert after["stepStartedAt"] == stepped  # the step clock carried on rather than restarting
    assert after["canaryWeight"] == 30
    done = wait_phase(operator, {"Promoted", "RolledBack"}, timeout=120)
    assert done["rolloutPhase"] == "Promoted" and done["stableRevision"] == new
    # The step took its pause from when it started, not from the restart.
    steps = [d for d in done["rolloutDecisions"] if d["action"] == "CanaryStep" and d["revision"] == new]
    assert [d["weight"] for d in steps] == [30, 70]
    assert _epoch(steps[1]["time"]) - _epoch(stepped) < 45 + 20
    load.stop.set()
    assert all(s.code == 200 for s in load.samples), [s for s in load.samples if s.code != 200][:5]


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rolled_back_at(load: Load) -> float:
    """When status first showed the rollback (canary weight back to 0)."""
    return next(t for t, weight, phase in load.weights if phase == "RolledBack" and weight == 0)


def test_a_canary_failing_above_the_error_budget_is_rolled_back_whatever_retries_hid(
    operator: Any, load: Load
) -> None:
    # 40% of the canary's requests fail against a 5% SLO; the router retries some of them onto stable
    # (its budget: 10% of requests), so clients see fewer failures than the canary makes.
    _, bad = start_rollout(operator, manifest("6", {"errorRate": 0.4}))
    done = wait_phase(operator, {"RolledBack", "Promoted"}, timeout=120)
    assert done["rolloutPhase"] == "RolledBack", done.get("rollout")
    assert done["rollout"]["rolledBackRevision"] == bad
    degraded = condition(isvc(operator), "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "AnalysisFailed"
    message = degraded["message"]
    assert "error_rate breaks the SLO" in message and "SLO 5.00%" in message, message
    assert "canary " in message and "stable 0.00%" in message, message
    print(f"\nDegraded: {message}")
    assert runtime_deployments(operator) == {done["stableRevision"]: 1}
    time.sleep(SETTLE_S + 1)
    load.stop.set()
    back = rolled_back_at(load)
    failed = [s for s in load.samples if s.code != 200]
    canary = [s for s in load.samples if s.track == "canary"]
    print(f"\n{len(load.samples)} requests, {len(canary)} answered by the canary, {len(failed)} failed")
    # Stable kept serving; a client saw an error only from the canary's share, and only until rollback.
    assert all(s.code == 200 for s in load.samples if s.track == "stable")
    assert all(s.track == "canary" and s.code == 500 for s in failed), failed[:5]
    assert all(s.sent < back + SETTLE_S for s in failed), (back, [s.sent for s in failed])


def test_a_canary_failing_within_the_error_budget_is_promoted(operator: Any, load: Load) -> None:
    # 2% of its requests fail against a 20% SLO: far inside the budget, and under half of it, so the
    # comparison with an error-free stable does not count it as a regression either.
    slo = {**SLO, "errorRate": 0.2}
    _, new = start_rollout(operator, manifest("7", {"errorRate": 0.02}, slo=slo))
    done = wait_phase(operator, {"Promoted", "RolledBack"}, timeout=180)
    assert done["rolloutPhase"] == "Promoted" and done["stableRevision"] == new, done.get("rollout")
    load.stop.set()
    assert all(s.code == 200 for s in load.samples if s.track == "stable")
