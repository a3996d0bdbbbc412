"""The autoscaler's edge: a timer per InferenceService, and the tick it runs (observe the pods, read
Prometheus, decide with autoscaling/tick.py, write status, post Events).

Race-free by construction: a timer never writes. It only adds the InferenceService's key to the work
queue, and the worker that takes the key runs the tick (when due) and then the reconcile, one after the
other. The queue never runs one key twice at once, so the tick's status write and the reconcile's (both
merge patches of status, the conditions list written whole) never interleave; the reconcile reads the
object after the tick wrote desiredReplicas and applies it to the Deployment in the same work item.

The stabilization state lives in this process, as the HPA keeps its own: a status field written on
every tick would be a write per service per interval. A new leader starts without it, which the policy
makes safe: no scale-down until it has watched a whole scale-down window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException
from prometheus_api_client import PrometheusConnect
from pydantic import ValidationError

from kubeinfer_operator.api import InferenceServiceSpec, parse_duration
from kubeinfer_operator.autoscaling import MetricsUnavailable, ScalingState, engine_metrics, fetch_signals
from kubeinfer_operator.autoscaling.forecast import forecast
from kubeinfer_operator.autoscaling.signals import fetch_arrivals_history, fetch_slo_readings
from kubeinfer_operator.autoscaling.tick import (
    count_pods,
    enabled,
    plan_disabled,
    plan_tick,
    transition_event,
)
from kubeinfer_operator.kube import Kube
from kubeinfer_operator.names import APP_NAME, KIND, LABEL_APP, LABEL_ISVC
from kubeinfer_operator.prometheus import connect
from kubeinfer_operator.reconcile import desired_replicas
from kubeinfer_operator.render import Owner, render_pod_template
from kubeinfer_operator.settings import Settings
from kubeinfer_operator.workqueue import Key

log = logging.getLogger(__name__)
RETRY_SECONDS = 15.0  # the next tick after one that could not read the spec or failed
# State older than this many intervals missed decisions (another leader made them, or the API was
# down): the windows would have gaps, so start afresh, which the policy makes safe.
STALE_INTERVALS = 3


class Autoscaler:
    def __init__(self, kube: Kube, settings: Settings, enqueue: Callable[[Key], None]) -> None:
        self.kube, self.settings, self._enqueue = kube, settings, enqueue
        self._states: dict[Key, tuple[ScalingState, float]] = {}  # and the monotonic time it was made
        self._next_tick: dict[Key, float] = {}  # monotonic time the key's next tick is due

    async def tick_if_due(self, key: Key) -> None:
        """Called by the work queue's worker before each reconcile of `key`: ticks when the key's timer
        is due (or it has none yet), then sets the timer for the next tick."""
        now = time.monotonic()
        if now < self._next_tick.get(key, 0.0):
            return
        interval: float | None = RETRY_SECONDS
        self._next_tick[key] = now + RETRY_SECONDS  # a failed tick retries on the timer, not per reconcile
        try:
            interval = await asyncio.to_thread(self.tick, *key)
        finally:
            if interval is None:  # the InferenceService is gone
                self._next_tick.pop(key, None)
                self._states.pop(key, None)
            else:
                self._next_tick[key] = now + interval
                asyncio.get_running_loop().call_later(interval, self._enqueue, key)

    def tick(self, namespace: str, name: str) -> float | None:
        """One decision for one InferenceService; returns the seconds until its next tick (None: it is
        gone)."""
        isvc = self.kube.get(KIND, namespace, name)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return None
        try:
            spec = InferenceServiceSpec.model_validate(isvc.get("spec") or {})
        except ValidationError:
            return RETRY_SECONDS  # the reconcile reports the invalid spec
        interval = parse_duration(spec.scaling.interval)
        if not enabled(spec):
            if patch := plan_disabled(isvc):
                self.kube.patch_status(KIND, namespace, name, patch)
            return interval

        meta = isvc["metadata"]
        revision = render_pod_template(Owner(name, namespace, meta["uid"]), spec, self.settings).revision
        replicas = self.kube.list("Pod", namespace, {LABEL_ISVC: name, LABEL_APP: APP_NAME})
        pods = count_pods(replicas, revision)
        if pods.other_revisions or not pods.ready:
            # Mid-rollout the ready count, the signals and the replica split describe two revisions at
            # once; with no replica ready there is no load to measure (and no series yet, at creation).
            log.debug("autoscaler of %s/%s waits for a revision to serve", namespace, name)
            return interval
        prometheus = connect(self.settings.prometheus_url)
        try:
            metrics = engine_metrics(spec.runtime.engine)
            signals: dict[str, float] | None = fetch_signals(prometheus, metrics, namespace, name)
            window = f"{max(int(parse_duration(spec.slo.window)), 30)}s"
            slo_readings = fetch_slo_readings(prometheus, metrics, namespace, name, window)
            error = ""
        except MetricsUnavailable as unavailable:
            signals, slo_readings, error = None, {}, str(unavailable)
        forecast_rps = self._forecast(prometheus, spec, namespace, name) if signals is not None else None
        key = (namespace, name)
        state, made = self._states.get(key, (ScalingState(), 0.0))
        if time.monotonic() - made > STALE_INTERVALS * interval:
            state = ScalingState()
        current = desired_replicas(spec, isvc.get("status") or {})
        plan = plan_tick(
            isvc, spec, current, pods, signals, error, state, time.time(), slo_readings, forecast_rps
        )
        if plan.status:
            self.kube.patch_status(KIND, namespace, name, plan.status)
        self._states[key] = (plan.state, time.monotonic())  # only once the decision it led to is written
        log.log(
            logging.INFO if plan.event is not None else logging.DEBUG,
            "autoscaled %s/%s: %s",
            namespace,
            name,
            plan.decision.reason,
        )
        # Events after the status that records them, as the reconcile does.
        if plan.event is not None:
            self._post(isvc, "Normal", *plan.event)
        for transition in plan.transitions:
            if event := transition_event(transition):
                self._post(isvc, *event)
        return interval

    @staticmethod
    def _forecast(
        prometheus: PrometheusConnect, spec: InferenceServiceSpec, namespace: str, name: str
    ) -> float | None:
        """Requests per second forecast one model load ahead, for scaling.predictive; None when it is off or
        the history cannot be read (the reactive signals still scale: a forecast is never required)."""
        predictive = spec.scaling.predictive
        if predictive is None:
            return None
        step_s = 30.0
        try:
            history = fetch_arrivals_history(
                prometheus,
                engine_metrics(spec.runtime.engine),
                namespace,
                name,
                time.time(),
                parse_duration(predictive.history),
                step_s,
            )
        except MetricsUnavailable as unavailable:
            log.warning("no forecast for %s/%s: %s", namespace, name, unavailable)
            return None
        season = parse_duration(predictive.season) if predictive.season else None
        return forecast(history, step_s, parse_duration(predictive.load_time), season)

    def _post(self, isvc: dict[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            self.kube.post_event(isvc, kind, reason, message)
        except ApiException as error:
            log.warning("could not post event %s: %s", reason, error.reason)
