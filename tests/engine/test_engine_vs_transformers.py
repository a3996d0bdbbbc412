"""The engine against `transformers` on the same weights: greedy tokens and prefill logits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import Reference, assert_all_blocks_free, random_prompts, references

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models import fused_ops

pytestmark = pytest.mark.slow

PRESETS = ["llama-mha", "llama-gqa", "llama-tied", "qwen2-bias", "llama3-rope"]
# 16 prompts around the block size (16) and its multiples, plus a few long ones.
LENGTHS = [1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100, 130, 200]
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
PROMPTS = random_prompts(LENGTHS, seed=3, shared_prefix=64)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Reference]:
    return references(tiny_model_dir, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_tokens_match_transformers(
    preset: str, make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    engine = make_engine(preset)
    assert engine.model_runner.cpu_kernels  # the C++ decode kernels, built by the test set-up
    assert engine.generate(PROMPTS, GREEDY) == reference(preset).tokens
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("preset", PRESETS)
def test_prefill_logits_match_transformers(
    preset: str, make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    engine = make_engine(preset)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    scheduled = engine.scheduler.schedule(now=0.0)
    assert len(scheduled.seqs) == len(PROMPTS)  # one batched prefill of every prompt
    seqs, logits, _ = engine.model_runner.execute(scheduled.seqs, scheduled.num_new_tokens)
    assert len(seqs) == len(PROMPTS)
    for seq, row in zip(seqs, logits, strict=True):
        expected = reference(preset).last_logits[int(seq.request_id)]
        torch.testing.assert_close(row, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("settings", "expect"),
    [
        ({"enable_prefix_caching": False}, "no_hits"),
        ({}, "hits"),
        ({"max_num_batched_tokens": 24}, "chunked"),
        ({"kv_cache_tokens": 256, "max_model_len": 256}, "preempted"),
        (
            {
                "kv_cache_tokens": 256,
                "max_model_len": 256,
                "max_num_batched_tokens": 20,
                "scheduling_policy": "priority",
            },
            "preempted",
        ),
    ],
    ids=["no-prefix-cache", "prefix-cache", "chunked-prefill", "preemption", "preemption-chunked-priority"],
)
def test_scheduling_settings_never_change_greedy_tokens(
    settings: dict[str, object],
    expect: str,
    make_engine: Callable[..., LLMEngine],
    reference: Callable[[str], Reference],
) -> None:
    engine = make_engine(**settings)
    expected = reference("llama-gqa").tokens
    # Twice: the second round finds the first one's blocks in the prefix cache.
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.generate(PROMPTS, GREEDY) == expected
    stats = engine.stats()
    if expect == "no_hits":
        assert stats.prefix_cache_hits_total == 0
    else:
        assert stats.prefix_cache_hits_total > 0
    if expect == "preempted":
        assert stats.preemptions_total > 0
    assert stats.prefix_cache_queries_total == 2 * sum(LENGTHS)
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("preset", ["llama-gqa", "qwen2-bias"])
def test_eager_path_without_cpu_kernels_matches_transformers(
    preset: str, make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    """The path CUDA and half precision take (eager ops, one padded attention call for every decode),
    run here on CPU with the C++ kernels turned off; the other tests run with them on."""
    engine = make_engine(preset, max_num_batched_tokens=40, cpu_kernels=False)
    try:
        assert not engine.model_runner.cpu_kernels
        assert engine.generate(PROMPTS, GREEDY) == reference(preset).tokens
        assert_all_blocks_free(engine)
    finally:
        fused_ops.use_cpu_kernels(True)  # the switch is per process: back on for the other tests


@pytest.mark.parametrize("preset", ["llama-gqa", "qwen2-bias"])
def test_weights_sliced_for_two_threads_match_transformers(
    preset: str, make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    """The CPU weight layout for two threads (column slices, one batched matmul), run on one thread:
    the layout is under test here, not the threading. Batched prefills and decodes, then a lone
    request, whose decodes are the one-row products the layout is for."""
    engine = make_engine(preset, num_threads=2)
    torch.set_num_threads(1)  # conftest's setting: tiny ops only wait on OpenMP barriers
    model = engine.model_runner.model
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape[0] == 2  # [slices, out / slices, in]
    assert model.lm_head.weight.shape[0] == 1  # its odd vocabulary (935) does not split: one block
    expected = reference(preset).tokens
    assert engine.generate(PROMPTS, GREEDY) == expected
    assert engine.generate([PROMPTS[-1]], GREEDY) == [expected[-1]]
    assert_all_blocks_free(engine)


def test_bfloat16_prefill_logits_stay_close_to_float32(
    make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    """bfloat16 on CPU (through the kernels, float32 RMSNorm statistics) against float32; the same
    path against transformers in bfloat16 is in test_engine_precisions_vs_transformers.py."""
    engine = make_engine(dtype="bfloat16")
    assert engine.model_runner.dtype == torch.bfloat16
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, GREEDY)
    scheduled = engine.scheduler.schedule(now=0.0)
    seqs, logits, _ = engine.model_runner.execute(scheduled.seqs, scheduled.num_new_tokens)
    for seq, row in zip(seqs, logits, strict=True):
        expected = reference("llama-gqa").last_logits[int(seq.request_id)]
        torch.testing.assert_close(row.float(), expected, rtol=0.02, atol=0.1)


@pytest.mark.parametrize("preset", ["llama-gqa", "qwen2-bias", "llama-tied"])
def test_few_sequence_decodes_run_each_layer_as_one_kernel_and_match_transformers(
    preset: str,
    make_engine: Callable[..., LLMEngine],
    reference: Callable[[str], Reference],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At most 3 sequences run at once, so decode-only steps take `fused_ops.decode_layer` (one C++
    call per layer); mixed steps take the op-by-op path. Both must give transformers' tokens."""
    calls = []
    fused = fused_ops.decode_layer
    monkeypatch.setattr(fused_ops, "decode_layer", lambda *args: calls.append(1) or fused(*args))
    engine = make_engine(preset, max_num_seqs=3)
    assert engine.generate(PROMPTS, GREEDY) == reference(preset).tokens
    assert calls  # the fused layers did run
    assert_all_blocks_free(engine)
