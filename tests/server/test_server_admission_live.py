"""Admission control, cancellation and drain on a live server with one running slot and a queue of two.

`--fault-token-latency-ms` makes every request last a predictable time, so that requests overlap.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from runtime_server_process import SERVED_MODEL, LiveServer, start_server

pytestmark = pytest.mark.slow

TOKEN_LATENCY_S = 0.04
QUEUE_TIMEOUT_S = 3.0
SLOW_SERVER_ARGS = [
    "--max-num-seqs", "1",
    "--max-queue", "2",
    "--queue-timeout", str(QUEUE_TIMEOUT_S),
    "--fault-token-latency-ms", str(TOKEN_LATENCY_S * 1000),
    "--drain-timeout", "20",
]  # fmt: skip


def _body(max_tokens: int, **extra: object) -> dict:
    return {"model": SERVED_MODEL, "prompt": "Hello", "max_tokens": max_tokens, "ignore_eos": True, **extra}


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(tiny_model, server_logs, *SLOW_SERVER_ARGS)
    try:
        live.wait_ready()
        yield live
    finally:
        live.kill()


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length (headers and body may come in several reads)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _gauge(server: LiveServer, name: str) -> float:
    return server.metrics()[(name, frozenset())]


def _outcomes(server: LiveServer) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in server.metrics().items()
        if name == "kubeinfer_requests_total"
    }


def test_overload_gets_429_with_retry_after_and_the_rest_succeed(server: LiveServer) -> None:
    before = _outcomes(server)
    with ThreadPoolExecutor(max_workers=6) as pool, server.http() as http:
        # The one running slot is taken first, so that all five others arrive while it is busy.
        busy = pool.submit(http.post, "/v1/completions", json=_body(25))
        _wait_for(lambda: _gauge(server, "kubeinfer_requests_running") == 1)
        responses = list(pool.map(lambda _: http.post("/v1/completions", json=_body(8)), range(5)))
        assert busy.result().status_code == 200
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 2 + [429] * 3  # two waiting; nothing hangs, no 5xx
    for refused in (r for r in responses if r.status_code == 429):
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_error"
    for served in (r for r in responses if r.status_code == 200):
        assert served.json()["usage"]["completion_tokens"] == 8
    after = _outcomes(server)
    assert after["success"] - before["success"] == 3
    assert after["rejected"] - before["rejected"] == 3


def test_request_past_the_queue_timeout_gets_503_and_never_runs(server: LiveServer) -> None:
    before = server.metrics()
    with server.http() as http, http.stream("POST", "/v1/completions", json=_body(500, stream=True)):
        # The slot stays busy (well past the timeout) until this stream is closed.
        _wait_for(lambda: _gauge(server, "kubeinfer_requests_running") == 1)
        waited = http.post("/v1/completions", json=_body(4))
    assert waited.status_code == 503
    assert waited.json()["error"]["code"] == "queue_timeout"
    _wait_for(lambda: _gauge(server, "kubeinfer_requests_running") == 0)
    after = server.metrics()

    def delta(name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return after[key] - before[key]

    assert delta("kubeinfer_requests_total", outcome="timeout") == 1
    assert delta("kubeinfer_requests_total", outcome="cancelled") == 1  # the stream closed above
    assert delta("kubeinfer_request_queue_time_seconds_count") == 1  # the timed-out one was never scheduled


def test_higher_priority_runs_first(server: LiveServer) -> None:
    finished: list[str] = []

    def send(name: str, http: httpx.Client, body: dict, headers: dict[str, str]) -> None:
        assert http.post("/v1/completions", json=body, headers=headers).status_code == 200
        finished.append(name)

    with ThreadPoolExecutor(max_workers=3) as pool, server.http() as http:
        busy = pool.submit(http.post, "/v1/completions", json=_body(25))
        _wait_for(lambda: _gauge(server, "kubeinfer_requests_running") == 1)
        low = pool.submit(send, "low", http, _body(4, priority=10), {})  # lower value runs first
        _wait_for(lambda: _gauge(server, "kubeinfer_requests_waiting") >= 1)
        high = pool.submit(send, "high", http, _body(4, priority=10), {"X-Request-Priority": "-10"})
        for future in (busy, low, high):
            future.result()
    assert finished == ["high", "low"]


def test_client_disconnect_aborts_and_frees_kv(server: LiveServer) -> None:
    before = _outcomes(server)
    events = 0
    body = _body(200, stream=True)
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            events += line.startswith("data:")
            if events == 3:
                break
    assert events == 3
    # The connection is closed mid-stream; the engine must notice and drop the request.
    _wait_for(lambda: _outcomes(server)["cancelled"] - before["cancelled"] == 1)
    assert _gauge(server, "kubeinfer_requests_running") == 0
    assert _gauge(server, "kubeinfer_kv_cache_usage_ratio") == 0
    assert _outcomes(server)["success"] == before["success"]


def test_token_latency_fault_slows_every_token(server: LiveServer) -> None:
    before = server.metrics()
    client = server.client()
    client.completions.create(model=SERVED_MODEL, prompt="Hi", max_tokens=6, extra_body={"ignore_eos": True})
    after = server.metrics()
    itl_sum = after[("kubeinfer_inter_token_latency_seconds_sum", frozenset())]
    itl_count = after[("kubeinfer_inter_token_latency_seconds_count", frozenset())]
    count = itl_count - before[("kubeinfer_inter_token_latency_seconds_count", frozenset())]
    total = itl_sum - before[("kubeinfer_inter_token_latency_seconds_sum", frozenset())]
    assert count == 5
    assert total / count >= TOKEN_LATENCY_S


def test_sigterm_lets_streams_finish_serves_late_requests_closing_connections_and_exits_0(
    server: LiveServer,
) -> None:
    client = server.client()
    idle = socket.create_connection(("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=30)
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # kept alive: HTTP/1.1's default
    assert _read_response(idle).startswith(b"HTTP/1.1 200")
    results: dict[int, tuple[str, int]] = {}
    first_token = threading.Event()

    def stream(i: int) -> None:
        chunks = []
        for chunk in client.completions.create(
            model=SERVED_MODEL,
            prompt="Hello",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        ):
            first_token.set()
            chunks.append(chunk)
        results[i] = (chunks[-2].choices[0].finish_reason, chunks[-1].usage.completion_tokens)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]  # one running, one queued
    for thread in threads:
        thread.start()
    assert first_token.wait(timeout=30)
    server.process.send_signal(signal.SIGTERM)
    _wait_for(lambda: httpx.get(f"{server.base_url}/ready").status_code == 503, timeout=2)
    # A client that picked this server before the drain is served, and told to reconnect elsewhere.
    late = httpx.post(f"{server.base_url}/v1/completions", json=_body(2))
    assert late.status_code == 200 and late.headers["connection"] == "close"
    assert idle.recv(65536) == b""  # the idle kept-alive connection: closed by the server
    for thread in threads:
        thread.join(timeout=30)
    assert results == {i: ("length", 6) for i in range(2)}
    assert server.process.wait(timeout=30) == 0
