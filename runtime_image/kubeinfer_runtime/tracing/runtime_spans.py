"""The runtime's spans, written when a request's response has been sent.

One SERVER span per API request, its parent the caller's W3C `traceparent` (the router's attempt, or
the client), with three children from the times the server layer already records (TrackedRequest):
queue (arrival to first scheduled), prefill (to the first token), decode (to the last token). They are
written after the fact with those timestamps, so nothing is added to the request's path while it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from kubeinfer_runtime.tracing.config import export_target

if TYPE_CHECKING:
    from starlette.requests import Request

    from kubeinfer_runtime.server.async_engine import TrackedRequest

# OpenTelemetry's semantic conventions (HTTP and GenAI); kubeinfer's own under `kubeinfer.`.
REVISION = "kubeinfer.revision"
REQUEST_ID = "kubeinfer.request_id"
OUTCOME = "kubeinfer.outcome"
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}


class RuntimeTracing(Protocol):
    def record(self, request: Request, status: int) -> None: ...


class NoRuntimeTracing:
    """Tracing off: nothing is recorded, the OpenTelemetry SDK is not even imported."""

    def record(self, request: Request, status: int) -> None:
        pass


def epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns


def monotonic_offset_ns() -> int:
    """Add to a time.monotonic() reading (in ns) to get wall-clock ns since the epoch, as spans carry."""
    return time.time_ns() - time.monotonic_ns()


def phases(tracked: TrackedRequest, ended: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of the phases the request went through, in time.monotonic() seconds. A request
    that never got scheduled (timed out, cancelled, rejected by the engine) has only its queue phase."""
    scheduled, first, last = tracked.scheduled_time, tracked.first_token_time, tracked.last_token_time
    if scheduled is None:
        return [("queue", tracked.arrival_time, ended)]
    spans = [("queue", tracked.arrival_time, scheduled)]
    spans.append(("prefill", scheduled, first if first is not None else ended))
    if first is not None and last is not None and last > first:
        spans.append(("decode", first, last))
    return spans


def phase_tokens(tracked: TrackedRequest) -> dict[str, dict[str, int]]:
    """The tokens each phase worked on (the prompt's first sequence, whose times the phases are)."""
    return {
        "prefill": {
            "gen_ai.usage.input_tokens": tracked.num_prompt_tokens,
            "gen_ai.usage.cache_read.input_tokens": tracked.num_cached_prompt_tokens,
        },
        "decode": {"gen_ai.usage.output_tokens": tracked.num_output_tokens},
    }


def usage_attributes(tracked: Sequence[TrackedRequest]) -> dict[str, int | Sequence[str]]:
    """Token counts over all the request's prompts, as the response's `usage` counts them."""
    attributes: dict[str, int | Sequence[str]] = {
        "gen_ai.usage.input_tokens": sum(t.num_prompt_tokens for t in tracked),
        "gen_ai.usage.output_tokens": sum(t.num_output_tokens for t in tracked),
        "gen_ai.usage.cache_read.input_tokens": sum(t.num_cached_prompt_tokens for t in tracked),
    }
    reasons = [reason for t in tracked for reason in t.finish_reasons]
    if reasons:
        attributes["gen_ai.response.finish_reasons"] = reasons
    return attributes


class OtelRuntimeTracing:
    def __init__(self, tracer: trace.Tracer, model: str, revision: str | None) -> None:
        self.tracer = tracer
        self.common = {"gen_ai.request.model": model} | ({REVISION: revision} if revision else {})

    def record(self, request: Request, status: int) -> None:
        ended = time.monotonic()
        offset = monotonic_offset_ns()
        path = request.url.path
        tracked: list[TrackedRequest] = getattr(request.state, "tracked_all", [])
        attributes = {
            **self.common,
            "http.request.method": request.method,
            "url.path": path,
            "http.response.status_code": status,
            REQUEST_ID: request.state.request_id,
        }
        if operation := OPERATIONS.get(path):
            attributes["gen_ai.operation.name"] = operation
        if tracked:
            attributes |= usage_attributes(tracked)
            attributes[OUTCOME] = tracked[0].outcome or "cancelled"
        span = self.tracer.start_span(
            f"{request.method} {path}",
            context=propagate.extract(request.headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=epoch_ns(request.state.arrival_time, offset),
        )
        if status >= 500:  # a 4xx is the client's error, not the server's (HTTP conventions)
            span.set_status(Status(StatusCode.ERROR))
        if tracked:
            parent = trace.set_span_in_context(span)
            tokens = phase_tokens(tracked[0])
            for name, start, end in phases(tracked[0], ended):
                child = self.tracer.start_span(
                    name,
                    context=parent,
                    attributes=self.common | tokens.get(name, {}),
                    start_time=epoch_ns(start, offset),
                )
                child.end(end_time=epoch_ns(end, offset))
        span.end(end_time=epoch_ns(ended, offset))


def start_runtime_tracing(
    otlp_endpoint: str | None, model: str, revision: str | None, environ: Mapping[str, str]
) -> tuple[RuntimeTracing, Callable[[], None]]:
    """The runtime's tracing and the function that flushes it at exit; NoRuntimeTracing unless an OTLP
    endpoint is configured (raises TracingConfigError on settings it cannot honour)."""
    target = export_target(otlp_endpoint, environ)
    if target is None:
        return NoRuntimeTracing(), lambda: None
    from kubeinfer_runtime.tracing.provider import start_tracer  # the SDK: only when on

    resource = {REVISION: revision} if revision else {}
    tracer, shutdown = start_tracer(target, "kubeinfer-runtime", resource, environ)
    return OtelRuntimeTracing(tracer, model, revision), shutdown
