"""Canary wiring: what plan_canary writes for what it observes (the state machine itself is tested apart)."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from op_fixtures import OWNER, deployment, example, isvc, pod, spec_of

from kubeinfer_operator.names import LABEL_TRACK
from kubeinfer_operator.render import render_pod_template
from kubeinfer_operator.rollout.analysis import Outcome, Verdict
from kubeinfer_operator.rollout.controller import (
    TICK_SECONDS,
    CanaryPlan,
    plan_canary,
    rollout_spec,
    slo_targets,
)
from kubeinfer_operator.rollout.state_machine import RolloutState
from kubeinfer_operator.settings import Settings

SETTINGS = Settings()
NOW = 1_800_000_000.0
READY = {"podIP": "10.0.0.{}", "conditions": [{"type": "Ready", "status": "True"}]}


def canary_manifest(marker: str = "1", pause: str | None = "30s") -> dict[str, Any]:
    manifest = copy.deepcopy(example("tiny-cpu.yaml"))
    manifest["spec"]["replicas"] = 1
    manifest["spec"]["runtime"]["env"] = [{"name": "MARKER", "value": marker}]
    step: dict[str, Any] = {"weight": 25} | ({"pause": pause} if pause else {})
    manifest["spec"]["rollout"] = {"strategy": "Canary", "steps": [step], "analysis": {"interval": "10s"}}
    return manifest


def ready_pod(name: str, revision: str, ip: int) -> dict[str, Any]:
    return pod(name, revision, {**READY, "podIP": f"10.0.0.{ip}"})


def revision_of(manifest: dict[str, Any]) -> str:
    return render_pod_template(OWNER, spec_of(manifest), SETTINGS).revision


def run(
    manifest: dict[str, Any],
    status: dict[str, Any],
    deployments: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    now: float = NOW,
    verdict: Verdict | None = None,
) -> CanaryPlan:
    spec = spec_of(manifest)
    judged: list[tuple[float, float]] = []

    def judge(state: RolloutState, window: tuple[float, float]) -> Verdict:
        judged.append(window)
        assert verdict is not None, "an analysis ran that the test did not expect"
        return verdict

    pod_template = render_pod_template(OWNER, spec, SETTINGS)
    return plan_canary(
        isvc(manifest, status), spec, pod_template, 1, deployments, pods, SETTINGS, judge, now, "t"
    )


def router_config(plan: CanaryPlan) -> dict[str, Any]:
    config_map = next(o for o in plan.apply if o["kind"] == "ConfigMap")
    return json.loads(config_map["data"]["router.json"])


def test_rollout_spec_maps_durations_and_an_unpaused_step_waits_for_a_promote() -> None:
    spec = rollout_spec(spec_of(canary_manifest(pause=None)))
    assert spec.steps[0].weight == 25 and spec.steps[0].pause_s == math.inf
    assert spec.analysis.interval_s == 10 and spec.progress_deadline_s == 15 * 60


def test_slo_targets_cover_every_percentile_set() -> None:
    targets = slo_targets(spec_of(example("tiny-cpu.yaml")))
    assert [(o.key, o.target_s) for o in targets.latency] == [
        ("ttft_p95", 2),
        ("tpot_p95", 0.25),
        ("e2e_p95", 30),
    ]
    assert targets.error_rate == 0.05


def test_a_first_revision_serves_as_stable_through_the_router() -> None:
    manifest = canary_manifest()
    revision = revision_of(manifest)
    plan = run(manifest, {}, [deployment(revision, 1, 1)], [ready_pod("a", revision, 5)])
    assert plan.fields["stableRevision"] == revision and plan.fields["rolloutPhase"] == "Idle"
    assert router_config(plan)["tracks"]["stable"] == {"weight": 100, "endpoints": ["http://10.0.0.5:8000"]}
    assert plan.requeue_after is None and not plan.retire and not plan.scale


def test_a_new_revision_starts_as_a_canary_beside_stable_without_traffic_until_ready() -> None:
    old_manifest, new_manifest = canary_manifest("1"), canary_manifest("2")
    old, new = revision_of(old_manifest), revision_of(new_manifest)
    idle = run(old_manifest, {}, [deployment(old, 1, 1)], [ready_pod("a", old, 5)])
    status = dict(idle.fields)
    plan = run(new_manifest, status, [deployment(old, 1, 1)], [ready_pod("a", old, 5)])
    canary = next(o for o in plan.apply if o["kind"] == "Deployment" and new in o["metadata"]["name"])
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["template"]["metadata"]["labels"][LABEL_TRACK] == "canary"
    assert router_config(plan)["tracks"]["canary"] == {"weight": 0, "endpoints": []}
    assert plan.fields["canaryRevision"] == new and plan.fields["rolloutPhase"] == "Progressing"
    assert plan.requeue_after == TICK_SECONDS
    assert [e.reason for e in plan.events] == ["RolloutStarted"]
    assert plan.fields["rolloutDecisions"][-1]["action"] == "RolloutStarted"
    # the stable revision is no longer rendered by the spec: it keeps its Deployment, scaled only if needed
    assert not plan.scale and not plan.retire


def test_a_ready_canary_gets_its_weight_and_a_failed_analysis_sends_it_back_to_zero() -> None:
    old_manifest, new_manifest = canary_manifest("1"), canary_manifest("2")
    old, new = revision_of(old_manifest), revision_of(new_manifest)
    deployments = [deployment(old, 1, 1), deployment(new, 1, 1)]
    pods = [ready_pod("a", old, 5), ready_pod("b", new, 6)]
    status = dict(run(old_manifest, {}, deployments[:1], pods[:1]).fields)
    status = dict(run(new_manifest, status, deployments, pods).fields)  # started and canary ready: 25%
    assert status["canaryWeight"] == 25
    stepped = run(new_manifest, status, deployments, pods, now=NOW + 1)
    assert router_config(stepped)["tracks"]["canary"] == {"weight": 25, "endpoints": ["http://10.0.0.6:8000"]}

    failing = Verdict(Outcome.FAIL, "tpot_p95 breaks the SLO", "tpot_p95", 1.5, 0.25)
    status = dict(run(new_manifest, status, deployments, pods, NOW + 11, failing).fields)
    plan = run(new_manifest, status, deployments, pods, NOW + 22, failing)  # failureLimit 2
    assert plan.fields["rolloutPhase"] == "RollingBack"
    assert router_config(plan)["tracks"]["canary"]["weight"] == 0
    assert plan.conditions[1].status == "True" and plan.conditions[1].reason == "AnalysisFailed"
    canary = next(o for o in plan.apply if o["kind"] == "Deployment" and new in o["metadata"]["name"])
    assert canary["spec"]["replicas"] == 0

    done = run(new_manifest, dict(plan.fields), deployments, pods[:1], NOW + 25)  # canary pod gone
    assert done.fields["rolloutPhase"] == "RolledBack" and done.fields["canaryRevision"] is None
    assert [v.revision for v in done.retire] == [new]
    assert not [o for o in done.apply if o["kind"] == "Deployment" and new in o["metadata"]["name"]]


def test_state_keys_the_machine_drops_are_sent_as_null_for_the_merge_patch() -> None:
    manifest = canary_manifest()
    revision = revision_of(manifest)
    status = {
        "rollout": {
            "stableRevision": revision,
            "phase": "RolledBack",
            "failure": {"reason": "x", "message": "y"},
        }
    }
    plan = run(manifest, status, [deployment(revision, 1, 1)], [ready_pod("a", revision, 5)])
    assert plan.fields["rollout"]["failure"] is None
