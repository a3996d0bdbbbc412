"""The OpenAI-compatible API of a live server, driven by the real `openai` client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion
from runtime_server_process import SERVED_MODEL, LiveServer, start_server

from kubeinfer_runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

API_KEY = "test-key-0123"
MAX_MODEL_LEN = 256
GREEDY = {"temperature": 0.0}
EXACT_LENGTH = {"extra_body": {"ignore_eos": True}}  # random weights may sample EOS; these must not stop


def complete(client: openai.OpenAI, prompt: str | list[int], max_tokens: int, **options: Any) -> Completion:
    """A greedy completion of exactly `max_tokens` tokens unless `options` say otherwise."""
    return client.completions.create(
        model=SERVED_MODEL, prompt=prompt, max_tokens=max_tokens, **(GREEDY | EXACT_LENGTH | options)
    )


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(tiny_model, server_logs, "--max-model-len", str(MAX_MODEL_LEN), api_key=API_KEY)
    try:
        live.wait_ready()
        yield live
    finally:
        live.kill()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Tokenizer:
    return Tokenizer(tiny_model)


def test_probes_and_model_list(server: LiveServer, client: openai.OpenAI) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    ready = httpx.get(f"{server.base_url}/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert [m.id for m in client.models.list().data] == [SERVED_MODEL]


def test_completion_reports_usage_and_is_deterministic_when_greedy(
    client: openai.OpenAI, tokenizer: Tokenizer
) -> None:
    prompt = "The river runs past the old mill"
    first = complete(client, prompt, 6)
    again = complete(client, prompt, 6)
    assert first.object == "text_completion" and first.model == SERVED_MODEL
    assert first.choices[0].finish_reason == "length"
    assert first.choices[0].text == again.choices[0].text != ""
    as_token_ids = complete(client, tokenizer.encode(prompt), 6)
    assert as_token_ids.choices[0].text == first.choices[0].text
    assert first.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert first.usage.completion_tokens == 6
    assert first.usage.total_tokens == first.usage.prompt_tokens + 6


def test_chat_completion_uses_the_chat_template(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What time is it?"}]
    reply = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=5, **GREEDY)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    prompt = tokenizer.apply_chat_template(messages)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    assert 1 <= reply.usage.completion_tokens <= 5


def test_streams_carry_the_same_text_and_a_final_usage_chunk(client: openai.OpenAI) -> None:
    prompt = "Bakers start work long before sunrise."
    whole = complete(client, prompt, 8)
    chunks = list(
        client.completions.create(
            model=SERVED_MODEL,
            prompt=prompt,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
            **EXACT_LENGTH,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens

    messages = [{"role": "user", "content": prompt}]
    chat_whole = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=8, **GREEDY)
    chat_chunks = list(
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
    assert streamed == chat_whole.choices[0].message.content
    assert chat_chunks[-1].usage.completion_tokens == chat_whole.usage.completion_tokens


def test_stop_string_ends_the_output_before_it(client: openai.OpenAI) -> None:
    prompt = "Questions and answers: What time is it?"
    free = complete(client, prompt, 24)
    text = free.choices[0].text
    stop = text[len(text) // 2 :][:3]  # a piece from the middle of what the model says anyway
    assert stop.strip(), f"the model's output has no usable stop string: {text!r}"
    stopped = complete(client, prompt, 24, stop=[stop], extra_body={})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop)]


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        extra = {"top_k": 50, "ignore_eos": True}
        reply = complete(client, "Numbers:", 12, seed=seed, temperature=1.0, top_p=0.9, extra_body=extra)
        return reply.choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) > 1


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    prompt = "The library opens at nine o'clock. Students read quietly at long wooden tables. " * 3
    first = complete(client, prompt, 2)
    second = complete(client, prompt, 2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_errors_have_openai_shape_and_status(server: LiveServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=SERVED_MODEL, prompt="one two three " * 200, max_tokens=2)
    assert str(MAX_MODEL_LEN) in too_long.value.message
    prompt_tokens = too_long.value.message.split("the prompt has ")[1].split()[0]
    assert int(prompt_tokens) > MAX_MODEL_LEN

    with pytest.raises(openai.BadRequestError, match="vocab"):
        client.completions.create(model=SERVED_MODEL, prompt=[10**6], max_tokens=2)

    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert unknown.value.param == "model"

    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=SERVED_MODEL, prompt="hi", max_tokens=2, temperature=7)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as bad_chat:
        client.chat.completions.create(model=SERVED_MODEL, messages=[{"role": "user"}], max_tokens=-1)
    assert bad_chat.value.param == "max_tokens"

    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong-key").completions.create(model=SERVED_MODEL, prompt="hi", max_tokens=2)
    missing = httpx.post(f"{server.base_url}/v1/completions", json={"model": SERVED_MODEL, "prompt": "hi"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"


def test_request_id_is_echoed_and_logged(server: LiveServer) -> None:
    with server.http() as http:
        body = {"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
        given = http.post("/v1/completions", json=body, headers={"X-Request-Id": "trace-abc-123"})
        generated = http.post("/v1/completions", json=body)
    assert given.headers["x-request-id"] == "trace-abc-123"
    assert len(generated.headers["x-request-id"]) >= 16
    time.sleep(0.2)  # the log line is written as the response ends
    (line,) = [entry for entry in server.log_lines() if entry.get("request_id") == "trace-abc-123"]
    assert line["status"] == 200 and line["outcome"] == "success"
    assert line["prompt_tokens"] == given.json()["usage"]["prompt_tokens"]
    assert line["completion_tokens"] == 3
    assert 0 <= line["queue_time_s"] <= line["ttft_s"] <= line["e2e_s"]


def test_32_concurrent_streams_complete_with_exact_usage(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    def stream(i: int) -> tuple[str, int, int, str]:
        prompt = f"Request number {i} asks about the train"
        chunks = list(
            client.completions.create(
                model=SERVED_MODEL,
                prompt=prompt,
                max_tokens=4 + i % 5,
                stream=True,
                stream_options={"include_usage": True},
                **EXACT_LENGTH,
            )
        )
        usage = chunks[-1].usage
        return prompt, usage.prompt_tokens, usage.completion_tokens, chunks[-2].choices[0]

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(stream, range(32)))
    for i, (prompt, prompt_tokens, completion_tokens, last_choice) in enumerate(results):
        assert prompt_tokens == len(tokenizer.encode(prompt))
        assert completion_tokens == 4 + i % 5
        assert last_choice.finish_reason == "length"


def test_metrics_follow_a_known_workload(
    server: LiveServer, client: openai.OpenAI, contract_metric_names: list[str]
) -> None:
    before = server.metrics()
    assert {name for name, _ in before} >= set(contract_metric_names)
    prompts = ["one", "two words", "three little words"]
    replies = [complete(client, p, 5) for p in prompts]
    with pytest.raises(openai.BadRequestError):  # refused before admission: no outcome is counted
        client.completions.create(model=SERVED_MODEL, prompt="x", max_tokens=0)
    after = server.metrics()

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after[key] - before.get(key, 0.0)

    assert delta("kubeinfer_requests_total", outcome="success") == 3
    for outcome in ("rejected", "cancelled", "error", "timeout"):
        assert delta("kubeinfer_requests_total", outcome=outcome) == 0
    assert delta("kubeinfer_prompt_tokens_total") == sum(r.usage.prompt_tokens for r in replies)
    assert delta("kubeinfer_generation_tokens_total") == 15
    for histogram in ("request_queue_time", "time_to_first_token", "e2e_request_latency"):
        assert delta(f"kubeinfer_{histogram}_seconds_count") == 3, histogram
    assert delta("kubeinfer_time_per_output_token_seconds_count") == 3
    assert delta("kubeinfer_inter_token_latency_seconds_count") == 3 * 4
    assert after[("kubeinfer_requests_running", frozenset())] == 0
    assert after[("kubeinfer_kv_cache_usage_ratio", frozenset())] == 0
    assert (
        after[("kubeinfer_prefix_cache_hits_total", frozenset())]
        <= after[("kubeinfer_prefix_cache_queries_total", frozenset())]
    )
