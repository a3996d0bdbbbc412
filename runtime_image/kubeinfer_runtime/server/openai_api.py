"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kubeinfer_runtime.engine.types import RequestOutput, SamplingParams
from kubeinfer_runtime.server import errors
from kubeinfer_runtime.server.async_engine import AsyncEngine, TrackedRequest
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
)

if TYPE_CHECKING:
    from kubeinfer_runtime.server.app import RuntimeState

router = APIRouter()


def _runtime(request: Request) -> RuntimeState:
    return request.app.state.runtime


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    rt = _runtime(request)
    card = ModelCard(
        id=rt.config.served_model_name, created=rt.started_at, max_model_len=rt.engine.max_model_len
    )
    return ModelList(data=[card])


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    rt = _runtime(request)
    rt.check_accepting(body.model)
    prompt_ids = rt.engine.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else body.prompt
    _check_length(prompt_ids, rt.engine.max_model_len, "prompt")
    shape = _CompletionShape(f"cmpl-{uuid.uuid4().hex}", int(time.time()), body.model)
    return await _generate(request, rt, body, prompt_ids, body.sampling_params(body.max_tokens), shape)


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    rt = _runtime(request)
    rt.check_accepting(body.model)
    tokenizer = rt.engine.tokenizer
    try:
        text = tokenizer.apply_chat_template([{"role": m.role, "content": m.text()} for m in body.messages])
    except (ValueError, jinja2.TemplateError) as exc:  # no template, or the template refuses the messages
        raise APIError(400, f"messages: {exc}", param="messages") from exc
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)  # the template writes its own BOS
    _check_length(prompt_ids, rt.engine.max_model_len, "messages")
    max_tokens = body.requested_max_tokens() or rt.engine.max_model_len - len(prompt_ids)
    shape = _ChatShape(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), body.model)
    return await _generate(request, rt, body, prompt_ids, body.sampling_params(max_tokens), shape)


def _check_length(prompt_ids: list[int], max_model_len: int, param: str) -> None:
    # At least one position must be left for output.
    if len(prompt_ids) >= max_model_len:
        raise errors.prompt_too_long(len(prompt_ids), max_model_len, param)


def _priority(request: Request, body: CompletionRequest | ChatCompletionRequest) -> int:
    header = request.headers.get("x-request-priority")
    if header is None:
        return body.priority
    try:
        return int(header)
    except ValueError:
        raise APIError(400, f"X-Request-Priority: {header!r} is not an integer", param="priority") from None


async def _abort_on_disconnect(request: Request, engine: AsyncEngine, request_id: str) -> None:
    # The body has been read, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    engine.abort(request_id)


async def _generate(
    request: Request,
    rt: RuntimeState,
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
    params: SamplingParams,
    shape: _CompletionShape | _ChatShape,
) -> Response:
    priority = _priority(request, body)
    tracked = rt.engine.submit(shape.id, prompt_ids, params, priority, request.state.arrival_time)
    request.state.tracked = tracked  # for the request's log line
    watcher = asyncio.create_task(_abort_on_disconnect(request, rt.engine, shape.id))
    try:
        # Waiting for the first output keeps the status honest: a queue timeout can still be a 503.
        first = await tracked.next()
    except BaseException:
        watcher.cancel()
        rt.engine.abort(shape.id)
        raise
    if body.stream:
        events = _sse(rt.engine, tracked, first, shape, body.include_usage, watcher)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        out, text = first, [first.new_text]
        while not out.finished:
            out = await tracked.next()
            text.append(out.new_text)
    finally:
        watcher.cancel()
        rt.engine.abort(shape.id)
    return JSONResponse(shape.response("".join(text), out.finish_reason, _usage(tracked)))


def _usage(tracked: TrackedRequest) -> Usage:
    return Usage.of(tracked.num_prompt_tokens, tracked.num_output_tokens, tracked.num_cached_prompt_tokens)


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _sse(
    engine: AsyncEngine,
    tracked: TrackedRequest,
    first: RequestOutput,
    shape: _CompletionShape | _ChatShape,
    include_usage: bool,
    watcher: asyncio.Task[None],
) -> AsyncIterator[str]:
    try:
        for chunk in shape.opening_chunks():
            yield _event(chunk)
        out = first
        while True:
            if out.new_text or out.finished:
                yield _event(shape.chunk(out.new_text, out.finish_reason))
            if out.finished:
                break
            out = await tracked.next()
        if include_usage:
            yield _event(shape.usage_chunk(_usage(tracked)))
    except APIError as exc:  # the status line is gone; the error travels as an event
        yield _event(exc.body())
    finally:
        watcher.cancel()
        engine.abort(tracked.request_id)  # a no-op unless the client went away mid-stream
    yield "data: [DONE]\n\n"


@dataclass(frozen=True)
class _CompletionShape:
    id: str
    created: int
    model: str

    def response(self, text: str, finish_reason: str | None, usage: Usage) -> dict:
        choice = CompletionChoice(text=text, finish_reason=finish_reason)
        return self._body([choice], usage).model_dump()

    def opening_chunks(self) -> list[dict]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        return self._body([CompletionChoice(text=text, finish_reason=finish_reason)], None).model_dump()

    def usage_chunk(self, usage: Usage) -> dict:
        return self._body([], usage).model_dump()

    def _body(self, choices: list[CompletionChoice], usage: Usage | None) -> CompletionResponse:
        return CompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


@dataclass(frozen=True)
class _ChatShape:
    id: str
    created: int
    model: str

    def response(self, text: str, finish_reason: str | None, usage: Usage) -> dict:
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
        body = ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage
        )
        return body.model_dump()

    def opening_chunks(self) -> list[dict]:
        return [self._chunk([ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))], None)]

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        delta = ChatDelta(content=text or None)
        return self._chunk([ChatChunkChoice(delta=delta, finish_reason=finish_reason)], None)

    def usage_chunk(self, usage: Usage) -> dict:
        return self._chunk([], usage)

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None) -> dict:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        ).model_dump(exclude_none=False)
