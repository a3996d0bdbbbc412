"""Fixtures that start fake backends and routers; everything they start is stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from router_fakes import FakeBackend, ServerThread, write_config

from kubeinfer_runtime.router.app import create_app


@pytest.fixture
def start_backend() -> Iterator[Callable[..., FakeBackend]]:
    servers: list[ServerThread] = []

    def start(name: str, **kwargs: Any) -> FakeBackend:
        backend = FakeBackend(name, **kwargs)
        server = ServerThread(backend.app()).start()
        servers.append(server)
        backend.url = server.url
        return backend

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    """Starts a router on a config of {track: (weight, endpoints)}, with create_app's keyword options;
    returns its URL and config path."""
    servers: list[ServerThread] = []

    def start(tracks: dict[str, tuple[int, list[str]]], **options: Any) -> tuple[str, Path]:
        path = tmp_path / f"router-{len(servers)}.json"
        write_config(path, tracks)
        app = create_app(path, **({"probe_interval_s": 0.1, "config_poll_s": 0.1} | options))
        server = ServerThread(app).start()
        servers.append(server)
        return server.url, path

    yield start
    for server in servers:
        server.stop()
