"""Runs the model for one scheduled step: loads the weights, owns the KV cache, builds batch inputs."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from kubeinfer_runtime.engine.config import DTYPES, EngineConfig
from kubeinfer_runtime.engine.kv_cache import KVCachePlan, allocate_kv_cache, plan_kv_cache
from kubeinfer_runtime.engine.sequence import Sequence
from kubeinfer_runtime.models import fused_ops
from kubeinfer_runtime.models.attention import AttentionBatch, CachedContext, PrefillSpan
from kubeinfer_runtime.models.llama import LlamaConfig, rope_tables
from kubeinfer_runtime.models.loader import load_model

log = logging.getLogger(__name__)


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device is not None:
        device = torch.device(config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {config.device!r} requested but CUDA is not available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(config: EngineConfig, model: LlamaConfig, device: torch.device) -> torch.dtype:
    if config.dtype is not None:
        dtype = DTYPES[config.dtype]
    elif device.type == "cuda":
        dtype = DTYPES.get(model.torch_dtype or "bfloat16", torch.bfloat16)
    else:
        dtype = torch.float32  # half-precision matmuls are slow on most CPUs
    if dtype == torch.float16 and device.type == "cpu":
        raise ValueError("dtype float16 is only supported on CUDA; use float32 or bfloat16 on CPU")
    return dtype


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (a pod's limit)."""
    cpus = len(os.sched_getaffinity(0))
    cpu_max = Path("/sys/fs/cgroup/cpu.max")
    if cpu_max.is_file():
        quota, period = cpu_max.read_text().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    return cpus


@dataclass(frozen=True)
class PromptLogits:
    """Logits at prompt positions start, start + 1, ...: each predicts the prompt's next token."""

    seq: Sequence
    start: int
    logits: torch.Tensor


def _slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """Cache slots of token positions [start, end)."""
    first, last = start // block_size, -(-end // block_size)
    blocks = torch.tensor(block_table[first:last])
    slots = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()
    offset = start - first * block_size
    return slots[offset : offset + end - start]


