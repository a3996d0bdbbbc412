"""`status` of an InferenceService: what the operator observed and decided.

Only the operator writes it (through the status subresource). Latencies are duration strings
("212ms", see durations.format_duration) so they read like the SLO targets beside them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from .base import KubeModel
from .durations import Duration

MAX_DECISIONS = 20
CONDITION_TYPES = (
    "Ready",
    "Progressing",
    "Degraded",
    "Reconciling",
    "Stalled",
    "SLOMet",
    "MetricsAvailable",
    "ScalingLimited",
)


def _free_form(schema: dict[str, Any]) -> None:
    """A structural schema says "keep whatever is here" with preserve-unknown-fields, not
    additionalProperties."""
    schema.pop("additionalProperties", None)
    schema["x-kubernetes-preserve-unknown-fields"] = True


class StatusModel(KubeModel):
    # Status is read back from the apiserver as JSON (timestamps as strings), so coercion is on.
    model_config = ConfigDict(strict=False)


class Condition(StatusModel):
    """One aspect of the service's state, as in metav1.Condition. Types: Ready (serving traffic),
    Progressing (a rollout or scaling is under way), Degraded (a rollout was aborted or replicas
    fail), Reconciling and Stalled (the kstatus conventions Flux and kubectl wait read: work under way;
    stuck until someone acts), SLOMet (the SLO holds over slo.window), MetricsAvailable (Prometheus
    answers for every signal), ScalingLimited (desired replicas cannot be reached: maxReplicas,
    unschedulable GPUs, or spec.replicas pinned)."""

    type: str = Field(max_length=64)
    """Condition type, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = Field(max_length=128)
    """One CamelCase word for the cause, e.g. Unschedulable or ManualReplicas."""
    message: str = Field(max_length=4096)
    """What happened, for a person."""
    last_transition_time: datetime
    """When status last changed."""
    observed_generation: int | None = Field(None, ge=0)
    """metadata.generation this condition was computed from."""


class Signals(StatusModel):
    """The latest reading of each signal, across all replicas, over slo.window."""

    queue_time_p95: Duration | None = None
    """p95 time requests waited for a batch slot."""
    oldest_waiting_age: Duration | None = None
    """Age of the oldest request still waiting, the earliest sign of overload."""
    kv_cache_usage: float | None = Field(None, ge=0, le=1)
    """Average KV-cache usage across replicas, 0-1."""
    waiting_per_replica: float | None = Field(None, ge=0)
    """Requests waiting per ready replica."""
    ttft_p95: Duration | None = None
    """p95 time to first token."""
    tpot_p95: Duration | None = None
    """p95 time per output token."""
    e2e_p95: Duration | None = None
    """p95 end-to-end latency."""
    error_rate: float | None = Field(None, ge=0, le=1)
    """Fraction of requests that failed."""
    forecast_rps: float | None = Field(None, ge=0)
    """With scaling.predictive: requests per second forecast one model load ahead."""
    forecast_floor: int | None = Field(None, ge=0)
    """With scaling.predictive: the replicas that forecast needs (applied unless its mode is dryRun)."""
    time: datetime | None = None
    """When these readings were taken."""


class ScalingDecision(StatusModel):
    """One autoscaler decision, kept so a person can see why the replica count changed."""

    time: datetime
    """When it was made."""
    signal: str = Field(max_length=64)
    """The signal that set the count: queueTimeP95, oldestWaitingAge, kvCacheUsage,
    waitingPerReplica, backlog, or minReplicas / maxReplicas when the range set it."""
    value: str = Field(max_length=64)
    """The signal's value in its unit: a duration for queueTimeP95 and oldestWaitingAge (1.2s), a
    0-1 ratio for kvCacheUsage (0.83), requests for waitingPerReplica and backlog, replicas for
    minReplicas / maxReplicas (what the signals asked for)."""
    target: str = Field(max_length=64)
    """What the value was held to, in the same unit (250ms, 0.7, 4 requests, 3 replicas); for
    backlog, the time the replicas have to clear it in."""
    from_replicas: int = Field(ge=0)
    """Desired replicas before."""
    to_replicas: int = Field(ge=0)
    """Desired replicas after."""
    reason: str = Field(max_length=1024)
    """Why, including any limit applied (stabilization window, pending replicas, unschedulable
    GPUs, dryRun)."""


class RolloutDecision(StatusModel):
    """One canary analysis result or rollout action."""

    time: datetime
    """When it was made."""
    revision: str = Field(max_length=64)
    """The revision being rolled out."""
    step: int = Field(ge=0)
    """Index of the step in spec.rollout.steps."""
    weight: int = Field(ge=0, le=100)
    """Canary traffic percent at the time."""
    action: str = Field(max_length=32)
    """What was done: advance, hold, promote, abort or pause."""
    reason: str = Field(max_length=1024)
    """Why, e.g. canary ttft p95 640ms > 500ms (stable 310ms), 212 requests."""


class KvCapacity(StatusModel):
    """KV-cache planning for one replica: bytes per token = 2 x layers x kv heads x head dim x
    dtype bytes."""

    bytes_per_token: int | None = Field(None, ge=0)
    """KV-cache bytes one token occupies."""
    tokens_needed: int | None = Field(None, ge=0)
    """Tokens a full batch at full context needs (runtime.maxNumSeqs x model.maxModelLen)."""
    tokens_fit: int | None = Field(None, ge=0)
    """Tokens the configured KV budget holds. Below tokensNeeded, full batches preempt."""


class InferenceServiceStatus(StatusModel):
    """What the operator observed and decided. Written by the operator only."""

    observed_generation: int | None = Field(None, ge=0)
    """metadata.generation the operator last acted on."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Current conditions; see Condition for the types."""
    replicas: int | None = Field(None, ge=0)
    """Replica pods that exist, all revisions together (the scale subresource reads this)."""
    ready_replicas: int | None = Field(None, ge=0)
    """Replicas with the model loaded and warmed, serving traffic."""
    desired_replicas: int | None = Field(None, ge=0)
    """Replicas the operator wants: the autoscaler's decision, or spec.replicas when set."""
    selector: str | None = Field(None, max_length=4096)
    """Label selector of the replica pods, for the scale subresource (and HPA/KEDA)."""
    stable_revision: str | None = Field(None, max_length=64)
    """Revision serving the stable traffic."""
    canary_revision: str | None = Field(None, max_length=64)
    """Revision under canary, while a rollout is under way."""
    canary_weight: int | None = Field(None, ge=0, le=100)
    """Percent of traffic the canary receives."""
    canary_step: int | None = Field(None, ge=0)
    """Index of the current step in spec.rollout.steps."""
    rollout_phase: str | None = Field(None, max_length=32)
    """Idle (nothing to roll out), Progressing (canary steps), Promoting, Promoted, RollingBack or
    RolledBack."""
    url: str | None = Field(None, max_length=2048)
    """In-cluster URL of the OpenAI-compatible endpoint."""
    signals: Signals | None = None
    scaling_decisions: list[ScalingDecision] = Field(default_factory=list, max_length=MAX_DECISIONS)
    """The most recent autoscaler decisions, oldest first."""
    rollout_decisions: list[RolloutDecision] = Field(default_factory=list, max_length=MAX_DECISIONS)
    """The most recent canary analyses and rollout actions, oldest first."""
    kv_capacity: KvCapacity | None = None
    """Whether the configured batch fits the KV cache."""
    rollout: dict[str, Any] | None = Field(None, json_schema_extra=_free_form)
    """The canary state machine's own record (step clock, analyses, failure), from which an
    operator restarted mid-rollout resumes. Internal: read the fields above instead."""
