"""KV-cache and weights capacity planning, pure arithmetic over a model's config.json.

Used by `kubeinfer plan` and by the operator's KV-capacity check (kv_capacity.py). The memory model is vLLM's:
each GPU gives the engine `memory_utilization` of its memory; the weights, a reserve (CUDA context,
allocator slack, activations of one batched step) come out of that, and the rest is KV cache at
kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype bytes. With tensor
parallelism over N GPUs, weights and KV heads are split, so memory pools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

GIB = 1024**3
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "int8": 1,
    "int4": 0.5,
}
_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}
_DTYPE_ALIASES |= {"fp8": "float8", "float8_e4m3fn": "float8", "float8_e5m2": "float8"}
BLOCK_SIZE = 16  # KV cache tokens per block: budgets are rounded down to whole blocks
DEFAULT_RESERVE_BYTES = 1 * GIB  # CUDA context, allocator fragmentation, graphs: per GPU
DEFAULT_BATCHED_TOKENS = 2048  # tokens in one prefill chunk: sizes the activation reserve
MAX_SUGGESTED_SEQS = 256  # vLLM's default max_num_seqs: beyond it decode turns compute-bound
DEFAULT_MBU = 0.6  # memory-bandwidth utilization of a decode step (Databricks: ~55-60% at batch 1)


def _config(
    layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, ctx: int, **extra: object
) -> dict:
    """A config.json-shaped dict, so that named sizes and files are read the same way."""
    keys = (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    )
    shape = dict(zip(keys, (layers, hidden, heads, kv_heads, inter), strict=True))
    return {**shape, "vocab_size": vocab, "max_position_embeddings": ctx, "torch_dtype": "bfloat16", **extra}


# From each model's published config.json.
NAMED_CONFIGS: dict[str, dict] = {
    "llama-3-8b": _config(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama-3-70b": _config(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama-3.1-8b": _config(32, 4096, 32, 8, 14336, 128256, 131072),
    "llama-3.1-70b": _config(80, 8192, 64, 8, 28672, 128256, 131072),
    "llama-3.1-405b": _config(126, 16384, 128, 8, 53248, 128256, 131072),
    "llama-3.2-1b": _config(16, 2048, 32, 8, 8192, 128256, 131072, head_dim=64, tie_word_embeddings=True),
    "llama-3.2-3b": _config(28, 3072, 24, 8, 8192, 128256, 131072, head_dim=128, tie_word_embeddings=True),
    "mistral-7b": _config(32, 4096, 32, 8, 14336, 32768, 32768),
    "mixtral-8x7b": _config(32, 4096, 32, 8, 14336, 32000, 32768, num_local_experts=8),
    "qwen2-7b": _config(28, 3584, 28, 4, 18944, 152064, 32768, model_type="qwen2"),
    "qwen2.5-7b": _config(28, 3584, 28, 4, 18944, 152064, 32768, model_type="qwen2"),
    "qwen2.5-14b": _config(48, 5120, 40, 8, 13824, 152064, 32768, model_type="qwen2"),
    "qwen2.5-32b": _config(64, 5120, 40, 8, 27648, 152064, 32768, model_type="qwen2"),
    "qwen2.5-72b": _config(80, 8192, 64, 8, 29568, 152064, 32768, model_type="qwen2"),
}


@dataclass(frozen=True)
class Gpu:
    memory_bytes: int  # total, as nvidia-smi reports it
    bandwidth_bytes_s: float  # HBM/GDDR peak


GPUS: dict[str, Gpu] = {
    "a10": Gpu(23028 * 1024**2, 600e9),
    "l4": Gpu(23034 * 1024**2, 300e9),
    "l40s": Gpu(46068 * 1024**2, 864e9),
    "a100-40gb": Gpu(40960 * 1024**2, 1555e9),
    "a100-80gb": Gpu(81920 * 1024**2, 2039e9),
    "h100-80gb": Gpu(81559 * 1024**2, 3350e9),
    "h200": Gpu(143771 * 1024**2, 4800e9),
}


def dtype_bytes(dtype: str, field: str = "dtype") -> float:
    name = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if name not in DTYPE_BYTES:
        known = ", ".join([*DTYPE_BYTES, *_DTYPE_ALIASES])
        raise ValueError(f"{field}: unknown dtype {dtype!r}; expected one of {known}")
    return DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelShape:
    """What sizing needs from a Llama-family (dense or Mixtral-style MoE) config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 1  # all experts' weights are resident even if a token uses two
    qkv_bias: bool = False
    dtype: str = "bfloat16"
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config: Mapping, source: str = "config.json") -> ModelShape:
        config = {**config, **config.get("text_config", {})}  # multimodal configs nest the LM's shape
        for key in ("num_experts", "n_routed_experts", "kv_lora_rank"):  # Qwen-MoE, DeepSeek MoE / MLA
            if config.get(key):
                raise ValueError(
                    f"{source}: {key!r}: only dense Llama-family and Mixtral-style MoE models can be sized"
                )

        def positive(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if value is None:
                raise ValueError(f"{source}: missing {key!r}")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{source}: {key!r} must be a positive integer, got {value!r}")
            return value

        heads = positive("num_attention_heads")
        hidden = positive("hidden_size")
        if "head_dim" not in config and hidden % heads:
            raise ValueError(
                f"{source}: hidden_size {hidden} is not divisible by num_attention_heads {heads}"
            )
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        dtype_bytes(dtype, f"{source}: torch_dtype")
        return cls(
            vocab_size=positive("vocab_size"),
            hidden_size=hidden,
            intermediate_size=positive("intermediate_size"),
            num_layers=positive("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=positive("num_key_value_heads", heads),
            head_dim=positive("head_dim", hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=positive("num_local_experts", 1),
            qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
            dtype=dtype,
            max_position_embeddings=config.get("max_position_embeddings"),
        )

    @classmethod
    def named(cls, name: str) -> ModelShape:
        if name not in NAMED_CONFIGS:
            raise ValueError(f"--model: unknown model size {name!r}; known: {', '.join(NAMED_CONFIGS)}")
        return cls.from_config(NAMED_CONFIGS[name], name)

    def param_count(self) -> int:
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q_dim + 2 * kv_dim) + q_dim * self.hidden_size
        attention += (q_dim + 2 * kv_dim) if self.qkv_bias else 0
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts  # gate, up, down
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        norms = 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attention + mlp + router + norms) + embeddings + self.hidden_size

    def weight_bytes(self, dtype: str, quantization: str | None = None) -> int:
        """The weights in `dtype`; with int8 (the builtin engine's weight-only scheme) every matmul
        weight, the decoder layers' projections and an untied LM head, is one byte plus a float32
        scale per output row, and the rest (embeddings, norms, biases, router) stays in `dtype`."""
        params = self.param_count()
        if quantization is None:
            return int(params * dtype_bytes(dtype, "dtype"))
        if quantization != "int8":
            raise ValueError(f"quantization: unknown scheme {quantization!r}; expected int8")
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        head = 0 if self.tie_word_embeddings else self.vocab_size  # a tied head is the embedding table
        mlp_rows = (2 * self.intermediate_size + self.hidden_size) * self.num_experts
        rows = self.num_layers * (q_dim + 2 * kv_dim + self.hidden_size + mlp_rows) + head
        matmul = (
            self.num_layers
            * (
                self.hidden_size * (q_dim + 2 * kv_dim)
                + q_dim * self.hidden_size
                + 3 * self.hidden_size * self.intermediate_size * self.num_experts
            )
            + head * self.hidden_size
        )
        return int((params - matmul) * dtype_bytes(dtype, "dtype") + matmul + rows * DTYPE_BYTES["float32"])

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
        return int(
            2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype or self.dtype)
        )


