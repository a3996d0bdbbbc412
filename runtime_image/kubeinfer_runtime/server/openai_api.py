"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kubeinfer_runtime.engine.types import RequestOutput, SamplingParams, TokenLogprob
from kubeinfer_runtime.server import errors
from kubeinfer_runtime.server.async_engine import AsyncEngine, TrackedRequest
from kubeinfer_runtime.server.errors import APIError
from kubeinfer_runtime.server.logprobs import LogprobFormatter
from kubeinfer_runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from kubeinfer_runtime.server.response_shapes import ChatShape, Choice, CompletionShape, Delta, Shape

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
    body.refuse_unhonoured_extras()
    tokenizer = rt.engine.tokenizer
    prompts = [tokenizer.encode(p) if isinstance(p, str) else p for p in body.prompts()]
    for prompt_ids in prompts:
        _check_length(prompt_ids, rt.engine.max_model_len, "prompt")
    echo = None
    if body.echo:
        texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in body.prompts()]
        echo = list(zip(texts, prompts, strict=True))
    shape = CompletionShape(
        f"cmpl-{uuid.uuid4().hex}",
        int(time.time()),
        body.model,
        LogprobFormatter(tokenizer),
        with_logprobs=body.logprobs is not None,
        echo=echo,
    )
    params = body.engine_params(body.max_tokens)
    return await _generate(request, rt, body, prompts, params, shape, body.n)


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    rt = _runtime(request)
    rt.check_accepting(body.model)
    body.refuse_unhonoured_extras()
    tokenizer = rt.engine.tokenizer
    tools = body.tool_dicts() or None  # rendered by templates that support them, ignored by others
    try:
        text = tokenizer.apply_chat_template([m.for_template() for m in body.messages], tools=tools)
    except (ValueError, jinja2.TemplateError) as exc:  # no template, or the template refuses the messages
        raise APIError(400, f"messages: {exc}", param="messages") from exc
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)  # the template writes its own BOS
    _check_length(prompt_ids, rt.engine.max_model_len, "messages")
    max_tokens = body.requested_max_tokens() or rt.engine.max_model_len - len(prompt_ids)
    shape = ChatShape(
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        body.model,
        LogprobFormatter(tokenizer),
        with_logprobs=body.logprobs,
        tool_mode=body.tool_mode,
        named_tool=body.named_tool,
    )
    return await _generate(request, rt, body, [prompt_ids], body.engine_params(max_tokens), shape, body.n)


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


async def _abort_on_disconnect(request: Request, engine: AsyncEngine, request_ids: list[str]) -> None:
    # The body has been read, so the next message can only be the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for request_id in request_ids:
        engine.abort(request_id)


class _Choices:
    """The choices of one request: n per prompt (best_of of them generated when ranking)."""

    def __init__(self, num_prompts: int, num_sequences: int, n: int, shape: Shape) -> None:
        self.n, self.shape = n, shape
        self.by_key = {
            (k, j): Choice(k, j, index=k * n + j) for k in range(num_prompts) for j in range(num_sequences)
        }
        self.prompt_logprobs: dict[int, list[TokenLogprob | None]] = {}

    def add(self, prompt: int, out: RequestOutput) -> tuple[Choice, Delta]:
        choice = self.by_key[(prompt, out.index)]
        if out.prompt_logprobs is not None:
            self.prompt_logprobs[prompt] = out.prompt_logprobs
        delta = Delta(out.new_text, list(out.new_token_ids), list(out.new_logprobs), None)
        if not choice.started:
            choice.started = True
            self.shape.open(choice, delta, self.prompt_logprobs.get(prompt, []))
        if out.finished:
            choice.finish_reason = delta.finish_reason = out.finish_reason
        choice.text.append(delta.text)
        choice.token_ids += delta.token_ids
        choice.logprobs += delta.logprobs
        choice.cumulative_logprob = out.cumulative_logprob
        return choice, delta

    def returned(self) -> list[Choice]:
        """Every prompt's n choices: its n most likely sequences when best_of generated more."""
        chosen = []
        for k in sorted({k for k, _ in self.by_key}):
            mine = [c for (p, _), c in self.by_key.items() if p == k]
            if len(mine) > self.n:
                mine = sorted(mine, key=lambda c: c.cumulative_logprob, reverse=True)[: self.n]
            for j, choice in enumerate(mine):
                choice.index = k * self.n + j
            chosen += mine
        return chosen


