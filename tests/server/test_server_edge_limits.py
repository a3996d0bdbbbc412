"""Body size and read deadlines at the serving edge, on a live runtime server and on a live router process
in front of it (`kubeinfer-runtime serve` and `route`, as the pods run them), with the same flags."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from runtime_server_process import SERVED_MODEL, LiveServer, running_router, running_server

pytestmark = pytest.mark.slow

MAX_BODY = 4096
TIMEOUT_S = 1.0  # header, body and idle timeouts alike
EDGE_ARGS = [
    "--max-body-bytes", str(MAX_BODY),
    "--header-timeout", str(TIMEOUT_S),
    "--body-timeout", str(TIMEOUT_S),
    "--idle-timeout", str(TIMEOUT_S),
]  # fmt: skip
# A slow client's schedule is far longer than any deadline: a connection still open at CUT_BY was not cut.
CUT_BY_S = 8.0


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model, server_logs, *EDGE_ARGS) as live:
        yield live


@pytest.fixture(scope="module")
def router(server: LiveServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_router(server.base_url, tmp_path_factory.mktemp("router"), *EDGE_ARGS) as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_body_over_the_limit_gets_413_in_openai_shape_and_one_under_it_is_served(edge_url: str) -> None:
    client = _client(edge_url)
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model=SERVED_MODEL, prompt="x" * (MAX_BODY + 1), max_tokens=1)
    assert refused.value.status_code == 413
    error = refused.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "request_too_large"
    assert str(MAX_BODY) in error["message"]
    served = client.completions.create(model=SERVED_MODEL, prompt="hello " * 100, max_tokens=2)
    assert served.usage.completion_tokens == 2


def test_a_chunked_body_over_the_limit_gets_413(edge_url: str) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(MAX_BODY // 512 + 1):
            yield b"y" * 512
        yield b'"}'

    response = httpx.post(f"{edge_url}/v1/completions", content=chunks(), timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=CUT_BY_S)


def _sends_until_cut(sock: socket.socket, data: bytes, every_s: float) -> float:
    """Sends `data` a byte every `every_s`; seconds until the peer closed the connection."""
    started = time.monotonic()
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:  # reset: the server closed it
            return time.monotonic() - started
        time.sleep(every_s)
        if time.monotonic() - started > CUT_BY_S:
            break
    return time.monotonic() - started


def _read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(4096)
    return data


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_header_timeout(edge_url: str) -> None:
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" * 3
    with _connect(edge_url) as sock:
        took = _sends_until_cut(sock, request, every_s=0.1)  # ~20 s of headers at this pace
        assert took < CUT_BY_S, "the slow client still held its connection"
        sock.settimeout(2)
        assert sock.recv(1024) == b""  # closed, no request was ever answered


def test_a_body_sent_a_byte_at_a_time_gets_408_at_the_body_timeout(edge_url: str) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with _connect(edge_url) as sock:
        sock.sendall(head + b"Content-Length: 200\r\n\r\n")
        started = time.monotonic()
        for _ in range(40):  # ~8 s for the 200 bytes at this pace
            if select.select([sock], [], [], 0.2)[0]:
                answer = sock.recv(4096)
                break
            sock.sendall(b" ")
        else:
            pytest.fail("no answer while the body trickled in")
        assert time.monotonic() - started < CUT_BY_S
        assert answer.startswith(b"HTTP/1.1 408")
        assert b"request_timeout" in answer


def test_a_connection_that_sends_nothing_or_idles_after_a_request_is_closed(edge_url: str) -> None:
    with _connect(edge_url) as silent:
        started = time.monotonic()
        assert silent.recv(1024) == b""  # blocks until the server closes it (the socket times out at CUT_BY)
        assert time.monotonic() - started < CUT_BY_S
    with _connect(edge_url) as kept_alive:
        kept_alive.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(kept_alive).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert kept_alive.recv(1024) == b""
        assert time.monotonic() - started < CUT_BY_S
