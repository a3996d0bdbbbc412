"""The OpenTelemetry SDK set up to export over OTLP/HTTP: imported only when tracing is on."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from kubeinfer_runtime.tracing.config import ExportTarget

INSTRUMENTATION_NAME = "kubeinfer_runtime"


def start_tracer(
    target: ExportTarget, service_name: str, attributes: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[trace.Tracer, Callable[[], None]]:
    """A tracer whose spans are batched and exported in a background thread, and the function that
    flushes and stops it. The sampler follows OTEL_TRACES_SAMPLER (default: parent-based, always on);
    OTEL_SERVICE_NAME names the service; OTEL_RESOURCE_ATTRIBUTES adds to the resource."""
    resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME") or service_name, **attributes})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=target.traces_url)))
    # Not made the global provider: FastAPI (0.16x) starts its own server and operation spans whenever the
    # global one is set, which would double the runtime's server span and bury its phases.
    return provider.get_tracer(INSTRUMENTATION_NAME), provider.shutdown
