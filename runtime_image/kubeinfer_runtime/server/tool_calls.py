"""Tool calls: what `tool_choice` asks of the generation, and the output read back as `tool_calls`.

  auto      the model sees the tools (through its chat template) and may answer in Hermes' format,
            <tool_call>{"name": ..., "arguments": {...}}</tool_call>, which is parsed out of the text
  none      the model sees the tools, but its text is returned as it is
  required  the output is constrained to a JSON array of {"name", "parameters"} calls, one schema
            per tool (vLLM's approach), so it always parses
  named     the output is constrained to that function's parameters schema: it is the arguments

One `ToolCallReader` per choice turns the generated text, as it streams in, into content and
complete tool calls, so the streamed and the whole reply are read by the same code.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubeinfer_runtime.engine.types import Grammar

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_ANY_OBJECT: dict[str, Any] = {"type": "object"}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def tool_grammar(
    mode: Mode, tools: list[dict[str, Any]], named: str | None, parallel: bool
) -> Grammar | None:
    """The constraint `mode` puts on the output; `tools` are OpenAI's {"type", "function"} dicts."""
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if mode == "named":
        assert named is not None
        return Grammar("json_schema", json.dumps(functions[named].get("parameters") or _ANY_OBJECT))
    if mode != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "parameters": f.get("parameters") or _ANY_OBJECT},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, f in functions.items()
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return Grammar("json_schema", json.dumps(schema))


def _held_back(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag`."""
    return next((n for n in range(min(len(tag) - 1, len(text)), 0, -1) if tag.startswith(text[-n:])), 0)


class ToolCallReader:
    """Reads one choice's generated text as content and tool calls, piece by piece."""

    def __init__(self, mode: Mode, named: str | None = None) -> None:
        self.mode, self.named = mode, named
        self.buffer = ""  # text not yet turned into content or calls
        self.calls: list[ToolCall] = []
        self._array_started = False

    def feed(self, text: str) -> tuple[str, list[ToolCall | str]]:
        """Content to pass on, and call progress: a complete ToolCall, or for a named function a
        piece of its arguments (its ToolCall first)."""
        self.buffer += text
        if self.mode == "named":
            return "", self._named_pieces()
        if self.mode == "required":
            return "", self._array_calls()
        if self.mode == "auto":
            return self._hermes()
        content, self.buffer = self.buffer, ""
        return content, []

    def finish(self) -> tuple[str, list[ToolCall | str]]:
        """At the end of the output: whatever is left (an unfinished tag is content after all)."""
        content, progress = self.feed("")
        if self.mode in ("auto", "none"):
            content, self.buffer = content + self.buffer, ""
        return content, progress

    def _named_pieces(self) -> list[ToolCall | str]:
        progress: list[ToolCall | str] = []
        if not self.calls:
            assert self.named is not None
            self.calls = [ToolCall(self.named, "")]
            progress.append(self.calls[0])
        if self.buffer:
            progress.append(self.buffer)
            self.calls = [replace(self.calls[0], arguments=self.calls[0].arguments + self.buffer)]
            self.buffer = ""
        return progress

    def _array_calls(self) -> list[ToolCall | str]:
        """Each element of the constrained JSON array as soon as it is complete."""
        found: list[ToolCall | str] = []
        decoder = json.JSONDecoder()
        while True:
            rest = self.buffer.lstrip()
            if rest[:1] == ("," if self._array_started else "["):
                rest = rest[1:].lstrip()
            else:
                return found
            try:
                item, end = decoder.raw_decode(rest)
            except json.JSONDecodeError:
                return found  # the element is still being written
            self._array_started = True
            self.buffer = rest[end:]
            call = ToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
            self.calls.append(call)
            found.append(call)

    def _hermes(self) -> tuple[str, list[ToolCall | str]]:
        content, found = "", []
        while True:
            start = self.buffer.find(TOOL_CALL_START)
            if start < 0:
                keep = _held_back(self.buffer, TOOL_CALL_START)
                content += self.buffer[: len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep :]
                return content, found
            content += self.buffer[:start]
            end = self.buffer.find(TOOL_CALL_END, start)
            if end < 0:
                self.buffer = self.buffer[start:]
                return content, found
            body = self.buffer[start + len(TOOL_CALL_START) : end]
            self.buffer = self.buffer[end + len(TOOL_CALL_END) :]
            call = _parse_hermes_call(body)
            if call is None:  # not a call after all: the model's text, unchanged
                content += TOOL_CALL_START + body + TOOL_CALL_END
                continue
            self.calls.append(call)
            found.append(call)


def _parse_hermes_call(body: str) -> ToolCall | None:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    return ToolCall(
        parsed["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    )
