"""A benchmark's results as text for people and JSON for machines."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from kubeinfer_operator.bench.runner import Knee, PointResult
from kubeinfer_operator.bench.slo import Slo
from kubeinfer_operator.bench.stats import Distribution, PointStats

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}"


def format_point(run: PointResult) -> str:
    """One load point in full: throughput, every latency's mean and percentiles, errors, SLO."""
    s: PointStats = run.stats
    lines = [
        f"== {run.point.label}"
        + (f", burstiness {run.point.burstiness:g}" if run.point.burstiness != 1 else ""),
        f"requests: {s.completed} completed, {s.failed} failed in {s.duration_s:.2f} s",
        f"throughput: {s.request_throughput:.2f} req/s, {s.output_token_throughput:.1f} output tok/s"
        + ("" if s.input_token_throughput is None else f", {s.input_token_throughput:.1f} input tok/s"),
        f"{'latency (ms)':<13}{'mean':>9}{'p50':>9}{'p90':>9}{'p95':>9}{'p99':>9}{'n':>7}",
    ]
    for key, title in LATENCIES:
        d: Distribution = getattr(s, key)
        values = "".join(f"{_ms(v):>9}" for v in (d.mean, d.p50, d.p90, d.p95, d.p99))
        lines.append(f"{title:<13}{values}{d.count:>7}")
    if s.errors:
        lines.append("errors: " + ", ".join(f"{kind} {count}" for kind, count in s.errors.items()))
    if s.slo is not None:
        lines.append(
            f"goodput: {s.goodput:.2f} req/s ({s.good_requests} of {s.completed + s.failed} within the SLO)"
        )
        lines.append("SLO: met" if s.slo.met else "SLO: missed (" + "; ".join(s.slo.failures) + ")")
    return "\n".join(lines)


def format_sweep(runs: Sequence[PointResult], knee: Knee | None) -> str:
    """One row per load point, the knee marked."""
    header = (
        f"{'load':<28}{'req/s':>8}{'out tok/s':>11}{'TTFT p50':>10}{'TTFT p95':>10}"
        f"{'TPOT p95':>10}{'E2E p95':>10}{'failed':>8}{'goodput':>9}  SLO"
    )
    lines = [header]
    for i, run in enumerate(runs):
        s = run.stats
        slo = "" if s.slo is None else ("met" if s.slo.met else "missed")
        goodput = "-" if s.goodput is None else f"{s.goodput:.2f}"
        mark = "  <- knee" if knee and knee.index == i else ""
        lines.append(
            f"{run.point.label:<28}{s.request_throughput:>8.2f}{s.output_token_throughput:>11.1f}"
            f"{_ms(s.ttft.p50):>10}{_ms(s.ttft.p95):>10}{_ms(s.tpot.p95):>10}{_ms(s.e2e.p95):>10}"
            f"{s.failed:>8}{goodput:>9}  {slo}{mark}"
        )
    lines.append("latencies in ms")
    if knee is None:
        lines.append(
            "knee: none found ("
            + (
                "no rate met the SLO"
                if runs and runs[0].stats.slo
                else "throughput never kept up with the offered load"
            )
            + ")"
        )
    else:
        run = runs[knee.index]
        lines.append(
            f"knee: {run.point.label}: {knee.reason}; {run.stats.request_throughput:.2f} req/s, "
            f"{run.stats.output_token_throughput:.1f} output tok/s"
        )
    return "\n".join(lines)


def json_safe(value: object) -> object:
    """NaN/inf are not JSON: write null (no samples) or the string "inf" (an unbounded rate)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def to_json(runs: Sequence[PointResult], knee: Knee | None, slo: Slo | None, config: dict) -> dict:
    return json_safe(
        {
            "config": config,
            "slo": None
            if not slo
            else {
                "targets": [
                    {"metric": t.metric, "percentile": t.percentile, "threshold_s": t.threshold_s}
                    for t in slo.targets
                ],
                "error_rate": slo.error_rate,
            },
            "points": [
                {
                    "rate": run.point.rate,
                    "burstiness": run.point.burstiness,
                    "max_concurrency": run.point.max_concurrency,
                    **run.stats.to_dict(),
                }
                for run in runs
            ],
            "knee": None
            if knee is None
            else {
                "index": knee.index,
                "rule": knee.rule,
                "reason": knee.reason,
                "rate": runs[knee.index].point.rate,
            },
        }
    )  # type: ignore[return-value]


def write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
