"""The router's spans: a SERVER span per request, and under it a CLIENT span per upstream attempt.

The server span continues the client's W3C `traceparent` (a new trace when there is none); each attempt
(the first, and each retry on another replica) is its own span, and its context is injected into that
attempt's request so the runtime's spans hang under it. An attempt's span records the pick: the track,
the replica and the load it was picked on. The committed attempt's span ends when the response has been
relayed to its end, so it covers the runtime's whole work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from kubeinfer_runtime.router.balancer import BackendLoad

from kubeinfer_runtime.tracing.config import export_target

TRACK = "kubeinfer.track"
ATTEMPT = "kubeinfer.attempt"
TRACK_HEADER = b"x-kubeinfer-track"  # kubeinfer_runtime.router.app.TRACK_HEADER
TRANSPORT = "transport"  # kubeinfer_runtime.router.app.TRANSPORT
CLIENT_GONE = "499"


class AttemptSpan(Protocol):
    def headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]: ...
    def answered(self, status: int) -> None: ...
    def failed(self, exc: BaseException) -> None: ...
    def end(self, outcome: str | None = None) -> None: ...


class RouterTracing(Protocol):
    def wrap(self, app: ASGIApp) -> ASGIApp: ...
    def attempt(
        self, track: str, endpoint: str, number: int, load: BackendLoad | None, in_flight: int
    ) -> AttemptSpan: ...


class _NoAttempt:
    def headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return headers

    def answered(self, status: int) -> None:
        pass

    def failed(self, exc: BaseException) -> None:
        pass

    def end(self, outcome: str | None = None) -> None:
        pass


NO_ATTEMPT = _NoAttempt()


class NoRouterTracing:
    """Tracing off: the app is served unwrapped and every attempt hook is a no-op."""

    def wrap(self, app: ASGIApp) -> ASGIApp:
        return app

    def attempt(
        self, track: str, endpoint: str, number: int, load: BackendLoad | None, in_flight: int
    ) -> AttemptSpan:
        return NO_ATTEMPT


class _Attempt:
    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.settled = False  # the replica answered, or the connection failed

    def headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self.span))
        names = set(carrier)
        return [(k, v) for k, v in headers if k.lower() not in names] + list(carrier.items())

    def answered(self, status: int) -> None:
        self.settled = True
        self.span.set_attribute("http.response.status_code", status)
        if status >= 400:
            self.span.set_status(Status(StatusCode.ERROR))
            self.span.set_attribute("error.type", str(status))

    def failed(self, exc: BaseException) -> None:
        self.settled = True
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, repr(exc)))
        self.span.set_attribute("error.type", type(exc).__qualname__)

    def end(self, outcome: str | None = None) -> None:
        """`outcome` is the relay's: TRANSPORT when the replica cut the stream, 499 when the client left."""
        if outcome == TRANSPORT:
            self.span.set_status(Status(StatusCode.ERROR, "the replica cut the stream"))
            self.span.set_attribute("error.type", TRANSPORT)
        elif outcome == CLIENT_GONE or not self.settled:
            self.span.set_attribute("error.type", "client_gone")
        self.span.end()


class _TracedEndpoint:
    """The router's /v1 endpoint inside a SERVER span that is the current span while it runs (the
    tasks the endpoint starts inherit it), with the status and track of the response it sent."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        parent = propagate.extract(headers)
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )
        if request_id := headers.get("x-request-id"):
            span.set_attribute("kubeinfer.request_id", request_id)
        token = context.attach(trace.set_span_in_context(span, parent))
        sent = False

        async def send_traced(message: Message) -> None:
            nonlocal sent
            if message["type"] == "http.response.start":
                sent = True
                status = message["status"]
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                for name, value in message.get("headers", []):
                    if name.lower() == TRACK_HEADER:
                        span.set_attribute(TRACK, value.decode())
            await send(message)

        try:
            await self.app(scope, receive, send_traced)
        finally:
            if not sent:
                span.set_attribute("error.type", "client_gone")
            context.detach(token)
            span.end()


class OtelRouterTracing:
    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def wrap(self, app: ASGIApp) -> ASGIApp:
        return _TracedEndpoint(app, self.tracer)

    def attempt(
        self, track: str, endpoint: str, number: int, load: BackendLoad | None, in_flight: int
    ) -> AttemptSpan:
        url = urlsplit(endpoint)
        attributes: dict[str, str | int | float | bool] = {
            TRACK: track,
            ATTEMPT: number,
            "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "kubeinfer.replica.in_flight": in_flight,
        }
        if load is not None:  # what the last /metrics probe said, which the pick went by
            attributes |= {
                "kubeinfer.replica.waiting": load.waiting,
                "kubeinfer.replica.kv_cache_usage": load.kv_cache_usage,
                "kubeinfer.replica.reachable": load.reachable,
            }
        span = self.tracer.start_span("upstream attempt", kind=SpanKind.CLIENT, attributes=attributes)
        return _Attempt(span)


def start_router_tracing(
    otlp_endpoint: str | None, environ: Mapping[str, str]
) -> tuple[RouterTracing, Callable[[], None]]:
    """The router's tracing and the function that flushes it at exit; NoRouterTracing unless an OTLP
    endpoint is configured (raises TracingConfigError on settings it cannot honour)."""
    target = export_target(otlp_endpoint, environ)
    if target is None:
        return NoRouterTracing(), lambda: None
    from kubeinfer_runtime.tracing.provider import start_tracer  # the SDK: only when on

    tracer, shutdown = start_tracer(target, "kubeinfer-router", {}, environ)
    return OtelRouterTracing(tracer), shutdown
