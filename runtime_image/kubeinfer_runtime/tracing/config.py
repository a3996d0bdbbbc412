"""Whether traces are exported, and where: decided from a CLI flag and the standard OTEL_* variables.

No OpenTelemetry import here: with tracing off, the SDK is never imported, so no request does any of
its work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The OTLP/HTTP exporter reads these itself (and OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, ...).
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SUPPORTED_PROTOCOLS = ("http/protobuf",)


class TracingConfigError(ValueError):
    """The OTEL_* settings ask for something this build cannot do; the message says what."""


@dataclass(frozen=True)
class ExportTarget:
    """Spans go to an OTLP/HTTP collector: `traces_url` when a flag named it, else wherever the
    exporter's OTEL_EXPORTER_OTLP_* variables point."""

    traces_url: str | None


def traces_url(base: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is read."""
    return base.rstrip("/") + "/v1/traces"


def export_target(flag: str | None, environ: Mapping[str, str]) -> ExportTarget | None:
    """None (tracing off) unless --otlp-endpoint or an OTLP endpoint variable is set.

    OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off whatever else is set, as the
    OpenTelemetry specification says; only the http/protobuf protocol is built in."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "none" in exporters:
        return None
    if not flag and not any(environ.get(name) for name in ENDPOINT_VARS):
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(name)
        if protocol and protocol not in SUPPORTED_PROTOCOLS:
            raise TracingConfigError(
                f"{name}={protocol!r}: only {', '.join(SUPPORTED_PROTOCOLS)} is supported (OTLP over HTTP, "
                "port 4318 on a collector)"
            )
        if protocol:
            break
    return ExportTarget(traces_url(flag) if flag else None)
