"""The router's configuration file: which endpoints make up each track and each track's traffic weight.

The operator writes it into a ConfigMap mounted into the router pod, for example::

    {"tracks": {"stable": {"weight": 90, "endpoints": ["http://10.244.0.5:8000"]},
                "canary": {"weight": 10, "endpoints": ["http://10.244.0.9:8000"]}}}

JSON or YAML. Weights are relative integers (90/10 and 9/1 split alike). The file is re-read when its
content changes; a kubelet updates a mounted ConfigMap by swapping a symlink, so the router compares
content rather than trusting mtimes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """The configuration is malformed; the message names the offending field."""


@dataclass(frozen=True)
class Track:
    weight: int
    endpoints: tuple[str, ...]


@dataclass(frozen=True)
class RouterConfig:
    tracks: dict[str, Track]

    def routable_weights(self) -> dict[str, int]:
        """Weights of the tracks that can take traffic: a track with no endpoints drops out, so its share
        goes to the others in proportion to their weights; a track with weight 0 never gets traffic."""
        return {name: t.weight for name, t in self.tracks.items() if t.weight > 0 and t.endpoints}

    def all_endpoints(self) -> set[str]:
        return {endpoint for track in self.tracks.values() for endpoint in track.endpoints}


def parse_config(data: Any) -> RouterConfig:
    if not isinstance(data, dict) or not isinstance(data.get("tracks"), dict):
        raise ConfigError("tracks: required, a mapping of track name to {weight, endpoints}")
    tracks: dict[str, Track] = {}
    for name, raw in data["tracks"].items():
        where = f"tracks.{name}"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a mapping with weight and endpoints")
        weight = raw.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ConfigError(f"{where}.weight: must be a non-negative integer, got {weight!r}")
        endpoints = raw.get("endpoints", [])
        if not isinstance(endpoints, list):
            raise ConfigError(f"{where}.endpoints: must be a list of URLs, got {endpoints!r}")
        for i, url in enumerate(endpoints):
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigError(f"{where}.endpoints[{i}]: must be an http(s) URL, got {url!r}")
        tracks[str(name)] = Track(weight=weight, endpoints=tuple(url.rstrip("/") for url in endpoints))
    return RouterConfig(tracks=tracks)


def _parse_bytes(raw: bytes, path: Path) -> RouterConfig:
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid JSON or YAML: {exc}") from exc
    return parse_config(data)


class ConfigFile:
    """The current configuration, re-read whenever the file's content changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"--config {path}: cannot read router config: {exc}") from exc
        self.current = _parse_bytes(self._raw, path)

    def reload_if_changed(self) -> bool:
        """Pick up a changed file; a broken edit is logged and the last good configuration kept."""
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            log.warning("router config %s unreadable, keeping the last one: %s", self.path, exc)
            return False
        if raw == self._raw:
            return False
        self._raw = raw
        try:
            self.current = _parse_bytes(raw, self.path)
        except ConfigError as exc:
            log.error("router config %s rejected, keeping the last one: %s", self.path, exc)
            return False
        log.info(
            "router config reloaded: %s",
            {n: (t.weight, len(t.endpoints)) for n, t in self.current.tracks.items()},
        )
        return True
