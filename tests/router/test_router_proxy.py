"""The router against live fake backends over real HTTP: split, least-load, streaming, retry, ids, metrics."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_fakes import FakeBackend, free_dead_url, hang_up_url, write_config

from kubeinfer_runtime.router.retry_budget import RetryBudget

Router = Callable[..., tuple[str, Path]]
Backends = Callable[..., FakeBackend]
BODY = {"model": "m", "prompt": "hi", "max_tokens": 3}
# One pooled client: a fresh httpx client per request costs tens of milliseconds (SSL context setup).
http = httpx.Client(timeout=10)


def complete(url: str, stream: bool = False, headers: dict[str, str] | None = None) -> httpx.Response:
    return http.post(f"{url}/v1/completions", json=BODY | {"stream": stream}, headers=headers)


def tracks_of(url: str, n: int) -> collections.Counter[str]:
    responses = [complete(url) for _ in range(n)]
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    return collections.Counter(r.headers["x-kubeinfer-track"] for r in responses)


def samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = http.get(f"{url}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(values: dict, name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_splits_90_10_exactly_and_counts_per_track(start_backend: Backends, start_router: Router) -> None:
    stable_a, stable_b, canary = start_backend("a"), start_backend("b"), start_backend("c")
    url, _ = start_router({"stable": (90, [stable_a.url, stable_b.url]), "canary": (10, [canary.url])})

    assert tracks_of(url, 100) == {"stable": 90, "canary": 10}
    assert (stable_a.served + stable_b.served, canary.served) == (90, 10)
    assert (stable_a.served, stable_b.served) == (45, 45), "equally idle replicas take turns"
    values = samples(url)
    assert sample(values, "kubeinfer_router_requests_total", track="stable", code="200") == 90
    assert sample(values, "kubeinfer_router_requests_total", track="canary", code="200") == 10
    assert sample(values, "kubeinfer_router_e2e_request_latency_seconds_count", track="canary") == 10


def test_weight_0_and_empty_tracks_get_no_traffic(start_backend: Backends, start_router: Router) -> None:
    stable, canary = start_backend("s"), start_backend("c")
    url, config = start_router({"stable": (0, [stable.url]), "canary": (100, [canary.url])})
    assert tracks_of(url, 20) == {"canary": 20}

    # A canary with no ready endpoint yet: its 10% goes to stable rather than failing.
    write_config(config, {"stable": (90, [stable.url]), "canary": (10, [])})
    wait_until(lambda: complete(url).headers["x-kubeinfer-track"] == "stable" and stable.served > 0)
    assert tracks_of(url, 20) == {"stable": 20}
    assert http.get(f"{url}/ready").status_code == 200

    write_config(config, {"stable": (90, []), "canary": (10, [])})
    wait_until(lambda: http.get(f"{url}/ready").status_code == 503)
    response = complete(url)
    assert response.status_code == 503
    assert "no replica" in response.json()["error"]["message"]


def test_picks_the_replica_with_fewest_waiting_requests(
    start_backend: Backends, start_router: Router
) -> None:
    busy, idle, half = (
        start_backend("busy", waiting=7),
        start_backend("idle", waiting=0),
        start_backend("half", waiting=3),
    )
    url, _ = start_router({"stable": (100, [busy.url, idle.url, half.url])})
    # A second probe round has begun only after the first one's loads were stored.
    wait_until(lambda: min(busy.probes, idle.probes, half.probes) >= 2)
    tracks_of(url, 20)
    assert (busy.served, idle.served, half.served) == (0, 20, 0)

    idle.waiting = 10
    wait_until(lambda: complete(url) is not None and half.served > 0)
    before = half.served
    tracks_of(url, 10)
    assert half.served - before == 10


def test_streams_chunks_as_they_arrive(start_backend: Backends, start_router: Router) -> None:
    slow = start_backend("slow", chunks=4, chunk_delay_s=0.3)
    url, _ = start_router({"stable": (100, [slow.url])})

    with http.stream("POST", f"{url}/v1/completions", json=BODY | {"stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        assert not slow.stream_finished.is_set(), (
            "the first event reached the client only after the backend finished"
        )
        assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "tok0"
        rest = [line for line in lines if line]
    assert slow.stream_finished.is_set()
    assert rest[-1] == "data: [DONE]" and len(rest) == 4

    values = samples(url)
    assert sample(values, "kubeinfer_router_time_to_first_token_seconds_count", track="stable") == 1
    # Time to the first event (sent at once), not to the end of the stream (0.9 s later).
    assert sample(values, "kubeinfer_router_time_to_first_token_seconds_sum", track="stable") < 0.6
    assert sample(values, "kubeinfer_router_inter_token_latency_seconds_count", track="stable") >= 3
    assert sample(values, "kubeinfer_router_e2e_request_latency_seconds_sum", track="stable") >= 0.9


def test_client_going_away_stops_the_backend(start_backend: Backends, start_router: Router) -> None:
    streaming = start_backend("streaming", chunks=100, chunk_delay_s=0.05)
    url, config = start_router({"stable": (100, [streaming.url])})
    with http.stream("POST", f"{url}/v1/completions", json=BODY | {"stream": True}) as response:
        next(response.iter_raw())
    wait_until(streaming.cancelled.is_set, timeout_s=3)
    assert not streaming.stream_finished.is_set()

    def client_gone_count() -> float:
        return sample(samples(url), "kubeinfer_router_requests_total", track="stable", code="499")

    wait_until(lambda: client_gone_count() == 1)

    # A non-streamed request gets nothing back until its generation ends: leaving early must stop it too.
    slow = start_backend("slow", reply_after_s=5.0)
    write_config(config, {"stable": (100, [slow.url])})
    wait_until(lambda: slow.probes > 0)  # the router probes only what its config lists
    with httpx.Client(timeout=0.5) as impatient, contextlib.suppress(httpx.ReadTimeout):
        impatient.post(f"{url}/v1/completions", json=BODY)
    wait_until(slow.cancelled.is_set, timeout_s=3)
    wait_until(lambda: client_gone_count() == 2)


def test_retries_on_another_replica_before_the_first_byte(
    start_backend: Backends, start_router: Router
) -> None:
    live, broken, overloaded = (
        start_backend("live"),
        start_backend("broken", status=500),
        start_backend("full", status=429),
    )
    stable = [free_dead_url(), hang_up_url(), broken.url, overloaded.url, live.url]
    # A budget that covers every failure here: what is tested is which replicas a retry may go to.
    url, config = start_router(
        {"stable": (100, stable)}, max_attempts=5, retry_budget=RetryBudget(ratio=1.0, floor=100)
    )
    responses = [complete(url, stream=i % 2 == 0) for i in range(12)]
    assert [r.status_code for r in responses] == [200] * 12
    assert live.served == 12
    assert broken.request_ids and overloaded.request_ids, "the failing replicas were tried and skipped"
    assert sample(samples(url), "kubeinfer_router_requests_total", track="stable", code="200") == 12

    # The stable track's replicas are all down: the canary serves rather than the client seeing an error.
    canary = start_backend("canary")
    write_config(config, {"stable": (90, [free_dead_url(), broken.url]), "canary": (10, [canary.url])})
    wait_until(lambda: complete(url).status_code == 200 and canary.served > 0)
    assert all(complete(url).status_code == 200 for _ in range(10))

    # Nobody left to try: the last replica's own answer (with its Retry-After, say) reaches the client.
    write_config(config, {"stable": (100, [broken.url, overloaded.url])})
    wait_until(lambda: complete(url).status_code in (500, 429))
    last = complete(url)
    assert last.status_code in (500, 429) and "is broken" in last.json()["error"]["message"]

    write_config(config, {"stable": (100, [free_dead_url(), free_dead_url()])})
    wait_until(lambda: complete(url).status_code == 502)
    assert "no replica answered" in complete(url).json()["error"]["message"]
    assert sample(samples(url), "kubeinfer_router_requests_total", track="stable", code="502") >= 2


def test_a_stream_cut_after_the_first_byte_reaches_the_client_as_an_error(
    start_backend: Backends, start_router: Router
) -> None:
    crashing = start_backend("crashing", chunks=5, chunk_delay_s=0.05, crash_after_chunks=2)
    url, _ = start_router({"stable": (100, [crashing.url])})
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),  # not a clean end: the client knows it lost the rest
        http.stream("POST", f"{url}/v1/completions", json=BODY | {"stream": True}) as response,
    ):
        for line in response.iter_lines():
            received += [line] if line else []
    assert len(received) == 2
    wait_until(
        lambda: sample(samples(url), "kubeinfer_router_requests_total", track="stable", code="502") == 1
    )


def test_request_id_is_propagated_or_generated(start_backend: Backends, start_router: Router) -> None:
    backend = start_backend("b")
    url, _ = start_router({"stable": (100, [backend.url])})

    given = complete(url, headers={"X-Request-Id": "req-42"})
    assert given.headers["x-request-id"] == "req-42"
    assert backend.request_ids[-1] == "req-42"

    generated = complete(url, stream=True)
    assert generated.headers["x-request-id"] == backend.request_ids[-1]
    assert len(generated.headers["x-request-id"]) >= 16


def test_every_attempt_counts_against_its_track_while_retries_hide_some_failures(
    start_backend: Backends, start_router: Router
) -> None:
    """A canary that fails every request: its failures are counted on the canary track however many the
    retries hid from clients, retries stay within the budget, and a client sees an error only from the
    canary (when the budget is spent), never from stable."""
    stable, canary = start_backend("stable"), start_backend("canary", status=500)
    budget = RetryBudget(ratio=0.1, floor=2, window_s=60)
    url, _ = start_router({"stable": (70, [stable.url]), "canary": (30, [canary.url])}, retry_budget=budget)
    responses = [complete(url, stream=i % 2 == 0) for i in range(100)]
    failed = [r for r in responses if r.status_code != 200]
    values = samples(url)
    attempts = "kubeinfer_router_upstream_attempts_total"
    assert sample(values, attempts, track="canary", code="500") == 30  # every canary attempt
    assert sample(values, attempts, track="stable", code="200") == 100 - len(failed)
    retried = sample(values, "kubeinfer_router_retries_total", track="canary", reason="500")
    denied = sample(values, "kubeinfer_router_retries_denied_total", track="canary")
    # The floor plus 10% of the requests so far at each failure: at most 2 + 10 over these 100 requests.
    assert 2 + 8 <= retried <= 2 + 10 and retried + denied == 30
    assert len(failed) == denied and all(r.headers["x-kubeinfer-track"] == "canary" for r in failed)
    assert all(r.status_code == 500 for r in failed)
    # What clients got, by the track that answered: the retried ones count as stable successes.
    assert sample(values, "kubeinfer_router_requests_total", track="canary", code="500") == len(failed)


def test_retry_budget_is_a_share_of_recent_requests_plus_a_floor() -> None:
    now = [0.0]
    budget = RetryBudget(ratio=0.2, floor=1, window_s=10, clock=lambda: now[0])
    for _ in range(10):
        budget.request()
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]  # 1 + 0.2 x 10
    now[0] = 11.0  # the window moved past all of it: only the floor is left
    assert budget.allowed() == 1
    assert budget.try_spend() and not budget.try_spend()
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=1.5)
