"""vLLM's extra request parameters, through the `openai` client's extra_body: honoured, or refused
with a 400 that names them (never silently ignored)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from runtime_server_process import SERVED_MODEL, running_server

from kubeinfer_runtime.server.protocol import REFUSED_EXTRA_PARAMS
from kubeinfer_runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

PROMPT = "Every morning the baker opens the shop"


@pytest.fixture(scope="module")
def client(tiny_model: Path, server_logs: Path) -> Iterator[openai.OpenAI]:
    with running_server(tiny_model, server_logs, "--max-model-len", "256") as server:
        yield server.client()


def complete(client: openai.OpenAI, max_tokens: int = 8, **extra: object) -> openai.types.Completion:
    return client.completions.create(
        model=SERVED_MODEL, prompt=PROMPT, max_tokens=max_tokens, temperature=0, logprobs=0, extra_body=extra
    )


def test_min_tokens_and_stop_token_ids_are_honoured(client: openai.OpenAI, tiny_model: Path) -> None:
    tokenizer = Tokenizer(tiny_model)
    vocab = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
    messages = [{"role": "user", "content": PROMPT}]

    def chat(**extra: object) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(
            model=SERVED_MODEL,
            messages=messages,
            max_tokens=8,
            temperature=0,
            logprobs=True,
            extra_body=extra,
        )

    first = vocab[bytes(chat().choices[0].logprobs.content[0].bytes)]  # the greedy first token's id
    stopped = chat(stop_token_ids=[first])
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    held = chat(stop_token_ids=[first], min_tokens=5)
    assert held.usage.completion_tokens >= 5
    assert first not in [vocab[bytes(e.bytes)] for e in held.choices[0].logprobs.content[:5]]


def test_penalties_ignore_eos_and_skip_special_tokens_are_honoured(client: openai.OpenAI) -> None:
    exact = complete(client, max_tokens=20, ignore_eos=True, skip_special_tokens=False)
    assert exact.usage.completion_tokens == 20
    penalized = complete(client, max_tokens=20, ignore_eos=True, repetition_penalty=3.0)
    assert penalized.choices[0].text != exact.choices[0].text
    # OpenAI's own penalties, as the client sends them.
    frequency = client.completions.create(
        model=SERVED_MODEL,
        prompt=PROMPT,
        max_tokens=20,
        temperature=0,
        frequency_penalty=2.0,
        presence_penalty=1.0,
        extra_body={"ignore_eos": True},
    )
    assert frequency.choices[0].text != exact.choices[0].text
    with pytest.raises(openai.BadRequestError) as bad:
        complete(client, repetition_penalty=0)
    assert bad.value.param == "repetition_penalty"


@pytest.mark.parametrize("name", REFUSED_EXTRA_PARAMS)
def test_unhonoured_vllm_params_are_refused_by_name(client: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        complete(client, **{name: 1})
    assert refused.value.param == name and name in refused.value.message