@dataclass(frozen=True)
class Plan:
    """How a model fits on its GPUs. Bytes and tokens are totals over all `gpus`."""

    params: int
    dtype: str
    kv_dtype: str
    gpus: int
    gpu_memory_bytes: int  # per GPU
    memory_utilization: float
    context_length: int
    weights_bytes: int
    kv_bytes_per_token: int
    reserve_bytes: int
    kv_budget_bytes: int  # what is left for the KV cache (0 if nothing is)
    kv_tokens: int  # tokens that fit, whole blocks only
    seqs_at_context: int  # sequences that fit if every one reaches context_length
    avg_seq_tokens: int
    seqs_at_avg: int
    tpot_batch1_s: float | None  # roofline time per output token at batch 1, when bandwidth is known
    seqs_within_tpot: int | None  # largest batch whose roofline TPOT meets the target
    suggested_max_num_seqs: int
    suggested_kv_cache_tokens: int
    fits: bool  # one sequence of context_length fits
    notes: tuple[str, ...] = field(default=())
    quantization: str | None = None  # weight-only scheme counted in weights_bytes


def activation_reserve_bytes(shape: ModelShape, batched_tokens: int = DEFAULT_BATCHED_TOKENS) -> int:
    """Peak activations of one step: MLP gate/up and a few hidden-size buffers per token (16-bit),
    plus fp32 logits for up to MAX_SUGGESTED_SEQS sampled rows."""
    per_token = (2 * shape.intermediate_size + 4 * shape.hidden_size) * 2
    return batched_tokens * per_token + min(batched_tokens, MAX_SUGGESTED_SEQS) * shape.vocab_size * 4


