"""The C++ CPU kernels (models/csrc/cpu_ops.cpp) against the eager PyTorch path they replace."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from kubeinfer_runtime.models import fused_ops

BLOCK = 4


@pytest.fixture
def kernels() -> Iterator[None]:
    assert fused_ops.use_cpu_kernels(True), "the CPU kernels did not build"
    yield
    fused_ops.use_cpu_kernels(True)


def both_paths(fn: Callable[..., Any], *args: Any) -> list[tuple[Any, list[Any]]]:
    """(kernel result, eager result) of fn on independent copies of args (kernels write in place)."""
    results = []
    for enabled in (True, False):
        fused_ops.use_cpu_kernels(enabled)
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        results.append((fn(*copies), copies))
    return results


@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_eager(kernels: None, with_residual: bool) -> None:
    x, residual, weight = torch.randn(5, 96), torch.randn(5, 96), torch.rand(96) + 0.5
    (k_out, k_args), (e_out, _) = both_paths(
        fused_ops.add_rms_norm, x, residual if with_residual else None, weight, 1e-6
    )
    torch.testing.assert_close(k_out[0], e_out[0])
    torch.testing.assert_close(k_out[1], e_out[1])  # the updated residual stream
    if with_residual:  # the kernel adds into the caller's residual tensor
        torch.testing.assert_close(k_args[1], x + residual)


def test_rope_and_cache_matches_eager(kernels: None) -> None:
    heads, kv_heads, dim, tokens = 4, 2, 16, 6
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim)
    cos, sin = torch.randn(tokens, dim), torch.randn(tokens, dim)
    cache = torch.zeros(2 * kv_heads, 32, dim)
    slots = torch.tensor([3, 17, 4, 30, 0, 9])
    (_, k_args), (_, e_args) = both_paths(fused_ops.rope_and_cache_, qkv, cos, sin, cache, slots, heads)
    torch.testing.assert_close(k_args[0], e_args[0])  # q and k rotated in place, v untouched
    torch.testing.assert_close(k_args[3], e_args[3])  # keys and values at their slots
    assert torch.equal(k_args[0][:, heads + kv_heads :], qkv[:, heads + kv_heads :])


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2)])
def test_paged_decode_attention_matches_eager(kernels: None, heads: int, kv_heads: int) -> None:
    """Three sequences of different lengths over scattered, padded block tables; q a strided view."""
    dim, num_blocks = 16, 12
    cache = torch.randn(2 * kv_heads, num_blocks * BLOCK, dim)
    tables = torch.tensor([[7, 2, 9, 0], [5, 0, 0, 0], [1, 11, 3, 8]])
    lens = torch.tensor([10, 1, 16])
    q = torch.randn(3, heads + 2 * kv_heads, dim)[:, :heads]
    (k_out, _), (e_out, _) = both_paths(fused_ops.paged_decode_attention, q, cache, tables, lens, BLOCK, 0.25)
    torch.testing.assert_close(k_out, e_out)


def test_paged_decode_attention_ignores_padding_blocks(kernels: None) -> None:
    cache = torch.randn(2, 8 * BLOCK, 8)
    q = torch.randn(1, 1, 8)
    lens = torch.tensor([6])
    padded = torch.ops.kubeinfer.paged_decode_attention(q, cache, torch.tensor([[2, 5, 0]]), lens, BLOCK, 1.0)
    exact = torch.ops.kubeinfer.paged_decode_attention(q, cache, torch.tensor([[2, 5]]), lens, BLOCK, 1.0)
    assert torch.equal(padded, exact)


def test_silu_mul_and_packed_linear_match_eager(kernels: None) -> None:
    gate_up = torch.randn(3, 64)
    (k_out, _), (e_out, _) = both_paths(fused_ops.silu_mul, gate_up)
    torch.testing.assert_close(k_out, e_out)
    # Streamed (few rows) and MKL's (more). 30 inputs and 27 outputs per block leave remainders after
    # the 8 inputs and the 4 output rows the kernel takes at a time.
    for rows in (1, 3, 6):
        x, weight, bias = torch.randn(rows, 30), torch.randn(2, 27, 30), torch.randn(54)
        (k_out, _), (e_out, _) = both_paths(fused_ops.packed_linear, x, weight, bias)
        torch.testing.assert_close(k_out, e_out)
        plain = x @ weight.reshape(54, 30).t() + bias
        torch.testing.assert_close(k_out, plain)
        for _ in range(2):  # the bias is an input, never an accumulator: the second call sees it intact
            torch.testing.assert_close(fused_ops.packed_linear(x, weight, bias), plain)


def test_kernels_refuse_what_they_do_not_handle(kernels: None) -> None:
    cache = torch.randn(2, 8, 8)
    with pytest.raises(RuntimeError, match="context longer than its block table"):
        torch.ops.kubeinfer.paged_decode_attention(
            torch.randn(1, 1, 8), cache, torch.tensor([[0]]), torch.tensor([5]), BLOCK, 1.0
        )
    with pytest.raises(RuntimeError, match="slot out of range"):
        torch.ops.kubeinfer.rope_and_cache(
            torch.randn(1, 3, 8), torch.ones(1, 8), torch.zeros(1, 8), cache, torch.tensor([8]), 1
        )
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.kubeinfer.add_rms_norm(torch.randn(2, 8, dtype=torch.float64), None, torch.ones(8), 1e-6)
