"""InferenceService -> the Kubernetes objects that serve it (Deployment per revision, Service, PDB).

Pure: the same spec renders byte-identical objects, which is what makes re-reconciling an
unchanged InferenceService a no-op under server-side apply. Values are computed here; the
templates only lay them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from kubeinfer_operator.api import InferenceServiceSpec, parse_duration
from kubeinfer_operator.data_templates import environment, render_data
from kubeinfer_operator.names import (
    API_VERSION,
    APP_NAME,
    CONTAINER_NAME,
    GROUP,
    HTTP_PORT,
    KIND,
    LABEL_APP,
    LABEL_ISVC,
    LABEL_REVISION,
    LABEL_TRACK,
    SERVICE_PORT,
    deployment_name,
    owned_labels,
)
from kubeinfer_operator.revision import revision_of
from kubeinfer_operator.settings import Settings

Track = Literal["stable", "canary"]
MODEL_MOUNT = "/mnt/model"
PRE_STOP_SECONDS = 5
STARTUP_PROBE_PERIOD = 5
MIN_DRAIN_SECONDS = 30
MAX_DRAIN_SECONDS = 600
# Writable places for engines that cache compiled kernels and downloads under $HOME.
SCRATCH_ENV = {"HOME": "/tmp", "XDG_CACHE_HOME": "/tmp/.cache", "HF_HOME": "/tmp/hf"}


@dataclass(frozen=True)
class Owner:
    """The InferenceService the objects belong to; deleting it garbage-collects them."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class PodTemplate:
    revision: str
    template: dict[str, Any]  # without the revision and track labels, exactly what was hashed


def _render(template: str, **values: Any) -> Any:
    """The object a template under templates/ lays out, values substituted as data (data_templates.py)."""
    return render_data(environment("kubeinfer_operator", "templates").get_template(template), **values)


def drain_seconds(spec: InferenceServiceSpec) -> int:
    """Time in-flight streams get after SIGTERM: twice the slowest end-to-end latency the SLO
    allows, so a request at the SLO bound finishes even if it started just before."""
    e2e = spec.slo.e2e
    bounds = [parse_duration(t) for t in (e2e.p50, e2e.p95, e2e.p99) if t] if e2e else []
    wanted = 2 * max(bounds) if bounds else 60
    return int(min(MAX_DRAIN_SECONDS, max(MIN_DRAIN_SECONDS, math.ceil(wanted))))


def _model_location(spec: InferenceServiceSpec) -> tuple[dict[str, Any] | None, str]:
    """The model volume (None for remote weights) and the path or id the engine loads."""
    source = spec.model.source
    if source.host_path is not None:
        volume = {"name": "model", "hostPath": {"path": source.host_path.path, "type": "Directory"}}
        return volume, MODEL_MOUNT
    if source.pvc is not None:
        volume = {
            "name": "model",
            "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
        }
        path = f"{MODEL_MOUNT}/{source.pvc.path.strip('/')}" if source.pvc.path else MODEL_MOUNT
        return volume, path
    assert source.uri is not None
    # vLLM takes a Hugging Face id (org/name); other schemes it resolves itself.
    return None, source.uri.removeprefix("hf://")


def builtin_args(spec: InferenceServiceSpec, model_path: str) -> list[str]:
    runtime = spec.runtime
    args = [
        "--model", model_path,
        "--served-model-name", spec.model.name,
        "--host", "0.0.0.0",
        "--port", str(HTTP_PORT),
        "--max-num-seqs", str(runtime.max_num_seqs),
        "--max-queue", str(runtime.max_queue),
        "--queue-timeout", f"{parse_duration(runtime.queue_timeout):g}",
        "--drain-timeout", str(drain_seconds(spec)),
        "--log-format", "json",
    ]  # fmt: skip
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if spec.model.quantization != "none":
        args += ["--quantization", spec.model.quantization]
    if runtime.resources.gpus == 0:
        args += ["--device", "cpu"]
    if runtime.kv_cache_tokens is not None:
        args += ["--kv-cache-tokens", str(runtime.kv_cache_tokens)]
    if runtime.kv_cache_fraction is not None:
        args += ["--kv-cache-memory-fraction", f"{runtime.kv_cache_fraction:g}"]
    if not runtime.prefix_caching:
        args.append("--no-enable-prefix-caching")
    if faults := runtime.faults:
        if faults.token_latency:
            args += ["--fault-token-latency-ms", f"{parse_duration(faults.token_latency) * 1000:g}"]
        if faults.error_rate:
            args += ["--fault-error-rate", f"{faults.error_rate:g}"]
        if faults.fail_load:
            args.append("--fault-fail-load")
    return args + list(runtime.args)


VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block size; --num-gpu-blocks-override counts blocks


def vllm_args(spec: InferenceServiceSpec, model: str) -> list[str]:
    runtime = spec.runtime
    args = [
        model,
        "--served-model-name", spec.model.name,
        "--host", "0.0.0.0",
        "--port", str(HTTP_PORT),
        "--max-num-seqs", str(runtime.max_num_seqs),
    ]  # fmt: skip
    if spec.model.source.uri is not None and spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.model.max_model_len is not None:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if runtime.resources.gpus > 1:
        args += ["--tensor-parallel-size", str(runtime.resources.gpus)]
    if runtime.kv_cache_fraction is not None:
        args += ["--gpu-memory-utilization", f"{runtime.kv_cache_fraction:g}"]
    if runtime.kv_cache_tokens is not None:
        args += ["--num-gpu-blocks-override", str(math.ceil(runtime.kv_cache_tokens / VLLM_BLOCK_TOKENS))]
    args.append("--enable-prefix-caching" if runtime.prefix_caching else "--no-enable-prefix-caching")
    return args + list(runtime.args)


