"""n > 1, best_of and batched prompts through the real `openai` client: choices, indices, honest usage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from runtime_server_process import SERVED_MODEL, running_server

pytestmark = pytest.mark.slow

SAMPLED = {"temperature": 1.0, "seed": 5, "extra_body": {"ignore_eos": True}}
PROMPT = "A long line of people waited outside the station for the first train of the day"


@pytest.fixture(scope="module")
def client(tiny_model: Path, server_logs: Path) -> Iterator[openai.OpenAI]:
    with running_server(tiny_model, server_logs, "--max-model-len", "256") as server:
        yield server.client()


def test_chat_n_returns_n_choices_and_counts_the_prompt_once(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=messages, max_tokens=7, n=3, **SAMPLED
    )
    single = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=7, **SAMPLED)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens
    assert reply.usage.completion_tokens == 3 * 7
    assert reply.choices[0].message.content == single.choices[0].message.content  # the same seed
    assert len({c.message.content for c in reply.choices}) == 3
    # The prompt was new: the first sequence computed it, and its cache hits for the other two are
    # the engine's own sharing, not a prompt the client had sent before.
    assert (
        reply.usage.prompt_tokens_details.cached_tokens
        == 0
        < single.usage.prompt_tokens_details.cached_tokens
    )


def test_streamed_n_interleaves_choices_and_matches_the_whole_reply(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=SERVED_MODEL, prompt=PROMPT, max_tokens=6, n=2, **SAMPLED)
    stream = client.completions.create(
        model=SERVED_MODEL,
        prompt=PROMPT,
        max_tokens=6,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        **SAMPLED,
    )
    chunks = list(stream)
    texts = {0: "", 1: ""}
    finish = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {0: "length", 1: "length"}
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_best_of_returns_the_most_likely_of_its_sequences(client: openai.OpenAI) -> None:
    options = {"model": SERVED_MODEL, "prompt": PROMPT, "max_tokens": 5, **SAMPLED}
    every = client.completions.create(n=4, logprobs=0, **options)
    ranked = sorted(every.choices, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    best = client.completions.create(best_of=4, n=2, **options)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert best.choices[0].logprobs is None  # not asked for, though used for the ranking
    assert best.usage.completion_tokens == 4 * 5  # every generated token counts


def test_a_batch_of_prompts_gets_n_choices_each_in_prompt_order(client: openai.OpenAI) -> None:
    prompts = ["The cat sat on", "Rain fell over the hills"]
    batch = client.completions.create(model=SERVED_MODEL, prompt=prompts, max_tokens=4, n=2, **SAMPLED)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    for k, prompt in enumerate(prompts):
        alone = client.completions.create(model=SERVED_MODEL, prompt=prompt, max_tokens=4, n=2, **SAMPLED)
        assert [c.text for c in batch.choices[2 * k : 2 * k + 2]] == [c.text for c in alone.choices]
    singles = [
        client.completions.create(model=SERVED_MODEL, prompt=p, max_tokens=4, **SAMPLED) for p in prompts
    ]
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == 4 * 4


def test_best_of_that_cannot_be_honoured_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model=SERVED_MODEL, prompt="hi", best_of=2, n=3)
    with pytest.raises(openai.BadRequestError, match="streamed"):
        client.completions.create(model=SERVED_MODEL, prompt="hi", best_of=3, stream=True)
    with pytest.raises(openai.BadRequestError) as zero:
        client.completions.create(model=SERVED_MODEL, prompt="hi", n=0)
    assert zero.value.param == "n"
