"""A tiny OpenAI-compatible server whose latencies and failures are set by flags.

Every request waits `--ttft` before its first token and `--itl` between tokens, counted from when
it starts generating so sleeps do not drift. With `--max-running N`, requests beyond N queue for a
slot first, so load past capacity shows up as TTFT, as on a real engine. A request generates
exactly max_tokens "tokens" (one word each); prompt tokens are counted as words. `--faults` cycles
over requests: ok, 429, 500, hang (never answers) or drop (closes the connection mid-stream).
GET /stats reports requests seen, arrival times and the most in flight at once. Used by the bench
tests, and as a target to try `kubeinfer bench` without a GPU:

    python -m kubeinfer_operator.bench.synthetic_server --port 8000 --ttft 200ms --itl 20ms --max-running 8
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kubeinfer_operator.api import parse_duration

FAULTS = ("ok", "429", "500", "hang", "drop")
MODEL = "synthetic"


@dataclass
class ServerState:
    ttft_s: float
    itl_s: float
    faults: itertools.cycle  # of FAULTS entries
    slots: asyncio.Semaphore | None  # --max-running: requests beyond it queue, as on a full engine
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each request


def _prompt_tokens(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


def _chunk(chat: bool, text: str | None, finish: str | None = None, usage: dict | None = None) -> str:
    if text is None:
        choices = []
    elif chat:
        choices = [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text, "finish_reason": finish}]
    kind = "chat.completion.chunk" if chat else "text_completion"
    return (
        "data: " + json.dumps({"object": kind, "model": MODEL, "choices": choices, "usage": usage}) + "\n\n"
    )


async def _generate(state: ServerState, chat: bool, body: dict, fault: str) -> AsyncIterator[str]:
    max_tokens = int(body.get("max_tokens") or 16)
    prompt_tokens = _prompt_tokens(body)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    if state.slots:
        await state.slots.acquire()
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    started = time.monotonic()
    try:
        for i in range(max_tokens):
            await asyncio.sleep(max(0.0, started + state.ttft_s + i * state.itl_s - time.monotonic()))
            if fault == "drop" and i == 1:
                raise ConnectionAbortedError("synthetic fault: dropping the connection mid-stream")
            yield _chunk(chat, f" tok{i}", "length" if i == max_tokens - 1 else None)
    finally:
        # Leave the in-flight count before the last bytes go out, so a client that starts its next
        # request on receiving them can never be counted twice.
        state.in_flight -= 1
        if state.slots:
            state.slots.release()
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _chunk(chat, None, usage=usage)
    yield "data: [DONE]\n\n"


def build_app(
    ttft_s: float, itl_s: float, faults: tuple[str, ...] = ("ok",), max_running: int | None = None
) -> Starlette:
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"--faults: unknown {sorted(unknown)}; expected some of {', '.join(FAULTS)}")
    slots = asyncio.Semaphore(max_running) if max_running else None
    state = ServerState(ttft_s, itl_s, itertools.cycle(faults), slots)

    async def completions(request: Request) -> Response:
        body = await request.json()
        chat = request.url.path.endswith("/chat/completions")
        state.requests += 1
        state.arrivals.append(time.monotonic())
        fault = next(state.faults)
        if not body.get("stream"):
            return JSONResponse({"error": {"message": "this server only streams: set stream to true"}}, 400)
        if fault in ("429", "500"):
            headers = {"Retry-After": "1"} if fault == "429" else {}
            return JSONResponse(
                {"error": {"message": f"synthetic {fault}"}}, status_code=int(fault), headers=headers
            )
        if fault == "hang":
            await asyncio.sleep(3600)
        return StreamingResponse(_generate(state, chat, body, fault), media_type="text/event-stream")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def stats(_: Request) -> Response:
        return JSONResponse(
            {
                "requests": state.requests,
                "in_flight": state.in_flight,
                "max_in_flight": state.max_in_flight,
                "arrivals": state.arrivals,
            }
        )

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", health),
            Route("/stats", stats),
        ]
    )


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m kubeinfer_operator.bench.synthetic_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttft", type=_duration, default="50ms", help="time to first token (default 50ms)")
    parser.add_argument("--itl", type=_duration, default="10ms", help="time between tokens (default 10ms)")
    parser.add_argument("--max-running", type=int, help="requests generated at once; the rest queue")
    parser.add_argument(
        "--faults", default="ok", help=f"comma list cycled over requests, of: {', '.join(FAULTS)}"
    )
    args = parser.parse_args(argv)
    try:
        app = build_app(args.ttft, args.itl, tuple(args.faults.split(",")), args.max_running)
    except ValueError as e:
        parser.error(str(e))
    # A hanging request must not hold shutdown forever.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
