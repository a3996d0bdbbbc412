"""Speculative decoding by prompt lookup (engine/spec_decode.py): exact against transformers when
greedy, the target distribution when sampled, and the KV cache rolled back to the accepted tokens."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import Reference, assert_all_blocks_free, random_prompts, references
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.config import EngineConfig
from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.spec_decode import NgramIndex, verify_greedy, verify_sampled
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models import fused_ops

MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
# Random prompts (random-weight models fall into loops under greedy decoding: their own output gives
# drafts) and prompts that repeat a span (drafts from the prompt), around block boundaries.
PROMPTS = [
    *random_prompts([1, 3, 15, 16, 17, 33, 64, 100], seed=5),
    [11, 12, 13, 14, 15] * 6,
    [40, 41] * 9,
    random_prompts([20], seed=9)[0] * 3,
]
SPEC = {"speculative": "ngram", "num_speculative_tokens": 3}


def chi_square_p_value(observed: list[int], expected_probs: list[float]) -> float:
    """Pearson's goodness-of-fit test; cells expected under 5 times are pooled into one."""
    total = sum(observed)
    cells: list[tuple[float, float]] = []
    pooled_obs = pooled_exp = 0.0
    for obs, prob in zip(observed, expected_probs, strict=True):
        if prob * total < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + prob * total
        else:
            cells.append((obs, prob * total))
    if pooled_exp > 0:
        cells.append((pooled_obs, pooled_exp))
    statistic = sum((o - e) ** 2 / e for o, e in cells)
    dof = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))


# --- the drafter and the acceptance rules, as pure functions ---------------------------------


def test_ngram_draft_continues_the_latest_occurrence_of_the_longest_suffix() -> None:
    index = NgramIndex(min_n=1, max_n=3)
    # Suffix [7, 8, 9] occurs once before (followed by 1, 2); [8, 9] alone later (followed by 5).
    tokens = [7, 8, 9, 1, 2, 3, 8, 9, 5, 6, 7, 8, 9]
    assert index.propose(tokens, 2) == [1, 2]
    assert index.propose([*tokens, 4], 3) == []  # 4 never occurred before
    assert NgramIndex(1, 1).propose(tokens, 3) == [5, 6, 7]  # unigram 9: latest earlier occurrence


def test_ngram_index_grown_step_by_step_proposes_what_a_fresh_one_does() -> None:
    tokens = random_prompts([300], seed=1)[0][:40] * 3 + [5, 6]
    grown = NgramIndex(2, 4)
    for end in range(1, len(tokens) + 1):
        assert grown.propose(tokens[:end], 4) == NgramIndex(2, 4).propose(tokens[:end], 4)


def test_ngram_draft_never_matches_the_suffix_itself() -> None:
    assert NgramIndex(1, 4).propose([1, 2, 3], 5) == []
    assert NgramIndex(1, 4).propose([3, 3], 5) == [3]  # the first 3 is an earlier occurrence


def test_greedy_acceptance_keeps_the_agreeing_prefix_then_the_targets_token() -> None:
    assert verify_greedy([5, 6, 9, 1], [5, 6, 7]) == [5, 6, 9]
    assert verify_greedy([4, 6, 7, 1], [5, 6, 7]) == [4]
    assert verify_greedy([5, 6, 7, 1], [5, 6, 7]) == [5, 6, 7, 1]  # all accepted, plus the bonus


def test_rejection_sampling_emits_each_position_from_the_target_distribution() -> None:
    """With q one-hot on the draft, every emitted token must be distributed as the target's p at its
    position (given the tokens before it), whether it is an accepted draft token, the residual sample
    after a rejection, or the bonus token. A chi-square test per position, with a fixed seed."""
    vocab, trials = 6, 20000
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor(
        [
            [0.50, 0.20, 0.10, 0.10, 0.05, 0.05],  # draft 0: likely
            [0.05, 0.15, 0.40, 0.20, 0.10, 0.10],  # draft 2
            [0.30, 0.10, 0.00, 0.10, 0.40, 0.10],  # draft 0; token 2 masked out (as top-k does)
            [0.20, 0.20, 0.20, 0.10, 0.10, 0.20],  # the bonus position
        ]
    )
    draft = [0, 2, 0]
    emitted = [verify_sampled(probs, draft, gen) for _ in range(trials)]
    for position in range(4):
        # Outputs that got this far with the draft's tokens before it: the next token is from p.
        reached = [
            out[position] for out in emitted if len(out) > position and out[:position] == draft[:position]
        ]
        assert len(reached) > 500
        counts = Counter(reached)
        p = chi_square_p_value([counts[t] for t in range(vocab)], probs[position].tolist())
        assert p > 1e-3, (position, counts, probs[position])


def test_speculative_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="speculative must be one of"):
        EngineConfig(model="m", speculative="eagle")
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        EngineConfig(model="m", speculative="ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="ngram_max"):
        EngineConfig(model="m", ngram_min=3, ngram_max=2)


# --- the engine: greedy against transformers -------------------------------------------------


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Callable[[str], Path]) -> Callable[[str], Reference]:
    return references(tiny_model_dir, PROMPTS, MAX_TOKENS)


