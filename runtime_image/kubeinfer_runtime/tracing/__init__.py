"""OpenTelemetry traces of the runtime and the router: off unless an OTLP endpoint is configured."""
