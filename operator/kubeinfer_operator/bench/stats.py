"""Pure statistics over a load point's request results: percentiles, throughput, goodput, the SLO."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kubeinfer_operator.bench.client import RequestResult
from kubeinfer_operator.bench.slo import Slo

PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks, as numpy's default."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """Seconds. NaN when there were no samples."""

    count: int
    mean: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        p50, p90, p95, p99 = (percentile(values, q) for q in PERCENTILES)
        return cls(len(values), mean, p50, p90, p95, p99)


@dataclass(frozen=True)
class SloVerdict:
    met: bool
    failures: tuple[str, ...]  # e.g. "ttft.p95 612ms > 500ms"


@dataclass(frozen=True)
class PointStats:
    """What one load point measured."""

    duration_s: float  # first send to last response
    completed: int
    failed: int
    errors: dict[str, int]  # error kind -> count
    request_throughput: float  # completed requests/s
    input_token_throughput: float | None  # prompt tokens/s; None when the server reports no usage
    output_token_throughput: float
    ttft: Distribution
    itl: Distribution
    tpot: Distribution
    e2e: Distribution
    goodput: float | None  # requests/s within every per-request SLO threshold; None without an SLO
    good_requests: int | None
    slo: SloVerdict | None

    def to_dict(self) -> dict:
        return asdict(self)


def _meets(result: RequestResult, slo: Slo) -> bool:
    for metric, value in (("ttft", result.ttft), ("tpot", result.tpot), ("e2e", result.e2e)):
        threshold = slo.per_request_threshold(metric)
        if threshold is None or (value is None and metric == "tpot"):  # one-token outputs have no TPOT
            continue
        if value is None or value > threshold:
            return False
    return True


def judge_slo(slo: Slo, values: dict[str, list[float]], failed: int, total: int) -> SloVerdict:
    """Each target's percentile over successful requests, and the error rate over all of them."""
    failures: list[str] = []
    for target in slo.targets:
        observed = percentile(values[target.metric], target.percentile)
        if math.isnan(observed) or observed > target.threshold_s:
            failures.append(f"{target.name} {observed * 1000:.0f}ms > {target.threshold_s * 1000:g}ms")
    if slo.error_rate is not None and total and failed / total > slo.error_rate:
        failures.append(f"errorRate {failed / total:.3f} > {slo.error_rate:g}")
    return SloVerdict(not failures, tuple(failures))


def summarize(results: Sequence[RequestResult], duration_s: float, slo: Slo | None = None) -> PointStats:
    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    e2es = [r.e2e for r in ok]
    itls = [gap for r in ok for gap in r.itls]
    duration = max(duration_s, 1e-9)
    prompt_counts = [r.prompt_tokens for r in ok]
    input_tokens = None if None in prompt_counts else sum(prompt_counts)  # type: ignore[arg-type]
    good = sum(_meets(r, slo) for r in ok) if slo else None
    verdict = (
        judge_slo(slo, {"ttft": ttfts, "tpot": tpots, "e2e": e2es}, len(results) - len(ok), len(results))
        if slo
        else None
    )
    return PointStats(
        duration_s=duration_s,
        completed=len(ok),
        failed=len(results) - len(ok),
        errors=dict(sorted(errors.items())),  # type: ignore[arg-type]
        request_throughput=len(ok) / duration,
        input_token_throughput=None if input_tokens is None else input_tokens / duration,
        output_token_throughput=sum(r.output_tokens for r in ok) / duration,
        ttft=Distribution.of(ttfts),
        itl=Distribution.of(itls),
        tpot=Distribution.of(tpots),
        e2e=Distribution.of(e2es),
        goodput=None if good is None else good / duration,
        good_requests=good,
        slo=verdict,
    )
