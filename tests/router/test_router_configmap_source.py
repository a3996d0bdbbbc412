"""`kubeinfer-runtime route --configmap NAMESPACE/NAME`: bad input is named before anything starts."""

from __future__ import annotations

from pathlib import Path

import certifi
import pytest

from kubeinfer_runtime.router.config import ConfigError
from kubeinfer_runtime.router.configmap_source import ConfigMapSource, parse_reference


def test_a_reference_is_namespace_slash_name() -> None:
    assert parse_reference("prod/chat-router") == ("prod", "chat-router")
    for bad in ("chat-router", "/chat", "prod/", "a/b/c"):
        with pytest.raises(ConfigError, match="--configmap"):
            parse_reference(bad)


def test_outside_a_pod_it_says_to_use_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="use --config"):
        ConfigMapSource("prod", "chat-router")


def test_a_missing_cluster_ca_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigError, match=r"ca\.crt"):
        ConfigMapSource("prod", "chat-router", account_dir=tmp_path)


def test_it_starts_with_no_tracks_and_keeps_them_when_the_api_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")  # nothing listens there
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text(Path(certifi.where()).read_text())
    source = ConfigMapSource("prod", "chat-router", account_dir=tmp_path)
    assert source.current.routable_weights() == {}  # the router stays not-ready
    assert source.reload_if_changed() is False
    assert source.current.tracks == {}