async def _outputs(
    tracked: list[TrackedRequest], firsts: list[RequestOutput]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Every output of the request's prompts, tagged with the prompt, in the order they arrive."""
    merged: asyncio.Queue[tuple[int, RequestOutput | APIError]] = asyncio.Queue()

    async def pump(k: int) -> None:
        try:
            while True:
                out = await tracked[k].next()
                merged.put_nowait((k, out))
                if out.request_finished:
                    return
        except APIError as exc:
            merged.put_nowait((k, exc))

    pumps = []
    for k, first in enumerate(firsts):
        yield k, first
        if not first.request_finished:
            pumps.append(asyncio.create_task(pump(k)))
    try:
        remaining = len(pumps)
        while remaining:
            k, item = await merged.get()
            if isinstance(item, APIError):
                raise item
            yield k, item
            remaining -= item.request_finished
    finally:
        for task in pumps:
            task.cancel()


async def _generate(
    request: Request,
    rt: RuntimeState,
    body: CompletionRequest | ChatCompletionRequest,
    prompts: list[list[int]],
    params: SamplingParams,
    shape: Shape,
    n: int,
) -> Response:
    priority = _priority(request, body)
    ids = [shape.id] if len(prompts) == 1 else [f"{shape.id}-{k}" for k in range(len(prompts))]
    tracked: list[TrackedRequest] = []
    request.state.tracked_all = tracked  # every prompt's, for the request's trace
    watcher = asyncio.create_task(_abort_on_disconnect(request, rt.engine, ids))

    def abort_all() -> None:
        watcher.cancel()
        for request_id in ids:
            rt.engine.abort(request_id)  # a no-op once finished

    try:
        for request_id, prompt_ids in zip(ids, prompts, strict=True):
            tracked.append(
                rt.engine.submit(request_id, prompt_ids, params, priority, request.state.arrival_time)
            )
            request.state.tracked = tracked[0]  # for the request's log line
        # Waiting for the first outputs keeps the status honest: a queue timeout can still be a 503.
        firsts = [await t.next() for t in tracked]
    except BaseException:
        abort_all()
        raise
    choices = _Choices(len(prompts), params.n, n, shape)
    outputs = _outputs(tracked, firsts)
    if body.stream:
        events = _sse(outputs, choices, tracked, body.include_usage, abort_all)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
    try:
        async for k, out in outputs:
            choices.add(k, out)
    finally:
        abort_all()
    return JSONResponse(shape.response(choices.returned(), _usage(tracked)))


def _usage(tracked: list[TrackedRequest]) -> Usage:
    """The prompt counted once per prompt, however many sequences share it; every generated token."""
    return Usage.of(
        sum(t.num_prompt_tokens for t in tracked),
        sum(t.num_output_tokens for t in tracked),
        sum(t.num_cached_prompt_tokens for t in tracked),
    )


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _sse(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    choices: _Choices,
    tracked: list[TrackedRequest],
    include_usage: bool,
    abort_all: Any,
) -> AsyncIterator[str]:
    shape = choices.shape
    try:
        for chunk in shape.opening_chunks([c.index for c in choices.by_key.values()]):
            yield _event(chunk)
        async for k, out in outputs:
            choice, delta = choices.add(k, out)
            if (chunk := shape.chunk(choice, delta)) is not None:
                yield _event(chunk)
        if include_usage:
            yield _event(shape.usage_chunk(_usage(tracked)))
    except APIError as exc:  # the status line is gone; the error travels as an event
        yield _event(exc.body())
    finally:
        abort_all()  # a no-op unless the client went away mid-stream
    yield "data: [DONE]\n\n"
