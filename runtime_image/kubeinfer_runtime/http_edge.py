"""What a client may hold of an HTTP server at the serving edge (the router and the runtime server alike).

- A request body is at most `max_body_bytes` (413 in OpenAI's error shape, before the body is read when
  Content-Length says so) and arrives within `body_timeout_s` of its headers (else 408): the body is
  read here, whole, before the app sees it — both apps need all of it anyway (a JSON document).
- Request headers arrive within `header_timeout_s` of the connection opening or of the previous response
  ending, else the connection is closed: uvicorn's only timeout is the keep-alive one, which it arms
  after a response and disarms on any byte, so a client sending a byte a second (or nothing at all
  after connecting) would hold its connection forever. Go's ReadHeaderTimeout, in effect.
- An idle kept-alive connection is closed after `idle_timeout_s` (uvicorn's timeout_keep_alive).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024  # a 128k-token prompt is ~0.5 MB of JSON; 2 MiB leaves room
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_IDLE_TIMEOUT_S = 5.0  # uvicorn's own default


@dataclass(frozen=True)
class EdgeLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"the body limit must be at least 1 byte, got {self.max_body_bytes}")
        if min(self.header_timeout_s, self.body_timeout_s, self.idle_timeout_s) <= 0:
            raise ValueError("the header, body and idle timeouts must be positive")

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for uvicorn.Config that apply the connection-level limits."""
        return {
            "http": with_header_deadline(AutoHTTPProtocol, self.header_timeout_s),
            "timeout_keep_alive": self.idle_timeout_s,
        }


# (flag, help, default, type): the same flags on `kubeinfer-runtime serve` and `route`.
EDGE_FLAGS: tuple[tuple[str, str, Any, type], ...] = (
    ("--max-body-bytes", "largest request body accepted; a larger one gets 413", DEFAULT_MAX_BODY_BYTES, int),
    ("--header-timeout", "seconds a request's headers may take to arrive (from the connection opening or "
     "the previous response); the connection is closed after", DEFAULT_HEADER_TIMEOUT_S, float),
    ("--body-timeout", "seconds a request's body may take to arrive after its headers; 408 after",
     DEFAULT_BODY_TIMEOUT_S, float),
    ("--idle-timeout", "seconds a kept-alive connection may sit idle between requests",
     DEFAULT_IDLE_TIMEOUT_S, float),
)  # fmt: skip


def add_edge_arguments(add: Callable[[str, str, Any, type], object]) -> None:
    """Declares EDGE_FLAGS through `add(flag, help, default, type)` (each CLI has its own flag helper)."""
    for name, help_, default, type_ in EDGE_FLAGS:
        add(name, help_, default, type_)


def edge_limits_from(args: argparse.Namespace) -> EdgeLimits:
    """Raises ValueError naming the bad value."""
    return EdgeLimits(args.max_body_bytes, args.header_timeout, args.body_timeout, args.idle_timeout)


def with_header_deadline(base: type[asyncio.Protocol], timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (h11 or httptools: both keep the current request in `cycle`), closing a
    connection whose next request's headers have not arrived `timeout_s` after it opened or after the
    previous response ended. A request whose headers did arrive is left to the body deadline."""

    class HeaderDeadlineProtocol(base):  # type: ignore[misc, valid-type]
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(timeout_s, self._header_deadline_passed)

        def _header_deadline_passed(self) -> None:
            self._header_deadline = None
            request_in_progress = self.cycle is not None and not self.cycle.response_complete
            if not request_in_progress and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadlineProtocol.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadlineProtocol


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class BodyLimit:
    """ASGI middleware: the body of a request under `path_prefix`, read whole within the limits, then
    handed to the app as one message (the app's later receive() calls still see a disconnect)."""

    def __init__(self, app: ASGIApp, limits: EdgeLimits, path_prefix: str = "/v1/") -> None:
        self.app = app
        self.limits = limits
        self.path_prefix = path_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.path_prefix):
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _reject(
                send, 413, f"The request body ({declared} bytes) is over the limit of {limit} bytes."
            )
            return
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                body = await _read_body(receive, limit)
        except TimeoutError:
            timeout = self.limits.body_timeout_s
            await _reject(
                send, 408, f"The request body did not arrive within {timeout:g} s.", "request_timeout"
            )
            return
        except _TooLarge:
            await _reject(send, 413, f"The request body is over the limit of {limit} bytes.")
            return
        except _ClientGone:
            return
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive_after_body() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, receive_after_body, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser refuses a malformed one before the app is called
    return None


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _reject(send: Send, status: int, message: str, code: str = "request_too_large") -> None:
    """An error in OpenAI's shape; the connection closes, since the rest of the body was never read."""
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
