"""tools / tool_choice through the real `openai` client: the template renders the tools, forced calls
always parse and validate against the function's parameters, and streams carry tool_calls deltas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest
from runtime_server_process import SERVED_MODEL, running_server

from kubeinfer_runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

# Bounded parameters: a random model never ends a free string (see the structured-output tests).
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ALARM = {
    "type": "object",
    "properties": {
        "hour": {"type": "integer", "minimum": 0, "maximum": 23},
        "label": {"type": "string", "maxLength": 8},
    },
    "required": ["hour"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Current weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "set_alarm", "parameters": ALARM}},
]
SCHEMAS = {"get_weather": WEATHER, "set_alarm": ALARM}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo? Then wake me at 7."}]


@pytest.fixture(scope="module")
def client(tiny_model: Path, server_logs: Path) -> Iterator[openai.OpenAI]:
    with running_server(tiny_model, server_logs, "--max-model-len", "1024") as server:
        yield server.client()


def assert_valid_calls(calls: list, allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_tool_calls_always_parse_and_validate(client: openai.OpenAI, seed: int) -> None:
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=300, seed=seed
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid_calls(choice.message.tool_calls, set(SCHEMAS))

    # The SDK's stream helper assembles the deltas into the same calls.
    with client.chat.completions.stream(
        model=SERVED_MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=300, seed=seed
    ) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in streamed] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]
    assert final.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_makes_one_call(client: openai.OpenAI) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=300,
            seed=seed,
        )
        assert len(reply.choices[0].message.tool_calls) == 1


def test_a_named_function_is_called_with_valid_arguments_streamed_in_pieces(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "set_alarm"}}
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=100, seed=3
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "set_alarm" and reply.choices[0].finish_reason == "stop"  # as OpenAI's
    assert_valid_calls([call], {"set_alarm"})

    chunks = list(
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=named,
            max_tokens=100,
            seed=3,
            stream=True,
        )
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function.name == "set_alarm"
    assert all(d.index == 0 and d.id is None for d in deltas[1:])
    assert len(deltas) > 2  # the arguments arrive in pieces, as they are generated
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments


def test_the_template_renders_tools_and_earlier_calls(client: openai.OpenAI, tiny_model: Path) -> None:
    tokenizer = Tokenizer(tiny_model)
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18 C"},
    ]
    for tool_choice in ("auto", "none"):
        reply = client.chat.completions.create(
            model=SERVED_MODEL,
            messages=history,
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=8,
            temperature=0,
        )
        as_template_reads_it = [
            *MESSAGES,
            {
                **history[1],
                "tool_calls": [
                    {
                        **history[1]["tool_calls"][0],
                        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                    }
                ],
            },
            history[2],
        ]
        prompt = tokenizer.apply_chat_template(as_template_reads_it, tools=TOOLS)
        assert (
            "<tools>" in prompt and '"arguments": {"city": "Oslo"}' in prompt and "<tool_response>" in prompt
        )
        assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
        # A random model writes no <tool_call>: its text comes back as content, with no calls.
        choice = reply.choices[0]
        assert isinstance(choice.message.content, str) and not choice.message.tool_calls
        assert choice.finish_reason in ("stop", "length")


def test_bad_tool_requests_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="nope"):
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model=SERVED_MODEL, messages=MESSAGES, tool_choice="required")
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            response_format={"type": "json_object"},
        )
    assert both.value.param == "tool_choice"
