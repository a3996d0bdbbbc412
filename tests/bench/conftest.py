from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{url} exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"{url} not up after {timeout} s")


@pytest.fixture
def synthetic_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start the synthetic server in its own process (so its timing does not share our GIL);
    returns its base URL. Every server started is stopped at the end of the test."""
    processes: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "kubeinfer_operator.bench.synthetic_server",
            "--port",
            str(port),
            *args,
        ]
        log = tmp_path / f"synthetic-{port}.log"
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        processes.append(process)
        base_url = f"http://127.0.0.1:{port}"
        wait_until_up(base_url + "/health", process, log)
        return base_url

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
