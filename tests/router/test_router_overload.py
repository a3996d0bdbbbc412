"""The router when replicas or the router itself are full: a 429 stays within its track and reaches the
client once, with a Retry-After; the cap on connections to the replicas answers 503 instead of queueing
without bound. Live fake backends over real HTTP."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from router_fakes import FakeBackend
from test_router_proxy import BODY, complete, sample, samples, wait_until

from kubeinfer_runtime.router.retry_budget import RetryBudget
from kubeinfer_runtime.router.upstream_limits import UpstreamLimits

Router = Callable[..., tuple[str, Path]]
Backends = Callable[..., FakeBackend]
ATTEMPTS = "kubeinfer_router_upstream_attempts_total"


def test_a_429_is_retried_on_a_sibling_replica_of_its_track(
    start_backend: Backends, start_router: Router
) -> None:
    full, live = start_backend("full", status=429), start_backend("live")
    url, _ = start_router(
        {"stable": (100, [full.url, live.url])}, retry_budget=RetryBudget(ratio=1.0, floor=100)
    )
    assert [complete(url).status_code for _ in range(10)] == [200] * 10
    assert live.served == 10 and full.request_ids, "the full replica was tried, its 429s hidden by a sibling"


def test_when_every_replica_of_the_track_says_429_the_client_gets_one_429_and_the_canary_no_overflow(
    start_backend: Backends, start_router: Router
) -> None:
    full_a, full_b = start_backend("full-a", status=429), start_backend("full-b", status=429)
    canary = start_backend("canary")
    budget = RetryBudget(ratio=1.0, floor=100)  # retries are not what stops the spill: the track is
    url, _ = start_router(
        {"stable": (80, [full_a.url, full_b.url]), "canary": (20, [canary.url])}, retry_budget=budget
    )
    responses = [complete(url) for _ in range(50)]
    by_track = {
        t: [r for r in responses if r.headers["x-kubeinfer-track"] == t] for t in ("stable", "canary")
    }
    assert len(by_track["stable"]) == 40 and len(by_track["canary"]) == 10
    assert {r.status_code for r in by_track["stable"]} == {429}
    assert all(r.headers["retry-after"] == "1" for r in by_track["stable"])  # the router's, none was given
    assert canary.served == 10, "no stable request was moved onto the canary"
    values = samples(url)
    # Each stable request: one attempt per stable replica (the second a retry), never a third.
    assert sample(values, ATTEMPTS, track="stable", code="429") == 80
    assert sample(values, "kubeinfer_router_requests_total", track="stable", code="429") == 40


def test_the_replicas_retry_after_reaches_the_client(start_backend: Backends, start_router: Router) -> None:
    full = start_backend("full", status=429, retry_after="7")
    url, _ = start_router({"stable": (100, [full.url])})
    response = complete(url)
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert response.headers.get_list("retry-after") == ["7"]


def test_at_the_upstream_connection_cap_a_request_gets_503_with_retry_after(
    start_backend: Backends, start_router: Router
) -> None:
    slow = start_backend("slow", reply_after_s=2.0)
    url, _ = start_router(
        {"stable": (100, [slow.url])}, upstream_limits=UpstreamLimits(max_connections=1, pool_timeout_s=0.3)
    )
    with ThreadPoolExecutor(2) as pool, httpx.Client(timeout=10) as other:
        first = pool.submit(complete, url)
        wait_until(lambda: slow.served == 1)  # the only connection is held by a generation
        refused = other.post(f"{url}/v1/completions", json=BODY)
        assert first.result().status_code == 200
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "limit of 1 connections" in refused.json()["error"]["message"]
    values = samples(url)
    # The router's own limit: no attempt is charged to the replica's track.
    assert sample(values, ATTEMPTS, track="stable", code="transport") == 0
    assert sample(values, "kubeinfer_router_requests_total", track="stable", code="503") == 1
