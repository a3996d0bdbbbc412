"""Engine settings: what the server's flags and the InferenceService spec turn into."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kubeinfer_runtime.models.loader import QUANTIZATIONS

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}
SCHEDULING_POLICIES = ("fcfs", "priority")
SPECULATIVE_METHODS = ("ngram",)


@dataclass
class EngineConfig:
    model: str | Path  # Hugging Face model directory
    dtype: str | None = None  # None: the config's dtype on CUDA, float32 on CPU
    device: str | None = None  # None: cuda when present, else cpu
    block_size: int = 16  # tokens per KV-cache block
    max_num_seqs: int = 64  # running sequences per step
    max_num_batched_tokens: int = 2048  # tokens per step; longer prompts are prefilled in chunks
    kv_cache_tokens: int | None = None  # KV-cache size in tokens; None: size from memory
    kv_cache_memory_fraction: float = 0.9  # of free device memory (CPU: of available RAM, see kv_cache.py)
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # or "priority": lower value first
    max_model_len: int | None = None  # None: the model's max_position_embeddings, capped by the cache
    seed: int = 0  # for requests that sample without a seed of their own
    num_threads: int | None = None  # CPU threads; None: the CPUs this process may use
    cpu_kernels: bool = True  # fused C++ decode kernels on CPU in float32/bfloat16 (models/fused_ops.py)
    quantization: str | None = None  # "int8": weight-only int8 matmul weights, quantized at load
    # Speculative decoding (engine/spec_decode.py): "ngram" drafts by prompt lookup; None: off.
    speculative: str | None = None
    num_speculative_tokens: int = 3  # most draft tokens verified per sequence and step
    ngram_min: int = 2  # shortest suffix looked up in the context
    ngram_max: int = 4  # longest; the longest one found wins

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("num_speculative_tokens", "ngram_min"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ngram_max < self.ngram_min:
            raise ValueError(f"ngram_max ({self.ngram_max}) must be >= ngram_min ({self.ngram_min})")
        if self.speculative is not None and self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative must be one of {SPECULATIVE_METHODS}, got {self.speculative!r}")
        for name in ("kv_cache_tokens", "max_model_len", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 when set, got {value}")
        if not 0 < self.kv_cache_memory_fraction <= 1:
            raise ValueError(
                f"kv_cache_memory_fraction must be in (0, 1], got {self.kv_cache_memory_fraction}"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.device is not None and torch.device(self.device).type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
