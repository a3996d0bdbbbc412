"""The C++ CPU kernels (models/csrc/cpu_ops.cpp) against the eager PyTorch path they replace, in float32
and bfloat16, with float32, bfloat16 and int8 matmul weights."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
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


DTYPES = [torch.float32, torch.bfloat16]


def close(dtype: torch.dtype) -> dict[str, float]:
    """Tolerances: float32's defaults; in bfloat16 a unit or two in the last place of an O(1) value
    (the two paths sum in different orders before they round)."""
    return {} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


def test_kernels_use_the_widest_vectors_the_build_targets(kernels: None) -> None:
    """Built for this machine (-march=native): AVX-512 where the CPU has it, else AVX2."""
    flags = set(Path("/proc/cpuinfo").read_text().split())
    expected = (
        "avx512" if {"avx512f", "avx512bw", "avx512vl"} <= flags else "avx2" if "avx2" in flags else "none"
    )
    assert fused_ops.cpu_isa() == expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_eager(kernels: None, with_residual: bool, dtype: torch.dtype) -> None:
    x, residual = torch.randn(5, 96, dtype=dtype), torch.randn(5, 96, dtype=dtype)
    weight = (torch.rand(96) + 0.5).to(dtype)
    (k_out, k_args), (e_out, _) = both_paths(
        fused_ops.add_rms_norm, x, residual if with_residual else None, weight, 1e-6
    )
    torch.testing.assert_close(k_out[0], e_out[0])
    torch.testing.assert_close(k_out[1], e_out[1])  # the updated residual stream
    if with_residual:  # the kernel adds into the caller's residual tensor
        torch.testing.assert_close(k_args[1], x + residual)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_cache_matches_eager(kernels: None, dtype: torch.dtype) -> None:
    heads, kv_heads, dim, tokens = 4, 2, 16, 6
    qkv = torch.randn(tokens, heads + 2 * kv_heads, dim, dtype=dtype)
    cos, sin = torch.randn(tokens, dim, dtype=dtype), torch.randn(tokens, dim, dtype=dtype)
    cache = torch.zeros(2 * kv_heads, 32, dim, dtype=dtype)
    slots = torch.tensor([3, 17, 4, 30, 0, 9])
    (_, k_args), (_, e_args) = both_paths(fused_ops.rope_and_cache_, qkv, cos, sin, cache, slots, heads)
    torch.testing.assert_close(k_args[0], e_args[0], **close(dtype))  # q and k rotated in place, v untouched
    torch.testing.assert_close(k_args[3], e_args[3], **close(dtype))  # keys and values at their slots
    assert torch.equal(k_args[0][:, heads + kv_heads :], qkv[:, heads + kv_heads :])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2)])
def test_paged_decode_attention_matches_eager(
    kernels: None, heads: int, kv_heads: int, dtype: torch.dtype
) -> None:
    """Three sequences of different lengths over scattered, padded block tables; q a strided view."""
    dim, num_blocks = 16, 12
    cache = torch.randn(2 * kv_heads, num_blocks * BLOCK, dim, dtype=dtype)
    tables = torch.tensor([[7, 2, 9, 0], [5, 0, 0, 0], [1, 11, 3, 8]])
    lens = torch.tensor([10, 1, 16])
    q = torch.randn(3, heads + 2 * kv_heads, dim, dtype=dtype)[:, :heads]
    (k_out, _), (e_out, _) = both_paths(fused_ops.paged_decode_attention, q, cache, tables, lens, BLOCK, 0.25)
    torch.testing.assert_close(k_out, e_out, **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_over_long_contexts_matches_eager(kernels: None, dtype: torch.dtype) -> None:
    """Contexts of hundreds of tokens, head_dim 64, scores spread over tens of units (the vector exp
    sees large negative arguments after the peak is subtracted)."""
    torch.manual_seed(0)
    kv_heads, heads, dim, blocks = 2, 8, 64, 80
    cache = torch.randn(2 * kv_heads, blocks * BLOCK, dim, dtype=dtype)
    tables = torch.randperm(blocks).view(2, 40)
    lens = torch.tensor([157, 160])
    q = (4 * torch.randn(2, heads, dim)).to(dtype)
    (k_out, _), (e_out, _) = both_paths(fused_ops.paged_decode_attention, q, cache, tables, lens, BLOCK, 0.5)
    # float32: sums of 160 terms in another order, and another exp (worst seen over 200 seeds: 2.3e-5).
    tolerance = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else close(dtype)
    torch.testing.assert_close(k_out, e_out, **tolerance)


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


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_bfloat16_packed_linear_matches_a_bfloat16_matmul(kernels: None, rows: int) -> None:
    """bfloat16 weights widened in registers (few rows) or oneDNN's matmul (more), against F.linear."""
    x = torch.randn(rows, 70, dtype=torch.bfloat16)
    weight, bias = torch.randn(2, 27, 70, dtype=torch.bfloat16), torch.randn(54, dtype=torch.bfloat16)
    out = fused_ops.packed_linear(x, weight, bias)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x.float(), weight.reshape(54, 70).float(), bias.float())
    torch.testing.assert_close(out.float(), expected, rtol=1.6e-2, atol=2e-2)


