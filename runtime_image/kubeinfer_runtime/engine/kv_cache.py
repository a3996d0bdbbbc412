"""Sizing and allocating the paged KV cache.

Every cached token costs 2 (key and value) x layers x kv_heads x head_dim x dtype bytes; the budget
is either a token count or a fraction of the memory left once the weights are loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kubeinfer_runtime.engine.config import EngineConfig
from kubeinfer_runtime.models.llama import LlamaConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    bytes_per_token: int

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token


def kv_bytes_per_token(model: LlamaConfig, dtype: torch.dtype) -> int:
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * dtype.itemsize


def available_cpu_memory() -> int:
    """MemAvailable from /proc/meminfo: what can be allocated without swapping or evicting much."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def free_device_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_cpu_memory()


def plan_kv_cache(
    config: EngineConfig, model: LlamaConfig, dtype: torch.dtype, device: torch.device, max_model_len: int
) -> KVCachePlan:
    per_token = kv_bytes_per_token(model, dtype)
    if config.kv_cache_tokens is not None:
        tokens = config.kv_cache_tokens
    else:
        tokens = int(free_device_memory(device) * config.kv_cache_memory_fraction) // per_token
        if device.type == "cpu":
            # RAM is shared with everything else on the node and a CPU step is far too slow to use a
            # huge cache, so never take more than every sequence slot filled to max_model_len needs.
            tokens = min(tokens, config.max_num_seqs * max_model_len)
    num_blocks = tokens // config.block_size
    if num_blocks < 1:
        raise ValueError(
            f"KV cache budget holds {tokens} tokens, less than one block of {config.block_size}: "
            "raise kv_cache_tokens or kv_cache_memory_fraction"
        )
    return KVCachePlan(num_blocks=num_blocks, block_size=config.block_size, bytes_per_token=per_token)


def allocate_kv_cache(
    plan: KVCachePlan, model: LlamaConfig, dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """One [2 * kv_heads, num_slots, head_dim] tensor per layer (keys, then values; see attention.py).

    Zeroed, not empty: padded decode batches read unused slots, and garbage there could hold NaNs,
    which survive being masked out (0 * NaN = NaN).
    """
    shape = (2 * model.num_kv_heads, plan.capacity_tokens, model.head_dim)
    log.info(
        "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB (%d bytes/token)",
        plan.num_blocks,
        plan.block_size,
        plan.capacity_tokens,
        plan.total_bytes / 2**20,
        plan.bytes_per_token,
    )
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(model.num_layers)]
