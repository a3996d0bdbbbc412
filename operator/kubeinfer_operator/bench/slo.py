"""The SLO a benchmark is judged against: from `--slo` flags or an InferenceService manifest.

Flags use the manifest's own names, so `--slo ttft.p95=500ms` means what `spec.slo.ttft.p95: 500ms`
means: the 95th percentile of time to first token must stay within 500 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from kubeinfer_operator.api import SLO, parse_duration, parse_manifest

LATENCY_METRICS = ("ttft", "tpot", "e2e")
_PERCENTILE_KEY = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


@dataclass(frozen=True)
class LatencyTarget:
    metric: str  # one of LATENCY_METRICS
    percentile: float  # 95.0 for p95
    threshold_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}.p{self.percentile:g}"


@dataclass(frozen=True)
class Slo:
    targets: tuple[LatencyTarget, ...] = ()
    error_rate: float | None = None  # the largest tolerated fraction of failed requests

    def __bool__(self) -> bool:
        return bool(self.targets) or self.error_rate is not None

    def per_request_threshold(self, metric: str) -> float | None:
        """The strictest threshold on `metric`: a request within it counts towards goodput."""
        thresholds = [t.threshold_s for t in self.targets if t.metric == metric]
        return min(thresholds) if thresholds else None

    def describe(self) -> str:
        parts = [f"{t.name}<={t.threshold_s * 1000:g}ms" for t in self.targets]
        if self.error_rate is not None:
            parts.append(f"errorRate<={self.error_rate:g}")
        return ", ".join(parts) or "none"

    def merged_with(self, override: Slo) -> Slo:
        """This SLO with `override`'s targets replacing ours on the same metric and percentile."""
        replaced = {(t.metric, t.percentile) for t in override.targets}
        kept = tuple(t for t in self.targets if (t.metric, t.percentile) not in replaced)
        error_rate = override.error_rate if override.error_rate is not None else self.error_rate
        return Slo(kept + override.targets, error_rate)


def _parse_error_rate(value: object, field: str) -> float:
    try:
        rate = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{field}: {value!r} is not a number between 0 and 1") from None
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{field}: {rate:g} is not between 0 and 1")
    return rate


def _parse_percentile(key: str, field: str) -> float:
    match = _PERCENTILE_KEY.match(key)
    if not match or not 0 < float(match.group(1)) < 100:
        raise ValueError(f"{field}: {key!r} is not a percentile; write e.g. p50, p95, p99")
    return float(match.group(1))


def _target(metric: str, percentile_key: str, duration: str, field: str) -> LatencyTarget:
    if metric not in LATENCY_METRICS:
        raise ValueError(f"{field}: unknown metric {metric!r}; expected one of {', '.join(LATENCY_METRICS)}")
    try:
        threshold = parse_duration(duration)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None
    if threshold <= 0:
        raise ValueError(f"{field}: the threshold must be positive")
    return LatencyTarget(metric, _parse_percentile(percentile_key, field), threshold)


def parse_slo_flags(items: list[str]) -> Slo:
    """`["ttft.p95=500ms", "tpot.p95=60ms", "errorRate=0.01"]` -> Slo."""
    targets: list[LatencyTarget] = []
    error_rate: float | None = None
    for item in items:
        key, sep, value = item.partition("=")
        field = f"--slo {item}"
        if not sep or not value:
            raise ValueError(f"{field}: expected KEY=VALUE such as ttft.p95=500ms or errorRate=0.01")
        if key == "errorRate":
            error_rate = _parse_error_rate(value, field)
            continue
        metric, dot, percentile = key.partition(".")
        if not dot:
            raise ValueError(f"{field}: expected METRIC.pNN=DURATION such as ttft.p95=500ms")
        targets.append(_target(metric, percentile, value, field))
    return Slo(tuple(targets), error_rate)


def slo_from_api(slo: SLO) -> Slo:
    """The bench's view of a validated `spec.slo`."""
    targets = [
        _target(metric, key, duration, f"spec.slo.{metric}.{key}")
        for metric in LATENCY_METRICS
        if (latency := getattr(slo, metric)) is not None
        for key, duration in (("p50", latency.p50), ("p95", latency.p95), ("p99", latency.p99))
        if duration is not None
    ]
    return Slo(tuple(targets), slo.error_rate)


def slo_from_manifest(path: Path) -> Slo:
    """The SLO of the single InferenceService in a YAML file, validated as the apiserver would."""
    with open(path) as f:
        documents = [d for d in yaml.safe_load_all(f) if isinstance(d, dict)]
    services = [d for d in documents if d.get("kind") == "InferenceService"]
    if len(services) != 1:
        raise ValueError(f"{path}: expected exactly one InferenceService document, found {len(services)}")
    if not (services[0].get("spec") or {}).get("slo"):
        raise ValueError(f"{path}: the InferenceService has no spec.slo")
    try:
        service = parse_manifest(services[0])
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return slo_from_api(service.spec.slo)