def assert_cache_holds_only_accepted_tokens(engine: LLMEngine) -> None:
    """After a step, each running sequence holds the blocks of its computed tokens and no more (the
    rejected drafts' blocks are back), and every block's references are those of the block tables."""
    bs, blocks = engine.block_manager.block_size, engine.block_manager
    for seq in engine.scheduler.running:
        assert len(seq.block_table) == -(-seq.num_computed_tokens // bs), seq
    held = Counter(b for seq in engine.scheduler.running for b in seq.block_table)
    assert all(blocks.ref_counts[b] == n for b, n in held.items())
    assert sum(blocks.ref_counts) == sum(held.values())
    assert blocks.num_free_blocks == blocks.num_blocks - len(held)


def generate_in_waves(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Half the requests first, the rest while those decode (and speculate): prefills and drafted
    decodes share steps. Checks the cache accounting after every step."""
    results: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    half = len(prompts) // 2
    for i in range(half):
        engine.add_request(str(i), prompts[i], params)
    for step in itertools.count():
        if step == 3:
            for i in range(half, len(prompts)):
                engine.add_request(str(i), prompts[i], params)
        if step > 3 and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            results[out.request_id] += out.new_token_ids
        assert_cache_holds_only_accepted_tokens(engine)
    return [results[str(i)] for i in range(len(prompts))]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llama-gqa", "qwen2-bias"])
def test_greedy_speculation_gives_transformers_tokens_and_frees_every_block(
    preset: str, make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    engine = make_engine(preset, **SPEC)
    assert generate_in_waves(engine, PROMPTS, GREEDY) == reference(preset).tokens
    stats = engine.stats()
    # Both outcomes happened: drafts accepted (several tokens in a step) and drafts rejected.
    assert 0 < stats.spec_accepted_tokens_total < stats.spec_draft_tokens_total
    assert stats.spec_accepted_tokens_total >= 5
    assert_all_blocks_free(engine)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        {"max_num_seqs": 1},  # <= 4 rows: every layer one fused C++ call (fused_ops.decode_layer)
        {"cpu_kernels": False},  # the eager path, as on CUDA
        {"kv_cache_tokens": 256, "max_model_len": 256, "max_num_batched_tokens": 20},  # preemption
        {"num_speculative_tokens": 7, "ngram_min": 1, "ngram_max": 2, "enable_prefix_caching": False},
    ],
    ids=["fused-decode-layer", "eager", "preemption-chunked", "long-drafts-no-prefix-cache"],
)
def test_speculation_never_changes_greedy_tokens(
    settings: dict[str, object], make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    engine = make_engine(**{**SPEC, **settings})
    try:
        assert engine.generate(PROMPTS, GREEDY) == reference("llama-gqa").tokens
        assert engine.stats().spec_accepted_tokens_total > 0
        if "kv_cache_tokens" in settings:
            assert engine.stats().preemptions_total > 0
        assert_all_blocks_free(engine)
    finally:
        fused_ops.use_cpu_kernels(True)  # the switch is per process: back on for the other tests


@pytest.mark.slow
def test_max_tokens_and_stop_tokens_end_a_speculated_output_where_plain_decoding_does(
    make_engine: Callable[..., LLMEngine], reference: Callable[[str], Reference]
) -> None:
    """Prompt 9's greedy output loops (drafts accepted from its 4th token on): every max_tokens, and
    a stop token first emitted at a position a draft was verified for, end the output on the spot."""
    expected = reference("llama-gqa").tokens[9]
    spec = make_engine(**SPEC)
    for max_tokens in range(1, MAX_TOKENS + 1):
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        assert spec.generate([PROMPTS[9]], params) == [expected[:max_tokens]]
    assert spec.stats().spec_accepted_tokens_total > 0
    stop_at = next(i for i in range(4, MAX_TOKENS) if expected[i] not in expected[:i])
    stop = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, stop_token_ids=[expected[stop_at]])
    assert spec.generate([PROMPTS[9]], stop) == [expected[: stop_at + 1]]  # the stop token, then no more
    assert_all_blocks_free(spec)


# --- the engine: sampling keeps the target distribution --------------------------------------


@pytest.mark.slow
def test_sampled_speculation_draws_from_transformers_distribution(
    make_engine: Callable[..., LLMEngine],
    tiny_model_dir: Callable[[str], Path],
    reference: Callable[[str], Reference],
) -> None:
    """The first 4 tokens of 1500 sampled continuations (top_k=2, so 16 possible outputs) against the
    exact probabilities of each, computed from transformers' logits. The prompt ends in the loop the
    model's greedy output falls into, so drafts are proposed at every decode step, often accepted and
    often rejected (both counted); a chi-square test with a fixed seed decides."""
    prompt = PROMPTS[9] + reference("llama-gqa").tokens[9][:7]  # ... 245 392 687 245 392 687
    params = SamplingParams(max_tokens=4, temperature=1.0, top_k=2, ignore_eos=True)
    engine = make_engine(**SPEC)
    outputs = engine.generate([prompt] * 1500, params)
    stats = engine.stats()
    rejected = stats.spec_draft_tokens_total - stats.spec_accepted_tokens_total
    assert stats.spec_accepted_tokens_total > 500 and rejected > 500, stats

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama-gqa"), dtype=torch.float32)

    def top2(prefix: list[int]) -> dict[int, float]:
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + prefix]), use_cache=False).logits[0, -1]
        values, ids = logits.topk(2)
        return dict(zip(ids.tolist(), values.softmax(dim=-1).tolist(), strict=True))

    exact: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(4):
        exact = {(*seq, t): p * q for seq, p in exact.items() for t, q in top2(list(seq)).items()}
    counts = Counter(tuple(out) for out in outputs)
    assert set(counts) <= set(exact)  # nothing outside the top-2 tree was ever emitted
    keys = sorted(exact)
    p = chi_square_p_value([counts[k] for k in keys], [exact[k] for k in keys])
    assert p > 1e-3, (p, counts, exact)
