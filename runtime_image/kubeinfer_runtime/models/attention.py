"""Attention over the paged KV cache, for a batch that mixes single-token decodes and prefill chunks.

A layer's cache is one tensor [2 * kv_heads, num_blocks * block_size, head_dim]: keys in the first
kv_heads rows, values in the rest, token slots along dim 1. Gathering a sequence's blocks therefore
yields contiguous [kv_heads, tokens, head_dim] keys and values, the layout attention wants.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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

    Rows [0, num_decodes) are single-token queries, attended one of two ways. On CPU, one call per
    sequence over its own gathered blocks (`decode_contexts`): the small gather is still in cache
    when attention reads it, where a padded batch would move twice the bytes. On CUDA, one padded
    call for all (`decode_blocks`, `decode_mask`): kernel launches cost more than bytes there.
    """

    slot_mapping: torch.Tensor  # [T] cache slot each new token's key and value go to
    cos: torch.Tensor  # [T, 1, head_dim] rotary tables at each token's position
    sin: torch.Tensor  # [T, 1, head_dim] (first half negated, see `apply_rope`)
    block_size: int
    num_decodes: int
    decode_contexts: list[CachedContext] | None
    decode_blocks: torch.Tensor | None  # [num_decodes * max_blocks] block tables, padded, row-major
    decode_mask: torch.Tensor | None  # [1, num_decodes, 1, max_blocks * block_size] True for real keys
    prefills: list[PrefillSpan]


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Rotary embedding in place, HF layout: x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1).

    `signed_sin` carries the minus sign in its first half, so rotate_half becomes a roll.
    """
    torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin, out=x)


def write_kv(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    """kv [T, 2 * kv_heads, head_dim] (keys, then values) into the cache slots, in one copy."""
    cache.index_copy_(1, slots, kv.transpose(0, 1))


def gather_context(cache: torch.Tensor, context: CachedContext, block_size: int) -> torch.Tensor:
    """[2 * kv_heads, num_tokens, head_dim]: a sequence's keys and values, copied block by block."""
    two_kv_heads, _, head_dim = cache.shape
    kv = cache.view(two_kv_heads, -1, block_size * head_dim).index_select(1, context.blocks)
    return kv.view(two_kv_heads, -1, head_dim)[:, : context.num_tokens]


def _decode_per_sequence(
    q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = cache.shape[0] // 2
    # Query heads sharing a KV head become extra query rows: grouped-query attention for free.
    queries = (q * scale).view(num_seqs, kv_heads, num_heads // kv_heads, head_dim)
    out = torch.empty_like(queries)
    for i, context in enumerate(batch.decode_contexts or []):
        k, v = gather_context(cache, context, batch.block_size).split(kv_heads)
        # Plain matmuls: for one query row per head, SDPA's setup costs more than the arithmetic.
        probs = torch.bmm(queries[i], k.transpose(1, 2)).softmax(-1, dtype=torch.float32)
        torch.bmm(probs.to(v.dtype), v, out=out[i])
    return out.view(num_seqs, num_heads, head_dim)


def _decode_batched(
    q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    two_kv_heads = cache.shape[0]
    kv_heads = two_kv_heads // 2
    kv = cache.view(two_kv_heads, -1, batch.block_size * head_dim).index_select(1, batch.decode_blocks)
    kv = kv.view(two_kv_heads, num_seqs, -1, head_dim)
    q = q.view(num_seqs, kv_heads, num_heads // kv_heads, head_dim).transpose(0, 1)
    out = F.scaled_dot_product_attention(
        q, kv[:kv_heads], kv[kv_heads:], attn_mask=batch.decode_mask, scale=scale
    )
    return out.transpose(0, 1).reshape(num_seqs, num_heads, head_dim)


def _decode_attention(
    q: torch.Tensor, cache: torch.Tensor, batch: AttentionBatch, scale: float
) -> torch.Tensor:
    if batch.decode_contexts is not None:
        return _decode_per_sequence(q, cache, batch, scale)
    return _decode_batched(q, cache, batch, scale)


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

    The new keys and values are written to the cache first, so decodes and chunks read them from there.
    """
    write_kv(cache, kv, batch.slot_mapping)
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
