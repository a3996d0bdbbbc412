"""The reconcile plan: what is applied, retired and reported for what is observed."""

from __future__ import annotations

from typing import Any

from op_fixtures import OWNER, deployment, example, isvc, pod, spec_of

from kubeinfer_operator import kv_capacity
from kubeinfer_operator.conditions import find
from kubeinfer_operator.reconcile import Plan, desired_replicas, plan, plan_invalid
from kubeinfer_operator.render import render_pod_template
from kubeinfer_operator.settings import Settings

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
SETTINGS = Settings()


def _plan(manifest: dict, deployments: list, pods: list, status: dict | None = None, now: str = NOW) -> Plan:
    obj = isvc(manifest, status)
    spec = spec_of(manifest)
    kv = kv_capacity.check(spec, None, kv_capacity.device_memory(spec))
    return plan(obj, spec, deployments, pods, SETTINGS, kv, now)


def _condition(status: dict[str, Any], type_: str) -> tuple[str, str]:
    found = find(status["conditions"], type_)
    assert found is not None
    return found["status"], found["reason"]


def _revision(manifest: dict) -> str:
    return render_pod_template(OWNER, spec_of(manifest), SETTINGS).revision


def test_a_new_service_gets_its_objects_and_a_creating_status() -> None:
    manifest = example("tiny-cpu.yaml")
    result = _plan(manifest, [], [])
    kinds = [o["kind"] for o in result.apply]
    assert kinds == ["Deployment", "Service", "PodDisruptionBudget"]
    assert result.apply[0]["spec"]["replicas"] == 1
    status = result.status
    assert status["observedGeneration"] == 1
    assert status["desiredReplicas"] == 1 and status["replicas"] == 0 and status["readyReplicas"] == 0
    assert (
        status["selector"]
        == "app.kubernetes.io/name=kubeinfer-runtime,serving.kubeinfer.dev/inferenceservice=tiny"
    )
    assert status["url"] == "http://tiny.default.svc.cluster.local"
    assert _condition(status, "Ready") == ("False", "Creating")
    assert _condition(status, "Progressing")[0] == "True"
    assert _condition(status, "Degraded") == ("False", "AsExpected")
    assert _condition(status, "KVCacheFits")[0] == "True"
    assert {t.condition.type for t in result.transitions} == {
        "Ready",
        "Progressing",
        "Degraded",
        "KVCacheFits",
    }


def test_status_carries_the_kstatus_conditions_without_events_of_their_own() -> None:
    result = _plan(example("tiny-cpu.yaml"), [], [])
    assert _condition(result.status, "Reconciling") == ("True", "ScalingReplicas")
    assert _condition(result.status, "Stalled") == ("False", "AsExpected")
    assert not {"Reconciling", "Stalled"} & {t.condition.type for t in result.transitions}


def test_replanning_an_unchanged_world_changes_nothing() -> None:
    manifest = example("tiny-cpu.yaml")
    revision = _revision(manifest)
    observed = [deployment(revision, 1, 1)]
    first = _plan(manifest, observed, [])
    second = _plan(manifest, observed, [], status=first.status, now=LATER)
    assert second.status == first.status
    assert second.transitions == ()
    assert second.apply == first.apply


def test_new_revision_rolls_out_beside_the_old_then_replaces_it() -> None:
    manifest = example("tiny-cpu.yaml")
    new = _revision(manifest)
    old = deployment("0ld0ld0ld0", 1, 1)
    during = _plan(manifest, [old, deployment(new, 1, 0)], [], status={"stableRevision": "0ld0ld0ld0"})
    assert during.retire == ()
    assert _condition(during.status, "Ready") == ("True", "Serving")  # the old revision still serves
    assert _condition(during.status, "Progressing") == ("True", "RollingOut")
    assert during.status["stableRevision"] == "0ld0ld0ld0"
    done = _plan(manifest, [old, deployment(new, 1, 1)], [], status=during.status)
    assert [v.name for v in done.retire] == ["tiny-0ld0ld0ld0"]
    assert done.status["stableRevision"] == new
    assert _condition(done.status, "Progressing") == ("False", "Complete")


