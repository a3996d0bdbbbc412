"""`kubeinfer bench` against the real runtime: what the client measures must agree with the
server's own Prometheus histograms for the same requests, within their bucket resolution."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from bench_processes import free_port, wait_until_up
from prometheus_client.parser import text_string_to_metric_families

from kubeinfer_operator.bench.client import Target, make_client
from kubeinfer_operator.bench.runner import LoadPoint, PointResult, run_point, warm_up
from kubeinfer_operator.bench.stats import percentile
from kubeinfer_operator.bench.workload import LengthDistribution, RequestSpec, synthetic_requests

RUNTIME_CLI = str(Path(sys.executable).parent / "kubeinfer-runtime")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [RUNTIME_CLI, "make-tiny-model", str(model_dir), "--preset", "llama-gqa"], check=True, timeout=300
    )
    port = free_port()
    log = model_dir / "server.log"
    command = [
        RUNTIME_CLI,
        "serve",
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
    ]
    command += ["--port", str(port), "--device", "cpu", "--max-num-seqs", "4"]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/ready", process, log, timeout=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=60)


def histograms(url: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts by upper bound, per histogram; and request outcome counters."""
    found: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                found.setdefault(sample.name.removesuffix("_bucket"), {})[float(sample.labels["le"])] = (
                    sample.value
                )
            elif sample.name == "kubeinfer_requests_total":
                found.setdefault(sample.name, {})[sample.labels["outcome"]] = sample.value  # type: ignore[index]
    return found


def run_bench(url: str) -> PointResult:
    async def go() -> PointResult:
        async with make_client(120.0) as client:
            target = Target(url, "tiny", timeout_s=120.0)
            lengths = LengthDistribution("uniform", 16, 64), LengthDistribution("uniform", 4, 24)
            requests = synthetic_requests(40, *lengths, random.Random(4))
            # Two in flight keep the server below saturation: an overloaded server's event loop
            # stamps a request's arrival late, and its histograms then under-count what clients wait.
            point = LoadPoint(max_concurrency=2)
            return await run_point(client, target, requests, point, random.Random(4), progress=False)

    return asyncio.run(go())


HTTP_ROUND_TRIP_S = 0.02


def assert_agrees_within_buckets(name: str, client: list[float], server: dict[float, float]) -> None:
    bounds = sorted(server)
    # Each request's client latency contains its server latency, so at no bound may the client
    # count more requests than the server did.
    for bound in bounds:
        assert sum(v <= bound for v in client) <= server[bound], (
            f"{name}: client faster than server at le={bound}"
        )
    # The client's p50 and p90 lie in the server's bucket for them, or the one either side, give or
    # take the HTTP round trip the client also waits for (a few ms here: at the tiny model's ~5 ms
    # TTFT that alone crosses a bucket). Not p95/p99: on a busy 2-core machine a few requests in 40
    # wait 0.1-0.5 s before the server's event loop stamps their arrival, which no histogram can see.
    total = server[float("inf")]
    for q in (50.0, 90.0):
        i = next(i for i, bound in enumerate(bounds) if server[bound] >= q / 100 * total)
        low = [0.0, *bounds][max(i - 1, 0)]
        high = max(bounds[min(i + 1, len(bounds) - 1)], bounds[i] + HTTP_ROUND_TRIP_S)
        measured = percentile(client, q)
        assert low <= measured <= high, f"{name} p{q:g}: client {measured:.3f}s, server bucket le={bounds[i]}"


def test_bench_agrees_with_the_runtimes_own_histograms(runtime_url: str) -> None:
    asyncio.run(_warm(runtime_url))  # before the first scrape: the warm-up is not part of the run
    before = histograms(runtime_url)
    run_ = run_bench(runtime_url)
    after = histograms(runtime_url)

    assert run_.stats.failed == 0 and run_.stats.completed == 40
    successes = after["kubeinfer_requests_total"]["success"] - before["kubeinfer_requests_total"].get(
        "success", 0
    )
    assert successes == 40
    for metric, values in (
        ("kubeinfer_time_to_first_token_seconds", [r.ttft for r in run_.results]),
        ("kubeinfer_e2e_request_latency_seconds", [r.e2e for r in run_.results]),
    ):
        delta = {le: count - before.get(metric, {}).get(le, 0) for le, count in after[metric].items()}
        assert delta[float("inf")] == 40, f"{metric} counted {delta[float('inf')]} requests"
        assert_agrees_within_buckets(metric, values, delta)  # type: ignore[arg-type]


async def _warm(url: str) -> None:
    async with make_client(120.0) as client:
        await warm_up(client, Target(url, "tiny", timeout_s=120.0), RequestSpec("warm up", None, 2))
