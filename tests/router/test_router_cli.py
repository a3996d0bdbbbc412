"""`kubeinfer-runtime route` as the router pod runs it: a process, no torch, a clear error on a bad config."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from router_fakes import FakeBackend, free_dead_url, write_config

ROUTE = [sys.executable, "-m", "kubeinfer_runtime.cli", "route"]


def test_router_does_not_import_torch_or_the_engine() -> None:
    code = (
        "import sys, kubeinfer_runtime.router.main, kubeinfer_runtime.router.app\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] == 'torch' or m.startswith('kubeinfer_runtime.engine'))\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "router.json"
    config.write_text('{"tracks": {"canary": {"weight": "ten", "endpoints": []}}}')
    result = subprocess.run([*ROUTE, "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "tracks.canary.weight" in result.stderr


@pytest.mark.slow
def test_route_command_serves_traffic(tmp_path: Path, start_backend: Callable[..., FakeBackend]) -> None:
    backend = start_backend("b")
    config = tmp_path / "router.yaml"
    write_config(config, {"stable": (100, [backend.url])})
    port = int(free_dead_url().rsplit(":", 1)[1])
    url = f"http://127.0.0.1:{port}"
    router = subprocess.Popen([*ROUTE, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)])
    try:
        deadline = time.monotonic() + 20
        while True:
            assert router.poll() is None, "router exited"
            try:
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "router never became ready"
                time.sleep(0.1)
        response = httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "hi"})
        assert response.status_code == 200 and response.json()["backend"] == "b"
    finally:
        router.terminate()
        # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says what stopped it.
        assert router.wait(timeout=10) in (0, -signal.SIGTERM)


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--upstream-max-connections", "0", "upstream max connections"),
        ("--max-body-bytes", "0", "body limit"),
    ],
)
def test_a_limit_out_of_range_exits_2_naming_it(tmp_path: Path, flag: str, value: str, named: str) -> None:
    config = tmp_path / "router.json"
    write_config(config, {"stable": (100, [])})
    result = subprocess.run(
        [*ROUTE, "--config", str(config), flag, value], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert named in result.stderr