def plan(
    shape: ModelShape,
    gpu_memory_bytes: int,
    *,
    gpus: int = 1,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    quantization: str | None = None,
    context_length: int | None = None,
    avg_seq_tokens: int | None = None,
    memory_utilization: float = 0.9,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    bandwidth_bytes_s: float | None = None,
    tpot_target_s: float | None = None,
    mbu: float = DEFAULT_MBU,
) -> Plan:
    """Weights, KV budget and suggested limits. `avg_seq_tokens` (prompt + output of a typical
    request, default context_length) sizes maxNumSeqs so that many sequences never need preemption;
    with a bandwidth and a TPOT target, the decode roofline caps the batch too. `quantization` int8
    counts the matmul weights at one byte (see `ModelShape.weight_bytes`)."""
    if gpu_memory_bytes <= 0:
        raise ValueError("gpu memory must be positive")
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, got {gpus}")
    if reserve_bytes < 0:
        raise ValueError(f"reserve must not be negative, got {reserve_bytes} bytes")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory utilization must be in (0, 1], got {memory_utilization:g}")
    context_length = context_length or shape.max_position_embeddings
    if not context_length or context_length < 1:
        raise ValueError("context length: the config has no max_position_embeddings; give --context-length")
    notes: list[str] = []
    if shape.max_position_embeddings and context_length > shape.max_position_embeddings:
        notes.append(
            f"context length {context_length} exceeds the model's max_position_embeddings "
            f"{shape.max_position_embeddings}"
        )
    avg_seq_tokens = min(avg_seq_tokens or context_length, context_length)
    weight_dtype = dtype or shape.dtype
    kv_dtype = kv_dtype or weight_dtype
    params = shape.param_count()
    weights = shape.weight_bytes(weight_dtype, quantization)
    kv_per_token = shape.kv_bytes_per_token(kv_dtype)
    reserve = gpus * reserve_bytes + activation_reserve_bytes(shape)
    usable = int(gpus * gpu_memory_bytes * memory_utilization)
    budget = max(0, usable - weights - reserve)
    kv_tokens = budget // kv_per_token // BLOCK_SIZE * BLOCK_SIZE
    fits = kv_tokens >= context_length
    if weights + reserve >= usable:
        notes.append(
            f"weights {weights / GIB:.2f} GiB + reserve {reserve / GIB:.2f} GiB exceed the "
            f"{usable / GIB:.2f} GiB the engine may use"
        )
    elif not fits:
        notes.append(
            f"one {context_length}-token sequence needs {context_length * kv_per_token / GIB:.2f} GiB of "
            f"KV cache; {budget / GIB:.2f} GiB is left after weights and reserve"
        )
    seqs_at_avg = kv_tokens // avg_seq_tokens
    tpot_batch1 = seqs_within_tpot = None
    if bandwidth_bytes_s:
        # A decode step reads every weight and every cached token's K and V once.
        bandwidth = gpus * bandwidth_bytes_s * mbu
        tpot_batch1 = (weights + avg_seq_tokens * kv_per_token) / bandwidth
        if tpot_target_s:
            seqs_within_tpot = max(
                0, int((tpot_target_s * bandwidth - weights) / (avg_seq_tokens * kv_per_token))
            )
            if not seqs_within_tpot:
                notes.append(
                    f"even one sequence misses TPOT {tpot_target_s * 1000:g} ms: reading the weights "
                    f"takes {weights / bandwidth * 1000:.1f} ms per token at {mbu:.0%} of peak bandwidth"
                )
    # A TPOT target no batch meets still leaves one sequence at a time (the note says it misses).
    limits = [seqs_at_avg, MAX_SUGGESTED_SEQS] + (
        [] if seqs_within_tpot is None else [max(1, seqs_within_tpot)]
    )
    return Plan(
        params=params,
        dtype=weight_dtype,
        kv_dtype=kv_dtype,
        gpus=gpus,
        gpu_memory_bytes=gpu_memory_bytes,
        memory_utilization=memory_utilization,
        context_length=context_length,
        weights_bytes=weights,
        kv_bytes_per_token=kv_per_token,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_tokens=kv_tokens,
        seqs_at_context=kv_tokens // context_length,
        avg_seq_tokens=avg_seq_tokens,
        seqs_at_avg=seqs_at_avg,
        tpot_batch1_s=tpot_batch1,
        seqs_within_tpot=seqs_within_tpot,
        suggested_max_num_seqs=min(limits) if fits else 0,
        suggested_kv_cache_tokens=kv_tokens if fits else 0,
        fits=fits,
        notes=tuple(notes),
        quantization=quantization,
    )
