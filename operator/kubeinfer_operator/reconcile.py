"""One reconcile of one InferenceService: observe, plan (pure), act.

Level-triggered: the plan depends only on what is observed now, so a reconcile that was lost
(operator restart, API error) is made up by the next one, and repeating one changes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from kubeinfer_operator import deletion_cost, kv_capacity
from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.api.base import field_errors
from kubeinfer_operator.conditions import Condition, Transition, merge, transitions
from kubeinfer_operator.engine_metrics import engine_metrics
from kubeinfer_operator.kube import Kube, StatusConflict, now_rfc3339
from kubeinfer_operator.names import (
    APP_NAME,
    FIELD_MANAGER,
    KIND,
    LABEL_APP,
    LABEL_ISVC,
    LABEL_MANAGED_BY,
    LABEL_REVISION,
    service_url,
)
from kubeinfer_operator.pod_diagnosis import ResourceAsk, diagnose
from kubeinfer_operator.prometheus import MetricsUnavailable
from kubeinfer_operator.render import (
    Owner,
    pod_selector,
    render_deployment,
    render_pdb,
    render_pod_template,
)
from kubeinfer_operator.rollout.controller import Judge, plan_canary, prometheus_judge, ready_by_revision
from kubeinfer_operator.rollout.rolling_update import RevisionReplicas, next_replicas, unavailable_allowed
from kubeinfer_operator.rollout.state_machine import RolloutEvent
from kubeinfer_operator.router_render import render_front_service, router_labels, router_name
from kubeinfer_operator.serving_path import (
    Serving,
    choose_path,
    current_path,
    desired_path,
    desired_routing,
    may_prune,
    probe_needed,
    routing_of,
    url_answers,
)
from kubeinfer_operator.serving_policy import Refusal, refusal_conditions, refusals
from kubeinfer_operator.settings import Settings
from kubeinfer_operator.slo_alerts import alert_objects
from kubeinfer_operator.status import (
    Observation,
    RevisionView,
    degraded_condition,
    invalid_spec_conditions,
    is_warning,
    kstatus_conditions,
    progressing_condition,
    ready_condition,
)
from kubeinfer_operator.url_probe import probe_url

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    apply: tuple[dict[str, Any], ...]
    retire: tuple[RevisionView, ...]  # Deployments of revisions the current one has replaced
    status: dict[str, Any]  # only the status fields this reconcile owns
    transitions: tuple[Transition, ...]
    scale: tuple[tuple[str, int], ...] = ()  # (Deployment, replicas) of revisions the spec no longer renders
    events: tuple[RolloutEvent, ...] = ()  # the canary state machine's own events
    requeue_after: float | None = None  # seconds: a rollout in flight is looked at again on time
    prune: tuple[tuple[str, str, str], ...] = ()  # (kind, name, uid) of traffic objects no longer rendered
    # Traffic objects of the previous routing kept until the URL answers from the new one.
    held: tuple[tuple[str, str, str], ...] = ()
    # (pod, pod-deletion-cost) set before a scale-down, so the replica with the least work goes.
    annotate: tuple[tuple[str, str], ...] = ()


# The router's objects and the Gateway split's, by the labels that find them: a change of strategy or of
# trafficRouting leaves them behind, and the reconcile deletes what its plan no longer renders. Replica
# Deployments are not among them: retiring a revision is the plan's own decision (Plan.retire).
CONFLICT_ATTEMPTS = 3  # reconciles in a row whose status write found the object changed
CONFLICT_RETRY_S = 1.0  # then the work queue tries again this much later
SWITCH_POLL_S = 1.0  # how soon to look again while the URL does not answer from the path it should
# No Role: the operator may not read or write Roles (a Role an older operator made for a router goes with
# its InferenceService, by garbage collection).
TRAFFIC_KINDS = ("Deployment", "Service", "ConfigMap", "ServiceAccount", "RoleBinding", "HTTPRoute")
# Owned objects deleted when the plan stops rendering them: the traffic kinds, and the SLO's alert rules
# (alerts switched off, or an engine whose metrics carry no objectives).
PRUNED_KINDS = (*TRAFFIC_KINDS, "PrometheusRule")


def traffic_selector(kind: str, name: str) -> dict[str, str]:
    if kind == "Deployment":
        return router_labels(name)
    return {LABEL_ISVC: name, LABEL_MANAGED_BY: FIELD_MANAGER}


def stale_objects(
    existing: dict[str, list[dict[str, Any]] | None], apply: tuple[dict[str, Any], ...], uid: str
) -> tuple[tuple[str, str, str], ...]:
    """Owned objects of TRAFFIC_KINDS that exist but that the plan does not apply."""
    rendered = {(obj["kind"], obj["metadata"]["name"]) for obj in apply}
    return tuple(
        (kind, obj["metadata"]["name"], obj["metadata"]["uid"])
        for kind, objects in existing.items()
        for obj in objects or ()
        if _owned_by(obj, uid) and (kind, obj["metadata"]["name"]) not in rendered
    )


def desired_replicas(spec: InferenceServiceSpec, status: dict[str, Any]) -> int:
    """The one place the replica count is decided: a pin in spec.replicas wins; otherwise the
    autoscaler's status.desiredReplicas (when active), kept within the scaling range."""
    if spec.replicas is not None:
        return spec.replicas
    scaling = spec.scaling
    autoscaled = status.get("desiredReplicas")
    if scaling.mode == "active" and isinstance(autoscaled, int):
        return max(scaling.min_replicas, min(scaling.max_replicas, autoscaled))
    return scaling.min_replicas


