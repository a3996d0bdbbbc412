"""`kubeinfer-runtime serve`: load the model in the background, serve HTTP at once, drain on SIGTERM.

The HTTP server starts before the model is loaded so that /health answers during a long load (a
startup probe) while /ready stays 503 until the warm-up generation has succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import uvicorn

from kubeinfer_runtime.api_keys import ApiKeys
from kubeinfer_runtime.server.app import RuntimeState, create_app
from kubeinfer_runtime.server.async_engine import AdmissionLimits, AsyncEngine
from kubeinfer_runtime.server.config import ServerConfig, parse_config
from kubeinfer_runtime.server.logs import configure_logging
from kubeinfer_runtime.tracing.config import TracingConfigError
from kubeinfer_runtime.tracing.runtime_spans import start_runtime_tracing

log = logging.getLogger("kubeinfer.server")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # SIGTERM/SIGINT are ours (see `_drain`); uvicorn's own handling would cut streams short.
        yield


def _load_engine(config: ServerConfig):  # -> LLMEngine; imported here so `--help` does not import torch
    if config.fault_fail_load:
        raise RuntimeError("injected fault: --fault-fail-load is set, so the model load fails")
    from kubeinfer_runtime.engine.llm_engine import LLMEngine

    return LLMEngine.from_model_dir(config.model, **config.engine_overrides())


def _close_idle_connections(server: uvicorn.Server) -> None:
    """Close the kept-alive connections that are idle now; one with a request in flight closes once its
    response is sent. A client's connection through kube-proxy stays on this pod for as long as it is
    open, whatever the endpoints say: closed, the client reconnects to a pod that is not stopping."""
    for connection in list(server.server_state.connections):
        connection.shutdown()


async def _drain(runtime: RuntimeState, server: uvicorn.Server) -> None:
    """Let what is in flight finish within the grace period, then stop the server. /ready says 503 from
    the signal on; requests that still arrive are served, each closing its connection."""
    _close_idle_connections(server)
    deadline = time.monotonic() + runtime.config.drain_timeout
    log.info("draining", extra={"fields": {"in_flight": runtime.http_in_flight}})
    while runtime.http_in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if runtime.http_in_flight:
        log.warning("drain timeout: aborting", extra={"fields": {"in_flight": runtime.http_in_flight}})
        runtime.engine.abort_all()
    server.should_exit = True


async def serve(config: ServerConfig) -> int:
    engine = AsyncEngine(
        lambda: _load_engine(config),
        AdmissionLimits(config.max_num_seqs, config.max_queue, config.queue_timeout),
        config.served_model_name,
        warm_up=config.warmup,
        fault_token_latency_s=config.fault_token_latency_ms / 1000,
    )
    keys = ApiKeys(Path(config.api_key_file), config.api_key_reload_seconds) if config.api_key_file else None
    try:
        tracing, stop_tracing = start_runtime_tracing(
            config.otlp_endpoint, config.served_model_name, config.serving_revision, os.environ
        )
    except TracingConfigError as exc:
        log.error(f"tracing: {exc}")
        return 2
    runtime = RuntimeState(config, engine, api_keys=keys, tracing=tracing)
    server = _Server(
        uvicorn.Config(
            create_app(runtime),
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,  # one structured line per request comes from the app instead
            lifespan="off",
            # After _drain: what it aborted at its deadline gets a few seconds to send the end.
            timeout_graceful_shutdown=5,
            **config.edge_limits.uvicorn_options(),
        )
    )

    drain_tasks: list[asyncio.Task[None]] = []  # held so the task is not garbage-collected

    def on_signal(signum: signal.Signals) -> None:
        if runtime.draining:  # a second signal: stop now
            server.should_exit = server.force_exit = True
            return
        log.info("received %s", signum.name)
        runtime.draining = True
        drain_tasks.append(asyncio.get_running_loop().create_task(_drain(runtime, server)))

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    log.info(
        "loading model",
        extra={"fields": {"model": config.model, "served_model_name": config.served_model_name}},
    )
    engine.start()
    assert engine.done is not None
    server_task = asyncio.create_task(server.serve())
    await asyncio.wait([server_task, engine.done], return_when=asyncio.FIRST_COMPLETED)
    exit_code = 0
    if engine.done.done() and engine.done.exception() is not None:
        what = "model load failed" if engine.tokenizer is None else "engine failed"
        log.error(f"{what}; exiting", extra={"fields": {"error": str(engine.done.exception())}})
        server.should_exit = True
        exit_code = 1
    await server_task
    engine.stop()
    stop_tracing()  # flushes the spans still batched
    return exit_code


def main(argv: list[str]) -> int:
    config = parse_config(argv)
    prometheus_client.disable_created_metrics()  # `_created` series double the scrape for nothing we use
    configure_logging(config.log_format)
    return asyncio.run(serve(config))
