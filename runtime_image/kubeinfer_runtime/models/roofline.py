"""The bytes one decode step must read from memory: the floor its time is measured against.

A decode step of a small batch is bound by memory bandwidth: it streams every matmul weight once
(whatever its dtype: float32, bfloat16, or int8 plus a scale per output row), the norms, one
embedding row per token (the lookup reads a row, not the table; a tied LM head streams the whole
table anyway), and every cached key and value of every sequence's context. Divided by the machine's
read bandwidth, that is the fastest the step could possibly be.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kubeinfer_runtime.models.llama import Linear, LlamaForCausalLM, RMSNorm


@dataclass(frozen=True)
class StepBytes:
    matmul_weights: int  # every Linear's weight, scales and bias
    norms: int
    embedding_rows: int  # one row per token looked up
    kv_cache: int  # keys and values of every context token, all layers

    @property
    def weights(self) -> int:
        return self.matmul_weights + self.norms + self.embedding_rows

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache


def _bytes(tensors: list[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def decode_step_bytes(model: LlamaForCausalLM, context_lens: list[int], kv_dtype: torch.dtype) -> StepBytes:
    """What a decode step of len(context_lens) sequences reads; context_lens counts each sequence's
    tokens including the new one (whose key and value the attention reads back from the cache)."""
    c = model.config
    matmul = sum(_bytes([m.weight, m.scales, m.bias]) for m in model.modules() if isinstance(m, Linear))
    norms = sum(_bytes([m.weight]) for m in model.modules() if isinstance(m, RMSNorm))
    table: nn.Embedding = model.model.embed_tokens
    row = 0 if c.tie_word_embeddings else table.embedding_dim * table.weight.element_size()
    kv_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_dtype.itemsize
    return StepBytes(matmul, norms, row * len(context_lens), kv_per_token * sum(context_lens))
