from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from runtime_server_process import LiveServer, start_server

# The runtime metric contract (shared conventions): what the operator and dashboards rely on.
CONTRACT_METRIC_NAMES = [
    "kubeinfer_requests_waiting",
    "kubeinfer_requests_running",
    "kubeinfer_oldest_waiting_request_age_seconds",
    "kubeinfer_kv_cache_usage_ratio",
    "kubeinfer_request_queue_time_seconds_bucket",
    "kubeinfer_time_to_first_token_seconds_bucket",
    "kubeinfer_inter_token_latency_seconds_bucket",
    "kubeinfer_time_per_output_token_seconds_bucket",
    "kubeinfer_e2e_request_latency_seconds_bucket",
    "kubeinfer_prompt_tokens_total",
    "kubeinfer_generation_tokens_total",
    "kubeinfer_requests_total",
    "kubeinfer_prefix_cache_queries_total",
    "kubeinfer_prefix_cache_hits_total",
    "kubeinfer_preemptions_total",
]


@pytest.fixture
def contract_metric_names() -> list[str]:
    return CONTRACT_METRIC_NAMES


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubeinfer_runtime.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model"), preset="llama-gqa")


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture
def launch(tiny_model: Path, server_logs: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start servers for one test; whatever is still running at the end is killed."""
    started: list[LiveServer] = []

    def _launch(*args: str, api_key: str | None = None) -> LiveServer:
        server = start_server(tiny_model, server_logs, *args, api_key=api_key)
        started.append(server)
        return server

    yield _launch
    for server in started:
        server.kill()


@pytest.fixture(params=["server", "router"])
def edge_url(request: pytest.FixtureRequest) -> str:
    """The module's `server` fixture's URL, then its `router` fixture's (a router process in front of
    that server): for what must hold at both edges."""
    if request.param == "server":
        return request.getfixturevalue("server").base_url
    return request.getfixturevalue("router")
