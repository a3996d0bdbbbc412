"""The canary verdict: canary and stable measured over the same window, judged against the SLO.

Rules, applied to the error rate and then to each latency objective of `spec.slo` in order:

1. The canary served fewer than `minRequests` requests in the window -> Inconclusive. Too few samples
   say nothing about a p95; an idle canary is never promoted on silence.
2. Canary breaks the SLO target while stable meets it (or stable has too few requests to judge) -> Fail.
3. Both break the target (an overload, an outage downstream): the window says nothing about the canary
   -> Inconclusive, unless the canary is also more than REGRESSION_RATIO x stable -> Fail.
4. Canary meets the target but is more than REGRESSION_RATIO x stable and uses more than
   REGRESSION_BUDGET_SHARE of the target -> Fail: a regression that eats into the budget now will
   break the SLO under more load. Below that share, differences are noise (2 ms vs 1 ms TTFT).
5. A canary value missing (no samples in a histogram) -> Inconclusive.

Rules 3 and 4 compare the tracks, which is fair only while each canary replica carries no more than
LOAD_PARITY x the requests of a stable replica: a step that sends 70% of the traffic to one canary
replica beside one stable replica loads the canary 2.3x, and a batching engine is slower under more
load whatever its revision. Past that, only the SLO itself (rule 2) judges the canary.

Any Fail wins over Inconclusive, which wins over Pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Literal

REGRESSION_RATIO = 1.5
REGRESSION_BUDGET_SHARE = 0.5
LOAD_PARITY = 1.25
ERROR_RATE = "error_rate"

LatencyMetric = Literal["ttft", "tpot", "e2e"]


@dataclass(frozen=True)
class LatencyObjective:
    """One percentile target, e.g. TTFT p95 <= 0.5 s."""

    metric: LatencyMetric
    quantile: float
    target_s: float

    @property
    def key(self) -> str:
        return f"{self.metric}_p{self.quantile * 100:g}"


@dataclass(frozen=True)
class SLOTargets:
    latency: tuple[LatencyObjective, ...] = ()
    error_rate: float | None = None


@dataclass(frozen=True)
class TrackMeasurement:
    """One track over the analysis window: request and error counts, and latency percentiles by objective
    key (None where the histogram had no samples)."""

    requests: float
    errors: float | None  # None: nothing counts this track's failures (an engine without outcomes)
    latency: Mapping[str, float | None]
    replicas: int = 1  # serving the track during the window: load per replica = requests / replicas
    retried: float = 0.0  # failed attempts the router retried elsewhere: hidden from clients, not from us

    @property
    def requests_per_replica(self) -> float:
        return self.requests / max(1, self.replicas)

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests > 0 and self.errors is not None else None


class Outcome(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    message: str
    metric: str | None = None
    canary: float | None = None
    reference: float | None = None  # the SLO target or the stable value the canary was held to

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            outcome=Outcome(data["outcome"]),
            message=data.get("message", ""),
            metric=data.get("metric"),
            canary=data.get("canary"),
            reference=data.get("reference"),
        )


def show(metric: str, value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:.2%}" if metric == ERROR_RATE else f"{value * 1000:.0f}ms"


def _judge(
    metric: str, canary: float | None, stable: float | None, target: float, comparable: bool
) -> Verdict | None:
    """Rules 2-5 for one metric; None when the canary is fine on it."""
    if canary is None:
        return Verdict(Outcome.INCONCLUSIVE, f"no canary samples for {metric}", metric)
    values = f"canary {show(metric, canary)}, stable {show(metric, stable)}, SLO {show(metric, target)}"
    regressed = comparable and stable is not None and canary > REGRESSION_RATIO * stable
    if canary > target:
        if stable is None or stable <= target:
            return Verdict(Outcome.FAIL, f"{metric} breaks the SLO: {values}", metric, canary, target)
        if regressed:
            return Verdict(
                Outcome.FAIL,
                f"{metric} is over {REGRESSION_RATIO}x stable while both break the SLO: {values}",
                metric,
                canary,
                stable,
            )
        return Verdict(Outcome.INCONCLUSIVE, f"{metric}: stable breaks the SLO too ({values})", metric)
    if regressed and canary > REGRESSION_BUDGET_SHARE * target:
        return Verdict(
            Outcome.FAIL, f"{metric} is over {REGRESSION_RATIO}x stable: {values}", metric, canary, stable
        )
    return None


def analyse(
    canary: TrackMeasurement, stable: TrackMeasurement, slo: SLOTargets, min_requests: int
) -> Verdict:
    if canary.requests < min_requests:
        return Verdict(
            Outcome.INCONCLUSIVE,
            f"canary served {canary.requests:.0f} requests in the window, "
            f"fewer than minRequests {min_requests}",
        )
    if canary.requests == 0:
        return Verdict(Outcome.PASS, "canary served no requests and minRequests is 0: nothing to judge")
    stable_judged = stable.requests >= max(min_requests, 1)

    def stable_value(value: float | None) -> float | None:
        return value if stable_judged else None

    checks: list[tuple[str, float | None, float | None, float]] = []
    unjudged: list[Verdict] = []
    if slo.error_rate is not None and canary.errors is None:  # not "no samples": nothing counts them
        unjudged.append(
            Verdict(
                Outcome.INCONCLUSIVE,
                "the engine counts no failed requests: error_rate is unjudged",
                ERROR_RATE,
            )
        )
    elif slo.error_rate is not None:
        checks.append((ERROR_RATE, canary.error_rate, stable_value(stable.error_rate), slo.error_rate))
    for objective in slo.latency:
        canary_value, stable_latency = canary.latency.get(objective.key), stable.latency.get(objective.key)
        checks.append((objective.key, canary_value, stable_value(stable_latency), objective.target_s))
    comparable = canary.requests_per_replica <= LOAD_PARITY * stable.requests_per_replica
    verdicts = unjudged + [v for v in (_judge(*check, comparable) for check in checks) if v is not None]
    failed = [v for v in verdicts if v.outcome is Outcome.FAIL]
    if failed:
        first = failed[0]
        hidden = (
            f"; the router retried {canary.retried:.0f} of the canary's failed attempts on other replicas"
            if canary.retried
            else ""
        )
        message = "; ".join(v.message for v in failed) + hidden
        return Verdict(Outcome.FAIL, message, first.metric, first.canary, first.reference)
    if verdicts:
        return Verdict(Outcome.INCONCLUSIVE, "; ".join(v.message for v in verdicts), verdicts[0].metric)
    summary = ", ".join(f"{m} {show(m, c)} (stable {show(m, s)})" for m, c, s, _ in checks)
    return Verdict(
        Outcome.PASS, f"canary meets the SLO on {canary.requests:.0f} requests: {summary or 'no objectives'}"
    )
