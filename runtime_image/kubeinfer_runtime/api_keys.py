"""API keys a client must send as `Authorization: Bearer <key>`, read from a file or a directory and
re-read while serving, so keys rotate without a restart.

A directory is what a mounted Kubernetes Secret looks like: one file per key of the Secret, each holding
one API key. A file holds one key per line. Rotation: add the new key (a new Secret entry, a new line),
move the clients over, then remove the old one; a running server sees each change within `reload_s`
seconds of the file changing (plus, for a mounted Secret, the kubelet's sync period, about a minute).

Every key is compared in constant time (hmac.compare_digest), and all of them are compared whatever
matches, so the time taken says nothing about which key, or how much of one, was right.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)
DEFAULT_RELOAD_S = 10.0


def read_keys(source: Path) -> tuple[str, ...]:
    """The keys at `source`: each file of a directory (hidden ones, such as a Secret volume's ..data
    links, skipped), or each non-empty line of a file."""
    if source.is_dir():
        texts = [
            p.read_text() for p in sorted(source.iterdir()) if not p.name.startswith(".") and p.is_file()
        ]
        keys = [text.strip() for text in texts]
    else:
        keys = [line.strip() for line in source.read_text().splitlines()]
    return tuple(key for key in keys if key)


class ApiKeys:
    """The current keys of `source`, re-read at most every `reload_s` seconds when asked to check one.
    A read that fails or finds no key keeps the keys it had (a Secret volume is swapped atomically, but a
    hand-edited file may be caught half-written)."""

    def __init__(
        self, source: Path, reload_s: float = DEFAULT_RELOAD_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.reload_s = reload_s
        self.clock = clock
        self.keys = read_keys(source)
        if not self.keys:
            raise ValueError(f"{source}: holds no API key")
        self._read_at = clock()

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._read_at < self.reload_s:
            return
        self._read_at = now
        try:
            keys = read_keys(self.source)
        except OSError as error:
            log.warning("API keys at %s not re-read, keeping %d: %s", self.source, len(self.keys), error)
            return
        if not keys:
            log.warning("API keys at %s: none found, keeping the %d there were", self.source, len(self.keys))
        elif keys != self.keys:
            log.info("API keys at %s: %d now (were %d)", self.source, len(keys), len(self.keys))
            self.keys = keys

    def allows(self, authorization: str | None) -> bool:
        """Whether an Authorization header value carries one of the keys."""
        self._refresh()
        scheme, _, token = (authorization or "").partition(" ")
        token_bytes = token.strip().encode()
        matches = [hmac.compare_digest(token_bytes, key.encode()) for key in self.keys]
        return scheme.lower() == "bearer" and any(matches)


UNAUTHORIZED_BODY = json.dumps(
    {
        "error": {
            "message": "Missing or incorrect API key (Authorization: Bearer <key>).",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
).encode()


class RequireApiKey:
    """ASGI middleware: requests under `path_prefix` need a key (401 in OpenAI's shape); probes and
    /metrics outside it need none."""

    def __init__(self, app: ASGIApp, keys: ApiKeys | None, path_prefix: str = "/v1/") -> None:
        self.app = app
        self.keys = keys
        self.path_prefix = path_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keys is None or scope["type"] != "http" or not scope["path"].startswith(self.path_prefix):
            await self.app(scope, receive, send)
            return
        authorization = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None
        )
        if self.keys.allows(authorization):
            await self.app(scope, receive, send)
            return
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY, "more_body": False})
