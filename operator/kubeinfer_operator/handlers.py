"""kopf wiring, and nothing else: watch events feed the operator's object cache (cache.py) and name an
InferenceService; the work queue deduplicates them, and the Lease holder's workers reconcile
(reconcile.py) from the cache. An autoscaler timer only asks for a tick: the reconcile runs when an
event (the tick's own status write among them), a resync or a requeue asks for it.

    kopf run -m kubeinfer_operator.handlers --standalone --all-namespaces

Only `on.event` handlers: kopf then keeps no state in the user's object (no annotations, no
finalizers), so deleting an InferenceService never waits for the operator and a GitOps diff shows
nothing the operator wrote outside status.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from kubeinfer_operator.autoscaling.controller import Autoscaler
from kubeinfer_operator.cached_kube import CachedKube
from kubeinfer_operator.kube import load_client
from kubeinfer_operator.leader import Leadership
from kubeinfer_operator.metrics import RECONCILE_SECONDS, RECONCILES
from kubeinfer_operator.names import GROUP, KIND, LABEL_ISVC, PLURAL, VERSION
from kubeinfer_operator.reconcile import reconcile
from kubeinfer_operator.service_metrics import ServiceMetrics, serve
from kubeinfer_operator.settings import Settings, load_settings
from kubeinfer_operator.workqueue import Key, WorkQueue

log = logging.getLogger(__name__)
OWNED = {LABEL_ISVC: kopf.PRESENT}


@dataclass
class Operator:
    settings: Settings
    kube: CachedKube
    queue: WorkQueue
    leadership: Leadership | None  # None: leader election off (one replica, or development)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # referenced, so never collected
    autoscaler: Autoscaler | None = None
    wanted: set[Key] = field(default_factory=set)  # keys an event asked to reconcile, not only to tick

    def want(self, key: Key, background: bool = False) -> None:
        """Reconcile `key` (and tick it if due): for watch events and requeues, and (in the background,
        after what events ask for) resync passes."""
        self.wanted.add(key)
        self.queue.add(key, background)

    metrics: ServiceMetrics | None = None  # the operator's /metrics, when settings.metrics_port is set

    def leading(self) -> bool:
        return self.leadership is None or self.leadership.leading.is_set()

    async def process(self, key: Key) -> None:
        if self.leading():  # a standby drops work: the leader reconciles everything when elected
            if self.autoscaler is not None:  # its tick runs here, so it never races the reconcile
                await self.autoscaler.tick_if_due(key)
            if key not in self.wanted:
                return  # only the autoscaler's timer: a status write of the tick comes back as an event
            self.wanted.discard(key)  # before the reconcile: an event during it asks again
            outcome = "error"
            try:
                with RECONCILE_SECONDS.time():
                    again = await asyncio.to_thread(reconcile, self.kube, self.settings, *key)
                outcome = "ok"
            finally:
                RECONCILES.labels(outcome=outcome).inc()
            if again is not None:
                asyncio.get_running_loop().call_later(again, self.want, key)

    async def enqueue_all(self) -> None:
        for namespace in self.settings.namespaces or (None,):
            for isvc in await asyncio.to_thread(self.kube.list, KIND, namespace):
                self.want((isvc["metadata"]["namespace"], isvc["metadata"]["name"]), background=True)

    async def resync(self) -> None:
        """Level-triggered safety net: the cache is re-listed (a broken watch may have missed a deletion)
        and every InferenceService reconciled."""
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            try:
                await asyncio.to_thread(self.kube.resync, self.settings.namespaces)
                if self.leading():
                    await self.enqueue_all()
            except Exception:
                log.exception("resync listing failed; the next pass retries")


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    try:
        config = load_settings()
    except ValueError as error:  # a bad chart value: stop with its name rather than retry forever
        raise kopf.PermanentError(str(error)) from None
    logging.getLogger("kubeinfer_operator").setLevel(config.log_level)
    if config.log_level != "DEBUG":  # kopf logs every watch event, aiohttp every liveness probe
        for name in ("kopf.objects", "aiohttp.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
    # kopf would post its own log lines as Events; ours (one per condition change) say more.
    settings.posting.enabled = False
    # The watched resources exist when the chart starts the operator (Helm installs CRDs first):
    # no need to watch CRDs and namespaces, nor the RBAC to do so.
    settings.scanning.disabled = True
    loop = asyncio.get_running_loop()
    kube = CachedKube(load_client())
    # Seeded before any reconcile: a half-filled cache would look like missing objects.
    await asyncio.to_thread(kube.resync, config.namespaces)
    operator = Operator(config, kube, WorkQueue(lambda key: operator.process(key)), None)
    operator.autoscaler = Autoscaler(kube, config, operator.queue.add)
    if config.metrics_port:
        operator.metrics = serve(config.metrics_port)
    if config.leader_election:

        def elected() -> None:
            asyncio.run_coroutine_threadsafe(operator.enqueue_all(), loop)

        operator.leadership = Leadership(config.lease_name, config.lease_namespace, config.identity, elected)
        kube.may_write = operator.leading  # a reconcile in flight when the term ends writes no more
        operator.leadership.start()
    operator.tasks = [loop.create_task(operator.queue.worker()) for _ in range(config.workers)]
    operator.tasks.append(loop.create_task(operator.resync()))
    memo.operator = operator
    log.info(
        "kubeinfer operator started: namespaces=%s leader_election=%s",
        ",".join(config.namespaces) or "all",
        config.leader_election,
    )


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    operator: Operator | None = memo.get("operator")  # absent when start failed
    if operator is not None and operator.leadership is not None:
        await asyncio.to_thread(operator.leadership.release)


def _cache_event(operator: Operator, kind: str, event: kopf.RawEvent) -> None:
    obj = event["object"]
    meta = obj.get("metadata") or {}
    if event["type"] == "DELETED":
        operator.kube.cache.remove(kind, meta.get("namespace", ""), meta["name"], meta.get("resourceVersion"))
    else:
        operator.kube.cache.upsert(kind, obj)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def inference_service_changed(
    name: str, namespace: str, event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    _cache_event(memo.operator, KIND, event)
    memo.operator.want((namespace, name))
    if (metrics := memo.operator.metrics) is not None:
        if event["type"] == "DELETED":
            metrics.forget(namespace, name)
        else:
            metrics.observe(namespace, name, copy.deepcopy(dict(body.get("status") or {})))


def _owner(body: kopf.Body, labels: kopf.Labels) -> str:
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("controller"):
            return ref["name"]
    return labels[LABEL_ISVC]  # pods: owned by a ReplicaSet, labelled by the template


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("v1", "services", labels=OWNED)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=OWNED)
@kopf.on.event("v1", "pods", labels=OWNED)
@kopf.on.event("v1", "configmaps", labels=OWNED)
@kopf.on.event("v1", "serviceaccounts", labels=OWNED)
@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=OWNED)
async def owned_object_changed(
    body: kopf.Body,
    labels: kopf.Labels,
    namespace: str,
    event: kopf.RawEvent,
    resource: kopf.Resource,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    _cache_event(memo.operator, resource.kind, event)
    memo.operator.want((namespace, _owner(body, labels)))
