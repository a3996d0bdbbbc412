"""Traces of a real request through a live router and a live runtime, read back from a live Jaeger.

The client sends a W3C `traceparent`; the router's span continues it, each upstream attempt (the failed
first one and the retry) is its own child span, the runtime's span hangs under the attempt that reached
it, and the runtime's queue, prefill and decode spans under that, with the model, the revision and the
token counts as attributes.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import httpx
import pytest
from jaeger_process import Jaeger
from runtime_server_process import SERVED_MODEL

pytestmark = pytest.mark.slow

Span = dict[str, Any]


def tags(span: Span) -> dict[str, Any]:
    return {tag["key"]: tag["value"] for tag in span["tags"]}


def parent_id(span: Span) -> str | None:
    parents = [ref["spanID"] for ref in span["references"] if ref["refType"] == "CHILD_OF"]
    assert len(parents) <= 1, span["references"]
    return parents[0] if parents else None


def service(trace: dict[str, Any], span: Span) -> str:
    return trace["processes"][span["processID"]]["serviceName"]


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s["operationName"] == name]
    assert len(found) == 1, f"{name}: {len(found)} spans among {sorted(s['operationName'] for s in spans)}"
    return found[0]


def end(span: Span) -> int:
    return span["startTime"] + span["duration"]  # microseconds


def test_client_traceparent_router_attempts_and_runtime_phases(
    jaeger: Jaeger, router: str, revision: str
) -> None:
    trace_id, client_span_id = secrets.token_hex(16), secrets.token_hex(8)
    body = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    headers = {"traceparent": f"00-{trace_id}-{client_span_id}-01"}
    response = httpx.post(f"{router}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]

    # router: server span + 2 attempts; runtime: server span + queue, prefill, decode
    trace = jaeger.trace(trace_id, spans=7)
    spans = trace["spans"]
    assert {s["traceID"] for s in spans} == {trace_id}
    by_service = {
        name: [s for s in spans if service(trace, s) == name]
        for name in ("kubeinfer-router", "kubeinfer-runtime")
    }
    assert sum(map(len, by_service.values())) == len(spans) == 7, [s["operationName"] for s in spans]

    # The router: its server span continues the client's span; one child per attempt.
    router_span = one(by_service["kubeinfer-router"], "POST /v1/chat/completions")
    assert parent_id(router_span) == client_span_id
    assert (
        tags(router_span).items() >= {"http.response.status_code": 200, "kubeinfer.track": "stable"}.items()
    )
    attempts = sorted(
        (s for s in by_service["kubeinfer-router"] if s["operationName"] == "upstream attempt"),
        key=lambda s: tags(s)["kubeinfer.attempt"],
    )
    assert [parent_id(a) for a in attempts] == [router_span["spanID"]] * 2
    failed, served = (tags(a) for a in attempts)
    assert failed["kubeinfer.track"] == "canary" and failed["error.type"] == "ConnectError"
    assert failed["otel.status_code"] == "ERROR"
    assert served["kubeinfer.track"] == "stable" and served["http.response.status_code"] == 200
    assert end(attempts[0]) <= attempts[1]["startTime"], "the retry starts after the failed attempt"

    # The runtime: its server span is a child of the attempt that reached it.
    runtime_span = one(by_service["kubeinfer-runtime"], "POST /v1/chat/completions")
    assert parent_id(runtime_span) == attempts[1]["spanID"]
    attributes = tags(runtime_span)
    assert attributes["gen_ai.request.model"] == SERVED_MODEL
    assert attributes["kubeinfer.revision"] == revision
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 6
    # Jaeger shows an array attribute as its JSON text.
    assert json.loads(attributes["gen_ai.response.finish_reasons"]) == ["length"]
    process_tags = {t["key"]: t["value"] for t in trace["processes"][runtime_span["processID"]]["tags"]}
    assert process_tags["kubeinfer.revision"] == revision

    # Its phases, in order, inside it: queue until scheduled, prefill until the first token, then decode.
    queue, prefill, decode = (one(by_service["kubeinfer-runtime"], n) for n in ("queue", "prefill", "decode"))
    assert {parent_id(p) for p in (queue, prefill, decode)} == {runtime_span["spanID"]}
    assert runtime_span["startTime"] <= queue["startTime"] <= end(queue) <= prefill["startTime"] + 1
    assert end(prefill) <= decode["startTime"] + 1 and end(decode) <= end(runtime_span) + 1
    assert tags(prefill)["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert tags(decode)["gen_ai.usage.output_tokens"] == 6
    assert all(tags(p)["kubeinfer.revision"] == revision for p in (queue, prefill, decode))
    # The runtime's span lies within the attempt's, which lies within the router's.
    assert attempts[1]["startTime"] <= runtime_span["startTime"] and end(runtime_span) <= end(attempts[1]) + 1
    assert end(attempts[1]) <= end(router_span) + 1


def test_a_request_without_traceparent_starts_a_trace_at_the_router(jaeger: Jaeger, router: str) -> None:
    """Streamed, with no client trace: found by its request id through Jaeger's search by service."""
    request_id = secrets.token_hex(8)
    body = {"model": SERVED_MODEL, "prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{router}/v1/completions", json=body | {"stream": True}, headers={"x-request-id": request_id}
    ) as response:
        assert response.status_code == 200
        assert "data: [DONE]" in response.read().decode()

    found = jaeger.search("kubeinfer-runtime", {"kubeinfer.request_id": request_id}, spans=7)
    spans = found["spans"]
    router_span = next(
        s for s in spans if service(found, s) == "kubeinfer-router" and s["operationName"].startswith("POST")
    )
    assert parent_id(router_span) is None, "the router's span is the trace's root"
    runtime_span = next(
        s for s in spans if service(found, s) == "kubeinfer-runtime" and s["operationName"].startswith("POST")
    )
    served = next(s for s in spans if s["spanID"] == parent_id(runtime_span))
    assert served["operationName"] == "upstream attempt" and parent_id(served) == router_span["spanID"]
    assert tags(runtime_span)["gen_ai.operation.name"] == "text_completion"
    assert tags(runtime_span)["gen_ai.usage.output_tokens"] == 4
    assert (
        tags(runtime_span)["kubeinfer.request_id"] == tags(router_span)["kubeinfer.request_id"] == request_id
    )
    assert {s["operationName"] for s in spans if parent_id(s) == runtime_span["spanID"]} == {
        "queue",
        "prefill",
        "decode",
    }
