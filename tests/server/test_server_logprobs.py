"""logprobs / top_logprobs (chat) and logprobs + echo (completions) through the real `openai` client,
streamed and not, against transformers' log_softmax on the same random weights."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
import torch
from runtime_server_process import SERVED_MODEL, running_server
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

EXACT = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}
PROMPT = "The baker sells fresh bread every morning"


@pytest.fixture(scope="module")
def client(tiny_model: Path, server_logs: Path) -> Iterator[openai.OpenAI]:
    with running_server(tiny_model, server_logs, "--max-model-len", "256") as server:
        yield server.client()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Tokenizer:
    return Tokenizer(tiny_model)


@pytest.fixture(scope="module")
def log_softmax(tiny_model: Path) -> Callable[[list[int]], torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)

    def at_every_position(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([token_ids]), use_cache=False).logits[0].float().log_softmax(-1)

    return at_every_position


def test_chat_logprobs_and_top_logprobs_equal_transformers(
    client: openai.OpenAI, tokenizer: Tokenizer, log_softmax
) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=messages, max_tokens=6, logprobs=True, top_logprobs=4, **EXACT
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 6
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    vocab = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
    output_ids = [vocab[bytes(e.bytes)] for e in entries]
    reference = log_softmax(prompt_ids + output_ids)
    for k, entry in enumerate(entries):
        row = reference[len(prompt_ids) - 1 + k]
        assert entry.logprob == pytest.approx(row[output_ids[k]].item(), abs=1e-4)
        values, ids = row.topk(4)
        assert [vocab[bytes(t.bytes)] for t in entry.top_logprobs] == ids.tolist()
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
        assert entry.token == bytes(entry.bytes).decode("utf-8", errors="replace")
    assert tokenizer.decode(output_ids) == reply.choices[0].message.content

    options = {"max_tokens": 6, "logprobs": True, "top_logprobs": 4}
    stream = client.chat.completions.create(
        model=SERVED_MODEL, messages=messages, stream=True, **options, **EXACT
    )
    streamed = [e for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in entries]


def test_completion_echo_logprobs_score_the_prompt_like_transformers(
    client: openai.OpenAI, tokenizer: Tokenizer, log_softmax
) -> None:
    """What lm-eval's loglikelihood requests do: echo the prompt with its logprobs, one token out."""
    prompt_ids = tokenizer.encode(PROMPT)
    reply = client.completions.create(
        model=SERVED_MODEL, prompt=prompt_ids, max_tokens=1, logprobs=2, echo=True, **EXACT
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    reference = log_softmax(prompt_ids)
    for p in range(1, len(prompt_ids)):
        assert lp.token_logprobs[p] == pytest.approx(reference[p - 1, prompt_ids[p]].item(), abs=1e-4)
        top = lp.top_logprobs[p]
        assert max(top.values()) == pytest.approx(reference[p - 1].max().item(), abs=1e-4)
        assert lp.tokens[p] in top  # the prompt's own token is listed beside the 2 most likely
    assert choice.text.startswith(PROMPT)
    assert "".join(lp.tokens[:-1]) == tokenizer.decode(prompt_ids, skip_special_tokens=False)  # with <s>
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert reply.usage.prompt_tokens == len(prompt_ids) and reply.usage.completion_tokens == 1

    stream = client.completions.create(
        model=SERVED_MODEL, prompt=prompt_ids, max_tokens=1, logprobs=2, echo=True, stream=True, **EXACT
    )
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == choice.text
    assert [v for c in chunks for v in c.logprobs.token_logprobs] == lp.token_logprobs
    assert [v for c in chunks for v in c.logprobs.text_offset] == lp.text_offset


def test_completion_logprobs_without_echo_cover_the_output_only(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=SERVED_MODEL, prompt=PROMPT, max_tokens=5, logprobs=0, **EXACT)
    lp = reply.choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and all(v <= 0 for v in lp.token_logprobs)
    assert [len(top) for top in lp.top_logprobs] == [1] * 5  # logprobs=0: just the chosen token
    assert "".join(lp.tokens) == reply.choices[0].text
    echoed = client.completions.create(model=SERVED_MODEL, prompt=PROMPT, max_tokens=5, echo=True, **EXACT)
    assert echoed.choices[0].text == PROMPT + reply.choices[0].text
    assert echoed.choices[0].logprobs is None


def test_logprob_requests_out_of_range_are_named(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model=SERVED_MODEL, messages=messages, top_logprobs=3)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model=SERVED_MODEL, messages=messages, logprobs=True, top_logprobs=21)
    assert too_many.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as legacy:
        client.completions.create(model=SERVED_MODEL, prompt="hi", logprobs=21)
    assert legacy.value.param == "logprobs"
