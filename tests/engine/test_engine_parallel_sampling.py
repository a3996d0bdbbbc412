"""n > 1: one prefill of the prompt, whose KV blocks the other sequences share through the prefix cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine_helpers import assert_all_blocks_free, random_prompts

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import RequestOutput, SamplingParams

PROMPT = random_prompts([40], seed=11)[0]  # two full blocks of 16 and a partial one


def drain(engine: LLMEngine) -> list[RequestOutput]:
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def by_sequence(outs: list[RequestOutput], request_id: str) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for out in outs:
        if out.request_id == request_id:
            tokens.setdefault(out.index, []).extend(out.new_token_ids)
    return tokens


def test_other_sequences_start_from_the_prompts_cached_blocks(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=8, n=4, seed=3, ignore_eos=True))
    first = engine.step()  # the prompt's prefill: only the first sequence runs
    assert [(o.index, len(o.new_token_ids)) for o in first] == [(0, 1)]
    outs = first + engine.step()
    shared = engine.sequences["r"][0].block_table[:2]
    assert [engine.block_manager.ref_counts[b] for b in shared] == [4, 4]  # one copy, four readers
    outs += drain(engine)
    cached = {o.index: o.num_cached_prompt_tokens for o in outs if o.finished}
    assert cached == {0: 0, 1: 32, 2: 32, 3: 32}  # each recomputes only the partial last block
    assert engine.stats().prefix_cache_hits_total == 3 * 32
    assert {len(t) for t in by_sequence(outs, "r").values()} == {8}
    assert [o.request_finished for o in outs].count(True) == 1 and outs[-1].request_finished
    assert_all_blocks_free(engine)


def test_seeded_sequences_are_the_requests_seed_plus_their_index(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """As in vLLM: sequence i of a request with seed s samples as a lone request with seed s + i."""
    params = SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True)
    engine = make_engine()
    engine.add_request("n3", PROMPT, SamplingParams(max_tokens=10, n=3, seed=7, ignore_eos=True))
    together = by_sequence(drain(engine), "n3")
    alone = [make_engine().generate([PROMPT], replace(params, seed=7 + i))[0] for i in range(3)]
    assert [together[i] for i in range(3)] == alone
    assert len({tuple(t) for t in alone}) == 3


def test_greedy_sequences_are_identical_with_or_without_prefix_caching(
    make_engine: Callable[..., LLMEngine],
) -> None:
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    expected = make_engine().generate([PROMPT], greedy)[0]
    for caching in (True, False):
        engine = make_engine(enable_prefix_caching=caching)
        engine.add_request("g", PROMPT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=3))
        assert list(by_sequence(drain(engine), "g").values()) == [expected] * 3
        assert_all_blocks_free(engine)


def test_abort_ends_every_sequence_and_frees_the_shared_blocks(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine()
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=50, n=3, ignore_eos=True))
    engine.add_request("b", PROMPT, SamplingParams(max_tokens=50, n=2, ignore_eos=True))
    engine.step()  # "b"'s siblings still wait for its first token; "a"'s have not started either
    engine.abort_request("b")
    engine.step()
    engine.step()
    engine.abort_request("a")
    finished = [o for o in drain(engine) if o.finished]
    assert {(o.request_id, o.index) for o in finished} == {("a", 0), ("a", 1), ("a", 2)}
    assert_all_blocks_free(engine)
