"""Llama-family decoder (Llama 2/3, Qwen2): RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.

Projections that read the same input are fused into one matmul (q/k/v, gate/up); the loader fills
the fused weights from the checkpoint's separate tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kubeinfer_runtime.models import fused_ops
from kubeinfer_runtime.models.attention import AttentionBatch, paged_attention

ROPE_TYPES = ("default", "linear", "llama3")


def _required(hf: dict[str, Any], key: str) -> Any:
    if key not in hf:
        raise ValueError(f"config.json lacks {key!r}")
    return hf[key]


@dataclass(frozen=True)
class LlamaConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # None, or the llama3 / linear parameters
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    torch_dtype: str | None

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> LlamaConfig:
        architecture = hf["architectures"][0]
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json hidden_act {hf['hidden_act']!r} is not supported; only 'silu'")
        if hf.get("use_sliding_window"):
            raise ValueError("config.json use_sliding_window=true is not supported (full attention only)")
        # transformers >= 5 writes rope settings as `rope_parameters`; older configs use
        # `rope_theta` + `rope_scaling` (whose type key was once `type`).
        rope = {**(hf.get("rope_parameters") or {}), **(hf.get("rope_scaling") or {})}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"config.json rope_type {rope_type!r} is not supported; supported: {ROPE_TYPES}")
        qwen2 = architecture == "Qwen2ForCausalLM"
        num_heads = _required(hf, "num_attention_heads")
        return cls(
            architecture=architecture,
            vocab_size=_required(hf, "vocab_size"),
            hidden_size=_required(hf, "hidden_size"),
            intermediate_size=_required(hf, "intermediate_size"),
            num_layers=_required(hf, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or _required(hf, "hidden_size") // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_scaling=None
            if rope_type == "default"
            else {**{k: v for k, v in rope.items() if k != "rope_theta"}, "rope_type": rope_type},
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            qkv_bias=qwen2 or hf.get("attention_bias", False),
            o_bias=not qwen2 and hf.get("attention_bias", False),
            mlp_bias=hf.get("mlp_bias", False),
            torch_dtype=hf.get("torch_dtype") or hf.get("dtype"),
        )


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies exactly as transformers computes them, llama3 / linear scaling included."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(config: LlamaConfig, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin [max_len, head_dim] for positions 0..max_len-1 (see `fused_ops.apply_rope_`)."""
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(config))
    emb = torch.cat((freqs, freqs), dim=-1)
    signed_sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
    return emb.cos().to(dtype), signed_sin.to(dtype)


class LinearWeights(NamedTuple):
    weight: torch.Tensor  # [out, in], or row blocks [splits, out / splits, in] (see Linear.pack_for_cpu)
    bias: torch.Tensor | None
    scales: torch.Tensor | None  # int8 weights: float32, one per output row


class Linear(nn.Module):
    """nn.Linear: y = x W^T + b, with the checkpoint's [out, in] weight.

    On CPU, `pack_for_cpu(splits)` views the weight as `splits` blocks of output rows [splits,
    out / splits, in], one per thread (`fused_ops.packed_linear`). A decode step is a matrix-vector
    product per weight, bound by reading the weight; MKL runs it on a single thread, at one core's
    share of memory bandwidth, where the blocks let every core stream its own. On bench-60m (2 cores)
    a batch-1 step's 33 matmuls took 9.0 ms with oneDNN's prepacked weights, 7.5 ms as one batched
    MKL matmul over column slices, and ~30% less again in the C++ kernel over row blocks.

    `quantize_int8()` replaces the weight by int8 values and one float32 scale per output row
    (weight-only quantization: activations keep the model dtype, the weight is widened in registers).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.register_buffer("scales", None)  # float32, one per output row, once quantized

    def quantize_int8(self) -> None:
        q, scales = fused_ops.quantize_int8(self.weight)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.scales = scales

    def pack_for_cpu(self, splits: int) -> None:
        out_features, in_features = self.weight.shape
        splits = splits if out_features % splits == 0 else 1
        # A view, not a copy: a tied LM head keeps sharing the embedding table.
        self.weight = nn.Parameter(self.weight.detach().view(splits, -1, in_features), requires_grad=False)

    def tensors(self) -> LinearWeights:
        return LinearWeights(self.weight, self.bias, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_ops.linear(x, *self.tensors())


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, qkv_out, bias=config.qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.o_bias)
        self.kv_cache = torch.empty(0)  # set by the model runner once the cache is allocated


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)


class LayerWeights(NamedTuple):
    """One decoder layer's tensors, gathered once for the forward pass (see LlamaForCausalLM.forward)."""

    input_norm: torch.Tensor
    qkv: LinearWeights
    o: LinearWeights
    post_norm: torch.Tensor
    gate_up: LinearWeights
    down: LinearWeights
    attention: Attention  # its kv_cache, which the model runner sets after loading


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def tensors(self) -> LayerWeights:
        attn, mlp = self.self_attn, self.mlp
        return LayerWeights(
            self.input_layernorm.weight,
            attn.qkv_proj.tensors(),
            attn.o_proj.tensors(),
            self.post_attention_layernorm.weight,
            mlp.gate_up_proj.tensors(),
            mlp.down_proj.tensors(),
            attn,
        )


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def _copy_checked(name: str, target: torch.Tensor, tensor: torch.Tensor) -> None:
    if target.shape != tensor.shape:
        raise ValueError(
            f"checkpoint tensor {name!r} has shape {list(tensor.shape)}, expected {list(target.shape)}"
        )
    target.copy_(tensor)


