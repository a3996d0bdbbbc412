"""`spec` of an InferenceService: the contract users write.

Docstrings under each field are the descriptions `kubectl explain` prints, so they are written
for the person filling in a manifest. Cross-field rules live in `rules` (see base.Rule).
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, PlainValidator, WithJsonSchema

from .base import KubeModel, Rule
from .durations import DURATION_PATTERN, Duration, parse_duration

HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # Gateway API's
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{NUMBER}))?$"  # Kubernetes' own, unsigned


def _if_well_formed(*durations: str) -> str:
    """CEL prefix that skips a rule while a duration is malformed: the schema's pattern reports that
    already, and duration() would add a confusing conversion error."""
    return "".join(f"!{d}.matches('{DURATION_PATTERN}') || " for d in durations)


def _percentile_order(lower: str, upper: str) -> Rule:
    """The rule that percentile `lower` (e.g. p50) is not set above percentile `upper` (e.g. p95)."""
    return Rule(
        cel=f"!has(self.{lower}) || !has(self.{upper}) || "
        + _if_well_formed(f"self.{lower}", f"self.{upper}")
        + f"duration(self.{lower}) <= duration(self.{upper})",
        message=f"{lower} must not exceed {upper}",
        holds=lambda s: (
            None in (getattr(s, lower), getattr(s, upper))
            or parse_duration(getattr(s, lower)) <= parse_duration(getattr(s, upper))
        ),
        field=f".{lower}",
    )


def _check_quantity(value: object) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.match(QUANTITY_PATTERN, value):
        return value
    raise ValueError(f"{value!r} is not a quantity: write a whole number or a string such as 500m, 2, 4Gi")


# Kubernetes quantities arrive as YAML integers (cpu: 2) or strings (cpu: 500m); the schema is
# the int-or-string form Kubernetes' own types publish.
Quantity = Annotated[
    int | str,
    PlainValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


class PvcSource(KubeModel):
    """A PersistentVolumeClaim holding the model files, mounted read-only into every replica: the
    usual choice in production."""

    claim_name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the PersistentVolumeClaim, in the InferenceService's namespace."""
    path: str | None = Field(None, max_length=1024)
    """Directory inside the claim that holds config.json, the *.safetensors weights and
    tokenizer.json. Unset: the claim's root."""

    rules = (
        Rule(
            cel="!has(self.path) || (!self.path.startsWith('/') && !self.path.contains('..'))",
            message="path is relative to the claim's root: no leading / and no ..",
            holds=lambda s: s.path is None or (not s.path.startswith("/") and ".." not in s.path),
            field=".path",
        ),
    )


class HostPathSource(KubeModel):
    """A directory on the node itself. Every node that may run a replica needs the files: fine
    for a single-node lab or a demo, use pvc elsewhere."""

    path: str = Field(max_length=1024, pattern="^/")
    """Absolute directory on the node holding config.json, the *.safetensors weights and
    tokenizer.json."""


class ModelSource(KubeModel):
    """Where the weights come from. Set exactly one of pvc, hostPath or uri."""

    pvc: PvcSource | None = None
    host_path: HostPathSource | None = None
    uri: str | None = Field(None, max_length=2048, pattern=r"^(hf|s3|gs|https?)://\S+$")
    """Remote weights the engine fetches at start: hf://org/name, s3://bucket/path, gs://...,
    https://.... Only engine vllm downloads; the builtin engine reads local files."""

    rules = (
        Rule(
            cel="(has(self.pvc) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) + (has(self.uri) ? 1 : 0) == 1",
            message="set exactly one of pvc, hostPath or uri",
            holds=lambda s: [s.pvc, s.host_path, s.uri].count(None) == 2,
        ),
    )


