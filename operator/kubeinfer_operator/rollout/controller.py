"""Canary rollouts (spec.rollout.strategy Canary) in the reconcile: observe -> rollout/state_machine ->
the objects that make its decision so.

Per reconcile: read the machine's state from status.rollout, run the analysis it asks for (PromQL from
rollout/queries.py against Prometheus, at the window's end), step the machine, and return what to write:
one Deployment per revision at the machine's stable/canary replica counts (other revisions deleted),
the router (router_render.py) with the canary weight and the Ready pods of each revision, or instead, with
spec.rollout.trafficRouting.gatewayAPI, per-track Services and an HTTPRoute (gateway_render.py), status (the
machine's state, so a restarted operator resumes at the same step), conditions and events.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubeinfer_operator.api import InferenceServiceSpec, parse_duration
from kubeinfer_operator.api.status import MAX_DECISIONS
from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.engine_metrics import engine_metrics
from kubeinfer_operator.gateway_render import render_gateway_split
from kubeinfer_operator.names import HTTP_PORT, LABEL_REVISION, LABEL_TRACK
from kubeinfer_operator.prometheus import MetricsUnavailable, connect, instant
from kubeinfer_operator.render import Owner, PodTemplate, render_deployment, render_pdb
from kubeinfer_operator.rollout import state_machine as machine
from kubeinfer_operator.rollout.analysis import LatencyObjective, Outcome, SLOTargets, Verdict, analyse
from kubeinfer_operator.rollout.queries import measurement, track_queries
from kubeinfer_operator.rollout.traffic import router_config
from kubeinfer_operator.router_render import render_front_service, render_router, tracing_env
from kubeinfer_operator.settings import Settings
from kubeinfer_operator.status import RevisionView

log = logging.getLogger(__name__)

TICK_SECONDS = 2.0  # how often a rollout in flight is looked at: step clocks and analyses are due on time
ACTIVE_PHASES = frozenset({machine.Phase.PROGRESSING, machine.Phase.PROMOTING, machine.Phase.ROLLING_BACK})

Judge = Callable[[machine.RolloutState, tuple[float, float]], Verdict]


@dataclass(frozen=True)
class CanaryPlan:
    apply: tuple[dict[str, Any], ...]
    scale: tuple[tuple[str, int], ...]  # (Deployment name, replicas) of revisions the spec no longer renders
    retire: tuple[RevisionView, ...]
    fields: dict[str, Any]  # status fields besides observedGeneration and conditions
    conditions: tuple[Condition, ...]
    events: tuple[machine.RolloutEvent, ...]
    requeue_after: float | None


def rollout_spec(spec: InferenceServiceSpec) -> machine.RolloutSpec:
    rollout = spec.rollout
    return machine.RolloutSpec(
        strategy=machine.Strategy(rollout.strategy),
        # A step without a pause waits for the promote annotation.
        steps=tuple(
            machine.Step(s.weight, parse_duration(s.pause) if s.pause else math.inf)
            for s in rollout.steps or ()
        ),
        analysis=machine.AnalysisSpec(
            parse_duration(rollout.analysis.interval),
            rollout.analysis.min_requests,
            rollout.analysis.failure_limit,
        ),
        progress_deadline_s=parse_duration(rollout.progress_deadline),
        max_surge=rollout.max_surge,
        paused=rollout.paused,
    )


def slo_targets(spec: InferenceServiceSpec) -> SLOTargets:
    latency = []
    for metric in ("ttft", "tpot", "e2e"):
        targets = getattr(spec.slo, metric)
        for quantile, target in (
            ((0.5, targets.p50), (0.95, targets.p95), (0.99, targets.p99)) if targets else ()
        ):
            if target:
                latency.append(LatencyObjective(metric, quantile, parse_duration(target)))
    return SLOTargets(tuple(latency), spec.slo.error_rate)


def _is_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp") or not pod.get("status", {}).get("podIP"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_by_revision(pods: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in filter(_is_ready, pods):
        revision = pod["metadata"].get("labels", {}).get(LABEL_REVISION, "")
        counts[revision] = counts.get(revision, 0) + 1
    return counts


def ready_endpoints(pods: list[dict[str, Any]], revision: str | None) -> list[str]:
    return [
        f"http://{p['status']['podIP']}:{HTTP_PORT}"
        for p in pods
        if _is_ready(p)
        and revision is not None
        and p["metadata"].get("labels", {}).get(LABEL_REVISION) == revision
    ]


def initial_state(status: Mapping[str, Any], views: list[RevisionView]) -> machine.RolloutState:
    """The machine's state from status; a service switching from RollingUpdate starts from what serves."""
    state = machine.RolloutState.from_status(status.get("rollout"))
    stable = status.get("stableRevision")
    if state.stable_revision is None and stable in {v.revision for v in views}:
        spec_replicas = next(v.spec_replicas for v in views if v.revision == stable)
        return machine.RolloutState(stable_revision=stable, stable_replicas=spec_replicas)
    return state


def _decisions(
    previous: list[dict[str, Any]],
    state: machine.RolloutState,
    events: tuple[machine.RolloutEvent, ...],
    now: str,
) -> list[dict[str, Any]]:
    revision = state.canary_revision or state.rolled_back_revision or state.stable_revision or ""
    new = [
        {
            "time": now,
            "revision": revision,
            "step": state.step_index,
            "weight": state.canary_weight,
            "action": e.reason[:32],
            "reason": e.message[:1024],
        }
        for e in events
    ]
    return (previous + new)[-MAX_DECISIONS:]


