"""Request validation and error shapes: a bad field is answered 400 in OpenAI's shape, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.server import errors
from kubeinfer_runtime.server.protocol import ChatCompletionRequest, CompletionRequest


def _error_for(model: type, body: dict) -> errors.APIError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return errors.validation_error(caught.value.errors())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "prompt": "hi", "temperature": 5}, "temperature"),
        ({"model": "m", "prompt": "hi", "top_p": 0}, "top_p"),
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "prompt": "hi", "n": 0}, "n"),
        ({"model": "m", "prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"model": "m", "prompt": ""}, "prompt"),
        ({"prompt": "hi"}, "model"),
    ],
)
def test_bad_completion_field_is_named(body: dict, param: str) -> None:
    error = _error_for(CompletionRequest, body)
    assert error.status == 400
    assert error.param == param
    assert error.message.startswith(f"{param}: ")


def test_bad_chat_message_names_its_path() -> None:
    error = _error_for(ChatCompletionRequest, {"model": "m", "messages": [{"role": "robot", "content": "x"}]})
    assert error.param == "messages.0.role"
    assert _error_for(ChatCompletionRequest, {"model": "m", "messages": []}).param == "messages"


def test_error_body_has_openai_shape() -> None:
    body = errors.queue_full(7).body()
    assert body == {
        "error": {
            "message": body["error"]["message"],
            "type": "rate_limit_error",
            "param": None,
            "code": "queue_full",
        }
    }
    assert errors.queue_full(7).headers == {"Retry-After": "7"}
    too_long = errors.prompt_too_long(300, 256, "prompt")
    assert "300" in too_long.message and "256" in too_long.message and too_long.status == 400


def test_sampling_params_follow_the_request() -> None:
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "hi", "stop": "\n", "temperature": 0, "top_k": 5, "seed": 3, "max_tokens": 4}
    )
    assert request.sampling_params(request.max_tokens) == SamplingParams(
        max_tokens=4, temperature=0.0, top_k=5, seed=3, stop=("\n",)
    )
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]}],
            "max_tokens": 9,
            "max_completion_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert chat.requested_max_tokens() == 5
    assert chat.messages[0].text() == "ab"
    assert chat.include_usage
