"""Reading generated text back as content and tool calls, whole or piece by piece (pure logic)."""

from __future__ import annotations

import json

import pytest

from kubeinfer_runtime.server.tool_calls import ToolCall, ToolCallReader, tool_grammar

TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
    },
    {"type": "function", "function": {"name": "g"}},
]


def read(
    mode: str, text: str, piece: int, named: str | None = None
) -> tuple[str, list[ToolCall | str], ToolCallReader]:
    """Feed `text` in pieces of `piece` characters; all content and progress, in order."""
    reader = ToolCallReader(mode, named)  # type: ignore[arg-type]
    content, progress = "", []
    for i in range(0, len(text), piece):
        c, p = reader.feed(text[i : i + piece])
        content, progress = content + c, progress + p
    c, p = reader.finish()
    return content + c, progress + p, reader


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_hermes_calls_are_cut_out_of_the_text(piece: int) -> None:
    text = (
        'Let me check.<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
        '<tool_call>{"name": "g"}</tool_call>'
    )
    content, progress, reader = read("auto", text, piece)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [("f", {"a": 1}), ("g", {})]
    assert progress == reader.calls  # each call once, when complete
    assert len({c.id for c in reader.calls}) == 2


def test_text_that_only_looks_like_a_call_stays_content() -> None:
    assert read("auto", "a <tool_call>not json</tool_call> b", 2)[0] == "a <tool_call>not json</tool_call> b"
    assert read("auto", "ends with <tool_ca", 1)[0] == "ends with <tool_ca"
    content, _, reader = read("none", '<tool_call>{"name": "f"}</tool_call>', 4)
    assert content == '<tool_call>{"name": "f"}</tool_call>' and reader.calls == []


def test_a_required_array_yields_each_call_as_it_completes() -> None:
    reader = ToolCallReader("required")
    text = '[{"name":"f","parameters":{"a":1}},{"name":"g","parameters":{}}]'
    first_end = text.index("},{") + 1
    assert reader.feed(text[: first_end - 1])[1] == []  # the first call's closing brace is missing
    (first,) = reader.feed(text[first_end - 1 : first_end])[1]
    assert (first.name, first.arguments) == ("f", '{"a": 1}')
    (second,) = reader.feed(text[first_end:])[1]
    assert second.name == "g" and reader.finish() == ("", [])


def test_a_named_call_streams_its_arguments() -> None:
    content, progress, reader = read("named", '{"a": 12}', 2, named="f")
    assert content == ""
    assert isinstance(progress[0], ToolCall) and progress[0].name == "f"
    assert "".join(p for p in progress[1:] if isinstance(p, str)) == '{"a": 12}'
    assert [(c.name, c.arguments, c.id) for c in reader.calls] == [("f", '{"a": 12}', progress[0].id)]


def test_tool_grammars() -> None:
    assert tool_grammar("auto", TOOLS, None, True) is None
    assert tool_grammar("none", TOOLS, None, True) is None
    named = tool_grammar("named", TOOLS, "f", True)
    assert named is not None and json.loads(named.source) == TOOLS[0]["function"]["parameters"]
    required = tool_grammar("required", TOOLS, None, parallel=False)
    assert required is not None
    schema = json.loads(required.source)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [item["properties"]["name"] for item in schema["items"]["anyOf"]] == [
        {"const": "f"},
        {"const": "g"},
    ]
