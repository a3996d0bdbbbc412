"""Sampling parameters beyond temperature / top-p / top-k: vLLM's min_tokens, repetition_penalty
(against transformers' own processor), stop_token_ids, skip_special_tokens, and OpenAI's presence
and frequency penalties."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import random_prompts
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.logits import constrain
from kubeinfer_runtime.engine.sequence import Sequence
from kubeinfer_runtime.engine.types import FinishReason, SamplingParams
from kubeinfer_runtime.tokenizer import Tokenizer

PROMPTS = random_prompts([6, 20, 33], seed=21)


def outputs(
    engine: LLMEngine, prompt: list[int], params: SamplingParams
) -> tuple[list[int], FinishReason | None]:
    engine.add_request("r", prompt, params)
    tokens, reason = [], None
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.new_token_ids
            reason = out.finish_reason
    return tokens, reason


def test_min_tokens_holds_back_stop_tokens(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    first = outputs(engine, PROMPTS[0], greedy)[0][0]
    # The greedy first token as a stop token ends the output at once...
    stop_at_once = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first,))
    assert outputs(engine, PROMPTS[0], stop_at_once) == ([first], FinishReason.STOP)
    # ...unless min_tokens masks it (and EOS) for the first 4 tokens.
    held = SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(first,), min_tokens=4)
    tokens, _ = outputs(engine, PROMPTS[0], held)
    assert len(tokens) >= 4 and first not in tokens[:4]
    assert not set(tokens[:4]) & engine.eos_token_ids


@pytest.mark.slow
def test_repetition_penalty_matches_transformers(
    make_engine: Callable[..., LLMEngine], gqa_dir: Path
) -> None:
    """Same rule (CTRL's, as vLLM applies it over prompt and output tokens) as transformers' processor."""
    model = AutoModelForCausalLM.from_pretrained(gqa_dir, dtype=torch.float32)
    engine = make_engine()
    penalized = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, repetition_penalty=1.8)
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    changed = []
    for prompt in PROMPTS:
        with torch.inference_mode():
            expected = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
                repetition_penalty=1.8,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        got = outputs(engine, prompt, penalized)[0]
        assert got == expected
        changed.append(got != outputs(engine, prompt, plain)[0])
    assert any(changed)  # the penalty made a difference somewhere


def test_skip_special_tokens_false_keeps_them_in_the_text(gqa_dir: Path) -> None:
    tokenizer = Tokenizer(gqa_dir)
    end = tokenizer.token_to_id("<|im_end|>")
    word = tokenizer.encode("hello", add_special_tokens=False)
    kept = tokenizer.detokenizer([5], skip_special_tokens=False)
    assert "".join(kept.step(t) for t in [*word, end]) == "hello<|im_end|>"
    skipped = tokenizer.detokenizer([5])
    assert "".join(skipped.step(t) for t in [*word, end]) == "hello"


def test_presence_and_frequency_penalties_count_output_tokens_only() -> None:
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    seq = Sequence("s", [7, 7, 3], params, 0, 0.0, 0, None, None)  # type: ignore[arg-type]
    seq.token_ids += [3, 3, 5]  # the output so far
    logits = torch.zeros(1, 10)
    out = constrain(logits, [seq], frozenset())
    expected = torch.zeros(10)
    expected[3] = -(0.5 + 2 * 0.25)  # twice in the output
    expected[5] = -(0.5 + 0.25)
    torch.testing.assert_close(out[0], expected)  # 7, only in the prompt, is not penalised
    assert torch.equal(logits, torch.zeros(1, 10))  # the input is kept
