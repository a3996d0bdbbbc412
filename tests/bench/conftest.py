from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bench_processes import free_port, wait_until_up


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
