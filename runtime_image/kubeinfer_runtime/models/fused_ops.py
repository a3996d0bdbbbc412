"""The model's fused steps: C++ kernels on CPU in float32 and bfloat16 (csrc/cpu_ops.cpp), eager PyTorch
otherwise (CUDA, float16, or a machine without a compiler).

The kernels are compiled on first use with the machine's C++ compiler (torch.utils.cpp_extension, about
a minute, cached under TORCH_EXTENSIONS_DIR); `python -m kubeinfer_runtime.models.fused_ops` builds them
ahead of time, and with `--install DIR` copies the library out for an image: `KUBEINFER_CPU_KERNELS_LIB`
naming it makes the engine load it directly (torch.ops.load_library), because cpp_extension.load takes a
lock file in its build directory at every load, which a read-only root refuses. Without a compiler the
engine logs why and runs the eager path: same outputs, slower decode. Each function below gives both
paths; the eager one is also the reference the kernel tests use.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # both import this module
    from kubeinfer_runtime.models.attention import AttentionBatch
    from kubeinfer_runtime.models.llama import LayerWeights

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "cpu_ops.cpp"
_state: dict[str, bool] = {"loaded": False, "enabled": False, "streamed_matmul": False}
_library: dict[str, str] = {}  # "path": the library loaded
# Rows up to this many take the C++ streamed product; more go to oneDNN (or MKL), whose blocking pays off
# once each weight element serves enough rows (int8 weights: the C++ tiled product, which dequantizes
# tiles for oneDNN).
STREAMED_ROWS = 4
# From this many rows on (prefill chunks) an int8 weight is dequantized whole for one multi-threaded
# matmul: a [2048, 512] x [512, 3072] product takes ~20 ms, widening the weight ~0.3 ms, while the
# single-threaded per-tile products below it lose more than that.
DEQUANTIZE_ROWS = 256
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
INT8_MAX = 127


EXTENSION = "kubeinfer_cpu_ops"
PREBUILT_ENV = "KUBEINFER_CPU_KERNELS_LIB"


def _cflags() -> list[str]:
    # native: the build runs on the machine that uses it (cached per machine), so the kernels get the
    # widest vectors it has (AVX-512 where present, else AVX2); an image built elsewhere names a
    # baseline instead (runtime_image/Dockerfile: x86-64-v3, AVX2 and FMA).
    return ["-O3", f"-march={os.environ.get('KUBEINFER_CPU_KERNEL_ARCH', 'native')}", "-fopenmp"]


def source_digest() -> str:
    """What a prebuilt library was built from: the kernel source, the compiler flags and torch's version
    (the library links against libtorch's C++ ABI)."""
    inputs = [SOURCE.read_bytes(), " ".join(_cflags()).encode(), torch.__version__.encode()]
    return hashlib.sha256(b"\0".join(inputs)).hexdigest()


def _stamp(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _load_prebuilt(library: Path) -> bool:
    """Load a library `main --install` wrote, if it was built from this source; False to build instead."""
    try:
        built_from = _stamp(library).read_text().strip()
    except OSError as err:
        log.warning("%s=%s: no build stamp (%s); building the kernels", PREBUILT_ENV, library, err)
        return False
    if built_from != source_digest():
        log.warning("%s=%s: built from another source or torch; building the kernels", PREBUILT_ENV, library)
        return False
    torch.ops.load_library(str(library))
    return True


def load_cpu_kernels(verbose: bool = False) -> None:
    """Load the prebuilt CPU kernels, or compile (or reuse the cached build of) them; raises when that is
    impossible."""
    if _state["loaded"]:
        return
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt and _load_prebuilt(Path(prebuilt)):
        _library["path"] = prebuilt
    else:
        from torch.utils.cpp_extension import load  # imports setuptools machinery: only when needed

        load(
            name=EXTENSION,
            sources=[str(SOURCE)],
            extra_cflags=_cflags(),
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=verbose,
        )
        _library["path"] = next(p for p in torch.ops.loaded_libraries if Path(p).name.startswith(EXTENSION))
    _state["loaded"] = True
    # Without vector FMA (a build for a pre-AVX2 baseline) MKL beats the plain-loop float32 product.
    _state["streamed_matmul"] = cpu_isa() != "none"


def cpu_isa() -> str:
    """The vector instructions the built kernels use: 'avx512', 'avx2' or 'none' (not built: 'unbuilt')."""
    return str(torch.ops.kubeinfer.cpu_isa()) if _state["loaded"] else "unbuilt"


def use_cpu_kernels(wanted: bool) -> bool:
    """Turn the CPU kernels on or off for this process; returns whether they are on."""
    if wanted and not _state["loaded"]:
        try:
            log.info("building the CPU kernels (cached after the first time)")
            load_cpu_kernels()
        except Exception as err:  # no compiler, no headers: the eager path still works
            log.warning("CPU kernels unavailable, decoding with eager PyTorch ops: %s", err)
    _state["enabled"] = wanted and _state["loaded"]
    if _state["enabled"]:
        log.info("CPU kernels on (%s, %s)", cpu_isa(), _library["path"])
    return _state["enabled"]


HUGE_PAGE_BYTES = 2 << 20


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """t copied into memory backed by 2 MB pages where the kernels are built (see huge_page_copy in
    cpu_ops.cpp: the KV cache's scattered blocks and the streamed weights), else t itself. Tensors
    under one huge page gain nothing and stay where they are."""
    if not _state["loaded"] or t.device.type != "cpu" or t.numel() * t.element_size() < HUGE_PAGE_BYTES:
        return t
    return torch.ops.kubeinfer.huge_page_copy(t.contiguous())


def _kernel(x: torch.Tensor) -> bool:
    return _state["enabled"] and x.dtype in KERNEL_DTYPES and x.device.type == "cpu"


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); with no residual, x is the residual."""
    if _kernel(x):
        return torch.ops.kubeinfer.add_rms_norm(x, residual, weight, eps), x if residual is None else residual
    if residual is not None:
        x = x + residual
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps), x
    # Half precision: normalise in float32 like transformers, then scale in the model dtype.
    return F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype) * weight, x


def apply_rope_(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Rotary embedding in place, HF layout: x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1).

    `signed_sin` carries the minus sign in its first half, so rotate_half becomes a roll. In half
    precision both products are rounded before the sum, as transformers' ops round them.
    """
    rolled = x.roll(x.shape[-1] // 2, -1)
    if x.dtype == torch.float32:
        torch.addcmul(x * cos, rolled, signed_sin, out=x)
    else:
        torch.add(x * cos, rolled * signed_sin, out=x)


def rope_and_cache_(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
) -> None:
    """qkv [T, heads + 2 * kv_heads, head_dim]: rotate q and k in place, then write k and v to the
    cache [2 * kv_heads, slots, head_dim] at each token's slot. cos / signed_sin: [T, head_dim]."""
    if _kernel(qkv):
        torch.ops.kubeinfer.rope_and_cache(qkv, cos, signed_sin, cache, slots, num_heads)
        return
    kv_heads = (qkv.shape[1] - num_heads) // 2
    apply_rope_(qkv[:, : num_heads + kv_heads], cos.unsqueeze(1), signed_sin.unsqueeze(1))
    # Keys and values are adjacent in qkv, so the cache takes them in one copy.
    cache.index_copy_(1, slots, qkv[:, num_heads:].transpose(0, 1))


def paged_decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """One query per sequence, q [S, heads, head_dim], over its paged keys and values: block_tables
    [S, max_blocks] (padded with any valid block), context_lens [S] -> [S, heads, head_dim]."""
    if _kernel(q):
        return torch.ops.kubeinfer.paged_decode_attention(
            q, cache, block_tables, context_lens, block_size, scale
        )
    num_seqs, num_heads, head_dim = q.shape
    two_kv_heads = cache.shape[0]
    kv_heads = two_kv_heads // 2
    # Gather every sequence's blocks into one padded batch and mask the padding: one call for all.
    kv = cache.view(two_kv_heads, -1, block_size * head_dim).index_select(1, block_tables.flatten())
    kv = kv.view(two_kv_heads, num_seqs, -1, head_dim)
    mask = torch.arange(kv.shape[2], device=q.device) < context_lens[:, None]
    q = q.reshape(num_seqs, kv_heads, num_heads // kv_heads, head_dim).transpose(0, 1)
    out = F.scaled_dot_product_attention(
        q, kv[:kv_heads], kv[kv_heads:], attn_mask=mask.view(1, num_seqs, 1, -1), scale=scale
    )
    return out.transpose(0, 1).reshape(num_seqs, num_heads, head_dim)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 * I] -> silu(gate) * up, [T, I]."""
    if _kernel(gate_up):
        return torch.ops.kubeinfer.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (q [out, in] int8, scales [out] float32), weight ~ q * scales.

    Each row's scale maps its largest magnitude to 127 (the range stays symmetric: -128 is unused); an
    all-zero row gets scale 1 so it dequantizes to zeros rather than NaN.
    """
    w = weight.detach().float()
    absmax = w.abs().amax(dim=-1)
    scales = torch.where(absmax > 0, absmax / INT8_MAX, torch.ones_like(absmax))
    q = torch.round(w / scales[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [rows, in] times int8 weight [out, in] with per-row scales, in eager torch ops (CUDA, and CPU
    without the kernels): the matmul over the widened weight, then each output column times its scale."""
    y = F.linear(x, weight.to(x.dtype)) * scales.to(x.dtype)
    return y if bias is None else y + bias


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scales: torch.Tensor | None
) -> torch.Tensor:
    """x W^T + b for a weight as llama.Linear holds it: [out, in] (int8 with scales, or the model
    dtype), or CPU row blocks [splits, out / splits, in] (`packed_linear`)."""
    if weight.dim() == 3:
        return packed_linear(x, weight, bias, scales)
    if scales is not None:
        return int8_linear(x, weight, scales, bias)
    return F.linear(x, weight, bias)


def _onednn_linear(x: torch.Tensor) -> bool:
    """Whether oneDNN's float32 linear (an ATen op over the plain [out, in] weight) can take x. On this
    project's AMD machines it ran many-row products 2.1-2.8x faster than MKL, whose AVX-512 code
    paths are Intel-only; on Intel CPUs the two are close."""
    return (
        x.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


_scratches: dict[torch.dtype, torch.Tensor] = {}


def _scratch(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A [shape] tensor of dtype over memory reused from call to call (the largest asked for so far)."""
    numel = shape.numel()
    if dtype not in _scratches or _scratches[dtype].numel() < numel:
        _scratches[dtype] = on_huge_pages(torch.empty(numel, dtype=dtype))  # like the weights it stands for
    return _scratches[dtype][:numel].view(shape)


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """x [rows, in] times a weight stored as blocks of output rows [splits, out / splits, in]: float32 or
    bfloat16 like x, or int8 with `scales` [out] (see `quantize_int8`)."""
    rows, quantized = x.shape[0], weight.dtype == torch.int8
    if _kernel(x):
        if rows <= STREAMED_ROWS and (weight.dtype != torch.float32 or _state["streamed_matmul"]):
            return torch.ops.kubeinfer.packed_linear(x, weight, scales, bias)
        if quantized and rows < DEQUANTIZE_ROWS:
            return torch.ops.kubeinfer.int8_linear_tiled(x, weight, scales, bias)
    if quantized:
        assert scales is not None
        if rows < DEQUANTIZE_ROWS:
            return int8_linear(x, weight.flatten(0, 1), scales, bias)
        # w * scale computed in float32 and rounded once to x's dtype, as the tiles do, into a buffer
        # kept between calls (fresh megabytes come back as new pages, costly to fault in).
        widened = _scratch(weight.shape, x.dtype)
        if _kernel(x):
            torch.ops.kubeinfer.dequantize_int8(weight, scales, widened)
        else:  # a slower mixed-dtype multiply, same numbers
            torch.mul(weight, scales.view(*weight.shape[:-1], 1), out=widened)
        weight = widened
    if weight.dtype != torch.float32:  # oneDNN's half-precision matmul over the plain [out, in] matrix
        return F.linear(x, weight.flatten(0, 1), bias)
    if rows > STREAMED_ROWS and _onednn_linear(x):
        return torch.ops.mkldnn._linear_pointwise(x, weight.flatten(0, 1), bias, "none", [], "")
    y = torch.bmm(x.expand(weight.shape[0], *x.shape), weight.transpose(1, 2))  # [splits, rows, out / splits]
    y = y.transpose(0, 1).reshape(rows, -1)  # a view for a single row, a copy for more
    return y if bias is None else y + bias


def fuses_decode_layers(x: torch.Tensor, batch: AttentionBatch, layer: LayerWeights) -> bool:
    """Whether a step's layers can each run as one C++ call (`decode_layer`): a few decodes and no
    prefill, on the CPU kernels, over packed weights."""
    return (
        not batch.prefills
        and x.shape[0] <= STREAMED_ROWS
        and _kernel(x)
        and _state["streamed_matmul"]
        and layer.qkv.weight.dim() == 3
    )


def decode_layer(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    layer: LayerWeights,
    batch: AttentionBatch,
    eps: float,
    num_heads: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer of a decode step in one kernel call (see `fuses_decode_layers`), the same ops
    as llama.LlamaForCausalLM.forward: (this layer's MLP output, the residual stream)."""
    out = torch.ops.kubeinfer.decode_layer(
        x, residual, layer.input_norm, layer.post_norm, eps,
        *layer.qkv, *layer.o, *layer.gate_up, *layer.down,
        batch.cos, batch.sin, layer.attention.kv_cache, batch.slot_mapping,
        batch.decode_block_tables, batch.decode_context_lens, batch.block_size, num_heads, scale,
    )  # fmt: skip
    return out, x if residual is None else residual


def main(argv: list[str]) -> int:
    """Build the kernels now (an image build step, CI set-up) rather than at the first model load;
    `--install DIR`: copy the library and its build stamp into DIR, for KUBEINFER_CPU_KERNELS_LIB."""
    os.environ.pop(PREBUILT_ENV, None)  # build from source, whatever the environment says
    print(f"building {SOURCE.name} (cached under TORCH_EXTENSIONS_DIR or torch's default)")
    load_cpu_kernels(verbose="-v" in argv)
    print(f"CPU kernels ready ({cpu_isa()}): {_library['path']}")
    if "--install" in argv:
        target = Path(argv[argv.index("--install") + 1])
        target.mkdir(parents=True, exist_ok=True)
        library = target / f"{EXTENSION}.so"
        shutil.copy2(_library["path"], library)
        _stamp(library).write_text(source_digest() + "\n")
        print(f"installed {library}: set {PREBUILT_ENV}={library}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
