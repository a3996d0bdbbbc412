"""The LLMEngine API the server drives: requests in, per-step outputs, aborts, stops, stats."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import assert_all_blocks_free, random_prompts

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import FinishReason, RequestOutput, SamplingParams
from kubeinfer_runtime.tiny_model import make_tiny_model

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def drain(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    """Step until idle; every output, grouped by request."""
    outputs: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_outputs_carry_tokens_text_counts_and_timings(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    prompt = engine.tokenizer.encode("The river runs past the old mill")
    engine.add_request("a", prompt, GREEDY, arrival_time=0.0)
    outs = drain(engine)["a"]
    tokens = [t for o in outs for t in o.new_token_ids]
    assert len(tokens) == 24 and all(len(o.new_token_ids) == 1 for o in outs)
    last = outs[-1]
    assert last.finished and last.finish_reason is FinishReason.LENGTH
    assert [o.finished for o in outs[:-1]] == [False] * 23
    assert last.num_prompt_tokens == len(prompt) and last.num_output_tokens == 24
    assert "".join(o.new_text for o in outs) == engine.tokenizer.decode(tokens)
    assert last.arrival_time == 0.0 < last.first_scheduled_time <= last.first_token_time
    times = [t for o in outs for t in o.token_times]
    assert times == sorted(times) and times[0] == last.first_token_time
    assert_all_blocks_free(engine)


def test_abort_frees_blocks_and_the_next_step_reports_it(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(max_num_seqs=1)
    prompts = random_prompts([40, 40])
    engine.add_request("running", prompts[0], GREEDY)
    engine.add_request("waiting", prompts[1], GREEDY)
    engine.step()
    assert engine.stats().num_running == 1 and engine.stats().num_waiting == 1
    assert engine.stats().kv_usage > 0
    engine.abort_request("running")
    engine.abort_request("waiting")
    engine.abort_request("waiting")  # idempotent
    engine.abort_request("never-existed")
    outs = engine.step()
    assert {o.request_id: (o.finished, o.finish_reason, o.new_token_ids) for o in outs} == {
        "running": (True, FinishReason.ABORT, []),
        "waiting": (True, FinishReason.ABORT, []),
    }
    assert not engine.has_unfinished_requests()
    assert_all_blocks_free(engine)


def test_many_requests_finishing_or_aborted_leave_no_block_behind(
    make_engine: Callable[..., LLMEngine],
) -> None:
    engine = make_engine(kv_cache_tokens=512, max_model_len=256, max_num_batched_tokens=64)
    prompts = random_prompts([5 + 9 * i for i in range(20)], shared_prefix=40)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=5 + i, temperature=0.0, ignore_eos=True))
    for step in range(400):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        if step % 3 == 0:
            engine.abort_request(str(step % 20))
    assert not engine.has_unfinished_requests()
    assert engine.stats().preemptions_total > 0 and engine.stats().prefix_cache_hits_total > 0
    assert_all_blocks_free(engine)


def test_stop_string_ends_output_and_is_never_streamed(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    prompt = engine.tokenizer.encode("Bakers start work long before sunrise.")
    engine.add_request("full", prompt, GREEDY)
    full_text = "".join(o.new_text for o in drain(engine)["full"])
    stop = full_text[10:13]
    cut = full_text.index(stop)
    engine.add_request(
        "stopped", prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=(stop,))
    )
    outs = drain(engine)["stopped"]
    assert outs[-1].finish_reason is FinishReason.STOP
    assert "".join(o.new_text for o in outs) == full_text[:cut]
    assert all(stop not in o.new_text for o in outs)


def test_stop_token_and_eos_end_output(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    prompt = random_prompts([12])[0]
    greedy = engine.generate([prompt], GREEDY)[0]
    target = greedy[5]
    first = greedy.index(target)
    engine.add_request(
        "stop-id", prompt, SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(target,))
    )
    outs = drain(engine)["stop-id"]
    assert [t for o in outs for t in o.new_token_ids] == greedy[: first + 1]
    assert outs[-1].finish_reason is FinishReason.STOP
    engine.eos_token_ids = frozenset({target})
    assert engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0)) == [greedy[: first + 1]]
    assert engine.generate([prompt], GREEDY) == [greedy]  # ignore_eos


def test_max_model_len_ends_output_with_length(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(max_model_len=40)
    assert engine.max_model_len == 40
    outs = engine.generate(
        random_prompts([30]), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    )
    assert len(outs[0]) == 10


def test_bad_requests_are_refused_with_the_reason(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(max_model_len=64)
    engine.add_request("a", [5, 6], GREEDY)
    with pytest.raises(ValueError, match="'a' is already in use"):
        engine.add_request("a", [5, 6], GREEDY)
    with pytest.raises(ValueError, match="prompt has 64 tokens but max_model_len is 64"):
        engine.add_request("b", [5] * 64, GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("c", [], GREEDY)
    with pytest.raises(ValueError, match="vocab_size"):
        engine.add_request("d", [10**6], GREEDY)
    with pytest.raises(ValueError, match="top_p"):
        engine.add_request("e", [5], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("f", [5], SamplingParams(max_tokens=0))


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    prompts = random_prompts([7, 19, 33])
    seeded = [SamplingParams(max_tokens=16, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    first = engine.generate(prompts, seeded)
    # Same seeds, other batch company and order: same tokens.
    again = engine.generate([prompts[2], prompts[0]], [seeded[2], seeded[0]])
    assert again == [first[2], first[0]]
    assert (
        first[0]
        != engine.generate(
            [prompts[0]], SamplingParams(max_tokens=16, temperature=1.0, seed=9, ignore_eos=True)
        )[0]
    )
    greedy = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    top1 = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.5, top_k=1, ignore_eos=True))
    assert top1 == greedy != first


def test_priority_policy_serves_the_most_important_request_first(
    make_engine: Callable[..., LLMEngine],
) -> None:
    engine = make_engine(scheduling_policy="priority", max_num_seqs=1)
    for request_id, priority in (("low", 5), ("high", -1), ("mid", 0)):
        engine.add_request(
            request_id, [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0), priority=priority
        )
    finished = [o.request_id for _ in range(20) for o in engine.step() if o.finished]
    assert finished == ["high", "mid", "low"]


def test_kv_cache_reports_its_capacity(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(kv_cache_tokens=1000, block_size=16)
    stats = engine.stats()
    assert stats.num_blocks_total == stats.num_blocks_free == 62
    assert stats.kv_capacity_tokens == 62 * 16
    config = engine.model_config
    assert (
        engine.model_runner.kv_plan.bytes_per_token
        == 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    )


def test_max_model_len_beyond_the_cache_is_refused(gqa_dir: Path) -> None:
    with pytest.raises(ValueError, match="max_model_len 512 does not fit the KV cache"):
        LLMEngine.from_model_dir(gqa_dir, kv_cache_tokens=256, max_model_len=512, num_threads=1)


def test_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(
        ValueError, match="unsupported architecture 'MistralForCausalLM'; supported: LlamaForCausalLM"
    ):
        LLMEngine.from_model_dir(model_dir)


def test_float16_on_cpu_is_refused(gqa_dir: Path) -> None:
    with pytest.raises(ValueError, match="float16 is only supported on CUDA"):
        LLMEngine.from_model_dir(gqa_dir, device="cpu", dtype="fp16")