# checkpoint projection name -> (fused module name, shard index within it)
PACKED_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """The modules hold the parameters under the checkpoint's names; the forward pass runs over a flat
    list of each layer's tensors (`LayerWeights`), gathered once: going through ~75 nn.Module calls
    and attribute look-ups per step cost ~0.45 ms of a 1.5 ms int8 batch-1 decode step on bench-60m."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self._layers: list[LayerWeights] | None = None  # gathered at the first forward

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._layers = None

    def quantize_int8(self) -> None:
        """Weight-only int8 for every matmul: the decoder layers' projections and an untied LM head.

        A tied LM head is the embedding table, which the embedding lookup reads in the model dtype:
        it stays as it is (vLLM too leaves a tied head unquantized).
        """
        for name, module in self.named_modules():
            if isinstance(module, Linear) and not (name == "lm_head" and self.config.tie_word_embeddings):
                module.quantize_int8()
        self._layers = None

    def pack_for_cpu(self, splits: int) -> None:
        """View every matmul weight as one block of output rows per thread (see `Linear`)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack_for_cpu(splits)
        self._layers = None

    def forward(
        self, input_ids: torch.Tensor, batch: AttentionBatch, logit_rows: torch.Tensor
    ) -> torch.Tensor:
        """Logits [len(logit_rows), vocab] at the given rows; only those rows pay for the LM head.

        Each layer: norm(x + residual) -> fused q/k/v -> rotary + KV-cache write -> paged attention ->
        o_proj; norm(x + residual) -> fused gate/up -> SiLU-and-multiply -> down_proj. The residual add
        rides along with the norm after it.
        """
        if self._layers is None:
            self._layers = [layer.tensors() for layer in self.model.layers]
        c, linear, add_rms_norm = self.config, fused_ops.linear, fused_ops.add_rms_norm
        eps, heads, head_dim = c.rms_norm_eps, c.num_heads, c.head_dim
        scale = head_dim**-0.5
        x, residual = F.embedding(input_ids, self.model.embed_tokens.weight), None
        num_tokens = x.shape[0]
        fused = fused_ops.fuses_decode_layers(x, batch, self._layers[0])
        for layer in self._layers:
            if fused:  # the same ops in one kernel call
                x, residual = fused_ops.decode_layer(x, residual, layer, batch, eps, heads, scale)
                continue
            x, residual = add_rms_norm(x, residual, layer.input_norm, eps)
            qkv = linear(x, *layer.qkv).view(num_tokens, -1, head_dim)  # q heads, then k heads, then v heads
            cache = layer.attention.kv_cache
            fused_ops.rope_and_cache_(qkv, batch.cos, batch.sin, cache, batch.slot_mapping, heads)
            out = paged_attention(qkv[:, :heads], qkv[:, heads:], cache, batch, scale)
            x, residual = add_rms_norm(
                linear(out.view(num_tokens, -1), *layer.o), residual, layer.post_norm, eps
            )
            x = linear(fused_ops.silu_mul(linear(x, *layer.gate_up)), *layer.down)
        assert residual is not None  # a model has layers
        x = add_rms_norm(x[logit_rows], residual[logit_rows], self.model.norm.weight, eps)[0]
        return linear(x, *self.lm_head.tensors())

    def shard_sizes(self, fused: str) -> list[int]:
        c = self.config
        if fused == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the (fused) parameters; returns the parameter names filled."""
        params = dict(self.named_parameters())
        filled: set[str] = set()
        for name, tensor in weights:
            # Old checkpoints saved the rope buffer; tied ones may carry a copy of the embedding.
            if name.endswith("rotary_emb.inv_freq") or (
                name == "lm_head.weight" and self.config.tie_word_embeddings
            ):
                continue
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            fused, shard = PACKED_MODULES.get(proj, (proj, None))
            module = f"{parent}.{fused}" if parent else fused
            param = params.get(f"{module}.{leaf}")
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
            target = param.data
            key = f"{module}.{leaf}"
            if shard is not None:
                sizes = self.shard_sizes(fused)
                target = target[sum(sizes[:shard]) : sum(sizes[: shard + 1])]
                key += f"#{shard}"
            _copy_checked(name, target, tensor)
            filled.add(key)
        return filled

    def expected_weights(self) -> set[str]:
        """Everything `load_weights` must fill: fused parameters count once per shard."""
        expected = set()
        for name, _ in self.named_parameters():
            fused = name.rsplit(".", 2)[-2]
            if fused in ("qkv_proj", "gate_up_proj"):
                expected |= {f"{name}#{i}" for i in range(len(self.shard_sizes(fused)))}
            else:
                expected.add(name)
        return expected
