"""response_format (json_schema, json_object) and vLLM's guided_* through the real `openai` client, on a
random-weight model: whatever it samples, the reply parses and validates."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from runtime_server_process import SERVED_MODEL, LiveServer, running_server

pytestmark = pytest.mark.slow

# Every value bounded: a random model never closes a free string by itself (see the engine tests).
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
        "climate": {"enum": ["dry", "wet", "cold"]},
        "districts": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 10}, "parks": {"type": "boolean"}},
                "required": ["name", "parks"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["city", "population", "climate", "districts"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Paint(BaseModel):
    color: Color
    coats: int = Field(ge=1, le=5)
    brand: str = Field(max_length=10)


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model, server_logs, "--max-model-len", "512") as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture(scope="module")
def server_url(server: LiveServer) -> str:
    return server.base_url


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chat_json_schema_replies_validate(client: openai.OpenAI, seed: int) -> None:
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=MESSAGES, response_format=JSON_SCHEMA, max_tokens=300, seed=seed
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)

    stream = client.chat.completions.create(
        model=SERVED_MODEL,
        messages=MESSAGES,
        response_format=JSON_SCHEMA,
        max_tokens=300,
        seed=seed,
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == reply.choices[0].message.content


def test_the_clients_parse_helper_gets_its_pydantic_model(client: openai.OpenAI) -> None:
    """The SDK turns the model into a strict json_schema and parses the reply back into it."""
    for seed in range(3):
        completion = client.chat.completions.parse(
            model=SERVED_MODEL, messages=MESSAGES, response_format=Paint, max_tokens=100, seed=seed
        )
        paint = completion.choices[0].message.parsed
        assert isinstance(paint, Paint) and 1 <= paint.coats <= 5


def test_n_choices_each_validate(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=SERVED_MODEL, messages=MESSAGES, response_format=JSON_SCHEMA, max_tokens=300, n=3, seed=4
    )
    assert len(reply.choices) == 3
    for choice in reply.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_mode_and_vllm_guided_params(client: openai.OpenAI) -> None:
    seeds = range(4)
    objects = [
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            response_format={"type": "json_object"},
            max_tokens=200,
            seed=s,
        ).choices[0]
        for s in seeds
    ]
    ended = [c.message.content for c in objects if c.finish_reason == "stop"]
    assert ended and all(isinstance(json.loads(text), dict) for text in ended)

    choice = client.completions.create(
        model=SERVED_MODEL,
        prompt="Pick:",
        max_tokens=10,
        extra_body={"guided_choice": ["yes", "no", "maybe"]},
    )
    assert choice.choices[0].text in {"yes", "no", "maybe"}
    regex = client.completions.create(
        model=SERVED_MODEL, prompt="Code:", max_tokens=10, extra_body={"guided_regex": "[a-z]{3}[0-9]{2}"}
    )
    assert len(regex.choices[0].text) == 5 and regex.choices[0].text[3:].isdigit()
    guided = client.completions.create(
        model=SERVED_MODEL, prompt="JSON:", max_tokens=300, extra_body={"guided_json": SCHEMA}
    )
    jsonschema.validate(json.loads(guided.choices[0].text), SCHEMA)


def test_bad_constraints_are_refused(client: openai.OpenAI) -> None:
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}
    with pytest.raises(openai.BadRequestError, match="objec"):
        client.chat.completions.create(model=SERVED_MODEL, messages=MESSAGES, response_format=bad_schema)
    with pytest.raises(openai.BadRequestError, match="json_schema is required"):
        client.chat.completions.create(
            model=SERVED_MODEL, messages=MESSAGES, response_format={"type": "json_schema"}
        )
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(
            model=SERVED_MODEL,
            messages=MESSAGES,
            response_format={"type": "json_object"},
            extra_body={"guided_regex": "a+"},
        )
    assert both.value.param == "guided_regex"


def test_kubeinfer_bench_measures_with_a_response_format(server_url: str, tmp_path: Path) -> None:
    """`kubeinfer bench --response-format` sends the schema with every request; all are answered."""
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    report = tmp_path / "bench.json"
    command = [str(Path(sys.executable).parent / "kubeinfer"), "bench", "--url", server_url, "--chat"]
    command += ["--num-requests", "6", "--input-len", "16", "--output-len", "300", "--max-concurrency", "3"]
    command += ["--response-format", str(schema_file), "--json", str(report), "--no-progress"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(report.read_text())
    assert result["config"]["response_format"]["json_schema"]["schema"] == SCHEMA
    (point,) = result["points"]
    assert point["completed"] == 6 and point["failed"] == 0
