"""Log-probabilities of prompt and output tokens against transformers' log_softmax on the same weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import assert_all_blocks_free, random_prompts
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import RequestOutput, SamplingParams, TokenLogprob

pytestmark = pytest.mark.slow

PROMPTS = random_prompts([1, 2, 15, 16, 17, 40], seed=5, shared_prefix=16)
TOP = 5
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP)


def run(engine: LLMEngine, params: SamplingParams) -> dict[str, list[RequestOutput]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def reference_logprobs(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax at every position of `token_ids` (row p predicts token p + 1)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.inference_mode():
        return model(torch.tensor([token_ids]), use_cache=False).logits[0].float().log_softmax(-1)


def assert_matches(got: TokenLogprob, row: torch.Tensor, token: int) -> None:
    assert got.token_id == token
    assert got.logprob == pytest.approx(row[token].item(), abs=1e-4)
    values, ids = row.topk(TOP)
    assert [t for t, _ in got.top] == ids.tolist()
    torch.testing.assert_close(torch.tensor([v for _, v in got.top]), values, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "settings",
    [{}, {"max_num_batched_tokens": 7}, {"kv_cache_tokens": 96, "max_model_len": 64}],
    ids=["one-prefill", "chunked-prefill", "preemption"],
)
def test_prompt_and_output_logprobs_equal_transformers(
    settings: dict[str, object], make_engine: Callable[..., LLMEngine], gqa_dir: Path
) -> None:
    engine = make_engine(**settings)
    outputs = run(engine, PARAMS)
    for i, prompt in enumerate(PROMPTS):
        outs = outputs[str(i)]
        generated = [t for o in outs for t in o.new_token_ids]
        reference = reference_logprobs(gqa_dir, prompt + generated)
        prompt_logprobs = outs[0].prompt_logprobs
        assert prompt_logprobs is not None and len(prompt_logprobs) == len(prompt)
        assert prompt_logprobs[0] is None  # nothing predicts the first token
        for p in range(1, len(prompt)):
            assert_matches(prompt_logprobs[p], reference[p - 1], prompt[p])  # type: ignore[arg-type]
        assert all(o.prompt_logprobs is None for o in outs[1:])  # sent once
        logprobs = [lp for o in outs for lp in o.new_logprobs]
        assert len(logprobs) == len(generated) == PARAMS.max_tokens
        for k, (lp, token) in enumerate(zip(logprobs, generated, strict=True)):
            assert_matches(lp, reference[len(prompt) - 1 + k], token)
        assert outs[-1].cumulative_logprob == pytest.approx(sum(lp.logprob for lp in logprobs), abs=1e-4)
    if "kv_cache_tokens" in settings:
        assert engine.stats().preemptions_total > 0
    assert_all_blocks_free(engine)


def test_logprobs_do_not_change_greedy_tokens(make_engine: Callable[..., LLMEngine]) -> None:
    plain = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with_logprobs = make_engine().generate(PROMPTS, PARAMS)
    assert with_logprobs == make_engine().generate(PROMPTS, plain)


def test_sampled_logprobs_are_of_the_raw_distribution(make_engine: Callable[..., LLMEngine]) -> None:
    """Temperature changes which tokens are drawn, not the reported logprobs (vLLM's raw logprobs)."""
    engine = make_engine()
    hot = SamplingParams(max_tokens=4, temperature=1.5, seed=1, ignore_eos=True, logprobs=0)
    prompt = PROMPTS[3]
    engine.add_request("hot", prompt, hot)
    outs = [o for _ in range(8) for o in engine.step()]
    logprobs = [lp for o in outs for lp in o.new_logprobs]
    assert [lp.token_id for lp in logprobs] == [t for o in outs for t in o.new_token_ids]
    assert all(lp.top == () for lp in logprobs)
    # The first output token's logprob under the plain softmax of the last prompt position.
    scoring = SamplingParams(max_tokens=1, prompt_logprobs=0)
    engine.add_request("prompt", [*prompt, logprobs[0].token_id], scoring)
    (scored,) = [o for _ in range(3) for o in engine.step() if o.prompt_logprobs]
    assert scored.prompt_logprobs[-1].logprob == pytest.approx(logprobs[0].logprob, abs=1e-5)  # type: ignore[index, union-attr]
