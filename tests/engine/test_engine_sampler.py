"""Sampler: greedy, top-k / top-p masks, temperature, and seeds that make sampling reproducible."""

from __future__ import annotations

import torch

from kubeinfer_runtime.engine.sampler import sample
from kubeinfer_runtime.engine.types import SamplingParams


def rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


LOGITS = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]))


def draw(params: SamplingParams, n: int = 2000, seed: int = 0) -> torch.Tensor:
    """Token counts over n draws from the first row of LOGITS."""
    generator = rng(seed)
    tokens = [sample(LOGITS[:1], [params], [None], generator)[0] for _ in range(n)]
    return torch.bincount(torch.tensor(tokens), minlength=4)


def test_temperature_zero_is_argmax() -> None:
    greedy = SamplingParams(temperature=0.0)
    assert sample(LOGITS, [greedy, greedy], [None, None], rng()) == [3, 0]


def test_top_k_1_is_greedy_whatever_the_temperature() -> None:
    assert draw(SamplingParams(temperature=5.0, top_k=1), n=200).tolist() == [0, 0, 0, 200]


def test_temperature_one_follows_the_softmax() -> None:
    freq = draw(SamplingParams(temperature=1.0), n=4000).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.03, rtol=0)


def test_top_k_and_top_p_keep_only_the_head_of_the_distribution() -> None:
    assert draw(SamplingParams(temperature=1.0, top_k=2))[:2].tolist() == [0, 0]
    # top_p=0.5: 0.4 alone is below it, 0.4 + 0.3 reaches it, so tokens 3 and 2 remain.
    counts = draw(SamplingParams(temperature=1.0, top_p=0.5))
    assert counts[:2].tolist() == [0, 0] and counts[2] > 0 and counts[3] > 0


def test_a_seed_reproduces_tokens_whatever_shares_the_batch() -> None:
    seeded = SamplingParams(temperature=1.0, seed=7)
    other = SamplingParams(temperature=1.0)
    logits = torch.randn(3, 50, generator=rng(1))

    def run(rows: list[int]) -> list[int]:
        generators = {0: torch.Generator().manual_seed(7)}
        tokens = []
        for _ in range(20):
            params = [seeded if r == 0 else other for r in rows]
            gens = [generators.get(r) for r in rows]
            out = sample(logits[rows], params, gens, rng(99 + len(tokens)))
            tokens.append(out[rows.index(0)])
        return tokens

    alone = run([0])
    assert run([1, 0, 2]) == alone
    assert len(set(alone)) > 1  # it really sampled
