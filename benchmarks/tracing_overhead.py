"""What tracing costs a request, off and on, measured side by side in one run.

Per request, the runtime calls its tracing once (RuntimeTracing.record, after the response) and the
router once per attempt (the attempt span's hooks) plus its endpoint wrapper. This times exactly those
calls, in-process, for:

  off   the objects the runtime and router get when no OTLP endpoint is configured (the default)
  on    the OpenTelemetry SDK with its BatchSpanProcessor, as `--otlp-endpoint` sets it up, exporting to
        a sink that drops the spans (the export happens in the processor's thread, off the request path)

and, for scale, an empty Python function call. Rounds of --requests requests alternate off/on
(--repeats rounds each); the report gives medians in microseconds per request and the JSON every round.

Usage: python benchmarks/tracing_overhead.py [--requests N] [--repeats R] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from starlette.requests import Request

from kubeinfer_runtime.router.balancer import BackendLoad
from kubeinfer_runtime.server.async_engine import TrackedRequest
from kubeinfer_runtime.tracing.router_spans import NoRouterTracing, OtelRouterTracing, RouterTracing
from kubeinfer_runtime.tracing.runtime_spans import NoRuntimeTracing, OtelRuntimeTracing, RuntimeTracing

TRACEPARENT = (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")


class DroppingExporter(SpanExporter):
    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS


def runtime_request() -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [TRACEPARENT, (b"content-type", b"application/json")],
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
    }
    request = Request(scope)
    now = time.monotonic()
    tracked = TrackedRequest("chatcmpl-1", now - 0.5, num_prompt_tokens=40)
    tracked.scheduled_time, tracked.first_token_time, tracked.last_token_time = now - 0.4, now - 0.3, now
    tracked.num_output_tokens, tracked.finish_reasons, tracked.outcome = 16, ["length"], "success"
    request.state.request_id, request.state.arrival_time = "r-1", now - 0.5
    request.state.tracked_all = [tracked]
    return request


def runtime_per_request(tracing: RuntimeTracing) -> Callable[[], None]:
    request = runtime_request()
    return lambda: tracing.record(request, 200)


def router_per_request(tracing: RouterTracing) -> Callable[[], None]:
    """One request with one attempt: the endpoint wrapper around an app that answers, the attempt hooks."""
    headers = [("content-type", "application/json"), ("x-request-id", "r-1")]
    load = BackendLoad(waiting=1.0, kv_cache_usage=0.2)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        span = tracing.attempt("stable", "http://10.0.0.5:8000", 1, load, 1)
        span.headers(headers)
        span.answered(200)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"x-kubeinfer-track", b"stable")]}
        )
        span.end("200")

    endpoint = tracing.wrap(app)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [TRACEPARENT]}

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    # A coroutine driven by hand: no event-loop scheduling in the measurement, only the calls themselves.
    def one() -> None:
        coroutine = endpoint(scope, receive, send)
        try:
            coroutine.send(None)
        except StopIteration:
            return
        raise AssertionError("the endpoint waited on something: the measurement would not be of the calls")

    return one


def time_round(call: Callable[[], None], requests: int) -> float:
    """Microseconds per request over `requests` calls."""
    started = time.perf_counter_ns()
    for _ in range(requests):
        call()
    return (time.perf_counter_ns() - started) / requests / 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write every round here")
    args = parser.parse_args()

    exporter = DroppingExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    tracer = provider.get_tracer("bench")
    cases: dict[str, Callable[[], None]] = {
        "empty function call": lambda: None,
        "runtime off": runtime_per_request(NoRuntimeTracing()),
        "runtime on": runtime_per_request(OtelRuntimeTracing(tracer, "tiny", "5f0c1d2e3a")),
        "router off": router_per_request(NoRouterTracing()),
        "router on": router_per_request(OtelRouterTracing(tracer)),
    }
    for call in cases.values():  # warm-up
        time_round(call, 200)
    rounds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, call in cases.items():
            rounds[name].append(time_round(call, args.requests))
            provider.force_flush()  # the export thread's backlog must not spill into the next case
    provider.shutdown()

    medians = {name: statistics.median(values) for name, values in rounds.items()}
    print(f"tracing cost per request, median of {args.repeats} rounds of {args.requests} (microseconds)")
    print("(a shared, noisy machine: other jobs run on its cores)")
    for name, value in medians.items():
        print(f"  {name:<22} {value:9.2f} us")
    print(f"spans exported to the sink: {exporter.exported}")
    if args.json:
        result = {
            "benchmark": "tracing_overhead",
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
            },
            "requests_per_round": args.requests,
            "rounds_us_per_request": rounds,
            "median_us_per_request": medians,
            "spans_exported": exporter.exported,
        }
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
