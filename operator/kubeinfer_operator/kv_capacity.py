"""The KVCacheFits condition and status.kvCapacity: does the configured batch fit the KV cache
that is left beside the weights? Arithmetic from capacity.py; facts found by `model_shape` and
`device_memory` (best effort: unknown facts give an Unknown condition, never a guess)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from kubeinfer_operator.api import InferenceServiceSpec
from kubeinfer_operator.capacity import GIB, GPUS, NAMED_CONFIGS, ModelShape, plan
from kubeinfer_operator.conditions import Condition

CONDITION = "KVCacheFits"
DEFAULT_MEMORY_UTILIZATION = 0.9
# On CPU there is no CUDA context; the reserve is the Python process with torch loaded.
CPU_RESERVE_BYTES = 512 * 1024**2
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
_NAME_SUFFIXES = re.compile(r"(-(instruct|chat|it|base|hf))+$")


@dataclass(frozen=True)
class Device:
    """Memory one replica's engine may use: each GPU's, or the pod's memory on CPU."""

    memory_bytes: int
    count: int
    reserve_bytes: int | None  # None: capacity.py's GPU default
    description: str


def _size(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 1024**2:.1f} MiB"


def _named_shape(model_name: str) -> ModelShape | None:
    """Catalog lookup by the model's name: meta-llama/Llama-3.1-8B-Instruct -> llama-3.1-8b."""
    base = _NAME_SUFFIXES.sub("", model_name.rsplit("/", 1)[-1].lower())
    matches = [key for key in NAMED_CONFIGS if base == key or base.startswith(key + "-")]
    return ModelShape.named(max(matches, key=len)) if matches else None


def model_shape(spec: InferenceServiceSpec) -> ModelShape | None:
    """The model's shape from the catalog, else from config.json when the operator can read the
    hostPath directory (a single-node cluster or a development machine)."""
    if shape := _named_shape(spec.model.name):
        return shape
    host_path = spec.model.source.host_path
    if host_path is None:
        return None
    try:
        return ModelShape.from_config(json.loads((Path(host_path.path) / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def _gpu_by_product(product: str) -> str | None:
    """NVIDIA-H100-80GB-HBM3 -> h100-80gb: every part of the catalog key is a part of the label."""
    parts = set(product.lower().split("-"))
    found = [key for key in GPUS if set(key.split("-")) <= parts]
    return max(found, key=len) if found else None


def device_memory(spec: InferenceServiceSpec) -> Device | None:
    resources = spec.runtime.resources
    if resources.gpus == 0:
        if resources.memory is None:
            return None
        memory = int(parse_quantity(resources.memory))
        return Device(memory, 1, CPU_RESERVE_BYTES, f"{_size(memory)} of pod memory")
    product = spec.runtime.node_selector.get(GPU_PRODUCT_LABEL)
    key = _gpu_by_product(product) if product else None
    if key is None:
        return None
    memory = GPUS[key].memory_bytes
    return Device(memory, resources.gpus, None, f"{resources.gpus} x {product} ({_size(memory)})")


def check(
    spec: InferenceServiceSpec, shape: ModelShape | None, device: Device | None
) -> tuple[dict[str, Any], Condition]:
    """status.kvCapacity (camelCase, unknowns left out) and the KVCacheFits condition."""
    runtime = spec.runtime
    context = spec.model.max_model_len or (shape.max_position_embeddings if shape else None)
    needed = runtime.max_num_seqs * context if context else None
    bytes_per_token = (
        shape.kv_bytes_per_token(None if spec.model.dtype == "auto" else spec.model.dtype) if shape else None
    )
    fit: int | None = runtime.kv_cache_tokens
    memory_fit: int | None = None
    weights_note = ""
    if shape is not None and device is not None and context:
        planned = plan(
            shape,
            device.memory_bytes,
            gpus=device.count,
            dtype=None if spec.model.dtype == "auto" else spec.model.dtype,
            quantization=None if spec.model.quantization == "none" else spec.model.quantization,
            context_length=context,
            memory_utilization=runtime.kv_cache_fraction or DEFAULT_MEMORY_UTILIZATION,
            **({} if device.reserve_bytes is None else {"reserve_bytes": device.reserve_bytes}),
        )
        memory_fit = planned.kv_tokens
        weights_note = f" beside {_size(planned.weights_bytes)} of weights on {device.description}"
        fit = memory_fit if fit is None else fit
    capacity = {
        key: value
        for key, value in (("bytesPerToken", bytes_per_token), ("tokensNeeded", needed), ("tokensFit", fit))
        if value is not None
    }
    per_token = f" at {bytes_per_token} B/token" if bytes_per_token else ""
    if fit is None or needed is None or context is None:
        missing = "the model's shape" if shape is None else "the device memory"
        message = (
            f"Cannot check the KV cache: {missing} is unknown. Set runtime.kvCacheTokens, or name a "
            f"known model / set nodeSelector {GPU_PRODUCT_LABEL} (GPU) or resources.memory (CPU)."
        )
        return capacity, Condition(CONDITION, "Unknown", "CapacityUnknown", message)
    if (
        memory_fit is not None
        and runtime.kv_cache_tokens is not None
        and runtime.kv_cache_tokens > memory_fit
    ):
        message = (
            f"runtime.kvCacheTokens {runtime.kv_cache_tokens}{per_token} does not fit: only {memory_fit} "
            f"tokens fit{weights_note}. Lower kvCacheTokens or use a larger device."
        )
        return capacity, Condition(CONDITION, "False", "ExceedsDeviceMemory", message)
    if fit < context:
        message = (
            f"One sequence of maxModelLen {context} tokens needs {context} tokens{per_token}, but only {fit} "
            f"fit{weights_note}. Lower model.maxModelLen, raise the KV budget, or use more/larger GPUs."
        )
        return capacity, Condition(CONDITION, "False", "SequenceDoesNotFit", message)
    if fit < needed:
        message = (
            f"A full batch (maxNumSeqs {runtime.max_num_seqs} x maxModelLen {context}) needs {needed} "
            f"tokens{per_token}; {fit} fit{weights_note}: when every sequence reaches maxModelLen only "
            f"{fit // context} run at once and the rest wait or are preempted. Lower runtime.maxNumSeqs to "
            f"{fit // context} or model.maxModelLen, or add memory."
        )
        return capacity, Condition(CONDITION, "False", "FullBatchDoesNotFit", message)
    message = f"A full batch needs {needed} tokens{per_token}; {fit} fit{weights_note}."
    return capacity, Condition(CONDITION, "True", "Fits", message)
