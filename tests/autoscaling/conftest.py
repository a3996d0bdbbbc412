"""A fake Prometheus HTTP API for the autoscaling tests: answers each query with what a test says."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

Answer = Callable[[str], tuple[int, list[dict]]]  # PromQL -> (HTTP status, result)


@pytest.fixture
def prometheus() -> Iterator[Callable[[Answer], PrometheusConnect]]:
    """Start a server per call; its PrometheusConnect. Instant and range queries alike (GET ?query=)."""
    servers: list[ThreadingHTTPServer] = []

    def serve(answer: Answer) -> PrometheusConnect:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)["query"][0]
                status, result = answer(query)
                body = {"status": "success", "data": {"resultType": "vector", "result": result}}
                payload = json.dumps(body if status == 200 else {"status": "error", "error": "bad"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(server)
        return PrometheusConnect(f"http://127.0.0.1:{server.server_port}", retry=Retry(total=0))

    yield serve
    for server in servers:
        server.shutdown()
