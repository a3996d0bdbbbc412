"""Weight-only int8 and bfloat16 on CPU against `transformers`.

int8: transformers runs the very weights the engine computes with (each matmul weight replaced by its
dequantized int8 values, q * scale), so greedy tokens must match exactly and logits to float32
rounding: this checks the kernels and the quantized layout, not the quantization error (that one is
measured by benchmarks/int8_accuracy.py). bfloat16: transformers in bfloat16 on the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import Reference, assert_all_blocks_free, prefill_logits, random_prompts
from torch import nn
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models import fused_ops

pytestmark = pytest.mark.slow

LENGTHS = [1, 3, 15, 16, 17, 33, 64, 130]
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
PROMPTS = random_prompts(LENGTHS, seed=5, shared_prefix=32)


def dequantized_transformers(model_dir: Path) -> nn.Module:
    """transformers' model with every matmul weight the engine quantizes replaced by q * scale."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tied = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and not (name == "lm_head" and tied):
                q, scales = fused_ops.quantize_int8(module.weight)
                module.weight.copy_(q.float() * scales[:, None])
    return model


@pytest.fixture(scope="module")
def int8_reference(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Reference]:
    made: dict[str, Reference] = {}

    def get(preset: str) -> Reference:
        if preset not in made:
            made[preset] = Reference(dequantized_transformers(tiny_model_dir(preset)), PROMPTS, MAX_TOKENS)
        return made[preset]

    return get


@pytest.mark.parametrize("preset", ["llama-gqa", "llama-tied", "qwen2-bias"])
def test_int8_greedy_tokens_and_logits_match_transformers_on_the_dequantized_weights(
    preset: str, make_engine: Callable[..., LLMEngine], int8_reference: Callable[[str], Reference]
) -> None:
    engine = make_engine(preset, quantization="int8")
    assert engine.model_runner.cpu_kernels
    model = engine.model_runner.model
    assert model.model.layers[0].mlp.down_proj.weight.dtype == torch.int8
    # A tied head is the embedding table the lookup reads: it keeps the model dtype.
    assert model.lm_head.weight.dtype == (torch.float32 if preset == "llama-tied" else torch.int8)
    reference = int8_reference(preset)
    for row, expected in zip(prefill_logits(engine, PROMPTS), reference.last_logits, strict=True):
        torch.testing.assert_close(row, expected, rtol=1e-4, atol=1e-4)
    engine = make_engine(preset, quantization="int8")
    assert engine.generate(PROMPTS, GREEDY) == reference.tokens
    assert_all_blocks_free(engine)


def test_int8_eager_path_and_two_thread_layout_match_transformers(
    make_engine: Callable[..., LLMEngine], int8_reference: Callable[[str], Reference]
) -> None:
    """Without the kernels: the torch ops CUDA runs (F.linear over the widened weight, times the
    scales). With two threads: int8 row blocks per thread, run here on one (the layout is under test)."""
    expected = int8_reference("llama-gqa").tokens
    engine = make_engine(quantization="int8", cpu_kernels=False, max_num_batched_tokens=40)
    try:
        assert not engine.model_runner.cpu_kernels
        assert engine.generate(PROMPTS, GREEDY) == expected
    finally:
        fused_ops.use_cpu_kernels(True)  # the switch is per process: back on for the other tests
    engine = make_engine(quantization="int8", num_threads=2)
    torch.set_num_threads(1)  # conftest's setting: tiny ops only wait on OpenMP barriers
    assert engine.model_runner.model.model.layers[0].mlp.gate_up_proj.weight.shape[0] == 2
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.generate([PROMPTS[-1]], GREEDY) == [expected[-1]]  # one row: the streamed product


def test_int8_halves_and_quarters_the_weight_bytes(make_engine: Callable[..., LLMEngine]) -> None:
    def matmul_bytes(engine: LLMEngine) -> int:
        layers = engine.model_runner.model.model.layers
        return sum(p.numel() * p.element_size() for p in layers.parameters() if p.dim() > 1)

    fp32 = matmul_bytes(make_engine())
    assert matmul_bytes(make_engine(quantization="int8")) == fp32 // 4
    assert matmul_bytes(make_engine(dtype="bfloat16")) == fp32 // 2


def test_quantization_must_be_known(make_engine: Callable[..., LLMEngine]) -> None:
    with pytest.raises(ValueError, match="quantization must be one of"):
        make_engine(quantization="int4")


@pytest.fixture(scope="module")
def bf16_reference(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Reference]:
    made: dict[str, Reference] = {}

    def get(preset: str) -> Reference:
        if preset not in made:
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(preset), dtype=torch.bfloat16).eval()
            made[preset] = Reference(model, PROMPTS, MAX_TOKENS)
        return made[preset]

    return get


@pytest.mark.parametrize("preset", ["llama-gqa", "qwen2-bias", "llama3-rope"])
@pytest.mark.parametrize("cpu_kernels", [True, False], ids=["kernels", "eager"])
def test_bfloat16_matches_transformers_in_bfloat16(
    preset: str,
    cpu_kernels: bool,
    make_engine: Callable[..., LLMEngine],
    bf16_reference: Callable[[str], Reference],
) -> None:
    """Prefill logits within bfloat16 rounding of transformers'; and every greedy token the engine
    picks is one transformers, fed the engine's own continuation, ranks first to within that rounding
    (two paths that sum in different orders may break a near-tie differently, after which the texts
    part ways: exact agreement is counted too and must hold for most prompts)."""
    try:
        engine = make_engine(preset, dtype="bfloat16", cpu_kernels=cpu_kernels)
        assert engine.model_runner.cpu_kernels == cpu_kernels
        reference = bf16_reference(preset)
        for row, expected in zip(prefill_logits(engine, PROMPTS), reference.last_logits, strict=True):
            assert row.dtype == torch.bfloat16
            torch.testing.assert_close(row.float(), expected.float(), rtol=0.02, atol=0.05)
        # At most 3 at once: decode-only steps of the kernel path run each layer as one call.
        engine = make_engine(preset, dtype="bfloat16", cpu_kernels=cpu_kernels, max_num_seqs=3)
        outputs = engine.generate(PROMPTS, GREEDY)
    finally:
        fused_ops.use_cpu_kernels(True)
    for prompt, tokens in zip(PROMPTS, outputs, strict=True):
        logits = reference.logits_along(prompt, tokens)
        chosen = logits.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
        assert bool((chosen >= logits.max(dim=1).values - 0.05).all()), (prompt[:4], tokens)
    exact = sum(out == ref for out, ref in zip(outputs, reference.tokens, strict=True))
    assert exact >= len(PROMPTS) - 2, f"only {exact} of {len(PROMPTS)} continuations identical"
    assert_all_blocks_free(engine)


def test_int8_few_sequence_decodes_match_transformers_through_the_fused_layer(
    make_engine: Callable[..., LLMEngine],
    int8_reference: Callable[[str], Reference],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    fused = fused_ops.decode_layer
    monkeypatch.setattr(fused_ops, "decode_layer", lambda *args: calls.append(1) or fused(*args))
    engine = make_engine("qwen2-bias", quantization="int8", max_num_seqs=2)
    assert engine.generate(PROMPTS, GREEDY) == int8_reference("qwen2-bias").tokens
    assert calls
