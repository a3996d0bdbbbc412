"""`kubeinfer-runtime route`: run the router in front of an InferenceService's stable and canary replicas."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn

from kubeinfer_runtime.api_keys import DEFAULT_RELOAD_S, ApiKeys
from kubeinfer_runtime.http_edge import EdgeLimits, add_edge_arguments, edge_limits_from
from kubeinfer_runtime.router.app import create_app
from kubeinfer_runtime.router.config import ConfigError
from kubeinfer_runtime.router.configmap_source import ConfigMapSource, parse_reference
from kubeinfer_runtime.router.retry_budget import RetryBudget
from kubeinfer_runtime.router.upstream_limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_POOL_TIMEOUT_S,
    UpstreamLimits,
)
from kubeinfer_runtime.tracing.config import TracingConfigError
from kubeinfer_runtime.tracing.router_spans import start_router_tracing


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubeinfer-runtime route",
        description="Split OpenAI-compatible traffic between tracks by weight, and within a track by load.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="JSON/YAML file with the tracks; re-read on change")
    source.add_argument(
        "--configmap",
        metavar="NAMESPACE/NAME",
        help="read the tracks from this ConfigMap's router.json key through the API (in a pod)",
    )
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--probe-interval", type=float, default=1.0, help="seconds between /metrics load probes"
    )
    parser.add_argument(
        "--config-poll-interval", type=float, default=1.0, help="seconds between config checks"
    )
    parser.add_argument(
        "--max-attempts", type=int, default=2, help="replicas tried per request (1 = never retry)"
    )
    parser.add_argument(
        "--retry-budget-ratio",
        type=float,
        default=0.1,
        help="retries allowed as a share of the requests of the last --retry-budget-window seconds",
    )
    parser.add_argument(
        "--retry-budget-floor", type=int, default=3, help="retries allowed per window whatever the traffic"
    )
    parser.add_argument("--retry-budget-window", type=float, default=10.0, help="seconds")
    parser.add_argument("--connect-timeout", type=float, default=2.0, help="seconds to connect to a replica")
    parser.add_argument(
        "--upstream-max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="connections to all replicas in all; a request waits --upstream-pool-timeout for one, then 503",
    )
    parser.add_argument("--upstream-pool-timeout", type=float, default=DEFAULT_POOL_TIMEOUT_S, help="seconds")
    parser.add_argument(
        "--api-key-file",
        type=Path,
        help="API keys clients must send (a file, one per line, or a directory: a mounted Secret); re-read",
    )
    parser.add_argument("--api-key-reload-seconds", type=float, default=DEFAULT_RELOAD_S, help="seconds")
    add_edge_arguments(
        lambda name, help_, default, type_: parser.add_argument(name, type=type_, default=default, help=help_)
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="export traces to this OTLP/HTTP collector, e.g. http://jaeger:4318 (default: "
        "OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)",
    )
    args = parser.parse_args(argv)
    try:
        args.upstream_limits = UpstreamLimits(args.upstream_max_connections, args.upstream_pool_timeout)
        args.edge_limits = edge_limits_from(args)
        args.api_keys = ApiKeys(args.api_key_file, args.api_key_reload_seconds) if args.api_key_file else None
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    if args.max_attempts < 1:
        parser.error("--max-attempts: must be at least 1")
    if not 0 <= args.retry_budget_ratio <= 1 or args.retry_budget_floor < 0 or args.retry_budget_window <= 0:
        parser.error("--retry-budget-ratio must be within 0..1, the floor >= 0 and the window > 0")
    if args.probe_interval <= 0 or args.config_poll_interval <= 0:
        parser.error("--probe-interval and --config-poll-interval: must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        tracing, stop_tracing = start_router_tracing(args.otlp_endpoint, os.environ)
        source = args.config or ConfigMapSource(*parse_reference(args.configmap))
        app = create_app(
            source,
            probe_interval_s=args.probe_interval,
            config_poll_s=args.config_poll_interval,
            max_attempts=args.max_attempts,
            connect_timeout_s=args.connect_timeout,
            retry_budget=RetryBudget(
                args.retry_budget_ratio, args.retry_budget_floor, args.retry_budget_window
            ),
            upstream_limits=args.upstream_limits,
            edge_limits=args.edge_limits,
            api_keys=args.api_keys,
            tracing=tracing,
        )
    except (ConfigError, TracingConfigError) as exc:
        print(f"kubeinfer-runtime route: {exc}", file=sys.stderr)
        return 2
    # On SIGTERM uvicorn stops accepting and lets in-flight streams finish (the pod's grace period bounds it).
    edge: EdgeLimits = args.edge_limits
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        **edge.uvicorn_options(),
    )
    stop_tracing()  # flushes the spans still batched
    return 0