def plan_canary(
    isvc: dict[str, Any],
    spec: InferenceServiceSpec,
    pod: PodTemplate,
    desired: int,
    deployments: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: Settings,
    judge: Judge,
    now: float,
    now_text: str,
    front_selects_router: bool | None = None,
) -> CanaryPlan:
    """Pure but for `judge` (the analysis, run only when the machine says one is due).

    `front_selects_router`: what the Service behind status.url selects (serving_path.py decides; by
    default the router exactly when it routes)."""
    meta, status = isvc["metadata"], isvc.get("status") or {}
    owner = Owner(meta["name"], meta["namespace"], meta["uid"])
    views = [RevisionView.of(d) for d in deployments]
    tracks = {
        v.revision: d["metadata"].get("labels", {}).get(LABEL_TRACK)
        for v, d in zip(views, deployments, strict=True)
    }
    rspec = rollout_spec(spec)
    state = initial_state(status, views)
    window = machine.analysis_window(rspec, state, now)
    verdict = judge(state, window) if window else None
    command = machine.command_from_annotations(meta.get("annotations") or {}, pod.revision)
    observed = machine.Observation(now, pod.revision, desired, ready_by_revision(pods), verdict, command)
    decision = machine.reconcile(rspec, state, observed)
    new = decision.state

    wanted = {new.stable_revision: new.stable_replicas}
    if new.canary_revision is not None:
        wanted[new.canary_revision] = new.canary_replicas
    apply: list[dict[str, Any]] = []
    if pod.revision in wanted:
        # A pod's track label is the one it was created with: relabelling would restart every replica.
        track = tracks.get(pod.revision) or ("canary" if pod.revision == new.canary_revision else "stable")
        apply.append(render_deployment(owner, spec, pod, wanted[pod.revision], track))
    scale = tuple(
        (v.name, wanted[v.revision])
        for v in views
        if v.revision != pod.revision and v.revision in wanted and v.spec_replicas != wanted[v.revision]
    )
    retire = tuple(v for v in views if v.revision not in wanted)

    gateway = spec.rollout.gateway_api
    if gateway is not None:
        ready = ready_by_revision(pods)
        revisions = {"stable": new.stable_revision, "canary": new.canary_revision}
        ready_by_track = {track: ready.get(rev, 0) for track, rev in revisions.items() if rev is not None}
        # The Service keeps selecting every replica: in-cluster clients that bypass the Gateway still land.
        apply += render_gateway_split(owner, gateway, revisions, ready_by_track, new.canary_weight)
    else:
        config = router_config(
            new.canary_weight,
            ready_endpoints(pods, new.stable_revision),
            ready_endpoints(pods, new.canary_revision),
        )
        apply += render_router(owner, settings, config, tracing_env(spec.runtime.env))
    routed = gateway is None if front_selects_router is None else front_selects_router
    apply += [render_front_service(owner, routed), render_pdb(owner)]

    fields = {
        "stableRevision": new.stable_revision,
        "canaryRevision": new.canary_revision,
        "canaryWeight": new.canary_weight,
        "canaryStep": new.step_index if new.canary_revision else None,
        "rolloutPhase": str(new.phase),
        # status is merge-patched: a key the machine no longer sets must be sent as null to go.
        "rollout": {**dict.fromkeys(status.get("rollout") or {}), **new.to_status()},
        "rolloutDecisions": _decisions(status.get("rolloutDecisions") or [], new, decision.events, now_text),
    }
    conditions = tuple(decision.conditions)
    return CanaryPlan(
        apply=tuple(apply),
        scale=scale,
        retire=retire,
        fields=fields,
        conditions=conditions,
        events=decision.events,
        requeue_after=TICK_SECONDS if new.phase in ACTIVE_PHASES else None,
    )


def prometheus_judge(settings: Settings, spec: InferenceServiceSpec, namespace: str, name: str) -> Judge:
    """Canary and stable over the same window, evaluated at its end, judged against spec.slo."""
    slo = slo_targets(spec)
    # Without the router, only the replicas see the requests (a Gateway's own metrics vary by vendor).
    source = "replicas" if spec.rollout.gateway_api else "router"
    engine = engine_metrics(spec.runtime.engine)  # the same adapter the autoscaler reads through

    def judge(state: machine.RolloutState, window: tuple[float, float]) -> Verdict:
        start, end = window
        measured = {}
        prom = connect(settings.prometheus_url)
        try:
            tracks = (
                ("canary", state.canary_revision, state.canary_replicas),
                ("stable", state.stable_revision, state.stable_replicas),
            )
            for track, revision, replicas in tracks:
                queries = track_queries(
                    namespace, name, track, revision or "", end - start, slo, source, engine
                )
                results = {k: instant(prom, q, end) for k, q in queries.items()}
                measured[track] = measurement(results, slo, replicas)
        except MetricsUnavailable as error:
            log.warning("canary analysis of %s/%s: Prometheus unavailable: %s", namespace, name, error)
            return Verdict(
                Outcome.INCONCLUSIVE, f"metrics unavailable from {settings.prometheus_url}: {error}"
            )
        verdict = analyse(measured["canary"], measured["stable"], slo, spec.rollout.analysis.min_requests)
        log.info("canary analysis of %s/%s over %.0fs: %s", namespace, name, end - start, verdict.message)
        return verdict

    return judge
