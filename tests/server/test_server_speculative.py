"""`--speculative ngram` on a live server: the same greedy text as without it, streamed or not, and
its acceptance counted in /metrics; without the flag nothing is drafted."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from runtime_server_process import SERVED_MODEL, LiveServer

pytestmark = pytest.mark.slow

# Token-id prompts whose greedy continuations (random weights) fall into loops the drafter copies.
PROMPTS = [[40, 41] * 9, [11, 12, 13, 14, 15] * 6, [466, 245, 392, 687] * 3]
OPTIONS = {"max_tokens": 40, "temperature": 0.0, "extra_body": {"ignore_eos": True}}


def test_speculative_server_gives_the_plain_servers_text_and_counts_acceptance(
    launch: Callable[..., LiveServer],
) -> None:
    plain = launch()
    spec = launch("--speculative", "ngram", "--num-speculative-tokens", "4")
    plain.wait_ready()
    spec.wait_ready()
    before = spec.metrics()
    for prompt in PROMPTS:
        expected = plain.client().completions.create(model=SERVED_MODEL, prompt=prompt, **OPTIONS)
        got = spec.client().completions.create(model=SERVED_MODEL, prompt=prompt, **OPTIONS)
        assert got.choices[0].text == expected.choices[0].text
        assert got.usage.completion_tokens == 40
        stream = spec.client().completions.create(model=SERVED_MODEL, prompt=prompt, stream=True, **OPTIONS)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == expected.choices[0].text
    after = spec.metrics()

    def delta(name: str) -> float:
        key = (name, frozenset())
        return after[key] - before.get(key, 0.0)

    drafted, accepted = (
        delta("kubeinfer_spec_decode_draft_tokens_total"),
        delta("kubeinfer_spec_decode_accepted_tokens_total"),
    )
    assert 0 < accepted <= drafted
    ratio = after[("kubeinfer_spec_decode_acceptance_ratio", frozenset())]
    assert 0 < ratio <= 1
    assert plain.metrics()[("kubeinfer_spec_decode_draft_tokens_total", frozenset())] == 0  # off by default
