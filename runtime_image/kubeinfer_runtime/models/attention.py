"""Attention over the paged KV cache, for a batch that mixes single-token decodes and prefill chunks.

A layer's cache is one tensor [2 * kv_heads, num_blocks * block_size, head_dim]: keys in the first
kv_heads rows, values in the rest, token slots along dim 1. Gathering a sequence's blocks therefore
yields contiguous [kv_heads, tokens, head_dim] keys and values, the layout attention wants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kubeinfer_runtime.models import fused_ops


@dataclass
class CachedContext:
    """Where one sequence's keys and values are: its blocks, and how many tokens of them count."""

    blocks: torch.Tensor  # block ids, on the cache's device
    num_tokens: int


@dataclass
class PrefillSpan:
    """One sequence's prefill chunk: batch rows [start, end)."""

    start: int
    end: int
    # The whole context when part of it was computed in an earlier step (a prefix-cache hit or an
    # earlier chunk); None when the chunk is the whole context and attends only to itself.
    context: CachedContext | None


@dataclass
class AttentionBatch:
    """Per-step attention inputs, built once by the model runner and shared by every layer.

    Rows [0, num_decodes) are single-token queries, attended in one call for all of them over their
    padded block tables (`fused_ops.paged_decode_attention`); the rest are prefill chunks.
    """

    slot_mapping: torch.Tensor  # [T] cache slot each new token's key and value go to
    cos: torch.Tensor  # [T, head_dim] rotary tables at each token's position
    sin: torch.Tensor  # [T, head_dim] (first half negated, see `fused_ops.apply_rope_`)
    block_size: int
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [num_decodes, max_blocks], padded with block 0
    decode_context_lens: torch.Tensor | None  # [num_decodes] tokens each decode attends to
    prefills: list[PrefillSpan]


def gather_context(cache: torch.Tensor, context: CachedContext, block_size: int) -> torch.Tensor:
    """[2 * kv_heads, num_tokens, head_dim]: a sequence's keys and values, copied block by block."""
    two_kv_heads, _, head_dim = cache.shape
    kv = cache.view(two_kv_heads, -1, block_size * head_dim).index_select(1, context.blocks)
    return kv.view(two_kv_heads, -1, head_dim)[:, : context.num_tokens]


def _decode_attention(
    q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    assert batch.decode_block_tables is not None and batch.decode_context_lens is not None
    return fused_ops.paged_decode_attention(
        q, cache, batch.decode_block_tables, batch.decode_context_lens, batch.block_size, scale
    )


def _prefill_attention(
    q: torch.Tensor,
    kv: torch.Tensor,
    cache: torch.Tensor,
    batch: AttentionBatch,
    span: PrefillSpan,
    scale: float,
) -> torch.Tensor:
    kv_heads = kv.shape[1] // 2
    q = q.transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != kv_heads
    if span.context is None:
        kv = kv.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            q, kv[:, :kv_heads], kv[:, kv_heads:], is_causal=True, scale=scale, enable_gqa=gqa
        )
    else:
        kv = gather_context(cache, span.context, batch.block_size).unsqueeze(0)
        num_new, context_len = span.end - span.start, span.context.num_tokens
        # Query i sits at position context_len - num_new + i and sees every key up to it.
        key_pos = torch.arange(context_len, device=q.device)
        query_pos = torch.arange(context_len - num_new, context_len, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]
        out = F.scaled_dot_product_attention(
            q, kv[:, :kv_heads], kv[:, kv_heads:], attn_mask=mask, scale=scale, enable_gqa=gqa
        )
    return out.squeeze(0).transpose(0, 1)


def paged_attention(
    q: torch.Tensor, kv: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    """q [T, heads, head_dim], kv [T, 2 * kv_heads, head_dim] (keys, then values) -> [T, heads, head_dim].

    The new keys and values must already be in the cache (`fused_ops.rope_and_cache_`): decodes and
    chunks read them from there.
    """
    nd = batch.num_decodes
    if not batch.prefills:
        return _decode_attention(q, cache, batch, scale)
    out = torch.empty_like(q)
    if nd:
        out[:nd] = _decode_attention(q[:nd], cache, batch, scale)
    for span in batch.prefills:
        rows = slice(span.start, span.end)
        out[rows] = _prefill_attention(q[rows], kv[rows], cache, batch, span, scale)
    return out
