"""Run load points against a target: one point, a sweep over request rates, and the sweep's knee."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import httpx
from tqdm import tqdm

from kubeinfer_operator.bench.client import RequestResult, Target, send_request
from kubeinfer_operator.bench.slo import Slo
from kubeinfer_operator.bench.stats import PointStats, summarize
from kubeinfer_operator.bench.workload import RequestSpec, arrival_offsets

# Without an SLO, the knee is the last rate at which at least this fraction of the added offered
# load still came out as added throughput; past it, more load mostly becomes queueing.
KNEE_MARGINAL_EFFICIENCY = 0.5


@dataclass(frozen=True)
class LoadPoint:
    rate: float = math.inf  # requests/s offered; inf sends all at once
    burstiness: float = 1.0  # gamma shape of inter-arrival gaps; 1 is Poisson
    max_concurrency: int | None = None  # at most this many requests in flight

    @property
    def label(self) -> str:
        parts = ["max rate" if math.isinf(self.rate) else f"{self.rate:.3g} req/s"]
        if self.max_concurrency:
            parts.append(f"concurrency {self.max_concurrency}")
        return ", ".join(parts)


@dataclass
class PointResult:
    point: LoadPoint
    results: list[RequestResult]
    stats: PointStats


@dataclass(frozen=True)
class Knee:
    index: int  # into the sweep's points
    rule: str  # "slo" or "throughput"
    reason: str


async def warm_up(client: httpx.AsyncClient, target: Target, spec: RequestSpec) -> None:
    """One short request before measuring: checks the endpoint (a clear error instead of a run of
    failures) and keeps a cold server's first-request costs out of the numbers."""
    result = await send_request(client, target, replace(spec, max_tokens=min(spec.max_tokens, 4)))
    if not result.ok:
        detail = f": {result.error_detail}" if result.error_detail else ""
        raise ValueError(f"the warm-up request to {target.base_url} failed with {result.error}{detail}")


async def run_point(
    client: httpx.AsyncClient,
    target: Target,
    requests: Sequence[RequestSpec],
    point: LoadPoint,
    rng: random.Random,
    slo: Slo | None = None,
    progress: bool = True,
) -> PointResult:
    """Send `requests` at the point's arrival rate, never more than its concurrency in flight."""
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    bar = tqdm(total=len(requests), desc=point.label, unit="req", disable=not progress)
    errors = 0

    async def one(spec: RequestSpec) -> RequestResult:
        nonlocal errors
        try:
            result = await send_request(client, target, spec)
        finally:
            if limit:
                limit.release()
        errors += not result.ok
        bar.set_postfix(errors=errors, refresh=False)
        bar.update(1)
        return result

    tasks: list[asyncio.Task[RequestResult]] = []
    start = time.perf_counter()
    for spec, offset in zip(
        requests, arrival_offsets(len(requests), point.rate, point.burstiness, rng), strict=True
    ):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if limit:
            await limit.acquire()
        tasks.append(asyncio.create_task(one(spec)))
    results = list(await asyncio.gather(*tasks))
    bar.close()
    duration = max(r.end for r in results) - min(r.start for r in results) if results else 0.0
    return PointResult(point, results, summarize(results, duration, slo))


async def run_points(
    client: httpx.AsyncClient,
    target: Target,
    points: Sequence[LoadPoint],
    make_requests: Callable[[int], list[RequestSpec]],
    rng: random.Random,
    slo: Slo | None = None,
    progress: bool = True,
) -> list[PointResult]:
    """Run points one after another; `make_requests(i)` gives point i its requests."""
    runs: list[PointResult] = []
    for i, point in enumerate(points):
        run = await run_point(client, target, make_requests(i), point, rng, slo, progress)
        if progress:
            tqdm.write(
                f"{point.label}: {run.stats.request_throughput:.2f} req/s, "
                f"TTFT p95 {run.stats.ttft.p95 * 1000:.0f} ms, failed {run.stats.failed}",
                file=sys.stderr,
            )
        runs.append(run)
    return runs


async def run_auto_sweep(
    client: httpx.AsyncClient,
    target: Target,
    steps: int,
    base: LoadPoint,
    make_requests: Callable[[int], list[RequestSpec]],
    rng: random.Random,
    slo: Slo | None = None,
    progress: bool = True,
) -> list[PointResult]:
    """Find the ceiling with everything sent at once, then sweep `steps` rates up to it."""
    probe = await run_points(
        client,
        target,
        [LoadPoint(math.inf, base.burstiness, base.max_concurrency)],
        make_requests,
        rng,
        slo,
        progress,
    )
    rates = sweep_rates(probe[0].stats.request_throughput, steps)
    points = [LoadPoint(rate, base.burstiness, base.max_concurrency) for rate in rates]
    swept = await run_points(client, target, points, lambda i: make_requests(i + 1), rng, slo, progress)
    return swept + probe


def sweep_rates(max_throughput: float, steps: int) -> list[float]:
    """`steps` evenly spaced rates from max/steps up to max."""
    if steps < 1 or not max_throughput > 0:
        raise ValueError("a sweep needs at least one step and a positive measured throughput")
    return [max_throughput * i / steps for i in range(1, steps + 1)]


def find_knee(runs: Sequence[PointResult], slo: Slo | None) -> Knee | None:
    """The sweep's knee, over points with a finite rate, in order of rate.

    With an SLO: the highest rate such that it and every lower rate met the SLO.
    Without: the highest rate up to which each step still turned at least half of its added
    offered load into added throughput (KNEE_MARGINAL_EFFICIENCY), starting from (0, 0).
    """
    order = sorted(
        (i for i, r in enumerate(runs) if math.isfinite(r.point.rate)), key=lambda i: runs[i].point.rate
    )
    knee: Knee | None = None
    prev_rate = prev_throughput = 0.0
    for i in order:
        stats, rate = runs[i].stats, runs[i].point.rate
        if rate <= prev_rate:  # a repeated rate adds no information
            continue
        if slo:
            assert stats.slo is not None
            if not stats.slo.met:
                break
            knee = Knee(i, "slo", f"highest rate meeting the SLO ({slo.describe()})")
            prev_rate = rate
        else:
            efficiency = (stats.request_throughput - prev_throughput) / (rate - prev_rate)
            if efficiency < KNEE_MARGINAL_EFFICIENCY:
                break
            knee = Knee(i, "throughput", "highest rate before added load stops adding throughput")
            prev_rate, prev_throughput = rate, stats.request_throughput
    return knee
