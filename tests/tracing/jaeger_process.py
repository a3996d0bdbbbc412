"""A live Jaeger (all-in-one, in-memory storage) on free 127.0.0.1 ports, for the tracing tests: it takes
OTLP/HTTP and serves what it stored on its query API (/api/traces), as an SRE's Jaeger UI reads it."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from runtime_server_process import free_port

REPO = Path(__file__).resolve().parents[2]

CONFIG = """
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:  # Jaeger's own: none (no fixed ports, no exporting to a default endpoint)
    metrics:
      level: none
    traces:
      level: none
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    enable_tracing: false  # its own spans would go to a default localhost:4317
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp_port}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


def jaeger_binary() -> str:
    """Built once per machine and cached outside the repo (`make deps` builds it; so would this)."""
    result = subprocess.run(["bash", str(REPO / "e2e" / "build_jaeger.sh")], capture_output=True, text=True)
    assert result.returncode == 0, f"building Jaeger failed:\n{result.stderr[-4000:]}"
    return result.stdout.strip().splitlines()[-1]


@dataclass
class Jaeger:
    process: subprocess.Popen
    otlp_url: str  # the OTLP/HTTP base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it
    query_url: str
    log_path: Path

    def get(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.query_url}{path}", params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def trace(self, trace_id: str, spans: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """The trace once it holds at least `spans` spans (exporters batch, so they arrive late)."""
        deadline = time.monotonic() + timeout_s
        found: dict[str, Any] = {"spans": []}
        while time.monotonic() < deadline:
            response = httpx.get(f"{self.query_url}/api/traces/{trace_id}", timeout=10)
            if response.status_code == 200:
                found = response.json()["data"][0]
                if len(found["spans"]) >= spans:
                    return found
            time.sleep(0.2)
        names = sorted(s["operationName"] for s in found["spans"])
        raise AssertionError(f"trace {trace_id}: {len(names)} of {spans} spans after {timeout_s} s: {names}")

    def search(
        self, service: str, tags: dict[str, str], spans: int, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The one trace with a span of `service` carrying `tags`, as /api/traces?service=...&tags=... finds
        it, once it holds at least `spans` spans."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.get("/api/traces", service=service, tags=json.dumps(tags))["data"]
            assert len(found) <= 1, f"{len(found)} traces match {tags}"
            if found and len(found[0]["spans"]) >= spans:
                return found[0]
            time.sleep(0.2)
        raise AssertionError(f"no trace of {service} with {tags} and {spans} spans after {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_jaeger(work_dir: Path, timeout_s: float = 60.0) -> Jaeger:
    binary = jaeger_binary()
    query_port, otlp_port = free_port(), free_port()
    config = work_dir / "jaeger.yaml"
    config.write_text(CONFIG.format(query_port=query_port, query_grpc_port=free_port(), otlp_port=otlp_port))
    log_path = work_dir / "jaeger.log"
    with log_path.open("w") as log:
        process = subprocess.Popen([binary, "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    jaeger = Jaeger(process, f"http://127.0.0.1:{otlp_port}", f"http://127.0.0.1:{query_port}", log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise AssertionError(f"jaeger exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(f"{jaeger.query_url}/api/services", timeout=2).status_code == 200:
                return jaeger
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            jaeger.stop()
            raise AssertionError(f"jaeger not up after {timeout_s} s:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.2)