class ModelSpec(KubeModel):
    """The model to serve."""

    name: str = Field(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    """Name clients put in the OpenAI `model` field and /v1/models lists, usually the Hugging Face
    id, e.g. meta-llama/Llama-3.1-8B-Instruct."""
    source: ModelSource
    revision: str | None = Field(None, max_length=128)
    """Version of the weights: a commit or tag of a Hugging Face repo for uri sources, any label
    you choose for pvc and hostPath. Changing it, like changing any field of model or runtime,
    rolls out a new revision (see rollout)."""
    max_model_len: int | None = Field(None, ge=16, le=1048576)
    """Longest sequence, prompt plus output tokens, one request may have; longer prompts are
    refused with HTTP 400. Unset: the model's own context length. Lower values let more
    sequences share the KV cache."""
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    """Precision of weights and activations. auto: the engine picks from the checkpoint's config
    and the device."""
    quantization: Literal["none", "int8"] = "none"
    """Weight-only quantization the builtin engine applies as it loads a float32 / bfloat16
    checkpoint. int8: every matmul weight (an untied LM head included) as int8 with one scale per
    output row, about a quarter of float32's bytes (half of bfloat16's), so decode reads less and
    more memory is left for the KV cache; activations keep dtype. none: weights as dtype says."""


class Resources(KubeModel):
    """GPUs, CPU and memory for one replica."""

    gpus: int = Field(1, ge=0, le=16)
    """GPUs per replica, a whole number: GPUs are not shared between replicas. 0 runs on CPU,
    practical only for tiny models. More than 1 shards the model with tensor parallelism (engine
    vllm)."""
    gpu_resource: str = Field("nvidia.com/gpu", max_length=253, pattern=EXTENDED_RESOURCE)
    """Extended resource that counts GPUs on your nodes: nvidia.com/gpu, amd.com/gpu, or a MIG
    profile such as nvidia.com/mig-3g.40gb."""
    cpu: Quantity | None = None
    """CPU request per replica, e.g. 4 or 500m. Unset: no request."""
    memory: Quantity | None = None
    """Memory request and limit per replica, e.g. 32Gi. The weights pass through host memory
    while loading, so leave room for them."""


class Toleration(KubeModel):
    """A node taint replicas tolerate (as in a Pod's tolerations)."""

    key: str | None = Field(None, max_length=253)
    """Taint key to match; unset with operator Exists matches every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """Equal matches key and value; Exists matches the key alone."""
    value: str | None = Field(None, max_length=63)
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; unset matches all effects."""
    toleration_seconds: int | None = Field(None, ge=0)
    """For NoExecute: how long a replica stays on a node after the taint appears. Unset: forever."""

    rules = (
        Rule(
            cel="self.operator != 'Exists' || !has(self.value)",
            message="value must be unset when operator is Exists",
            holds=lambda s: s.operator != "Exists" or s.value is None,
            field=".value",
            reason="FieldValueForbidden",
        ),
    )


class KeyRef(KubeModel):
    """One key of a Secret or ConfigMap in the InferenceService's namespace."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret or ConfigMap."""
    key: str = Field(max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key within it."""


class EnvSource(KubeModel):
    """Read the value from a Secret or ConfigMap instead of value. Set exactly one of the two."""

    secret_key_ref: KeyRef | None = None
    """A key of a Secret, e.g. a Hugging Face token for gated models."""
    config_map_key_ref: KeyRef | None = None

    rules = (
        Rule(
            cel="has(self.secretKeyRef) != has(self.configMapKeyRef)",
            message="set exactly one of secretKeyRef or configMapKeyRef",
            holds=lambda s: (s.secret_key_ref is None) != (s.config_map_key_ref is None),
        ),
    )


class EnvVar(KubeModel):
    """An environment variable for the engine container."""

    name: str = Field(max_length=128, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name, e.g. HF_TOKEN or VLLM_ATTENTION_BACKEND."""
    value: str | None = Field(None, max_length=32768)
    """Literal value."""
    value_from: EnvSource | None = None

    rules = (
        Rule(
            cel="!has(self.value) || !has(self.valueFrom)",
            message="set value or valueFrom, not both",
            holds=lambda s: s.value is None or s.value_from is None,
            field=".valueFrom",
            reason="FieldValueForbidden",
        ),
    )


class Faults(KubeModel):
    """Fault injection for drills (builtin engine only): make a canary miss its SLO or fail to
    load, and watch kubeinfer roll it back. Unset (the default): no faults."""

    token_latency: Duration | None = None
    """Extra delay before every generated token; raises TTFT, TPOT and E2E."""
    error_rate: float = Field(0.0, ge=0, le=1)
    """Fraction of requests answered with HTTP 500."""
    fail_load: bool = False
    """Exit while loading the model, as a corrupt checkpoint would, so the replica never
    becomes ready."""


class Runtime(KubeModel):
    """The engine that serves the model and the pods it runs in."""

    engine: Literal["builtin", "vllm"] = "builtin"
    """builtin: kubeinfer's continuous-batching engine (Llama-family models, one GPU or CPU).
    vllm: the vLLM OpenAI server; needs image. The operator reads either engine's metrics."""
    image: str | None = Field(None, max_length=512)
    """Container image. builtin: defaults to the runtime image the operator was installed with.
    vllm: required, e.g. vllm/vllm-openai:v0.11.0."""
    args: list[str] = Field(default_factory=list, max_length=64)
    """Extra flags appended to the engine's command line, for settings this API does not model."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Environment variables for the engine container."""
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Labels a node must have to run a replica, e.g. nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints replicas tolerate; GPU nodes are often tainted nvidia.com/gpu:NoSchedule."""
    max_num_seqs: int = Field(64, ge=1, le=4096)
    """Most sequences one replica decodes together. Higher raises throughput and each request's
    TPOT; the KV cache must hold them (status.kvCapacity shows whether it does)."""
    max_queue: int = Field(256, ge=0, le=100000)
    """Requests that may wait for a batch slot on one replica; more are refused with HTTP 429 and
    Retry-After, so clients back off instead of timing out."""
    queue_timeout: Duration = "30s"
    """A request still waiting after this long is dropped with HTTP 503 instead of being served
    too late to matter."""
    kv_cache_fraction: float | None = Field(None, gt=0, le=1)
    """Fraction of device memory the engine may fill with weights, activations and KV cache
    (vLLM's --gpu-memory-utilization). Set this or kvCacheTokens, not both; neither: the engine's
    default."""
    kv_cache_tokens: int | None = Field(None, ge=16, le=100000000)
    """KV-cache size in tokens, the same on any device: capacity you can reproduce across GPU
    models. Must hold at least model.maxModelLen tokens."""
    prefix_caching: bool = True
    """Reuse the KV cache of prompt prefixes requests share (system prompts, chat history): lower
    TTFT for chat and agents at no cost to others."""
    startup_timeout: Duration = "10m"
    """How long a replica may take to load weights and warm up before it is restarted. Large
    models on network storage need more."""
    faults: Faults | None = None

    rules = (
        Rule(
            cel="self.engine != 'vllm' || has(self.image)",
            message="engine vllm needs an image, e.g. vllm/vllm-openai:v0.11.0",
            holds=lambda s: s.engine != "vllm" or s.image is not None,
            field=".image",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="self.engine != 'builtin' || self.resources.gpus <= 1",
            message="the builtin engine runs on one GPU; use engine vllm for tensor parallelism",
            holds=lambda s: s.engine != "builtin" or s.resources.gpus <= 1,
            field=".resources.gpus",
        ),
        Rule(
            cel="!has(self.kvCacheFraction) || !has(self.kvCacheTokens)",
            message="set kvCacheFraction or kvCacheTokens, not both",
            holds=lambda s: s.kv_cache_fraction is None or s.kv_cache_tokens is None,
            field=".kvCacheTokens",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="self.engine == 'builtin' || !has(self.faults)",
            message="fault injection needs engine builtin",
            holds=lambda s: s.engine == "builtin" or s.faults is None,
            field=".faults",
            reason="FieldValueForbidden",
        ),
    )


class LatencyTargets(KubeModel):
    """Percentile targets for one latency: the given share of requests in slo.window must take
    at most this long. Set at least one."""

    p50: Duration | None = None
    """Median target, e.g. 200ms."""
    p95: Duration | None = None
    """95th-percentile target, e.g. 500ms. Canaries and scaling judge this one first."""
    p99: Duration | None = None
    """99th-percentile target, e.g. 1s."""

    rules = (
        Rule(
            cel="has(self.p50) || has(self.p95) || has(self.p99)",
            message="set at least one of p50, p95, p99",
            holds=lambda s: (s.p50, s.p95, s.p99) != (None, None, None),
            reason="FieldValueRequired",
        ),
        _percentile_order("p50", "p95"),
        _percentile_order("p95", "p99"),
        _percentile_order("p50", "p99"),
    )


class SLO(KubeModel):
    """The service level a user is promised. kubeinfer compiles it into PromQL and uses it twice:
    a canary that misses it is rolled back, and the autoscaler keeps headroom to meet it."""

    workload_class: Literal["interactive", "batch", "agent"] = Field("interactive", alias="class")
    """The shape of the traffic. interactive: a person watches tokens stream, so TTFT and queue
    time matter most. batch: offline jobs, throughput matters and queueing is fine. agent: tool
    loops with long shared prefixes, where end-to-end time per call matters."""
    ttft: LatencyTargets | None = None
    """Time to first token: from request arrival to the first streamed token, queueing and
    prefill included."""
    tpot: LatencyTargets | None = None
    """Time per output token after the first: the streaming speed a reader sees."""
    e2e: LatencyTargets | None = None
    """End-to-end latency of a whole request."""
    error_rate: float = Field(0.01, ge=0, le=1)
    """Largest fraction of requests that may fail: server errors, timeouts and refusals (429)."""
    window: Duration = "5m"
    """Time window the percentiles and error rate are computed over, e.g. 5m."""

    rules = (
        Rule(
            cel=_if_well_formed("self.window") + "duration(self.window) >= duration('30s')",
            message="window must be at least 30s: percentiles need several Prometheus scrapes",
            holds=lambda s: parse_duration(s.window) >= 30,
            field=".window",
        ),
    )


class Predictive(KubeModel):
    """A replica floor from forecast arrivals: from the service's served-rate history in Prometheus,
    a seasonal forecast (Holt-Winters; Holt's trend alone until two seasons are recorded) of the
    requests per second one model load ahead; at least that / scaling.requestsPerReplica replicas
    run, and the reactive signals add replicas above the floor."""

    mode: Literal["active", "dryRun"] = "active"
    """active: apply the floor. dryRun: record the floor it would apply (status.signals.forecastFloor
    and the decisions' reasons) without applying it."""
    history: Duration = "2h"
    """How much served-rate history the forecast reads (a range query at 30s steps)."""
    season: Duration | None = None
    """The period that repeats, e.g. 24h for daily traffic; unset: trend only. Seasonality is used
    once the history holds two whole seasons, so history must then be at least twice this."""
    load_time: Duration = "60s"
    """How far ahead to forecast: about the time a new replica takes to serve (its model load)."""

    rules = (
        Rule(
            cel=_if_well_formed("self.history") + "duration(self.history) >= duration('5m')",
            message="history must be at least 5m",
            holds=lambda p: parse_duration(p.history) >= 300,
            field=".history",
        ),
    )


class Scaling(KubeModel):
    """How many replicas run. desired = the largest of what each signal asks for (queue time,
    KV-cache usage, waiting requests), within minReplicas and maxReplicas; every decision is
    recorded in status.scalingDecisions. spec.replicas, when set, overrides it."""

    min_replicas: int = Field(1, ge=1, le=1000)
    """Fewest replicas, kept even when idle."""
    max_replicas: int = Field(1, ge=1, le=1000)
    """Most replicas: your GPU budget. Autoscaling starts when you raise it above 1."""
    queue_time_target: Duration | None = None
    """p95 time requests may wait for a batch slot before replicas are added. Unset: half of
    slo.ttft.p95, or 500ms without a TTFT target. Must be below slo.ttft.p95, since queue time is
    part of TTFT."""
    kv_cache_target: float = Field(0.7, gt=0, le=1)
    """Average KV-cache usage (0-1) above which replicas are added: a full cache forces
    preemptions, which waste work and stall requests."""
    waiting_per_replica_target: int | None = Field(None, ge=1, le=100000)
    """Waiting requests per replica above which replicas are added. Unset: not used."""
    tolerance: float = Field(0.1, ge=0, lt=1)
    """Ignore a signal within this fraction of its target, so noise does not cause scaling."""
    scale_up_window: Duration = "0s"
    """Scale up to the lowest desired count seen over this window, so a short spike does not
    start GPU replicas that arrive after it has passed. 0s (the default, as the HPA's): scale up
    on the first breach; scale-ups are sized from the backlog and bounded by maxScaleUpRate."""
    scale_down_window: Duration = "5m"
    """Scale down to the highest desired count seen over this window, so replicas that took
    minutes to load are not dropped in a lull."""
    headroom: float = Field(0.0, ge=0, le=4)
    """Extra replicas kept on top of what the signals ask for, as a fraction (0.3 = 30% more):
    they serve a burst during the minute or so a new replica takes to load its model, and cost
    that much more. 0: none (the README's autoscaling simulation shows what each level buys)."""
    max_scale_up_rate: float = Field(2.0, gt=1, le=100)
    """At most this factor more replicas per decision (2 = double)."""
    interval: Duration = "15s"
    """How often signals are read and a decision is made."""
    mode: Literal["active", "dryRun"] = "active"
    """active: act on decisions. dryRun: record decisions in status without acting, to watch the
    autoscaler before trusting it; replicas stay at minReplicas (or spec.replicas)."""
    requests_per_replica: float | None = Field(None, gt=0, le=100000)
    """Requests per second one replica carries at the targets: the served rate per replica at the
    load `kubeinfer bench` or `kubeinfer backtest` shows the SLO holding. Needed by predictive."""
    predictive: Predictive | None = None
    """A floor from forecast arrivals under the reactive signals (opt-in); unset: reactive only."""

    rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="minReplicas must not exceed maxReplicas",
            holds=lambda s: s.min_replicas <= s.max_replicas,
            field=".minReplicas",
        ),
        Rule(
            cel=_if_well_formed("self.interval") + "duration(self.interval) >= duration('1s')",
            message="interval must be at least 1s",
            holds=lambda s: parse_duration(s.interval) >= 1,
            field=".interval",
        ),
        Rule(
            cel="!has(self.predictive) || has(self.requestsPerReplica)",
            message="predictive needs requestsPerReplica: the forecast is turned into replicas with it",
            holds=lambda s: s.predictive is None or s.requests_per_replica is not None,
            field=".requestsPerReplica",
        ),
    )


class Step(KubeModel):
    """One canary step: send weight percent of traffic to the new revision, then hold."""

    weight: int = Field(ge=1, le=100)
    """Percent of requests the canary receives during this step."""
    pause: Duration | None = None
    """How long to hold and analyse before the next step. Unset: wait until you promote with
    the annotation serving.kubeinfer.dev/promote."""


class Analysis(KubeModel):
    """How a canary is judged: each interval, canary and stable are compared against spec.slo
    over the same window."""

    interval: Duration = "1m"
    """How often the canary is checked."""
    min_requests: int = Field(50, ge=0, le=1000000)
    """Requests the canary must have served in a check before it counts; fewer is inconclusive
    and the step waits."""
    failure_limit: int = Field(2, ge=1, le=100)
    """Failed checks that abort the rollout and send all traffic back to stable."""

    rules = (
        Rule(
            cel=_if_well_formed("self.interval") + "duration(self.interval) >= duration('10s')",
            message="interval must be at least 10s",
            holds=lambda s: parse_duration(s.interval) >= 10,
            field=".interval",
        ),
    )


class ParentReference(KubeModel):
    """A Gateway (or a listener of one) the HTTPRoute attaches to: Gateway API's parentRef."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Gateway."""
    namespace: str | None = Field(None, max_length=63, pattern=DNS_LABEL)
    """Namespace of the Gateway. Unset: the InferenceService's namespace. A Gateway in another
    namespace must allow routes from this one (its listeners' allowedRoutes)."""
    section_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    """Listener of the Gateway to attach to. Unset: every listener that accepts the route."""


class GatewayAPIRouting(KubeModel):
    """Split canary traffic with a Gateway API HTTPRoute the operator writes and owns, named after
    the InferenceService: its backends are the Services <name>-stable and <name>-canary (each
    selecting one revision's pods), weighted by the canary step. The Gateway balances within a
    track its own way, and its requests are judged from the replicas' own metrics."""

    parent_refs: list[ParentReference] = Field(min_length=1, max_length=32)
    """Gateways the route attaches to."""
    hostnames: list[Annotated[str, Field(max_length=253, pattern=HOSTNAME)]] | None = Field(
        None, max_length=16
    )
    """Host names the route answers for. Unset: every host the Gateway listens on."""


class TrafficRouting(KubeModel):
    """What carries the canary weight to requests. Unset: the kubeinfer router, a Deployment the
    operator runs in front of the replicas (exact weights, balancing by load within a track)."""

    gateway_api: GatewayAPIRouting | None = Field(None, alias="gatewayAPI")  # camel() would say gatewayApi
    """Write an HTTPRoute instead of running the router (needs Gateway API in the cluster)."""


class Rollout(KubeModel):
    """How a new revision (any change to model or runtime) replaces the running one."""

    strategy: Literal["RollingUpdate", "Canary"] = "RollingUpdate"
    """RollingUpdate: replace replicas as new ones become ready (model loaded and warmed).
    Canary: run the new revision beside the old, shift traffic by steps, judge it against
    spec.slo, and roll back on failure."""
    steps: list[Step] | None = Field(None, min_length=1, max_length=20)
    """Canary only: traffic steps with strictly increasing weights. After the last step the
    canary is promoted to 100%."""
    analysis: Analysis = Field(default_factory=Analysis)
    """Canary only: how each step is judged."""
    paused: bool = False
    """Hold the rollout at its current step (traffic stays as it is) until set back to false."""
    progress_deadline: Duration = "15m"
    """Longest a step may go without progress, including loading the new revision's model, before
    the rollout is aborted."""
    max_surge: int = Field(1, ge=0, le=1000)
    """Replicas allowed above the desired count while two revisions run side by side, i.e. GPUs a
    rollout may borrow: the replicas of all revisions together never exceed desired + maxSurge.
    RollingUpdate: new replicas start in that room, and an old one goes once a new one is Ready.
    Canary: with at least the canary's size, stable stays whole through the steps (an abort has all
    its capacity); 0 makes stable give up a replica before each canary replica starts."""
    max_unavailable: int | None = Field(None, ge=0, le=1000)
    """RollingUpdate only: replicas that may be short of Ready while the new revision replaces the
    old, below the desired count. Unset: 0, or 1 when maxSurge is 0 (a cluster with no spare GPU
    then replaces one replica at a time). maxSurge and maxUnavailable must not both be 0."""
    traffic_routing: TrafficRouting | None = None
    """Canary only: how traffic is split between the revisions. Unset: the kubeinfer router."""

    @property
    def gateway_api(self) -> GatewayAPIRouting | None:
        return self.traffic_routing.gateway_api if self.traffic_routing else None

    rules = (
        Rule(
            cel="self.strategy != 'Canary' || has(self.steps)",
            message="strategy Canary needs steps",
            holds=lambda s: s.strategy != "Canary" or s.steps is not None,
            field=".steps",
            reason="FieldValueRequired",
        ),
        Rule(
            cel="self.strategy != 'RollingUpdate' || !has(self.steps)",
            message="steps apply only to strategy Canary",
            holds=lambda s: s.strategy != "RollingUpdate" or s.steps is None,
            field=".steps",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="!has(self.maxUnavailable) || self.maxUnavailable > 0 || self.maxSurge > 0",
            message="maxSurge and maxUnavailable must not both be 0: no replica could ever be replaced",
            holds=lambda s: s.max_unavailable is None or s.max_unavailable > 0 or s.max_surge > 0,
            field=".maxUnavailable",
        ),
        Rule(
            cel="self.strategy != 'Canary' || !has(self.maxUnavailable)",
            message="maxUnavailable applies only to strategy RollingUpdate",
            holds=lambda s: s.strategy != "Canary" or s.max_unavailable is None,
            field=".maxUnavailable",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="self.strategy == 'Canary' || !has(self.trafficRouting)",
            message="trafficRouting applies only to strategy Canary",
            holds=lambda s: s.strategy == "Canary" or s.traffic_routing is None,
            field=".trafficRouting",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=(
                "!has(self.steps) || (self.steps.map(s, s.weight).isSorted()"
                " && self.steps.all(a, self.steps.exists_one(b, b.weight == a.weight)))"
            ),
            message="step weights must strictly increase, e.g. 10, 25, 50",
            holds=lambda s: s.steps is None or all(a.weight < b.weight for a, b in pairwise(s.steps)),
            field=".steps",
        ),
    )


class InferenceServiceSpec(KubeModel):
    """The desired state of an InferenceService: the model, the engine that serves it, the SLO it
    is held to, and how it scales and rolls out."""

    model: ModelSpec
    runtime: Runtime = Field(default_factory=Runtime)
    slo: SLO = Field(default_factory=SLO)
    scaling: Scaling = Field(default_factory=Scaling)
    rollout: Rollout = Field(default_factory=Rollout)
    replicas: int | None = Field(None, ge=0, le=1000)
    """Replica count pinned by hand or by an external autoscaler: the field `kubectl scale`
    writes. Unset (the default): the kubeinfer autoscaler decides. Set: exactly this many
    replicas run, the autoscaler only records what it would do, and the ScalingLimited condition
    says so; 0 parks the service and frees its GPUs. Remove the field to hand control back to the
    autoscaler. At most scaling.maxReplicas. An HPA or KEDA scaler can read the scale subresource
    only while this is set, so set it when handing the count to one."""

    rules = (
        Rule(
            cel="!has(self.replicas) || self.replicas <= self.scaling.maxReplicas",
            message="replicas must not exceed scaling.maxReplicas",
            holds=lambda s: s.replicas is None or s.replicas <= s.scaling.max_replicas,
            field=".replicas",
        ),
        Rule(
            cel="self.runtime.engine != 'builtin' || !has(self.model.source.uri)",
            message="the builtin engine reads local files: use pvc or hostPath, or engine vllm",
            holds=lambda s: s.runtime.engine != "builtin" or s.model.source.uri is None,
            field=".model.source.uri",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel="self.runtime.engine == 'builtin' || self.model.quantization == 'none'",
            message="model.quantization is applied by the builtin engine; for vllm pass its own "
            "--quantization in runtime.args",
            holds=lambda s: s.runtime.engine == "builtin" or s.model.quantization == "none",
            field=".model.quantization",
            reason="FieldValueForbidden",
        ),
        Rule(
            cel=(
                "!has(self.runtime.kvCacheTokens) || !has(self.model.maxModelLen)"
                " || self.runtime.kvCacheTokens >= self.model.maxModelLen"
            ),
            message="kvCacheTokens must hold at least one sequence of model.maxModelLen tokens",
            holds=lambda s: (
                None in (s.runtime.kv_cache_tokens, s.model.max_model_len)
                or s.runtime.kv_cache_tokens >= s.model.max_model_len
            ),
            field=".runtime.kvCacheTokens",
        ),
        Rule(
            cel=(
                "!has(self.scaling.queueTimeTarget) || !has(self.slo.ttft) || !has(self.slo.ttft.p95) || "
                + _if_well_formed("self.scaling.queueTimeTarget", "self.slo.ttft.p95")
                + "duration(self.scaling.queueTimeTarget) < duration(self.slo.ttft.p95)"
            ),
            message=(
                "queueTimeTarget must be below slo.ttft.p95: queue time is part of TTFT, so a larger"
                " target scales only after the SLO is missed"
            ),
            holds=lambda s: (
                s.scaling.queue_time_target is None
                or s.slo.ttft is None
                or s.slo.ttft.p95 is None
                or parse_duration(s.scaling.queue_time_target) < parse_duration(s.slo.ttft.p95)
            ),
            field=".scaling.queueTimeTarget",
        ),
    )

    def queue_time_target_seconds(self) -> float:
        """The queue-time target the autoscaler uses (see scaling.queueTimeTarget)."""
        if self.scaling.queue_time_target is not None:
            return parse_duration(self.scaling.queue_time_target)
        if self.slo.ttft is not None and self.slo.ttft.p95 is not None:
            return parse_duration(self.slo.ttft.p95) / 2
        return 0.5
