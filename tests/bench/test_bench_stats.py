"""Pure parts of `kubeinfer bench`: workload generation, statistics, goodput, SLO parsing, the knee."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from pathlib import Path

import pytest

from kubeinfer_operator.bench.client import RequestResult
from kubeinfer_operator.bench.runner import LoadPoint, PointResult, find_knee, sweep_rates
from kubeinfer_operator.bench.slo import LatencyTarget, Slo, parse_slo_flags, slo_from_manifest
from kubeinfer_operator.bench.stats import percentile, summarize
from kubeinfer_operator.bench.workload import LengthDistribution, arrival_offsets, load_dataset


def result(
    ttft: float, itl: float, tokens: int, start: float = 0.0, error: str | None = None
) -> RequestResult:
    """A request whose first token came after `ttft` and the rest `itl` apart."""
    chunks = [start + ttft + i * itl for i in range(tokens)] if error is None else []
    end = chunks[-1] if chunks else start + ttft
    return RequestResult(
        start, end, error, "", chunks, prompt_tokens=10, output_tokens=tokens if chunks else 0
    )


# --- workload ---


def test_poisson_arrivals_have_the_requested_mean_rate_and_unit_cv() -> None:
    offsets = list(arrival_offsets(20000, rate=8.0, burstiness=1.0, rng=random.Random(3)))
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert len(gaps) / offsets[-1] == pytest.approx(8.0, rel=0.03)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.05)  # exponential gaps


def test_gamma_burstiness_keeps_the_rate_and_changes_the_spread() -> None:
    for shape in (0.25, 4.0):
        offsets = list(arrival_offsets(20000, rate=8.0, burstiness=shape, rng=random.Random(5)))
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        assert len(gaps) / offsets[-1] == pytest.approx(8.0, rel=0.05)
        assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1 / math.sqrt(shape), rel=0.1)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert list(arrival_offsets(3, math.inf, 1.0, random.Random(0))) == [0.0, 0.0, 0.0]


def test_length_distributions_parse_and_sample_in_range() -> None:
    rng = random.Random(0)
    assert LengthDistribution.parse("128", "--input-len").sample(rng) == 128
    uniform = LengthDistribution.parse("uniform:10:20", "--input-len")
    assert {uniform.sample(rng) for _ in range(500)} <= set(range(10, 21))
    normal = [LengthDistribution.parse("normal:100:10", "--x").sample(rng) for _ in range(4000)]
    assert statistics.mean(normal) == pytest.approx(100, abs=1.5)
    lognormal = [LengthDistribution.parse("lognormal:100:0.5", "--x").sample(rng) for _ in range(4000)]
    assert statistics.median(lognormal) == pytest.approx(100, rel=0.05)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("zipf:3", "--input-len: unknown distribution 'zipf'"),
        ("uniform:10", "--input-len: uniform takes 2 parameter(s)"),
        ("uniform:20:10", "uniform's high >= low"),
        ("normal:abc:3", "not a number"),
        ("0", "lengths must be >= 1"),
    ],
)
def test_bad_length_distributions_are_refused_naming_the_flag(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LengthDistribution.parse(text, "--input-len")


def test_dataset_lines_become_requests(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    lines = [{"prompt": "hello there", "max_tokens": 7}, {"messages": [{"role": "user", "content": "hi"}]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    first, second = load_dataset(path, LengthDistribution("fixed", 32), random.Random(0))
    assert (first.prompt, first.messages, first.max_tokens) == ("hello there", None, 7)
    assert (second.prompt, second.max_tokens) == (None, 32)  # no max_tokens: the --output-len default
    assert second.messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "d.jsonl:2: not valid JSON"),
        ('{"text": "x"}', "d.jsonl:2: needs exactly one of 'prompt'"),
        ('{"prompt": "x", "messages": []}', "d.jsonl:2: needs exactly one of 'prompt'"),
        ('{"messages": [{"content": "x"}]}', "d.jsonl:2: 'messages' must be a non-empty list"),
        ('{"prompt": "x", "max_tokens": 0}', "d.jsonl:2: 'max_tokens' must be a positive integer"),
    ],
)
def test_bad_dataset_lines_are_refused_with_their_line_number(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_dataset(path, LengthDistribution("fixed", 8), random.Random(0))


# --- statistics ---


def test_percentiles_interpolate_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert [percentile(values, q) for q in (0, 50, 90, 100)] == pytest.approx([1.0, 2.5, 3.7, 4.0])
    assert math.isnan(percentile([], 50))


def test_summary_counts_latencies_throughput_and_goodput() -> None:
    results = [result(0.1, 0.02, 11, start=i) for i in range(8)]  # fast: TTFT 100 ms, TPOT 20 ms
    results += [result(0.6, 0.02, 11), result(0.1, 0.09, 11)]  # slow first token; slow stream
    results += [result(0.0, 0.0, 0, error="http_429")]
    slo = parse_slo_flags(["ttft.p95=500ms", "tpot.p90=50ms"])
    stats = summarize(results, duration_s=10.0, slo=slo)
    assert (stats.completed, stats.failed, stats.errors) == (10, 1, {"http_429": 1})
    assert stats.request_throughput == pytest.approx(1.0)
    assert stats.output_token_throughput == pytest.approx(11.0)
    assert stats.input_token_throughput == pytest.approx(10.0)
    assert stats.ttft.p50 == pytest.approx(0.1) and stats.ttft.mean == pytest.approx(0.15)
    assert stats.tpot.p50 == pytest.approx(0.02)
    assert stats.itl.count == 100
    # Goodput counts requests within every per-request threshold: 8 of the 11.
    assert (stats.good_requests, stats.goodput) == (8, pytest.approx(0.8))
    # The percentile targets hold (TTFT p95 interpolates to 375 ms), though two requests missed.
    assert stats.slo is not None and stats.slo.met and stats.slo.failures == ()
    stricter = summarize(results, 10.0, parse_slo_flags(["ttft.p95=300ms", "errorRate=0.05"]))
    assert stricter.slo is not None
    assert stricter.slo.failures == ("ttft.p95 375ms > 300ms", "errorRate 0.091 > 0.05")


def test_summary_without_usage_counts_chunks_and_leaves_input_throughput_unknown() -> None:
    r = result(0.1, 0.01, 5)
    r.prompt_tokens = None
    stats = summarize([r], duration_s=1.0)
    assert stats.input_token_throughput is None and stats.goodput is None and stats.slo is None


# --- SLO ---


def test_slo_flags_use_the_manifests_names() -> None:
    slo = parse_slo_flags(["ttft.p95=500ms", "tpot.p99=1.5s", "e2e.p50=1m", "errorRate=0.02"])
    assert slo.targets == (
        LatencyTarget("ttft", 95.0, 0.5),
        LatencyTarget("tpot", 99.0, 1.5),
        LatencyTarget("e2e", 50.0, 60.0),
    )
    assert slo.error_rate == 0.02
    assert slo.describe() == "ttft.p95<=500ms, tpot.p99<=1500ms, e2e.p50<=60000ms, errorRate<=0.02"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("ttft=500ms", "--slo ttft=500ms: expected METRIC.pNN=DURATION"),
        ("ttft.p95", "expected KEY=VALUE"),
        ("queue.p95=1s", "unknown metric 'queue'"),
        ("ttft.95=1s", "'95' is not a percentile"),
        ("ttft.p95=500", "--slo ttft.p95=500: invalid duration '500'"),
        ("errorRate=2", "2 is not between 0 and 1"),
    ],
)
def test_bad_slo_flags_are_refused_naming_the_flag(flag: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_slo_flags([flag])


MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: serving.kubeinfer.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {name: tiny, source: {hostPath: {path: /models/tiny}}}
  slo:
    ttft: {p95: 500ms, p99: 2s}
    tpot: {p95: 60ms}
    errorRate: 0.01
"""


