"""Fake OpenAI-compatible backends and a uvicorn-in-a-thread server for the router tests: real HTTP on
free 127.0.0.1 ports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeBackend:
    """A replica that answers /v1/completions with `chunks` SSE events `chunk_delay_s` apart and reports
    `waiting`/`kv` on /metrics. `status` other than 200 makes it answer every completion with that error;
    `reply_after_s` delays a non-streamed answer, as a long generation would; `retry_after` is the
    Retry-After header of its error answers. `cancelled` is set when
    the client (the router) goes away before the answer is complete."""

    name: str
    waiting: float = 0.0
    kv: float = 0.0
    status: int = 200
    chunks: int = 3
    chunk_delay_s: float = 0.0
    reply_after_s: float = 0.0
    crash_after_chunks: int | None = None
    retry_after: str | None = None
    served: int = 0
    probes: int = 0
    request_ids: list[str] = field(default_factory=list)
    stream_finished: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def app(self) -> Starlette:
        async def completions(request: Request) -> Response:
            body = await request.json()
            self.request_ids.append(request.headers.get("x-request-id", ""))
            if self.status != 200:
                headers = {"retry-after": self.retry_after} if self.retry_after else None
                error = {"error": {"message": f"{self.name} is broken"}}
                return JSONResponse(error, status_code=self.status, headers=headers)
            self.served += 1
            if body.get("stream"):
                return StreamingResponse(self._events(), media_type="text/event-stream")
            deadline = time.monotonic() + self.reply_after_s
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.cancelled.set()
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
            return JSONResponse({"backend": self.name, "choices": [{"text": "hello", "index": 0}]})

        async def metrics(request: Request) -> Response:
            self.probes += 1
            text = (
                "# TYPE kubeinfer_requests_waiting gauge\n"
                f'kubeinfer_requests_waiting{{model="m"}} {self.waiting}\n'
                "# TYPE kubeinfer_kv_cache_usage_ratio gauge\n"
                f'kubeinfer_kv_cache_usage_ratio{{model="m"}} {self.kv}\n'
            )
            return PlainTextResponse(text)

        return Starlette(
            routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/metrics", metrics)]
        )

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.chunks):
                if i == self.crash_after_chunks:
                    raise RuntimeError(f"{self.name} crashed mid-stream")  # uvicorn drops the connection
                if i:
                    await asyncio.sleep(self.chunk_delay_s)
                event = {"backend": self.name, "choices": [{"text": f"tok{i}", "index": 0}]}
                yield f"data: {json.dumps(event)}\n\n".encode()
            yield b"data: [DONE]\n\n"
            self.stream_finished.set()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


class ServerThread:
    """Runs an ASGI app under uvicorn in a daemon thread, on a socket bound before start (no port race)."""

    def __init__(self, app: Any) -> None:
        # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections, as on uvicorn's own
        # socket; without it every keep-alive response stalls 40 ms on Nagle plus delayed ACK.
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def free_dead_url() -> str:
    """A URL nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def hang_up_url() -> str:
    """A URL whose server accepts connections and closes them without a word."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def hang_up() -> None:
        while True:
            connection, _ = listener.accept()
            connection.close()

    threading.Thread(target=hang_up, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def write_config(path: Path, tracks: dict[str, tuple[int, list[str]]]) -> None:
    doc = {"tracks": {name: {"weight": w, "endpoints": eps} for name, (w, eps) in tracks.items()}}
    path.write_text(json.dumps(doc))