def _resources(spec: InferenceServiceSpec) -> dict[str, Any]:
    wanted = spec.runtime.resources
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if wanted.cpu is not None:
        requests["cpu"] = str(wanted.cpu)  # no CPU limit: throttling shows up directly as latency
    if wanted.memory is not None:
        requests["memory"] = limits["memory"] = str(wanted.memory)
    if wanted.gpus:
        limits[wanted.gpu_resource] = str(wanted.gpus)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def _tolerations(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.runtime.tolerations]
    gpu = spec.runtime.resources.gpu_resource
    if spec.runtime.resources.gpus and not any(t.get("key") == gpu for t in tolerations):
        # GPU nodes are conventionally tainted with the GPU resource name; a GPU pod belongs there.
        tolerations.append({"key": gpu, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


# The builtin runtime records the revision it serves on its traces. The revision label is set after the
# template is hashed (render_deployment), so the pod reads it back through the downward API.
REVISION_ENV = {
    "name": "KUBEINFER_SERVING_REVISION",
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_REVISION}']"}},
}


def _env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    user = [e.model_dump(by_alias=True, exclude_none=True) for e in spec.runtime.env]
    names = {e["name"] for e in user}
    ours = [{"name": k, "value": v} for k, v in SCRATCH_ENV.items() if k not in names]
    if spec.runtime.engine == "builtin" and REVISION_ENV["name"] not in names:
        ours.append(REVISION_ENV)
    return ours + user


def _pod_annotations(spec: InferenceServiceSpec, settings: Settings) -> dict[str, str]:
    annotations = {}
    if settings.scrape_annotations:  # off where PodMonitors select the pods
        annotations |= {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(HTTP_PORT),
            "prometheus.io/path": "/metrics",
        }
    if spec.model.revision:
        # Part of the hashed template, so a new spec.model.revision is a new revision whatever the source.
        annotations[f"{GROUP}/model-revision"] = spec.model.revision
    return annotations


def render_pod_template(owner: Owner, spec: InferenceServiceSpec, settings: Settings) -> PodTemplate:
    runtime = spec.runtime
    volume, model_path = _model_location(spec)
    if runtime.engine == "vllm":
        command, args = ["vllm", "serve"], vllm_args(spec, model_path)
        # vLLM listens only once the model is loaded, so /health is the load signal.
        startup_path, ready_path = "/health", "/health"
    else:
        command, args = ["kubeinfer-runtime", "serve"], builtin_args(spec, model_path)
        # The builtin server answers /health while loading; /ready only after the warm-up.
        startup_path, ready_path = "/ready", "/ready"
    drain = drain_seconds(spec)
    template = _render(
        "pod.yaml.j2",
        labels=owned_labels(owner.name),
        annotations=_pod_annotations(spec, settings),
        spread_labels={LABEL_ISVC: owner.name},
        port=HTTP_PORT,
        grace_seconds=PRE_STOP_SECONDS + drain + 10,
        pre_stop_seconds=PRE_STOP_SECONDS,
        node_selector=runtime.node_selector,
        tolerations=_tolerations(spec),
        container_name=CONTAINER_NAME,
        image=runtime.image or settings.runtime_image,
        command=command,
        args=args,
        env=_env(spec),
        resources=_resources(spec),
        startup_path=startup_path,
        ready_path=ready_path,
        startup_period=STARTUP_PROBE_PERIOD,
        startup_failures=max(1, math.ceil(parse_duration(runtime.startup_timeout) / STARTUP_PROBE_PERIOD)),
        model_volume=volume,
        model_mount=MODEL_MOUNT,
        scratch_size="20Gi" if spec.model.source.uri else "2Gi",  # remote weights are downloaded here
        shm_size="8Gi" if runtime.resources.gpus > 1 else "1Gi",
    )
    return PodTemplate(revision=revision_of(template), template=template)


def render_deployment(
    owner: Owner, spec: InferenceServiceSpec, pod: PodTemplate, replicas: int, track: Track = "stable"
) -> dict[str, Any]:
    revision_labels = {LABEL_REVISION: pod.revision, LABEL_TRACK: track}
    template = {**pod.template, "metadata": {**pod.template["metadata"]}}
    template["metadata"]["labels"] = {**template["metadata"]["labels"], **revision_labels}
    return _render(
        "deployment.yaml.j2",
        name=deployment_name(owner.name, pod.revision),
        namespace=owner.namespace,
        labels={**owned_labels(owner.name), **revision_labels},
        owner_reference=owner.reference(),
        replicas=replicas,
        selector={LABEL_ISVC: owner.name, LABEL_REVISION: pod.revision},
        progress_deadline_seconds=int(parse_duration(spec.rollout.progress_deadline)),
        pod_template=template,
    )


def pod_selector(owner_name: str) -> dict[str, str]:
    """Every serving pod of the InferenceService, all revisions."""
    return {LABEL_APP: APP_NAME, LABEL_ISVC: owner_name}


def render_service(owner: Owner) -> dict[str, Any]:
    return _render(
        "service.yaml.j2",
        name=owner.name,
        namespace=owner.namespace,
        labels=owned_labels(owner.name),
        owner_reference=owner.reference(),
        selector=pod_selector(owner.name),
        service_port=SERVICE_PORT,
    )


def render_pdb(owner: Owner) -> dict[str, Any]:
    return _render(
        "pdb.yaml.j2",
        name=owner.name,
        namespace=owner.namespace,
        labels=owned_labels(owner.name),
        owner_reference=owner.reference(),
        selector=pod_selector(owner.name),
    )