class ModelRunner:
    def __init__(self, config: EngineConfig, model_config: LlamaConfig) -> None:
        self.device = resolve_device(config)
        self.dtype = resolve_dtype(config, model_config, self.device)
        threads = config.num_threads or usable_cpus()
        if self.device.type == "cpu":
            torch.set_num_threads(threads)
        self.block_size = config.block_size
        self.cpu_kernels = (
            self.device.type == "cpu"
            and self.dtype in fused_ops.KERNEL_DTYPES
            and fused_ops.use_cpu_kernels(config.cpu_kernels)
        )
        self.model = load_model(
            config.model, model_config, self.dtype, self.device, threads, config.quantization
        )

        requested = config.max_model_len or model_config.max_position_embeddings
        if requested > model_config.max_position_embeddings:
            raise ValueError(
                f"max_model_len {requested} exceeds the model's max_position_embeddings "
                f"{model_config.max_position_embeddings}"
            )
        self.kv_plan: KVCachePlan = plan_kv_cache(config, model_config, self.dtype, self.device, requested)
        capacity = self.kv_plan.capacity_tokens
        if capacity < requested:
            if config.max_model_len is not None:
                raise ValueError(
                    f"max_model_len {requested} does not fit the KV cache ({capacity} tokens); "
                    "lower max_model_len or give the cache more memory"
                )
            log.warning(
                "max_model_len lowered from %d to the KV cache capacity, %d tokens", requested, capacity
            )
        self.max_model_len = min(requested, capacity)
        self.kv_caches = allocate_kv_cache(self.kv_plan, model_config, self.dtype, self.device)
        for i, cache in enumerate(self.kv_caches):  # one layer at a time: no second full cache
            self.kv_caches[i] = fused_ops.on_huge_pages(cache)
        for layer, cache in zip(self.model.model.layers, self.kv_caches, strict=True):
            layer.self_attn.kv_cache = cache
        cos, sin = rope_tables(model_config, self.max_model_len, self.dtype)
        self.cos, self.sin = cos.to(self.device), sin.to(self.device)

    def _context(self, seq: Sequence, num_tokens: int) -> CachedContext:
        blocks = seq.block_table[: -(-num_tokens // self.block_size)]
        return CachedContext(torch.tensor(blocks, device=self.device), num_tokens)

    def _block_tables(
        self, seqs: list[Sequence], context_lens: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables [seqs, max_blocks] padded to the longest with block 0, and the context lengths."""
        bs = self.block_size
        max_blocks = -(-max(context_lens) // bs)
        table: list[list[int]] = []
        for seq, n in zip(seqs, context_lens, strict=True):
            blocks = seq.block_table[: -(-n // bs)]
            table.append(blocks + [0] * (max_blocks - len(blocks)))
        return torch.tensor(table, device=self.device), torch.tensor(context_lens, device=self.device)

    @torch.inference_mode()
    def execute(
        self, seqs: list[Sequence], num_new_tokens: list[int]
    ) -> tuple[list[Sequence], torch.Tensor, list[PromptLogits]]:
        """Compute the scheduled tokens; returns the sequences that reached their last token (in
        batch order), their next-token logits [rows, vocab], and the logits of the prompt positions
        computed for sequences that asked for prompt logprobs.

        A sequence with a draft (speculative decoding) gets 1 + len(draft) consecutive logit rows:
        after its last token and after each draft token. Its draft positions are decode rows too,
        each attending to the cache up to itself: every new key and value is written before any
        attention reads them, so one paged-decode call verifies every draft causally."""
        bs, device = self.block_size, self.device
        # A one-token prompt chunk whose logits are wanted takes the prefill path, which keeps them.
        is_decode = [
            n == 1 + len(seq.draft_token_ids) and not seq.needs_prompt_logits
            for seq, n in zip(seqs, num_new_tokens, strict=True)
        ]
        decodes = [seq for seq, d in zip(seqs, is_decode, strict=True) if d]
        prefills = [(seq, n) for seq, n, d in zip(seqs, num_new_tokens, is_decode, strict=True) if not d]
        row_seqs: list[Sequence] = []  # the sequence of each decode row
        positions: list[int] = []
        token_ids: list[int] = []
        sampled: list[Sequence] = []
        logit_rows: list[int] = []
        for seq in decodes:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + 1 + len(seq.draft_token_ids)
            if start + 1 == seq.num_tokens:
                sampled.append(seq)
                logit_rows += range(len(positions), len(positions) + end - start)
            row_seqs += [seq] * (end - start)
            positions += range(start, end)
            token_ids += [seq.token_ids[start], *seq.draft_token_ids]
        slots = [seq.block_table[p // bs] * bs + p % bs for seq, p in zip(row_seqs, positions, strict=True)]

        position_parts = [torch.tensor(positions, dtype=torch.long)]
        slot_parts = [torch.tensor(slots, dtype=torch.long)]
        spans: list[PrefillSpan] = []
        prompt_rows: list[tuple[Sequence, int, int, int]] = []  # (seq, first position, row span)
        row = len(positions)
        for seq, n in prefills:
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            token_ids += seq.token_ids[start:end]
            position_parts.append(torch.arange(start, end))
            slot_parts.append(_slots(seq.block_table, start, end, bs))
            spans.append(PrefillSpan(row, row + n, self._context(seq, end) if start else None))
            if seq.needs_prompt_logits and (last := min(end, seq.num_prompt_tokens - 1)) > start:
                prompt_rows.append((seq, start, row, row + last - start))
            row += n
            if end == seq.num_tokens:
                sampled.append(seq)
                logit_rows.append(row - 1)

        block_tables = context_lens = None
        if decodes:
            block_tables, context_lens = self._block_tables(row_seqs, [p + 1 for p in positions])
        positions_t = torch.cat(position_parts).to(device)
        batch = AttentionBatch(
            slot_mapping=torch.cat(slot_parts).to(device),
            cos=self.cos[positions_t],
            sin=self.sin[positions_t],
            block_size=bs,
            num_decodes=len(row_seqs),
            decode_block_tables=block_tables,
            decode_context_lens=context_lens,
            prefills=spans,
        )
        input_ids = torch.tensor(token_ids, device=device)
        num_sampled_rows = len(logit_rows)
        for _, _, first, end in prompt_rows:
            logit_rows += range(first, end)
        logits = self.model(input_ids, batch, torch.tensor(logit_rows, dtype=torch.long, device=device))
        prompt_logits, at = [], num_sampled_rows
        for seq, start, first, end in prompt_rows:
            prompt_logits.append(PromptLogits(seq, start, logits[at : at + end - first]))
            at += end - first
        return sampled, logits[:num_sampled_rows], prompt_logits
