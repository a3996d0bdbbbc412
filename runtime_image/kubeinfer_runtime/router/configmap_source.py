"""The router's configuration read straight from its ConfigMap through the Kubernetes API.

Why not the mounted file: a kubelet refreshes ConfigMap volumes on its sync period (60-90 s on a real
cluster), far too slow to move a canary's weight to 0 on rollback. Polling the one object the router's
ServiceAccount may read (get on a single ConfigMap, granted by the operator) picks a change up within
`--config-poll-interval`, needs no extra dependency (httpx is already here) and no watch to keep alive.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from pathlib import Path

import httpx

from kubeinfer_runtime.router.config import ConfigError, RouterConfig, parse_config

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONFIG_KEY = "router.json"


def parse_reference(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise ConfigError(f"--configmap {text!r}: expected NAMESPACE/NAME")
    return namespace, name


class ConfigMapSource:
    """Same interface as ConfigFile: `current`, and `reload_if_changed()` (blocking; run it off the loop).

    Starts with no tracks, so the router reports not-ready until the first read succeeds; after that a
    failed or malformed read keeps the last good configuration."""

    def __init__(self, namespace: str, name: str, account_dir: Path = SERVICE_ACCOUNT) -> None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ConfigError("--configmap: KUBERNETES_SERVICE_HOST/PORT unset; run in a pod or use --config")
        self.url = f"https://{host}:{port}/api/v1/namespaces/{namespace}/configmaps/{name}"
        self.token_file = account_dir / "token"
        try:
            trusted = ssl.create_default_context(cafile=account_dir / "ca.crt")
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"--configmap: cannot load the cluster CA {account_dir / 'ca.crt'}: {exc}"
            ) from exc
        self.client = httpx.Client(verify=trusted, timeout=5.0, trust_env=False)
        self.current = RouterConfig(tracks={})
        self._raw: str | None = None

    def reload_if_changed(self) -> bool:
        try:
            token = self.token_file.read_text().strip()  # re-read: bound tokens are rotated
            response = self.client.get(self.url, headers={"Authorization": f"Bearer {token}"})
            response.raise_for_status()
            raw = (response.json().get("data") or {}).get(CONFIG_KEY, "")
        except (OSError, httpx.HTTPError, ValueError) as exc:
            log.warning("router ConfigMap unreadable, keeping the last config: %s", exc)
            return False
        if raw == self._raw:
            return False
        self._raw = raw
        try:
            self.current = parse_config(json.loads(raw))
        except (ValueError, ConfigError) as exc:
            log.error("router ConfigMap key %s rejected, keeping the last config: %s", CONFIG_KEY, exc)
            return False
        log.info(
            "router config reloaded: %s",
            {n: (t.weight, len(t.endpoints)) for n, t in self.current.tracks.items()},
        )
        return True
