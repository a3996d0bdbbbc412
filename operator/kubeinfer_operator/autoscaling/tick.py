"""One autoscaler tick as a pure function: the spec, the observed pods and signals and the remembered
state in; the decision, the next state and the status fields to write out. autoscaling/controller.py does the
reading and writing around it."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from kubeinfer_operator.api import InferenceServiceSpec, format_duration, parse_duration
from kubeinfer_operator.api.status import MAX_DECISIONS
from kubeinfer_operator.autoscaling.policy import (
    BACKLOG,
    KV_USAGE,
    OLDEST_WAIT,
    QUEUE_TIME,
    WAITING,
    WAITING_PER_REPLICA,
    Decision,
    Observation,
    Predictive,
    ScalingConfig,
    ScalingState,
    Targets,
    decide,
)
from kubeinfer_operator.conditions import Condition, Transition, merge, transitions
from kubeinfer_operator.names import LABEL_REVISION

CONDITION_TYPES = ("MetricsAvailable", "ScalingLimited")
# The policy's signal names as status.signals and status.scalingDecisions spell them.
STATUS_NAMES = {
    QUEUE_TIME: "queueTimeP95",
    OLDEST_WAIT: "oldestWaitingAge",
    KV_USAGE: "kvCacheUsage",
    WAITING_PER_REPLICA: "waitingPerReplica",
}
SECONDS_SIGNALS = (QUEUE_TIME, OLDEST_WAIT)


def enabled(spec: InferenceServiceSpec) -> bool:
    """The API's promise: autoscaling starts when maxReplicas is raised above minReplicas."""
    return spec.scaling.max_replicas > spec.scaling.min_replicas


def scaling_config(spec: InferenceServiceSpec) -> ScalingConfig:
    scaling = spec.scaling
    queue_time = spec.queue_time_target_seconds()
    waiting = scaling.waiting_per_replica_target
    targets = Targets(
        queue_time_p95_s=queue_time,
        # The oldest waiting request is the tail of the queue: the policy's defaults give it twice the
        # queue-time p95 target.
        oldest_wait_s=2 * queue_time,
        kv_usage=scaling.kv_cache_target,
        waiting_per_replica=float(waiting) if waiting is not None else None,
    )
    return ScalingConfig(
        min_replicas=scaling.min_replicas,
        max_replicas=scaling.max_replicas,
        targets=targets,
        tolerance=scaling.tolerance,
        scale_up_window_s=parse_duration(scaling.scale_up_window),
        scale_down_window_s=parse_duration(scaling.scale_down_window),
        max_scale_up_factor=scaling.max_scale_up_rate,
        headroom=scaling.headroom,
        requests_per_replica=scaling.requests_per_replica,
        predictive=None if scaling.predictive is None else Predictive(scaling.predictive.mode),
        # A pinned spec.replicas wins over the autoscaler: it then only watches.
        mode="dryRun" if spec.replicas is not None else scaling.mode,
    )


@dataclass(frozen=True)
class PodCounts:
    ready: int
    unschedulable: int
    unschedulable_reason: str  # the scheduler's verdict on one of them
    other_revisions: int = 0  # live pods of other revisions: a rollout is in flight


def count_pods(pods: list[dict[str, Any]], revision: str) -> PodCounts:
    """Ready and unschedulable pods of one revision; terminating pods no longer count."""
    ready = unschedulable = others = 0
    reason = ""
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        if (meta.get("labels") or {}).get(LABEL_REVISION) != revision:
            others += 1
            continue
        conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
        scheduled = conditions.get("PodScheduled", {})
        if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
            unschedulable += 1
            # The part after "preemption:" repeats the verdict for preemption.
            reason = re.split(r"\s*preemption:", scheduled.get("message", ""), maxsplit=1)[0].strip()
        elif conditions.get("Ready", {}).get("status") == "True":
            ready += 1
    return PodCounts(ready, unschedulable, reason, others)


@dataclass(frozen=True)
class TickPlan:
    decision: Decision
    state: ScalingState
    status: dict[str, Any]  # only the fields that change, as a merge patch of status
    transitions: tuple[Transition, ...]
    event: tuple[str, str] | None  # (reason, message) when the replica count changes (or would, dryRun)


def rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_tick(
    isvc: dict[str, Any],
    spec: InferenceServiceSpec,
    current: int,
    pods: PodCounts,
    signals: dict[str, float] | None,
    metrics_error: str,
    state: ScalingState,
    now: float,
    slo_readings: dict[str, float] | None = None,
    forecast_rps: float | None = None,
) -> TickPlan:
    """`current`: the replica count the operator runs now; `signals` None: Prometheus did not answer."""
    status = isvc.get("status") or {}
    config = scaling_config(spec)
    observation = Observation(
        now=now,
        replicas=current,
        ready=pods.ready,
        # Wanted but not ready nor blocked: loading the model, or not even created yet. Counting the
        # latter too keeps a tick that comes right after a scale-up from asking again.
        starting=max(0, current - pods.ready - pods.unschedulable),
        unschedulable=pods.unschedulable,
        unschedulable_reason=pods.unschedulable_reason,
        signals=signals,
        metrics_error=metrics_error,
        forecast_rps=forecast_rps,
    )
    decision, state = decide(config, observation, state)
    conditions = list(decision.conditions)
    if spec.replicas is not None:
        pinned = Condition(
            "ScalingLimited",
            "True",
            "ManualReplicas",
            f"spec.replicas pins {spec.replicas} replicas: the autoscaler only reads its signals. "
            "Remove spec.replicas to autoscale.",
        )
        conditions = [pinned if c.type == "ScalingLimited" else c for c in conditions]

    patch: dict[str, Any] = {}
    if decision.act:
        patch["desiredReplicas"] = decision.desired
    if signals is not None:
        readings = status_signals(signals, pods.ready, slo_readings or {})
        if config.predictive is not None:
            # A dryRun floor changes no count, so no decision records it: status.signals shows it.
            readings["forecastRps"] = None if forecast_rps is None else round(forecast_rps, 3)
            readings["forecastFloor"] = decision.floor
        # None clears a reading in the merge patch: the stored object has no such key.
        previous = {k: v for k, v in (status.get("signals") or {}).items() if k in readings and v is not None}
        if previous != {k: v for k, v in readings.items() if v is not None}:
            patch["signals"] = {**readings, "time": rfc3339(now)}
    history = status.get("scalingDecisions") or []
    event = None
    if _worth_recording(decision, history, pinned=spec.replicas is not None):
        patch["scalingDecisions"] = [*history, decision_record(decision, config)][-MAX_DECISIONS:]
        verb = "ScaledUp" if decision.desired > decision.current else "ScaledDown"
        event = (verb if decision.act else "Would" + verb.replace("Scaled", "Scale"), decision.reason)
    previous_conditions = status.get("conditions") or []
    merged = merge(previous_conditions, conditions, rfc3339(now), isvc["metadata"].get("generation", 0))
    if merged != previous_conditions:
        patch["conditions"] = merged
    return TickPlan(decision, state, patch, tuple(transitions(previous_conditions, conditions)), event)