def test_slo_is_read_from_an_inferenceservice_manifest_and_flags_override_it(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(MANIFEST)
    slo = slo_from_manifest(path)
    assert slo.targets == (
        LatencyTarget("ttft", 95.0, 0.5),
        LatencyTarget("ttft", 99.0, 2.0),
        LatencyTarget("tpot", 95.0, 0.06),
    )
    assert slo.error_rate == 0.01
    merged = slo.merged_with(parse_slo_flags(["ttft.p95=1s"]))
    assert merged.per_request_threshold("ttft") == 1.0  # p95 replaced; p99's 2 s is looser
    assert len(merged.targets) == 3


def test_manifest_problems_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text(MANIFEST.replace("p95: 60ms", "p95: fast"))
    with pytest.raises(ValueError, match=r"svc.yaml: invalid InferenceService:\n.*spec.slo.tpot.p95"):
        slo_from_manifest(path)
    path.write_text(MANIFEST.split("---")[0])
    with pytest.raises(ValueError, match="expected exactly one InferenceService document, found 0"):
        slo_from_manifest(path)


# --- the knee ---


def point(rate: float, throughput: float, met: bool | None = None) -> PointResult:
    """A load point whose requests took 1 s each, so the summary's throughput is `throughput`."""
    count = 20
    results = [result(0.2 if met in (True, None) else 2.0, 0.01, 3, start=0.0) for _ in range(count)]
    slo = parse_slo_flags(["ttft.p95=1s"]) if met is not None else None
    return PointResult(LoadPoint(rate), results, summarize(results, count / throughput, slo))


def test_knee_without_slo_is_where_added_load_stops_adding_throughput() -> None:
    runs = [point(2, 2.0), point(4, 3.9), point(6, 5.6), point(8, 6.0), point(10, 6.1), point(math.inf, 6.2)]
    knee = find_knee(runs, None)
    assert knee is not None and knee.rule == "throughput"
    assert runs[knee.index].point.rate == 6  # 6 -> 8 added 0.4 of 2 offered: past the knee


def test_knee_with_slo_is_the_highest_rate_before_the_slo_first_breaks() -> None:
    slo = Slo((LatencyTarget("ttft", 95.0, 1.0),))
    runs = [
        point(8, 7.9, met=True),
        point(2, 2.0, met=True),
        point(12, 9.0, met=False),
        point(16, 9.1, met=True),
    ]
    knee = find_knee(runs, slo)
    assert knee is not None and knee.rule == "slo" and runs[knee.index].point.rate == 8
    assert find_knee([point(2, 2.0, met=False)], slo) is None


def test_sweep_rates_are_evenly_spaced_up_to_the_ceiling() -> None:
    assert sweep_rates(12.0, 4) == [3.0, 6.0, 9.0, 12.0]
    with pytest.raises(ValueError, match="positive measured throughput"):
        sweep_rates(0.0, 3)
