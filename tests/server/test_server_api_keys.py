"""API keys from a file or a mounted-Secret-like directory, re-read while serving: the key set itself,
then a live runtime server and a live router in front of it checking them (the router forwarding the key)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from runtime_server_process import SERVED_MODEL, LiveServer, running_router, running_server

from kubeinfer_runtime.api_keys import ApiKeys, read_keys

RELOAD_S = 0.5


def secret_volume(directory: Path, keys: dict[str, str]) -> Path:
    """A directory laid out as the kubelet mounts a Secret: ..data links to a timestamped dir, and one
    link per key into it; a change swaps ..data at once."""
    directory.mkdir(exist_ok=True)
    version = directory / f"..{time.monotonic_ns()}"
    version.mkdir()
    for name, key in keys.items():
        (version / name).write_text(key)
    (directory / "..data_tmp").symlink_to(version.name)
    (directory / "..data_tmp").rename(directory / "..data")
    for old in [p for p in directory.iterdir() if not p.name.startswith("..") and p.name not in keys]:
        old.unlink()
    for name in keys:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    return directory


def test_keys_are_the_files_of_a_secret_volume_or_the_lines_of_a_file(tmp_path: Path) -> None:
    assert read_keys(secret_volume(tmp_path / "secret", {"old": "key-a\n", "new": "key-b"})) == (
        "key-b",
        "key-a",
    )
    lines = tmp_path / "keys.txt"
    lines.write_text("key-a\n\n  key-b  \n")
    assert read_keys(lines) == ("key-a", "key-b")


def test_a_rotation_is_seen_after_the_reload_interval_and_an_empty_read_keeps_the_keys(
    tmp_path: Path,
) -> None:
    now = [0.0]
    volume = secret_volume(tmp_path / "secret", {"a": "key-a"})
    keys = ApiKeys(volume, reload_s=10, clock=lambda: now[0])
    assert keys.allows("Bearer key-a") and not keys.allows("Bearer key-b")
    secret_volume(volume, {"a": "key-a", "b": "key-b"})  # step 1: add the new key
    assert not keys.allows("Bearer key-b")  # not re-read yet
    now[0] = 10.0
    assert keys.allows("Bearer key-b") and keys.allows("Bearer key-a")
    secret_volume(volume, {"b": "key-b"})  # step 2: remove the old one
    now[0] = 20.0
    assert keys.allows("Bearer key-b") and not keys.allows("Bearer key-a")
    secret_volume(volume, {})  # emptied by mistake: the keys in use stay
    now[0] = 30.0
    assert keys.allows("Bearer key-b")
    assert not keys.allows("key-b") and not keys.allows("Basic key-b") and not keys.allows(None)
    assert not keys.allows("Bearer ") and not keys.allows("Bearer key-b-and-more")


def test_a_source_without_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no API key"):
        ApiKeys(secret_volume(tmp_path / "secret", {}))


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return secret_volume(tmp_path_factory.mktemp("keys") / "secret", {"a": "key-a", "b": "key-b"})


KEY_ARGS = ["--api-key-reload-seconds", str(RELOAD_S)]


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path, keys_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model, server_logs, "--api-key-file", str(keys_dir), *KEY_ARGS) as live:
        yield live


@pytest.fixture(scope="module")
def router(server: LiveServer, keys_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_router(
        server.base_url, tmp_path_factory.mktemp("router"), "--api-key-file", str(keys_dir), *KEY_ARGS
    ) as url:
        yield url


def _complete(url: str, key: str) -> int:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    try:
        client.completions.create(model=SERVED_MODEL, prompt="hi", max_tokens=1)
    except openai.APIStatusError as error:
        assert error.status_code != 401 or error.response.json()["error"]["code"] == "invalid_api_key"
        return error.status_code
    return 200


@pytest.mark.slow
def test_either_key_is_served_and_a_wrong_or_missing_one_gets_401(edge_url: str) -> None:
    assert (
        _complete(edge_url, "key-a") == 200 and _complete(edge_url, "key-b") == 200
    )  # through the router: forwarded
    assert _complete(edge_url, "key-c") == 401
    missing = httpx.post(
        f"{edge_url}/v1/completions", json={"model": SERVED_MODEL, "prompt": "hi"}, timeout=30
    )
    assert missing.status_code == 401
    assert missing.json()["error"] == {
        "message": "Missing or incorrect API key (Authorization: Bearer <key>).",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    for probe in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{edge_url}{probe}", timeout=10).status_code == 200, probe


@pytest.mark.slow
def test_keys_rotate_without_a_restart(edge_url: str, keys_dir: Path) -> None:
    try:
        secret_volume(keys_dir, {"a": "key-a", "b": "key-b", "c": "key-c"})
        deadline = time.monotonic() + 10 * RELOAD_S
        while _complete(edge_url, "key-c") != 200:
            assert time.monotonic() < deadline, "the added key was not taken up"
            time.sleep(0.1)
        secret_volume(keys_dir, {"b": "key-b", "c": "key-c"})
        while _complete(edge_url, "key-a") != 401:
            assert time.monotonic() < deadline, "the removed key was still accepted"
            time.sleep(0.1)
        assert _complete(edge_url, "key-b") == 200
    finally:
        secret_volume(keys_dir, {"a": "key-a", "b": "key-b"})
        time.sleep(2 * RELOAD_S)
