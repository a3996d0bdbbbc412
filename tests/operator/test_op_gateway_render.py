"""Canary through a Gateway API HTTPRoute (spec.rollout.trafficRouting.gatewayAPI): the objects written
at each point of a rollout, and what a reconcile deletes when the routing changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from op_fixtures import OWNER, deployment, isvc, pod, spec_of
from pydantic import ValidationError
from test_op_rollout_controller import canary_manifest, ready_pod, revision_of, run

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.api.base import field_errors
from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.gateway_render import route_weights
from kubeinfer_operator.names import LABEL_REVISION
from kubeinfer_operator.reconcile import plan_canary_rollout, stale_objects
from kubeinfer_operator.rollout.analysis import Outcome, Verdict
from kubeinfer_operator.rollout.controller import rollout_spec
from kubeinfer_operator.rollout.state_machine import RolloutState
from kubeinfer_operator.settings import Settings

GATEWAY = {"parentRefs": [{"name": "inference", "namespace": "gateways", "sectionName": "https"}]}


def gateway_manifest(marker: str = "1", pause: str | None = "30s") -> dict[str, Any]:
    manifest = canary_manifest(marker, pause)
    manifest["spec"]["rollout"]["trafficRouting"] = {
        "gatewayAPI": {**GATEWAY, "hostnames": ["llm.example.com"]}
    }
    return manifest


def by_kind(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def backends(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, int]]:
    (route,) = by_kind(objects, "HTTPRoute")
    return [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]]


def test_a_first_revision_is_routed_whole_to_the_stable_service_and_no_router_runs() -> None:
    manifest = gateway_manifest()
    revision = revision_of(manifest)
    plan = run(manifest, {}, [deployment(revision, 1, 1)], [ready_pod("a", revision, 5)])
    (route,) = by_kind(plan.apply, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid
    assert route["spec"]["parentRefs"] == GATEWAY["parentRefs"]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    assert backends(plan.apply) == [("tiny-stable", 100)]
    services = {s["metadata"]["name"]: s["spec"]["selector"] for s in by_kind(plan.apply, "Service")}
    assert services["tiny-stable"][LABEL_REVISION] == revision
    assert LABEL_REVISION not in services["tiny"], "the Service keeps selecting every replica"
    assert not by_kind(plan.apply, "ConfigMap") and len(by_kind(plan.apply, "Deployment")) == 1


def test_the_canary_enters_the_route_only_once_ready_then_at_its_weight() -> None:
    old_manifest, new_manifest = gateway_manifest("1"), gateway_manifest("2")
    old, new = revision_of(old_manifest), revision_of(new_manifest)
    idle = run(old_manifest, {}, [deployment(old, 1, 1)], [ready_pod("a", old, 5)])
    loading = run(new_manifest, dict(idle.fields), [deployment(old, 1, 1)], [ready_pod("a", old, 5)])
    assert backends(loading.apply) == [("tiny-stable", 100)]
    canary_service = next(
        s for s in by_kind(loading.apply, "Service") if s["metadata"]["name"] == "tiny-canary"
    )
    assert canary_service["spec"]["selector"][LABEL_REVISION] == new

    pods = [ready_pod("a", old, 5), ready_pod("b", new, 6)]
    ready = run(new_manifest, dict(loading.fields), [deployment(old, 1, 1), deployment(new, 1, 1)], pods)
    assert backends(ready.apply) == [("tiny-stable", 75), ("tiny-canary", 25)]


def test_a_failed_analysis_takes_the_canary_out_of_the_route() -> None:
    old_manifest, new_manifest = gateway_manifest("1"), gateway_manifest("2")
    old, new = revision_of(old_manifest), revision_of(new_manifest)
    deployments = [deployment(old, 1, 1), deployment(new, 1, 1)]
    pods = [ready_pod("a", old, 5), ready_pod("b", new, 6)]
    idle = run(old_manifest, {}, [deployment(old, 1, 1)], [ready_pod("a", old, 5)])
    status = dict(run(new_manifest, dict(idle.fields), deployments, pods).fields)
    bad = Verdict(Outcome.FAIL, "canary ttft_p95 3s > 2s", "ttft_p95", 3.0, 2.0)
    start = RolloutState.from_status(status["rollout"]).step_started_at or 0
    for tick in range(1, 4):  # interval 10 s, failureLimit 2
        plan = run(new_manifest, status, deployments, pods, now=start + 10 * tick + 0.5, verdict=bad)
        status = dict(plan.fields)
    assert status["rolloutPhase"] in ("RollingBack", "RolledBack")
    assert backends(plan.apply) == [("tiny-stable", 100)]


@pytest.mark.parametrize(
    ("weight", "stable_ready", "canary_ready", "expected"),
    [
        (25, 2, 1, {"stable": 75, "canary": 25}),
        (25, 2, 0, {"stable": 100}),
        (25, 0, 1, {"canary": 100}),
        (100, 0, 2, {"canary": 100}),
        (100, 1, 2, {"canary": 100}),
        (0, 1, 1, {"stable": 100}),
    ],
)
def test_route_weights_never_send_a_share_to_a_track_without_ready_pods(
    weight: int, stable_ready: int, canary_ready: int, expected: dict[str, int]
) -> None:
    assert route_weights(weight, stable_ready, canary_ready) == expected


def test_without_gateway_api_in_the_cluster_nothing_is_routed_and_degraded_says_why() -> None:
    manifest = gateway_manifest()
    revision = revision_of(manifest)
    plan = plan_canary_rollout(
        isvc(manifest, {}),
        spec_of(manifest),
        [deployment(revision, 1, 1)],
        [pod("a", revision, {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]})],
        Settings(),
        ({}, Condition("KVCacheFits", "True", "Fits", "ok")),
        "t",
        lambda state, window: Verdict(Outcome.PASS, "unused"),
        gateway_api_served=False,
    )
    assert not by_kind(plan.apply, "HTTPRoute")
    degraded = next(c for c in plan.status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "GatewayAPIUnavailable"
    assert "spec.rollout.trafficRouting.gatewayAPI" in degraded["message"]


def owned(kind: str, name: str, uid: str = OWNER.uid) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {"name": name, "uid": f"{kind}-{name}", "ownerReferences": [{"uid": uid}]},
    }


def test_stale_objects_are_the_owned_ones_the_plan_no_longer_renders() -> None:
    existing: dict[str, list[dict[str, Any]] | None] = {
        "Service": [owned("Service", "tiny"), owned("Service", "tiny-canary")],
        "ConfigMap": [owned("ConfigMap", "tiny-router")],
        "Deployment": [owned("Deployment", "tiny-router")],
        "HTTPRoute": None,  # not served by this cluster
        "Role": [owned("Role", "tiny-router", uid="someone-else")],
    }
    apply = ({"kind": "Service", "metadata": {"name": "tiny"}},)
    assert set(stale_objects(existing, apply, OWNER.uid)) == {
        ("Service", "tiny-canary", "Service-tiny-canary"),
        ("ConfigMap", "tiny-router", "ConfigMap-tiny-router"),
        ("Deployment", "tiny-router", "Deployment-tiny-router"),
    }


def test_traffic_routing_is_refused_outside_canary_and_needs_a_parent() -> None:
    rolling = copy.deepcopy(gateway_manifest()["spec"])
    rolling["rollout"] = {"trafficRouting": {"gatewayAPI": GATEWAY}}
    with pytest.raises(ValidationError) as refused:
        InferenceServiceSpec.model_validate(rolling)
    assert field_errors(refused.value) == [
        "rollout.trafficRouting: Forbidden: trafficRouting applies only to strategy Canary"
    ]
    no_parent = copy.deepcopy(gateway_manifest()["spec"])
    no_parent["rollout"]["trafficRouting"]["gatewayAPI"]["parentRefs"] = []
    with pytest.raises(ValidationError) as refused:
        InferenceServiceSpec.model_validate(no_parent)
    assert field_errors(refused.value)[0].startswith("rollout.trafficRouting.gatewayAPI.parentRefs:")


def test_max_surge_reaches_the_rollout() -> None:
    manifest = canary_manifest()
    manifest["spec"]["rollout"]["maxSurge"] = 0
    assert rollout_spec(spec_of(manifest)).max_surge == 0