def plan_disabled(isvc: dict[str, Any]) -> dict[str, Any]:
    """With autoscaling off, the autoscaler's conditions would describe a past configuration: drop them."""
    conditions = (isvc.get("status") or {}).get("conditions") or []
    kept = [c for c in conditions if c.get("type") not in CONDITION_TYPES]
    return {"conditions": kept} if kept != conditions else {}


def transition_event(transition: Transition) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for a condition change; None for a first good reading."""
    condition = transition.condition
    if condition.type == "MetricsAvailable":
        bad = condition.status == "False"
    else:  # ScalingLimited: bad when the load asks for more than it gets
        bad = condition.status == "True" and condition.reason not in ("ManualReplicas", "TooFewReplicas")
    if transition.previous_status is None and not bad:
        return None
    message = f"{condition.type} is {condition.status}: {condition.message}"
    return ("Warning" if bad else "Normal", condition.reason, message)


def _worth_recording(decision: Decision, history: list[dict[str, Any]], pinned: bool) -> bool:
    """A change of the replica count, or in dryRun one it would make (once per proposed change)."""
    if pinned or decision.desired == decision.current:
        return False
    if decision.act:
        return True
    last = history[-1] if history else {}
    return (last.get("fromReplicas"), last.get("toReplicas")) != (decision.current, decision.desired)


def status_signals(
    signals: dict[str, float], ready: int, slo_readings: dict[str, float] | None = None
) -> dict[str, Any]:
    """status.signals from the fetched values; an absent value is None so that a merge patch clears it.

    `slo_readings` (ttftP95, tpotP95, e2eP95 in seconds, errorRate 0-1) are shown beside the
    scaling signals, so `kubectl get` puts the SLO as measured next to the SLO as written."""
    waiting, kv = signals.get(WAITING), signals.get(KV_USAGE)
    per_replica = None if waiting is None or not ready else round(waiting / ready, 2)
    slo = slo_readings or {}
    error_rate = slo.get("errorRate")
    return {
        STATUS_NAMES[QUEUE_TIME]: _seconds(signals.get(QUEUE_TIME)),
        STATUS_NAMES[OLDEST_WAIT]: _seconds(signals.get(OLDEST_WAIT)),
        STATUS_NAMES[KV_USAGE]: None if kv is None else round(min(max(kv, 0.0), 1.0), 3),
        STATUS_NAMES[WAITING_PER_REPLICA]: per_replica,
        **{key: _seconds(slo.get(key)) for key in ("ttftP95", "tpotP95", "e2eP95")},
        "errorRate": None if error_rate is None else round(min(max(error_rate, 0.0), 1.0), 4),
    }


def decision_record(decision: Decision, config: ScalingConfig) -> dict[str, Any]:
    """One status.scalingDecisions entry: the signal that set the count, its value and its target, each in
    the signal's own unit (seconds for times, a ratio for KV usage, requests, replicas for the range)."""
    driver = decision.driver
    if driver is None:
        signal, value, target = "none", "", ""
    elif driver.signal == BACKLOG:  # requests to clear within a time
        signal, value, target = BACKLOG, f"{driver.value:.0f}", format_duration(driver.target)
    else:
        signal = STATUS_NAMES.get(driver.signal, driver.signal)
        value, target = _reading(driver.signal, driver.value), _reading(driver.signal, driver.target)
    # The range set the count, not the signal: the record is then in replicas, what the signals asked for
    # against the bound (the signal's own reading stays in the reason).
    asked = driver.proposal if driver is not None else decision.current
    if asked > decision.desired == config.max_replicas:
        signal, value, target = "maxReplicas", str(asked), str(config.max_replicas)
    elif asked < decision.desired == config.min_replicas:
        signal, value, target = "minReplicas", str(asked), str(config.min_replicas)
    return {
        "time": rfc3339(decision.time),
        "signal": signal,
        "value": value,
        "target": target,
        "fromReplicas": decision.current,
        "toReplicas": decision.desired,
        "reason": decision.reason[:1024],
    }


def _seconds(value: float | None) -> str | None:
    return None if value is None else format_duration(max(value, 0.0))


def _reading(signal: str, value: float) -> str:
    return format_duration(max(value, 0.0)) if signal in SECONDS_SIGNALS else f"{value:.3g}"
