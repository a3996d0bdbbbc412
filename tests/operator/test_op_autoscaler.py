"""One autoscaler tick (autoscaling/tick.py): from spec, pods and signals to the status it writes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest
from op_fixtures import example, isvc

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.autoscaling import ScalingState
from kubeinfer_operator.autoscaling.controller import Autoscaler
from kubeinfer_operator.autoscaling.policy import KV_USAGE, OLDEST_WAIT, QUEUE_TIME, WAITING
from kubeinfer_operator.autoscaling.tick import (
    PodCounts,
    count_pods,
    enabled,
    plan_disabled,
    plan_tick,
    scaling_config,
    transition_event,
)
from kubeinfer_operator.conditions import Condition, Transition
from kubeinfer_operator.names import LABEL_REVISION
from kubeinfer_operator.settings import Settings
from kubeinfer_operator.workqueue import Key

NOW = 1_700_000_000.0
IDLE = {QUEUE_TIME: 0.004, OLDEST_WAIT: 0.0, KV_USAGE: 0.0, WAITING: 0.0}
# One replica with a long queue: 6 waiting (target 2 per replica), the oldest for 3 s.
OVERLOADED = {QUEUE_TIME: 2.5, OLDEST_WAIT: 3.0, KV_USAGE: 0.2, WAITING: 6.0}


def manifest(replicas: int | None = None, **scaling: Any) -> dict[str, Any]:
    obj = copy.deepcopy(example("tiny-cpu.yaml"))
    obj["spec"]["scaling"] = {
        "minReplicas": 1,
        "maxReplicas": 4,
        "queueTimeTarget": "500ms",
        "waitingPerReplicaTarget": 2,
        "scaleUpWindow": "0s",
        "scaleDownWindow": "30s",
        **scaling,
    }
    if replicas is not None:
        obj["spec"]["replicas"] = replicas
    return obj


def spec(obj: dict[str, Any]) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(obj["spec"])


def tick(
    obj: dict[str, Any],
    signals: dict[str, float] | None,
    ready: int = 1,
    current: int = 1,
    unschedulable: int = 0,
    state: ScalingState | None = None,
    now: float = NOW,
) -> Any:
    reason = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu." if unschedulable else ""
    pods = PodCounts(ready, unschedulable, reason)
    error = "" if signals is not None else "Prometheus query for waiting failed: Connection refused"
    return plan_tick(
        isvc(obj, obj.get("status")), spec(obj), current, pods, signals, error, state or ScalingState(), now
    )


def condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    return next(c for c in conditions if c["type"] == type_)


def test_the_spec_maps_onto_the_policy_config() -> None:
    config = scaling_config(spec(manifest(kvCacheTarget=0.8, scaleDownWindow="2m", maxScaleUpRate=3)))
    assert (config.min_replicas, config.max_replicas, config.mode) == (1, 4, "active")
    assert config.targets.queue_time_p95_s == 0.5 and config.targets.oldest_wait_s == 1.0
    assert config.targets.kv_usage == 0.8 and config.targets.waiting_per_replica == 2.0
    assert (config.scale_up_window_s, config.scale_down_window_s, config.max_scale_up_factor) == (0, 120, 3)
    # Without a queue-time target: half the TTFT objective (the example's is 2s).
    unset = manifest()
    del unset["spec"]["scaling"]["queueTimeTarget"]
    assert scaling_config(spec(unset)).targets.queue_time_p95_s == 1.0
    # A pinned spec.replicas leaves the autoscaler watching only.
    assert scaling_config(spec(manifest(replicas=2))).mode == "dryRun"
    assert enabled(spec(manifest())) and not enabled(spec(manifest(maxReplicas=1)))


def pod(name: str, revision: str, ready: bool = False, unschedulable: str = "", gone: bool = False) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        ]
    meta: dict[str, Any] = {"name": name, "labels": {LABEL_REVISION: revision}}
    if gone:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"conditions": conditions}}


def test_pods_are_counted_for_the_current_revision() -> None:
    verdict = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available"
    pods = [
        pod("a", "r2", ready=True),
        pod("b", "r2"),  # loading
        pod("c", "r2", unschedulable=verdict),
        pod("d", "r2", ready=True, gone=True),  # terminating: no longer capacity
        pod("e", "r1", ready=True),
    ]
    assert count_pods(pods, "r2") == PodCounts(
        1, 1, "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", 1
    )


def test_an_overloaded_replica_scales_up_and_the_decision_is_recorded() -> None:
    plan = tick(manifest(), OVERLOADED)
    assert plan.status["desiredReplicas"] == 3  # 6 waiting / target 2 per replica
    (record,) = plan.status["scalingDecisions"]
    assert (record["fromReplicas"], record["toReplicas"]) == (1, 3)
    assert record["signal"] in ("waitingPerReplica", "oldestWaitingAge", "queueTimeP95")
    assert record["reason"].startswith("scale up 1->3") and record["time"] == "2023-11-14T22:13:20Z"
    assert plan.status["signals"] == {
        "queueTimeP95": "2.5s",
        "oldestWaitingAge": "3s",
        "kvCacheUsage": 0.2,
        "waitingPerReplica": 6.0,
        # No request finished in the SLO window yet: no reading, rather than a zero.
        "ttftP95": None,
        "tpotP95": None,
        "e2eP95": None,
        "errorRate": None,
        "time": "2023-11-14T22:13:20Z",
    }
    assert plan.event == ("ScaledUp", plan.decision.reason)
    metrics = condition(plan.status["conditions"], "MetricsAvailable")
    assert metrics["status"] == "True"


def test_a_decision_at_max_replicas_names_the_limit() -> None:
    plan = tick(manifest(maxReplicas=2), OVERLOADED)
    assert plan.status["desiredReplicas"] == 2
    assert plan.status["scalingDecisions"][-1]["signal"] == "maxReplicas"
    limited = condition(plan.status["conditions"], "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "TooManyReplicas")


def test_without_metrics_the_count_holds_and_the_condition_says_why() -> None:
    obj = manifest()
    obj["status"] = {"desiredReplicas": 2, "signals": {"kvCacheUsage": 0.3, "time": "2026-01-01T00:00:00Z"}}
    plan = tick(obj, None, ready=2, current=2)
    assert "desiredReplicas" not in plan.status and "scalingDecisions" not in plan.status
    assert "signals" not in plan.status  # the last readings stay, with the time they were read
    metrics = condition(plan.status["conditions"], "MetricsAvailable")
    assert (metrics["status"], metrics["reason"]) == ("False", "MetricsUnavailable")
    assert "Connection refused" in metrics["message"]
    assert [t.condition.type for t in plan.transitions] == ["MetricsAvailable", "ScalingLimited"]


def test_unschedulable_gpu_pods_stop_scale_up() -> None:
    plan = tick(manifest(), OVERLOADED, ready=2, current=3, unschedulable=1)
    assert "desiredReplicas" not in plan.status and plan.event is None
    limited = condition(plan.status["conditions"], "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "InsufficientNvidiaComGpu")
    assert "Insufficient nvidia.com/gpu" in limited["message"]


def test_dry_run_records_a_proposed_change_once_and_acts_never() -> None:
    obj = manifest(mode="dryRun")
    first = tick(obj, OVERLOADED)
    assert "desiredReplicas" not in first.status
    assert first.event is not None and first.event[0] == "WouldScaleUp"
    assert first.status["scalingDecisions"][0]["reason"].endswith("dry run: not applied")
    obj["status"] = first.status
    again = tick(obj, OVERLOADED, state=first.state, now=NOW + 5)
    assert "scalingDecisions" not in again.status and again.event is None


def test_a_pinned_replica_count_is_left_alone_and_explained() -> None:
    plan = tick(manifest(replicas=1), OVERLOADED)
    assert "desiredReplicas" not in plan.status and "scalingDecisions" not in plan.status
    limited = condition(plan.status["conditions"], "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "ManualReplicas")
    assert "signals" in plan.status


def test_an_idle_service_writes_nothing_once_its_readings_are_recorded() -> None:
    obj = manifest()
    first = tick(obj, IDLE)
    assert set(first.status) == {"signals", "conditions"}
    obj["status"] = first.status
    again = tick(obj, IDLE, state=first.state, now=NOW + 15)
    assert again.status == {} and again.event is None and again.transitions == ()


def test_the_decision_history_is_bounded() -> None:
    obj = manifest()
    old = {"time": "2026-01-01T00:00:00Z", "signal": "kvCacheUsage", "value": "0.9", "target": "0.7"}
    obj["status"] = {"scalingDecisions": [{**old, "fromReplicas": i, "toReplicas": i + 1} for i in range(20)]}
    decisions = tick(obj, OVERLOADED).status["scalingDecisions"]
    assert len(decisions) == 20
    assert decisions[0]["fromReplicas"] == 1 and decisions[-1]["toReplicas"] == 3


@pytest.mark.parametrize("types", [["Ready", "MetricsAvailable", "ScalingLimited"], ["Ready"]])
def test_turning_autoscaling_off_drops_its_conditions(types: list[str]) -> None:
    conditions = [{"type": t, "status": "True"} for t in types]
    patch = plan_disabled({"status": {"conditions": conditions}})
    assert patch == ({"conditions": [{"type": "Ready", "status": "True"}]} if len(types) > 1 else {})


@pytest.mark.parametrize(
    ("type_", "status", "reason", "previous", "expected"),
    [
        ("MetricsAvailable", "False", "MetricsUnavailable", "True", "Warning"),
        ("MetricsAvailable", "True", "SignalsRead", "False", "Normal"),  # recovered
        ("MetricsAvailable", "True", "SignalsRead", None, None),  # a first good reading is no news
        ("ScalingLimited", "True", "InsufficientNvidiaComGpu", "False", "Warning"),
        ("ScalingLimited", "True", "InsufficientNvidiaComGpu", None, "Warning"),
        ("ScalingLimited", "True", "TooFewReplicas", None, None),  # idle at minReplicas
        ("ScalingLimited", "False", "DesiredWithinRange", "True", "Normal"),
    ],
)
def test_condition_changes_become_events_of_the_right_type(
    type_: str, status: str, reason: str, previous: str | None, expected: str | None
) -> None:
    event = transition_event(Transition(Condition(type_, status, reason, "why"), previous))  # type: ignore[arg-type]
    assert (event[0] if event else None) == expected
    if event:
        assert event[1] == reason and event[2] == f"{type_} is {status}: why"


class TimedTicks(Autoscaler):
    """The real timers around a tick that only counts (the tick itself needs the API)."""

    def __init__(self, enqueue: Callable[[Key], None], interval: float | None) -> None:
        super().__init__(None, Settings(), enqueue)  # type: ignore[arg-type]
        self.interval, self.ticks = interval, 0

    def tick(self, namespace: str, name: str) -> float | None:
        self.ticks += 1
        return self.interval


def test_each_service_ticks_once_per_interval_through_the_queue() -> None:
    key = ("default", "tiny")

    async def scenario() -> None:
        queued: list[Key] = []
        # An interval long against a loaded machine's scheduling delays, short enough for a unit test.
        timers = TimedTicks(queued.append, interval=0.5)
        await timers.tick_if_due(key)
        await timers.tick_if_due(key)  # a reconcile between two ticks does not tick
        assert timers.ticks == 1 and queued == []
        await asyncio.sleep(0.8)
        assert queued == [key]  # the timer only queues the key: the worker runs the tick
        await timers.tick_if_due(key)
        assert timers.ticks == 2

        requeued: list[Key] = []
        gone = TimedTicks(requeued.append, interval=None)
        await gone.tick_if_due(key)
        await asyncio.sleep(0.15)
        assert requeued == []  # no timer is left for a deleted service

    asyncio.run(scenario())


def test_the_slo_as_measured_is_shown_beside_the_signals() -> None:
    from kubeinfer_operator.autoscaling.tick import status_signals

    readings = status_signals(
        {"waiting": 0.0, "kv_usage": 0.1}, 2, {"ttftP95": 0.212, "tpotP95": 0.04, "errorRate": 0.00123}
    )
    assert readings["ttftP95"] == "212ms" and readings["tpotP95"] == "40ms"
    assert readings["e2eP95"] is None and readings["errorRate"] == 0.0012


def test_predictive_maps_onto_the_policy_and_a_dry_run_floor_shows_in_status() -> None:
    predictive = {"mode": "dryRun", "season": "24h", "history": "48h"}
    obj = manifest(requestsPerReplica=2.5, predictive=predictive)
    config = scaling_config(spec(obj))
    assert config.predictive is not None and config.predictive.mode == "dryRun"
    assert config.requests_per_replica == 2.5
    without = manifest(predictive=predictive)
    with pytest.raises(ValueError, match="predictive needs requestsPerReplica"):
        spec(without)
    plan = plan_tick(
        isvc(obj, None), spec(obj), 1, PodCounts(1, 0, ""), IDLE, "", ScalingState(), NOW, None, 9.0
    )
    assert plan.status["signals"]["forecastRps"] == 9.0
    assert plan.status["signals"]["forecastFloor"] == 4  # 9 req/s at 2.5 per replica, within maxReplicas 4
    assert "desiredReplicas" not in plan.status  # dryRun: the floor is shown, not applied