def test_int8_quantization_is_symmetric_per_output_row() -> None:
    weight = torch.randn(6, 40) * torch.tensor([0.01, 1.0, 30.0, 1.0, 1.0, 0.0])[:, None]
    q, scales = fused_ops.quantize_int8(weight)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (6,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127  # symmetric: -128 never used
    torch.testing.assert_close(scales[:5], weight[:5].abs().amax(dim=1) / 127)
    assert scales[5] == 1 and not q[5].any()  # an all-zero row: zeros, not NaN
    error = (q.float() * scales[:, None] - weight).abs()
    assert bool((error <= scales[:, None] / 2 + 1e-7).all())  # round to nearest: half a step at most


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "inputs"),
    [(1, 30), (2, 30), (3, 70), (4, 70), (5, 30), (9, 70), (6, 16400), (fused_ops.DEQUANTIZE_ROWS, 70)],
)
def test_int8_packed_linear_matches_the_dequantized_matmul(
    kernels: None, rows: int, inputs: int, dtype: torch.dtype
) -> None:
    """Few rows: streamed, widened in registers; more: tiles dequantized for oneDNN (16400 inputs make the
    tiles 16 rows, fewer than a block's 20, so tails are covered); prefill-sized: the whole weight
    dequantized for one matmul. Odd sizes leave remainders."""
    weight = torch.randn(40, inputs)
    q, scales = fused_ops.quantize_int8(weight)
    x, bias = torch.randn(rows, inputs, dtype=dtype), torch.randn(40, dtype=dtype)
    plain = torch.nn.functional.linear(x.float(), q.float() * scales[:, None], bias.float())
    (k_out, _), (e_out, _) = both_paths(fused_ops.packed_linear, x, q.view(2, 20, inputs), bias, scales)
    assert k_out.dtype == e_out.dtype == dtype
    # bfloat16: products of up to 16400 terms, rounded to 8 bits of mantissa, against float32.
    scale = float(plain.abs().max())
    tolerance = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 0.0, "atol": scale / 64}
    torch.testing.assert_close(k_out.float(), plain, **tolerance)
    torch.testing.assert_close(e_out.float(), plain, **tolerance)
    no_bias = fused_ops.packed_linear(x, q.view(2, 20, inputs), None, scales)
    torch.testing.assert_close(no_bias.float(), plain - bias.float(), **tolerance)


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
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.kubeinfer.add_rms_norm(torch.randn(2, 8, dtype=torch.float64), None, torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="activations' dtype"):
        torch.ops.kubeinfer.add_rms_norm(torch.randn(2, 8), None, torch.ones(8, dtype=torch.bfloat16), 1e-6)
    q8 = torch.zeros(1, 4, 8, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="one per output row"):
        torch.ops.kubeinfer.packed_linear(torch.randn(1, 8), q8, None, None)
    with pytest.raises(RuntimeError, match="int8 weights only"):
        torch.ops.kubeinfer.packed_linear(torch.randn(1, 8), torch.randn(1, 4, 8), torch.ones(4), None)


def test_large_tensors_move_to_memory_aligned_for_huge_pages(kernels: None) -> None:
    big = torch.randn(3, 1 << 18)  # 3 MiB: two huge pages
    moved = fused_ops.on_huge_pages(big)
    assert torch.equal(moved, big) and moved.data_ptr() != big.data_ptr()
    assert moved.data_ptr() % fused_ops.HUGE_PAGE_BYTES == 0
    small = torch.randn(16, 16)
    assert fused_ops.on_huge_pages(small) is small  # under one page: nothing to gain
