"""The router's connections to its replicas: how many, how long a request waits for one, and the
Retry-After a client is told when the router (or every replica) is full.

A non-streamed completion holds its connection for the whole generation, so there is no read timeout;
but without a cap a flood of clients would open as many connections to the replicas (and as many
sockets, buffers and tasks in the router's 512 Mi) as they like, although each replica only runs
max-num-seqs + max-queue requests and answers the rest 429. The cap is over all replicas together
(httpx pools per client, not per host); the default sits well above what a few replicas admit.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_POOL_TIMEOUT_S = 5.0
RETRY_AFTER_S = 1  # what a client is told when no replica said how long to wait
PROBE_CONNECTIONS = 64


@dataclass(frozen=True)
class UpstreamLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S  # a request waits this long for a free connection

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.pool_timeout_s <= 0:
            raise ValueError("upstream max connections must be >= 1 and the pool timeout positive")


class UpstreamPoolFull(Exception):
    """Every allowed connection to the replicas stayed busy for the pool timeout."""

    def __init__(self, limits: UpstreamLimits) -> None:
        super().__init__(
            f"the router is at its limit of {limits.max_connections} connections to the replicas; "
            f"retry in {RETRY_AFTER_S} s"
        )


def upstream_client(limits: UpstreamLimits, connect_timeout_s: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=connect_timeout_s, read=None, write=30.0, pool=limits.pool_timeout_s),
        limits=httpx.Limits(
            max_connections=limits.max_connections,
            max_keepalive_connections=min(256, limits.max_connections),
        ),
        trust_env=False,  # an HTTP(S)_PROXY meant for egress must not catch pod-to-pod traffic
    )


def probe_client() -> httpx.AsyncClient:
    """For the load probes (each request sets its own timeout)."""
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=PROBE_CONNECTIONS), trust_env=False)


def with_retry_after(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A 429's headers, with the router's Retry-After where the replica gave none (vLLM gives none)."""
    if any(name.lower() == b"retry-after" for name, _ in headers):
        return headers
    return [*headers, (b"retry-after", str(RETRY_AFTER_S).encode())]
