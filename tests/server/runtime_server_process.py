"""A live `kubeinfer-runtime serve` process on 127.0.0.1, for the server tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

SERVED_MODEL = "tiny"
# The CLI the Dockerfile's entrypoint runs, from this interpreter's environment.
RUNTIME_CLI = str(Path(sys.executable).parent / "kubeinfer-runtime")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LiveServer:
    process: subprocess.Popen
    base_url: str
    log_path: Path
    api_key: str | None = None

    def client(self, api_key: str | None = None, timeout: float = 60.0) -> openai.OpenAI:
        key = api_key or self.api_key or "unused"
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key, max_retries=0, timeout=timeout)

    def http(self, timeout: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """Every sample of /metrics, keyed by (name, labels other than `model`)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = frozenset((k, v) for k, v in sample.labels.items() if k != "model")
                samples[(sample.name, labels)] = sample.value
        return samples

    def log_lines(self) -> list[dict]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text()[-chars:]

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log_tail()}")

    def terminate(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_server(
    model_dir: Path,
    log_dir: Path,
    *args: str,
    api_key: str | None = None,
    env: Mapping[str, str] | None = None,
) -> LiveServer:
    """Start a server on a free port, with `env` added to this process's environment; the caller waits
    for readiness (or for the exit it expects)."""
    port = free_port()
    command = [RUNTIME_CLI, "serve", "--model", str(model_dir), "--served-model-name", SERVED_MODEL]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", *args]
    if api_key:
        key_file = log_dir / f"api-key-{port}"
        key_file.write_text(api_key + "\n")
        command += ["--api-key-file", str(key_file)]
    log_path = log_dir / f"server-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return LiveServer(process, f"http://127.0.0.1:{port}", log_path, api_key)


@contextlib.contextmanager
def running_server(
    model_dir: Path, log_dir: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[LiveServer]:
    """A ready server for the block's duration (a module fixture's body), killed afterwards."""
    live = start_server(model_dir, log_dir, *args, env=env)
    try:
        live.wait_ready()
        yield live
    finally:
        live.kill()


def _answers_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def running_router(backend_url: str, config_dir: Path, *args: str) -> Iterator[str]:
    """A ready `kubeinfer-runtime route` process sending everything to `backend_url`; yields its URL."""
    config = config_dir / "router.json"
    config.write_text(json.dumps({"tracks": {"stable": {"weight": 100, "endpoints": [backend_url]}}}))
    port = free_port()
    command = [
        RUNTIME_CLI,
        "route",
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    process = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers_ready(url):
            assert process.poll() is None and time.monotonic() < deadline, "router never became ready"
            time.sleep(0.1)
        yield url
    finally:
        process.kill()
        process.wait()
