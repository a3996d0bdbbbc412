"""Live processes for the tracing tests: Jaeger, a runtime server on the tiny model and a router in front
of it, both exporting to that Jaeger. Everything started here is stopped after the module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# The live runtime server's helpers are shared with the server tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from jaeger_process import Jaeger, start_jaeger
from runtime_server_process import LiveServer, free_port, running_server

REVISION = "5f0c1d2e3a"
# Spans leave in batches; a short delay keeps the tests from waiting on the default 5 s.
EXPORT_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def revision() -> str:
    """The revision the runtime is told it serves, as the operator tells it from the pod's label."""
    return REVISION


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tracing")


@pytest.fixture(scope="module")
def jaeger(work_dir: Path) -> Iterator[Jaeger]:
    live = start_jaeger(work_dir)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def runtime(work_dir: Path, jaeger: Jaeger) -> Iterator[LiveServer]:
    from kubeinfer_runtime.tiny_model import make_tiny_model

    model = make_tiny_model(work_dir / "model", preset="llama-gqa")
    env = EXPORT_ENV | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_url,
        "KUBEINFER_SERVING_REVISION": REVISION,
    }
    # The fused CPU kernels are beside the point here, and compiling them can take a minute.
    with running_server(model, work_dir, "--no-cpu-kernels", env=env) as server:
        yield server


@pytest.fixture(scope="module")
def router(work_dir: Path, jaeger: Jaeger, runtime: LiveServer) -> Iterator[str]:
    """A router whose chosen track (canary, weight 100) has only a dead replica: every request's first
    attempt fails to connect and is retried on stable's runtime."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = work_dir / "router.json"
    tracks = {
        "canary": {"weight": 100, "endpoints": [dead]},
        "stable": {"weight": 1, "endpoints": [runtime.base_url]},
    }
    config.write_text(json.dumps({"tracks": tracks}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "kubeinfer_runtime.cli", "route", "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--otlp-endpoint", jaeger.otlp_url]
    log_path = work_dir / "router.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **EXPORT_ENV}
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, f"router exited:\n{log_path.read_text()[-4000:]}"
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "router never became ready"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
