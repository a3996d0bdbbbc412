"""Fault injection (off by default): a deliberately bad revision for canary and rollback tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import openai
import pytest
from runtime_server_process import SERVED_MODEL, LiveServer

pytestmark = pytest.mark.slow


def test_error_rate_answers_500_in_openai_shape_and_counts_errors(launch: Callable[..., LiveServer]) -> None:
    server = launch("--fault-error-rate", "1")
    server.wait_ready()
    with pytest.raises(openai.InternalServerError) as failed:
        server.client().completions.create(model=SERVED_MODEL, prompt="Hi", max_tokens=2)
    assert failed.value.status_code == 500
    assert failed.value.body["code"] == "injected_fault"
    errors = server.metrics()[("kubeinfer_requests_total", frozenset({("outcome", "error")}))]
    assert errors == 1
    assert server.terminate() == 0


def test_failed_load_exits_nonzero_with_a_clear_log_line_and_is_never_ready(
    launch: Callable[..., LiveServer],
) -> None:
    server = launch("--fault-fail-load")
    ready_answers = []
    while server.process.poll() is None:
        try:
            ready_answers.append(httpx.get(f"{server.base_url}/ready", timeout=1).status_code)
        except httpx.TransportError:
            time.sleep(0.02)
    assert server.process.returncode != 0
    assert 200 not in ready_answers
    failures = [line for line in server.log_lines() if line["msg"].startswith("model load failed")]
    assert failures and "--fault-fail-load" in failures[0]["error"]