def _selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(pod_selector(name).items()))


def _status(
    isvc: dict[str, Any], conditions: list[Condition], now: str, fields: dict[str, Any]
) -> tuple[dict[str, Any], tuple[Transition, ...]]:
    previous = (isvc.get("status") or {}).get("conditions") or []
    generation = isvc["metadata"].get("generation", 0)
    # Reconciling / Stalled restate the others for kstatus readers: in status, but no Events of their own.
    derived = kstatus_conditions(conditions)
    status = {
        "observedGeneration": generation,
        "conditions": merge(previous, [*conditions, *derived], now, generation),
        **fields,
    }
    return status, tuple(transitions(previous, conditions))


def _stable_revision(
    previous: str | None, current: RevisionView | None, older: tuple[RevisionView, ...], desired: int
) -> str | None:
    """The revision that serves: the current one once all its replicas are ready, else the one
    that served before while it still runs (mid-scale, mid-rollout), else any old one still running."""
    if current is not None and current.serves(desired):
        return current.revision
    running = {v.revision for v in (*older, *([current] if current else []))}
    if previous in running:
        return previous
    return older[0].revision if older else None


def plan(
    isvc: dict[str, Any],
    spec: InferenceServiceSpec,
    deployments: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: Settings,
    kv: tuple[dict[str, Any], Condition],
    now: str,
    serving: Serving | None = None,
) -> Plan:
    meta = isvc["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    pod = render_pod_template(owner, spec, settings)
    desired = desired_replicas(spec, isvc.get("status") or {})
    views = [RevisionView.of(d) for d in deployments]
    current = next((v for v in views if v.revision == pod.revision), None)
    older = tuple(v for v in views if v.revision != pod.revision)
    counts = rolling_counts(spec, desired, pod.revision, current, older)
    retire = tuple(v for v in older if counts[v.revision] == 0)
    remaining = tuple(v for v in older if v not in retire)
    scale = tuple((v.name, counts[v.revision]) for v in remaining if v.spec_replicas != counts[v.revision])

    ask = ResourceAsk(spec.runtime.resources.gpus, spec.runtime.resources.gpu_resource)
    new_pods = [p for p in pods if p["metadata"].get("labels", {}).get(LABEL_REVISION) == pod.revision]
    diagnosis = diagnose(new_pods, ask) or diagnose(pods, ask)
    if (
        diagnosis is not None
        and diagnosis.reason == "Unschedulable"
        and _replaced_pods_releasing(pods, older)
    ):
        diagnosis = None  # a new replica waits for the GPU that the one it replaces is still giving back
    url = service_url(owner.name, owner.namespace)
    observed = Observation(desired, pod.revision, current, remaining, diagnosis, url, serving)

    capacity, kv_condition = kv
    conditions = [
        ready_condition(observed),
        progressing_condition(observed),
        degraded_condition(observed),
        kv_condition,
    ]
    previous_stable = (isvc.get("status") or {}).get("stableRevision")
    status, changed = _status(
        isvc,
        conditions,
        now,
        {
            **_serving_fields(observed, owner, capacity),
            "stableRevision": _stable_revision(previous_stable, current, remaining, desired),
        },
    )
    # The Service stays on the router (a switch from Canary) until the replicas are Ready.
    selects_router = serving is not None and serving.path.selected == "router"
    objects = (
        render_deployment(owner, spec, pod, counts[pod.revision]),
        render_front_service(owner, selects_router),
        render_pdb(owner),
    )
    return Plan(apply=objects, retire=retire, status=status, transitions=changed, scale=scale)


def _replaced_pods_releasing(pods: list[dict[str, Any]], older: tuple[RevisionView, ...]) -> bool:
    """A rollout is under way and pods of the service are terminating: what they hold comes free."""
    return bool(older) and any(p["metadata"].get("deletionTimestamp") for p in pods)


def rolling_counts(
    spec: InferenceServiceSpec,
    desired: int,
    revision: str,
    current: RevisionView | None,
    older: tuple[RevisionView, ...],
) -> dict[str, int]:
    """Replicas per revision for this step of a RollingUpdate (rollout/rolling_update.py decides), from the
    Deployments' own counts: the ReplicaSet controller's view of which pods are Ready."""
    rollout = spec.rollout
    surge = rollout.max_surge
    unavailable = unavailable_allowed(surge, rollout.max_unavailable)
    new = RevisionReplicas(revision, current.spec_replicas, current.ready) if current else None
    old = [RevisionReplicas(v.revision, v.spec_replicas, v.ready) for v in older]
    return next_replicas(desired, surge, unavailable, new or RevisionReplicas(revision, 0, 0), old)


def plan_canary_rollout(
    isvc: dict[str, Any],
    spec: InferenceServiceSpec,
    deployments: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: Settings,
    kv: tuple[dict[str, Any], Condition],
    now: str,
    judge: Judge,
    gateway_api_served: bool = True,
    serving: Serving | None = None,
) -> Plan:
    """spec.rollout.strategy Canary: rollout/controller.py decides revisions, replicas and traffic; Ready,
    replica counts and pod diagnosis are read as for RollingUpdate."""
    meta = isvc["metadata"]
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    pod = render_pod_template(owner, spec, settings)
    desired = desired_replicas(spec, isvc.get("status") or {})
    selects_router = None if serving is None else serving.path.selected == "router"
    canary = plan_canary(
        isvc, spec, pod, desired, deployments, pods, settings, judge, time.time(), now, selects_router
    )
    # No HTTPRoute API to write the split into: say so rather than fail every reconcile.
    route_unserved = spec.rollout.gateway_api is not None and not gateway_api_served
    apply = tuple(obj for obj in canary.apply if not (route_unserved and obj["kind"] == "HTTPRoute"))
    views = [RevisionView.of(d) for d in deployments]
    current = next((v for v in views if v.revision == pod.revision), None)
    older = tuple(v for v in views if v.revision != pod.revision)
    ask = ResourceAsk(spec.runtime.resources.gpus, spec.runtime.resources.gpu_resource)
    url = service_url(owner.name, owner.namespace)
    observed = Observation(desired, pod.revision, current, older, diagnose(pods, ask), url, serving)
    progressing, rollout_degraded = canary.conditions
    capacity, kv_condition = kv
    degraded = rollout_degraded if rollout_degraded.status == "True" else degraded_condition(observed)
    if route_unserved:
        degraded = Condition(
            "Degraded",
            "True",
            "GatewayAPIUnavailable",
            "spec.rollout.trafficRouting.gatewayAPI: the cluster does not serve HTTPRoute "
            "(gateway.networking.k8s.io/v1), so no traffic reaches the canary; install Gateway API, "
            "or remove trafficRouting to split traffic with the kubeinfer router",
        )
    status, changed = _status(
        isvc,
        [ready_condition(observed), progressing, degraded, kv_condition],
        now,
        {**_serving_fields(observed, owner, capacity), **canary.fields},
    )
    return Plan(apply, canary.retire, status, changed, canary.scale, canary.events, canary.requeue_after)


def _serving_fields(observed: Observation, owner: Owner, capacity: dict[str, Any]) -> dict[str, Any]:
    """The status fields both strategies write the same way."""
    return {
        "replicas": observed.replicas,
        "readyReplicas": observed.ready,
        "desiredReplicas": observed.desired,
        "selector": _selector_string(owner.name),
        "url": observed.url,
        "kvCapacity": capacity or None,
    }


def plan_invalid(isvc: dict[str, Any], problems: list[str], now: str) -> Plan:
    """A spec the apiserver let through but the operator cannot serve (e.g. a CRD older than the
    operator): change nothing, say why."""
    return _plan_nothing(isvc, invalid_spec_conditions(problems), now)


def plan_refused(isvc: dict[str, Any], refused: list[Refusal], now: str) -> Plan:
    """A spec asking for what the administrator does not allow (serving_policy.py): no pod is created or
    changed (what already runs is left as it is), and the conditions name the chart value."""
    return _plan_nothing(isvc, refusal_conditions(refused), now)


def _plan_nothing(isvc: dict[str, Any], conditions: list[Condition], now: str) -> Plan:
    status, changed = _status(isvc, conditions, now, {})
    return Plan(apply=(), retire=(), status=status, transitions=changed)


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _was_ready(isvc: dict[str, Any]) -> bool:
    conditions = (isvc.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def observe_serving(
    isvc: dict[str, Any],
    spec: InferenceServiceSpec,
    pods: list[dict[str, Any]],
    traffic: dict[str, list[dict[str, Any]] | None],
    settings: Settings,
) -> tuple[Serving, bool, bool]:
    """What the Service is to select, whether the URL answers (probed when that decides something), and
    whether traffic objects of another routing may be deleted: (serving, foreign objects exist, may prune)."""
    meta = isvc["metadata"]
    name, uid = meta["name"], meta["uid"]

    def owned(kind: str, object_name: str) -> dict[str, Any] | None:
        return next(
            (
                o
                for o in traffic.get(kind) or ()
                if o["metadata"]["name"] == object_name and _owned_by(o, uid)
            ),
            None,
        )

    router = owned("Deployment", router_name(name))
    ready = {
        "router": ((router or {}).get("status") or {}).get("readyReplicas") or 0,
        "replicas": sum(ready_by_revision(pods).values()),
    }
    path = choose_path(current_path(owned("Service", name)), desired_path(spec), ready)
    routing = desired_routing(spec)
    foreign = any(
        routing_of(kind, obj["metadata"]["name"], name) not in (None, routing)
        for kind, objects in traffic.items()
        for obj in objects or ()
        if _owned_by(obj, uid)
    )
    probing = settings.probe_service_url
    probe = None
    if probe_needed(path, _was_ready(isvc), foreign, probing):
        probe = probe_url(service_url(name, meta["namespace"]))
    serving = Serving(path, url_answers(path, probe, probing), probe.error if probe else None)
    return serving, foreign, may_prune(path, probe, probing)


def observe_and_plan(kube: Kube, settings: Settings, isvc: dict[str, Any]) -> Plan:
    meta = isvc["metadata"]
    now = now_rfc3339()
    try:
        spec = InferenceServiceSpec.model_validate(isvc.get("spec") or {})
    except ValidationError as error:
        return plan_invalid(isvc, [f"spec.{line}" for line in field_errors(error)], now)
    if refused := refusals(spec, settings):
        return plan_refused(isvc, refused, now)
    labels = {LABEL_ISVC: meta["name"], LABEL_APP: APP_NAME}  # the replicas, not the canary router
    deployments = [d for d in kube.list("Deployment", meta["namespace"], labels) if _owned_by(d, meta["uid"])]
    pods = kube.list("Pod", meta["namespace"], labels)
    kv = kv_capacity.check(spec, kv_capacity.model_shape(spec), kv_capacity.device_memory(spec))
    # Kinds a CRD may bring (HTTPRoute, PrometheusRule) are None where the cluster does not serve them.
    traffic = {
        kind: kube.list_if_served(kind, meta["namespace"], traffic_selector(kind, meta["name"]))
        for kind in PRUNED_KINDS
    }
    serving, foreign, prunable = observe_serving(isvc, spec, pods, traffic, settings)
    if spec.rollout.strategy == "Canary":
        judge = prometheus_judge(settings, spec, meta["namespace"], meta["name"])
        served = traffic["HTTPRoute"] is not None
        planned = plan_canary_rollout(
            isvc, spec, deployments, pods, settings, kv, now, judge, served, serving
        )
    else:
        planned = plan(isvc, spec, deployments, pods, settings, kv, now, serving)
    if deletion_cost.scaling_down(deployments, planned.apply, planned.scale):
        planned = replace(planned, annotate=_deletion_costs(settings, spec, meta, pods))
    alerts = alert_objects(settings, isvc, spec, served=traffic["PrometheusRule"] is not None)
    planned = replace(planned, apply=planned.apply + alerts)
    stale = stale_objects(traffic, planned.apply, meta["uid"])
    routing = desired_routing(spec)
    previous = tuple(s for s in stale if routing_of(s[0], s[1], meta["name"]) not in (None, routing))
    held = () if prunable else previous
    requeue = planned.requeue_after
    if (foreign and not prunable) or (serving.path.ready_pods and not serving.answers):
        requeue = min(requeue or SWITCH_POLL_S, SWITCH_POLL_S)  # kube-proxy's sync is no event we see
    prune = tuple(s for s in stale if s not in held)
    return replace(planned, prune=prune, held=held, requeue_after=requeue)


def _deletion_costs(
    settings: Settings, spec: InferenceServiceSpec, meta: dict[str, Any], pods: list[dict[str, Any]]
) -> tuple[tuple[str, str], ...]:
    engine = engine_metrics(spec.runtime.engine)
    try:
        work = deletion_cost.fetch_work(settings.prometheus_url, engine, meta["namespace"], meta["name"])
    except MetricsUnavailable as error:
        # Scale down all the same: the ReplicaSet controller's own order (not Ready first, then newest).
        log.warning("scale-down of %s/%s without per-pod work: %s", meta["namespace"], meta["name"], error)
        return ()
    return deletion_cost.cost_updates(pods, work)


def meta_key(meta: dict[str, Any]) -> tuple[str, str]:
    return meta["namespace"], meta["name"]


def execute(kube: Kube, isvc: dict[str, Any], plan: Plan) -> None:
    meta = isvc["metadata"]
    for pod, cost in plan.annotate:  # before the scale-down that reads them
        kube.annotate("Pod", meta["namespace"], pod, {deletion_cost.ANNOTATION: cost})
    for obj in plan.apply:
        kube.apply(obj)
    for name, replicas in plan.scale:
        kube.scale("Deployment", meta["namespace"], name, replicas)
    for view in plan.retire:
        log.info("retiring revision %s of %s/%s", view.revision, meta["namespace"], meta["name"])
        kube.delete("Deployment", meta["namespace"], view.name, view.uid)
    for kind, _, _ in plan.held:
        log.info("keeping the %s of %s/%s until its URL answers from the new routing", kind, *meta_key(meta))
    for kind, name, uid in plan.prune:
        log.info("deleting %s %s/%s: the spec no longer routes through it", kind, meta["namespace"], name)
        kube.delete(kind, meta["namespace"], name, uid)
    current = isvc.get("status") or {}
    changed = {key: value for key, value in plan.status.items() if current.get(key) != value}
    if changed:
        # Planned from this version of the object: if it has changed since, StatusConflict (reconcile again).
        kube.patch_status(KIND, meta["namespace"], meta["name"], changed, meta.get("resourceVersion"))
    log.log(
        logging.INFO if changed or plan.retire else logging.DEBUG,
        "reconciled %s/%s: applied %d, retired %d, status fields changed: %s",
        meta["namespace"],
        meta["name"],
        len(plan.apply),
        len(plan.retire),
        ", ".join(sorted(changed)) or "none",
    )
    # Events only once the status that records the transition is written: a retried reconcile
    # then neither repeats nor loses them.
    for event in plan.events:
        try:
            kube.post_event(isvc, event.type, event.reason, event.message)
        except ApiException as error:
            log.warning("could not post event %s on %s: %s", event.reason, meta["name"], error.reason)
    for transition in plan.transitions:
        condition = transition.condition
        kind = "Warning" if is_warning(condition) else "Normal"
        message = f"{condition.type} is {condition.status}: {condition.message}"
        try:
            kube.post_event(isvc, kind, condition.reason, message)
        except ApiException as error:
            log.warning("could not post event %s on %s: %s", condition.reason, meta["name"], error.reason)


def reconcile(kube: Kube, settings: Settings, namespace: str, name: str) -> float | None:
    """Returns in how many seconds to reconcile again regardless of events (a rollout in flight).

    The status is written only over the version it was planned from. When someone else wrote in between
    (the autoscaler, a user, a cache behind the apiserver), the reconcile starts again from the object as
    it is now rather than overwrite what it did not see; applies and scales are idempotent, and events go
    out only after a successful status write, so nothing is repeated."""
    isvc = kube.get(KIND, namespace, name)
    for _ in range(CONFLICT_ATTEMPTS):
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return None  # the owned objects are garbage-collected with it
        plan = observe_and_plan(kube, settings, isvc)
        try:
            execute(kube, isvc, plan)
        except StatusConflict as conflict:
            log.info("%s: reconciling again from the object as it is now", conflict)
            isvc = kube.get_latest(KIND, namespace, name)
            continue
        return plan.requeue_after
    log.warning(
        "status of %s/%s kept changing under %d reconciles: retrying soon", namespace, name, CONFLICT_ATTEMPTS
    )
    return CONFLICT_RETRY_S
