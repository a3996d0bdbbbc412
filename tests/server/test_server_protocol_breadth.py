"""Request fields of issue 21 turned into engine parameters, and their refusals (pure logic)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kubeinfer_runtime.engine.types import Grammar
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.protocol import ChatCompletionRequest, CompletionRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_completion_logprobs_echo_and_best_of_become_engine_params() -> None:
    scoring = CompletionRequest.model_validate(
        {"model": "m", "prompt": [[1, 2, 3]], "echo": True, "logprobs": 2}
    )
    params = scoring.engine_params(1)
    assert (params.logprobs, params.prompt_logprobs, params.n) == (2, 2, 1)
    assert scoring.prompts() == [[1, 2, 3]]
    ranked = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "best_of": 3, "n": 2})
    assert (ranked.engine_params(4).n, ranked.engine_params(4).logprobs) == (3, 0)  # ranked by logprob
    assert CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]}).prompts() == ["a", "b"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "prompt": "hi", "best_of": 1, "n": 2},
        {"model": "m", "prompt": "hi", "best_of": 3, "stream": True},
        {**CHAT, "top_logprobs": 2},
        {**CHAT, "response_format": {"type": "json_schema"}},
        {**CHAT, "tool_choice": "required"},
        {**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
    ],
    ids=[
        "best_of-below-n",
        "best_of-streamed",
        "top-without-logprobs",
        "schema-missing",
        "required-no-tools",
        "unknown-function",
    ],
)
def test_inconsistent_requests_are_invalid(body: dict) -> None:
    model = CompletionRequest if "prompt" in body else ChatCompletionRequest
    with pytest.raises(ValidationError):
        model.model_validate(body)


def test_constraints_map_to_grammars_and_only_one_is_allowed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    strict = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    chat = ChatCompletionRequest.model_validate({**CHAT, "response_format": strict})
    assert chat.grammar() == Grammar("json_schema", json.dumps(schema))
    assert (
        ChatCompletionRequest.model_validate({**CHAT, "response_format": {"type": "text"}}).grammar() is None
    )
    guided = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "guided_choice": ["yes", 'say "no"']}
    )
    assert guided.grammar() == Grammar("lark", 'start: "yes" | "say \\"no\\""')
    both = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "guided_regex": "a+", "guided_json": schema}
    )
    with pytest.raises(APIError) as caught:
        both.grammar()
    assert caught.value.param == "guided_regex"


def test_tool_choice_picks_the_mode_and_its_grammar() -> None:
    assert ChatCompletionRequest.model_validate(CHAT).tool_mode == "none"
    auto = ChatCompletionRequest.model_validate({**CHAT, "tools": [TOOL]})
    assert auto.tool_mode == "auto" and auto.grammar() is None
    named = ChatCompletionRequest.model_validate(
        {**CHAT, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}
    )
    assert (named.tool_mode, named.named_tool) == ("named", "f")
    assert named.grammar() == Grammar("json_schema", json.dumps({"type": "object"}))
    forced_json = ChatCompletionRequest.model_validate(
        {**CHAT, "tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}
    )
    with pytest.raises(APIError) as caught:
        forced_json.grammar()
    assert caught.value.param == "tool_choice"


def test_unhonoured_vllm_extras_are_named_and_unknown_fields_ignored() -> None:
    with pytest.raises(APIError) as caught:
        CompletionRequest.model_validate(
            {"model": "m", "prompt": "x", "min_p": 0.1}
        ).refuse_unhonoured_extras()
    assert caught.value.param == "min_p" and caught.value.status == 400
    CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "user": "someone"}
    ).refuse_unhonoured_extras()


def test_assistant_tool_calls_reach_the_template_as_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
        }
    )
    assistant, tool = (m.for_template() for m in chat.messages)
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert tool == {"role": "tool", "content": "done", "tool_call_id": "c1"}