def test_a_rollout_with_no_spare_gpu_hands_over_one_replica_at_a_time() -> None:
    manifest = example("tiny-cpu.yaml")
    manifest["spec"]["replicas"] = 2
    manifest["spec"]["rollout"] = {"maxSurge": 0}
    new = _revision(manifest)
    old = deployment("0ld0ld0ld0", 2, 2)
    first = _plan(manifest, [old], [], status={"stableRevision": "0ld0ld0ld0"})
    assert first.apply[0]["spec"]["replicas"] == 0  # no room for a new replica yet
    assert first.scale == (("tiny-0ld0ld0ld0", 1),) and first.retire == ()
    old = deployment("0ld0ld0ld0", 1, 1)
    second = _plan(manifest, [old, deployment(new, 0, 0)], [], status=first.status)
    assert second.apply[0]["spec"]["replicas"] == 1 and second.scale == ()
    third = _plan(manifest, [old, deployment(new, 1, 1)], [], status=second.status)
    assert [v.name for v in third.retire] == ["tiny-0ld0ld0ld0"] and third.apply[0]["spec"]["replicas"] == 1
    assert _condition(third.status, "Ready") == ("True", "Serving")


def test_a_new_replica_waiting_for_a_gpu_being_given_back_is_not_degraded() -> None:
    manifest = example("tiny-cpu.yaml")
    manifest["spec"]["replicas"] = 2
    manifest["spec"]["rollout"] = {"maxSurge": 0}
    new = _revision(manifest)
    pending = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
            }
        ],
    }
    leaving = pod("tiny-old-1", "0ld0ld0ld0", {"phase": "Running"})
    leaving["metadata"]["deletionTimestamp"] = NOW
    observed = [deployment("0ld0ld0ld0", 1, 1), deployment(new, 1, 0)]
    waiting = _plan(manifest, observed, [pod("tiny-new-1", new, pending), leaving])
    assert _condition(waiting.status, "Degraded") == ("False", "AsExpected")
    stuck = _plan(manifest, observed, [pod("tiny-new-1", new, pending)])  # nothing is coming free
    assert _condition(stuck.status, "Degraded") == ("True", "Unschedulable")


def test_a_serving_revision_stays_stable_while_it_scales() -> None:
    manifest = example("tiny-cpu.yaml")
    revision = _revision(manifest)
    scaling = _plan(manifest, [deployment(revision, 3, 1)], [], status={"stableRevision": revision})
    assert scaling.status["stableRevision"] == revision
    assert _condition(scaling.status, "Ready") == ("True", "Serving")


def test_replica_count_comes_from_one_place() -> None:
    manifest = example("tiny-cpu.yaml")
    spec = spec_of(manifest)
    assert desired_replicas(spec, {}) == 1  # minReplicas
    assert desired_replicas(spec, {"desiredReplicas": 3}) == 3  # the autoscaler's decision
    assert desired_replicas(spec, {"desiredReplicas": 9}) == 3  # within maxReplicas
    pinned = {**manifest, "spec": {**manifest["spec"], "replicas": 0}}
    assert desired_replicas(spec_of(pinned), {"desiredReplicas": 3}) == 0
    dry = {
        **manifest,
        "spec": {**manifest["spec"], "scaling": {**manifest["spec"]["scaling"], "mode": "dryRun"}},
    }
    assert desired_replicas(spec_of(dry), {"desiredReplicas": 3}) == 1
    autoscaled = _plan(manifest, [], [], status={"desiredReplicas": 2})
    assert autoscaled.apply[0]["spec"]["replicas"] == 2


def test_parked_service_retires_everything_and_says_so() -> None:
    manifest = example("tiny-cpu.yaml")
    pinned = {**manifest, "spec": {**manifest["spec"], "replicas": 0}}
    result = _plan(pinned, [deployment("0ld0ld0ld0", 1, 1)], [])
    assert result.apply[0]["spec"]["replicas"] == 0
    assert [v.revision for v in result.retire] == ["0ld0ld0ld0"]
    assert _condition(result.status, "Ready") == ("False", "ScaledToZero")


def test_unschedulable_pods_make_ready_false_with_the_reason() -> None:
    manifest = example("tiny-cpu.yaml")
    revision = _revision(manifest)
    waiting = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/2 nodes are available: 2 Insufficient cpu.",
            }
        ],
    }
    result = _plan(manifest, [deployment(revision, 1, 0)], [pod("tiny-x", revision, waiting)])
    assert _condition(result.status, "Ready") == ("False", "Unschedulable")
    assert _condition(result.status, "Degraded") == ("True", "Unschedulable")
    ready = find(result.status["conditions"], "Ready")
    assert ready is not None and "Insufficient cpu" in ready["message"]


def test_an_unusable_spec_changes_nothing_and_names_the_field() -> None:
    manifest = example("tiny-cpu.yaml")
    result = plan_invalid(
        isvc(manifest), ["spec.runtime.maxNumSeqs: Input should be greater than or equal to 1"], NOW
    )
    assert result.apply == () and result.retire == ()
    assert _condition(result.status, "Ready") == ("False", "InvalidSpec")
    ready = find(result.status["conditions"], "Ready")
    assert ready is not None and "spec.runtime.maxNumSeqs" in ready["message"]
