"""The bodies of responses and stream chunks, completions' and chat's: each choice's text, logprobs
and (chat) tool calls, whole or as deltas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubeinfer_runtime.engine.types import TokenLogprob
from kubeinfer_runtime.server.logprobs import LogprobFormatter
from kubeinfer_runtime.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    FunctionCall,
    ToolCallOut,
    Usage,
)
from kubeinfer_runtime.server.tool_calls import Mode, ToolCall, ToolCallReader


@dataclass
class Choice:
    """One returned choice (a prompt's sequence) as its outputs accumulate."""

    prompt: int  # which of the request's prompts
    sequence: int  # which of that prompt's sequences
    index: int = 0  # in the response
    started: bool = False
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    finish_reason: str | None = None
    cumulative_logprob: float = 0.0
    offset: int = 0  # characters of text so far (the completions shape's text_offset)


@dataclass
class Delta:
    """What one output adds to its choice."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    finish_reason: str | None


@dataclass
class Shape:
    """What differs between completions and chat completions: the response and chunk bodies."""

    id: str
    created: int
    model: str
    logprob_formatter: LogprobFormatter
    with_logprobs: bool

    def open(self, choice: Choice, delta: Delta, prompt_logprobs: list[TokenLogprob | None]) -> None:
        """Adjust a choice's first delta (the completions shape prepends an echoed prompt)."""

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        raise NotImplementedError

    def opening_chunks(self, indices: list[int]) -> list[dict]:
        return []

    def chunk(self, choice: Choice, delta: Delta) -> dict | None:
        """The event for one output, or None when it adds nothing to send yet."""
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> dict:
        raise NotImplementedError


@dataclass
class CompletionShape(Shape):
    echo: list[tuple[str, list[int]]] | None = None  # each prompt's text and token ids, when echoed

    def open(self, choice: Choice, delta: Delta, prompt_logprobs: list[TokenLogprob | None]) -> None:
        if self.echo is None:
            return
        text, prompt_ids = self.echo[choice.prompt]
        delta.text = text + delta.text
        if self.with_logprobs:
            delta.token_ids = prompt_ids + delta.token_ids
            delta.logprobs = prompt_logprobs + delta.logprobs

    def _logprobs(
        self, choice: Choice, token_ids: list[int], logprobs: list[TokenLogprob | None]
    ) -> CompletionLogprobs | None:
        if not self.with_logprobs:
            return None
        out = self.logprob_formatter.completion(token_ids, logprobs, choice.offset)
        if out.tokens:  # a stream's next chunk continues from here
            choice.offset = out.text_offset[-1] + len(out.tokens[-1])
        return out

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        body = []
        for c in choices:
            logprobs = self._logprobs(c, c.token_ids, c.logprobs)
            body.append(
                CompletionChoice(
                    index=c.index, text="".join(c.text), logprobs=logprobs, finish_reason=c.finish_reason
                )
            )
        return self._body(body, usage).model_dump()

    def chunk(self, choice: Choice, delta: Delta) -> dict | None:
        if not (delta.text or delta.finish_reason or (self.with_logprobs and delta.token_ids)):
            return None
        logprobs = self._logprobs(choice, delta.token_ids, delta.logprobs)
        body = CompletionChoice(
            index=choice.index, text=delta.text, logprobs=logprobs, finish_reason=delta.finish_reason
        )
        return self._body([body], None).model_dump()

    def usage_chunk(self, usage: Usage) -> dict:
        return self._body([], usage).model_dump()

    def _body(self, choices: list[CompletionChoice], usage: Usage | None) -> CompletionResponse:
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


@dataclass
class ChatShape(Shape):
    tool_mode: Mode = "none"
    named_tool: str | None = None
    readers: dict[tuple[int, int], ToolCallReader] = field(default_factory=dict)  # per choice

    def _reader(self, choice: Choice) -> ToolCallReader:
        key = (choice.prompt, choice.sequence)
        if key not in self.readers:
            self.readers[key] = ToolCallReader(self.tool_mode, self.named_tool)
        return self.readers[key]

    def _logprobs(self, logprobs: list[TokenLogprob | None]) -> Any:
        if not self.with_logprobs:
            return None
        return self.logprob_formatter.chat([lp for lp in logprobs if lp is not None])

    def _finish_reason(self, reader: ToolCallReader, reason: str | None) -> str | None:
        # As OpenAI (and vLLM): "tool_calls" when the model chose to call; a named function is "stop".
        called = reader.calls and self.tool_mode in ("auto", "required")
        return "tool_calls" if called and reason == "stop" else reason

    def response(self, choices: list[Choice], usage: Usage) -> dict:
        body = []
        for c in choices:
            reader = self._reader(c)
            content, _ = reader.feed("".join(c.text))
            content += reader.finish()[0]
            calls = [
                ToolCallOut(id=t.id, function=FunctionCall(name=t.name, arguments=t.arguments))
                for t in reader.calls
            ]
            message = AssistantMessage(
                content=None if calls and not content.strip() else content, tool_calls=calls
            )
            body.append(
                ChatChoice(
                    index=c.index,
                    message=message,
                    logprobs=self._logprobs(c.logprobs),
                    finish_reason=self._finish_reason(reader, c.finish_reason),
                )
            )
        response = ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=body, usage=usage
        )
        return response.model_dump()

    def opening_chunks(self, indices: list[int]) -> list[dict]:
        return [
            self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))], None)
            for i in indices
        ]

    def chunk(self, choice: Choice, delta: Delta) -> dict | None:
        reader = self._reader(choice)
        content, progress = reader.feed(delta.text)
        if delta.finish_reason:
            rest, more = reader.finish()
            content, progress = content + rest, progress + more
        tool_calls = [_tool_call_delta(reader, item) for item in progress]
        logprobs = self._logprobs(delta.logprobs)
        if not (content or tool_calls or delta.finish_reason or (logprobs and logprobs.content)):
            return None
        body = ChatChunkChoice(
            index=choice.index,
            delta=ChatDelta(content=content or None, tool_calls=tool_calls or None),
            logprobs=logprobs,
            finish_reason=self._finish_reason(reader, delta.finish_reason),
        )
        return self._chunk([body], None)

    def usage_chunk(self, usage: Usage) -> dict:
        return self._chunk([], usage)

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> dict:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        ).model_dump(exclude_none=False)


def _tool_call_delta(reader: ToolCallReader, item: ToolCall | str) -> dict[str, Any]:
    """OpenAI's streamed shape: a call's id, name (and arguments) first, then argument pieces."""
    if isinstance(item, str):  # more arguments of the one named call
        return {"index": 0, "function": {"arguments": item}}
    index = next(i for i, call in enumerate(reader.calls) if call.id == item.id)
    return {
        "index": index,
        "id": item.id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
