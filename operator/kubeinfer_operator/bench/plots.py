"""PNG plots of a benchmark: latency CDFs per load point, and a sweep's latency-vs-throughput knee.

matplotlib is imported inside each function so `kubeinfer bench` without plots never loads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from kubeinfer_operator.bench.client import RequestResult
from kubeinfer_operator.bench.runner import Knee, PointResult
from kubeinfer_operator.bench.slo import Slo
from kubeinfer_operator.bench.stats import percentile


def _values(results: Sequence[RequestResult], metric: str) -> list[float]:
    ok = [r for r in results if r.ok]
    if metric == "itl":
        return [gap for r in ok for gap in r.itls]
    return [v for r in ok if (v := getattr(r, metric)) is not None]


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdfs(runs: Sequence[PointResult], path: Path, slo: Slo | None = None) -> None:
    """TTFT, TPOT, ITL and E2E CDFs, one line per load point; SLO thresholds dashed."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (metric, title) in zip(
        axes.flat, (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E")), strict=True
    ):
        for run in runs:
            values = sorted(v * 1000 for v in _values(run.results, metric))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, fractions, where="post", label=run.point.label)
        for target in slo.targets if slo else ():
            if target.metric == metric:
                ax.axvline(target.threshold_s * 1000, color="red", linestyle="--", linewidth=1)
                ax.axhline(target.percentile / 100, color="red", linestyle=":", linewidth=1)
        ax.set_title(f"{title} CDF")
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of token gaps")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(
    runs: Sequence[PointResult], knee: Knee | None, path: Path, slo: Slo | None = None, title: str = ""
) -> None:
    """TTFT and TPOT percentiles against achieved output throughput, one marker per load point.

    The percentile drawn is the SLO's for that metric (p95 without one); the knee is starred.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    order = sorted(range(len(runs)), key=lambda i: runs[i].point.rate)  # the curve follows offered load
    for ax, (metric, name) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT")), strict=True):
        targets = [t for t in (slo.targets if slo else ()) if t.metric == metric]
        q = targets[0].percentile if targets else 95.0
        xs = [runs[i].stats.output_token_throughput for i in order]
        ys = [percentile(_values(runs[i].results, metric), q) * 1000 for i in order]
        ax.plot(xs, ys, marker="o")
        for i, x, y in zip(order, xs, ys, strict=True):
            rate = runs[i].point.rate
            ax.annotate(
                "max" if math.isinf(rate) else f"{rate:.3g}/s",
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
        if knee is not None:
            x = runs[knee.index].stats.output_token_throughput
            y = percentile(_values(runs[knee.index].results, metric), q) * 1000
            ax.plot([x], [y], marker="*", markersize=16, color="tab:red", linestyle="none", label="knee")
        for target in targets:
            ax.axhline(
                target.threshold_s * 1000,
                color="red",
                linestyle="--",
                linewidth=1,
                label=f"SLO {target.name} {target.threshold_s * 1000:g} ms",
            )
        finite = [y for y in ys if y > 0]
        if finite and max(finite) > 20 * min(finite):  # past the knee latency climbs by orders of magnitude
            ax.set_yscale("log")
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{name} p{q:g} (ms)")
        ax.set_title(f"{name} p{q:g} vs throughput")
        ax.grid(alpha=0.3)
        if knee is not None or targets:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
