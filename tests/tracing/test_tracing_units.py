"""Tracing's decisions as plain functions: when it is on, where spans go, which phases a request had;
and that with tracing off neither the runtime nor the router sets up any of the OpenTelemetry SDK."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kubeinfer_runtime.server.async_engine import TrackedRequest
from kubeinfer_runtime.tracing.config import ExportTarget, TracingConfigError, export_target
from kubeinfer_runtime.tracing.runtime_spans import phases, usage_attributes


def test_off_unless_an_endpoint_is_configured() -> None:
    assert export_target(None, {}) is None
    assert export_target("", {"OTEL_SERVICE_NAME": "x"}) is None


def test_flag_names_the_collector_base_url() -> None:
    assert export_target("http://jaeger:4318/", {}) == ExportTarget("http://jaeger:4318/v1/traces")


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_standard_endpoint_variables_turn_it_on_and_the_exporter_reads_them(variable: str) -> None:
    assert export_target(None, {variable: "http://collector:4318"}) == ExportTarget(None)


@pytest.mark.parametrize(
    "off", [{"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "TRUE"}]
)
def test_standard_off_switches_win_over_an_endpoint(off: dict[str, str]) -> None:
    assert (
        export_target("http://jaeger:4318", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **off}) is None
    )


def test_grpc_protocol_is_refused_with_a_clear_error() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(TracingConfigError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL='grpc'.*http/protobuf"):
        export_target(None, environ)
    # The traces-specific variable wins over the general one.
    assert export_target(None, environ | {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}) is not None


def tracked(**times: float | None) -> TrackedRequest:
    request = TrackedRequest("r", arrival_time=10.0, num_prompt_tokens=7)
    for name, value in times.items():
        setattr(request, name, value)
    return request


def test_phases_of_a_request_that_decoded() -> None:
    request = tracked(scheduled_time=10.5, first_token_time=11.0, last_token_time=12.0)
    assert phases(request, ended=12.1) == [
        ("queue", 10.0, 10.5),
        ("prefill", 10.5, 11.0),
        ("decode", 11.0, 12.0),
    ]


def test_a_request_never_scheduled_only_queued_until_it_ended() -> None:
    assert phases(tracked(), ended=13.0) == [("queue", 10.0, 13.0)]


def test_one_token_has_no_decode_and_an_unfinished_prefill_ends_with_the_request() -> None:
    one_token = tracked(scheduled_time=10.5, first_token_time=11.0, last_token_time=11.0)
    assert [name for name, *_ in phases(one_token, ended=11.2)] == ["queue", "prefill"]
    assert phases(tracked(scheduled_time=10.5), ended=11.5)[-1] == ("prefill", 10.5, 11.5)


def test_usage_sums_every_prompt_of_the_request() -> None:
    first, second = tracked(), tracked()
    first.num_output_tokens, second.num_output_tokens = 3, 4
    first.finish_reasons, second.finish_reasons = ["length"], ["stop"]
    assert usage_attributes([first, second]) == {
        "gen_ai.usage.input_tokens": 14,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 0,
        "gen_ai.response.finish_reasons": ["length", "stop"],
    }


# A fresh interpreter: other tests in this process may have imported the SDK.
TRACING_OFF = """
import sys, threading
from pathlib import Path
from opentelemetry import trace
from kubeinfer_runtime.router.app import Router, create_app
from kubeinfer_runtime.tracing.router_spans import NoRouterTracing, start_router_tracing
from kubeinfer_runtime.tracing.runtime_spans import NoRuntimeTracing, start_runtime_tracing
import kubeinfer_runtime.server.app

environ = {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}  # no endpoint
runtime, _ = start_runtime_tracing(None, "tiny", "rev-1", environ)
router, _ = start_router_tracing(None, environ)
assert isinstance(runtime, NoRuntimeTracing) and isinstance(router, NoRouterTracing)
config = Path(sys.argv[1])
config.write_text('{"tracks": {"stable": {"weight": 1, "endpoints": ["http://127.0.0.1:9"]}}}')
app = create_app(config, tracing=router)
endpoint = next(r.app for r in app.routes if r.path.startswith("/v1/"))
print(type(endpoint).__name__)
print(type(trace.get_tracer_provider()).__name__)
print(sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter"))))
print(sorted(t.name for t in threading.enumerate()))
"""


def test_tracing_off_sets_up_no_provider_exporter_or_wrapper(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRACING_OFF, str(tmp_path / "router.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    endpoint, provider, sdk_modules, threads = result.stdout.splitlines()
    assert endpoint == "Router", "the /v1 endpoint is the router itself, no tracing wrapper around it"
    assert provider == "ProxyTracerProvider", "the API's default: no SDK TracerProvider was set"
    assert sdk_modules == "[]", "the OpenTelemetry SDK and exporter were never imported"
    assert threads == "['MainThread']", "no batch span processor thread"


def test_router_refuses_a_grpc_collector_at_start_naming_the_variable(tmp_path) -> None:
    config = tmp_path / "router.json"
    config.write_text('{"tracks": {"stable": {"weight": 1, "endpoints": ["http://127.0.0.1:9"]}}}')
    result = subprocess.run(
        [sys.executable, "-m", "kubeinfer_runtime.cli", "route", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        },
    )
    assert result.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'" in result.stderr and "http/protobuf" in result.stderr
