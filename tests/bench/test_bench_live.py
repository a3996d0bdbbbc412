"""`kubeinfer bench` against the synthetic server, whose latencies and faults the test sets."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest
from bench_processes import free_port

from kubeinfer_operator.bench.client import RequestResult, Target, make_client
from kubeinfer_operator.bench.command import main as bench_main
from kubeinfer_operator.bench.runner import LoadPoint, PointResult, run_point, warm_up
from kubeinfer_operator.bench.workload import (
    LengthDistribution,
    RequestSpec,
    arrival_offsets,
    synthetic_requests,
)

StartServer = Callable[..., str]


def run(base_url: str, requests: Sequence[RequestSpec], point: LoadPoint, seed: int = 0) -> PointResult:
    async def go() -> PointResult:
        async with make_client(10.0) as client:
            target = Target(base_url, "synthetic", timeout_s=10.0)
            await warm_up(client, target, RequestSpec("warm up", None, 2))
            return await run_point(client, target, requests, point, random.Random(seed), progress=False)

    return asyncio.run(go())


def requests(count: int, input_tokens: int, output_tokens: int) -> list[RequestSpec]:
    lengths = LengthDistribution("fixed", input_tokens), LengthDistribution("fixed", output_tokens)
    return synthetic_requests(count, *lengths, random.Random(1))


def max_overlap(results: Sequence[RequestResult]) -> int:
    events = sorted(
        [(r.start, 1) for r in results] + [(r.end, -1) for r in results], key=lambda e: (e[0], e[1])
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_measured_latencies_match_the_servers_settings(synthetic_server: StartServer) -> None:
    url = synthetic_server("--ttft", "150ms", "--itl", "30ms")
    # Two at a time: a Python client sending a burst spends milliseconds of CPU per request, which
    # would show up as TTFT and blur what this test checks.
    run_ = run(url, requests(12, input_tokens=30, output_tokens=6), LoadPoint(max_concurrency=2))
    assert run_.stats.completed == 12 and run_.stats.failed == 0
    # A client never sees a token before the server sends it: lower bounds are exact. Upper bounds
    # leave room for a busy CI machine; the medians show how close client and server agree.
    for r in run_.results:
        assert r.prompt_tokens == 30 and r.output_tokens == 6  # from the server's usage chunk
        assert 0.150 <= r.ttft <= 0.400
        assert 0.300 <= r.e2e <= 0.550  # ttft + 5 gaps of 30 ms
        assert len(r.itls) == 5
    assert run_.stats.ttft.p50 == pytest.approx(0.150, abs=0.03)
    assert run_.stats.e2e.p50 == pytest.approx(0.300, abs=0.05)
    assert run_.stats.tpot.p50 == pytest.approx(0.030, abs=0.005)
    assert run_.stats.itl.p50 == pytest.approx(0.030, abs=0.005)
    assert run_.stats.output_token_throughput == pytest.approx(12 * 6 / run_.stats.duration_s)


def test_chat_requests_are_timed_from_delta_content(synthetic_server: StartServer) -> None:
    url = synthetic_server("--ttft", "60ms", "--itl", "10ms")
    chat = [RequestSpec(None, [{"role": "user", "content": "one two three"}], 5) for _ in range(4)]
    run_ = run(url, chat, LoadPoint(max_concurrency=2))
    assert [(r.prompt_tokens, r.output_tokens, len(r.chunk_times)) for r in run_.results] == [(3, 5, 5)] * 4
    assert all(0.060 <= r.ttft <= 0.300 for r in run_.results)
    assert run_.stats.ttft.p50 == pytest.approx(0.060, abs=0.03)


def test_fixed_concurrency_never_exceeds_its_limit(synthetic_server: StartServer) -> None:
    url = synthetic_server("--ttft", "30ms", "--itl", "5ms")
    run_ = run(url, requests(30, 10, 6), LoadPoint(max_concurrency=3))
    server = httpx.get(url + "/stats").json()
    assert run_.stats.completed == 30
    assert server["requests"] == 31  # and the warm-up request
    assert server["max_in_flight"] == 3  # reached, never passed
    assert max_overlap(run_.results) <= 3


def test_requests_are_sent_on_the_poisson_schedule(synthetic_server: StartServer) -> None:
    url = synthetic_server("--ttft", "1ms", "--itl", "1ms")
    # 20/s: each send costs the Python client milliseconds of CPU, which a busy CI machine rations.
    run_ = run(url, requests(40, 5, 2), LoadPoint(rate=20.0), seed=7)
    assert httpx.get(url + "/stats").json()["requests"] == 41  # and the warm-up request
    scheduled = list(arrival_offsets(40, 20.0, 1.0, random.Random(7)))
    sent = [r.start - run_.results[0].start for r in run_.results]
    lateness = [s - t for s, t in zip(sent, scheduled, strict=True)]
    # Sends follow the schedule without drift; a loaded CI machine may wake the sender late now and then.
    assert sum(abs(x) < 0.03 for x in lateness) >= 0.8 * len(lateness)
    assert abs(statistics.mean(lateness)) < 0.02


def test_errors_are_counted_by_kind_and_judged_by_the_slo(
    synthetic_server: StartServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = synthetic_server("--ttft", "20ms", "--itl", "5ms", "--faults", "ok,429,500,drop,hang")
    out = tmp_path / "errors.json"
    code = bench_main([
        "--url", url, "--num-requests", "10", "--input-len", "8", "--output-len", "4", "--timeout", "1",
        "--slo", "ttft.p95=500ms", "--slo", "errorRate=0.1", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    point = json.loads(out.read_text())["points"][0]
    assert point["errors"] == {"connection": 2, "http_429": 2, "http_500": 2, "timeout": 2}
    assert (point["completed"], point["failed"], point["good_requests"]) == (2, 8, 2)
    assert point["slo"]["met"] is False
    assert point["slo"]["failures"] == ["errorRate 0.800 > 0.1"]
    captured = capsys.readouterr()
    assert "errors: connection 2, http_429 2, http_500 2, timeout 2" in captured.out
    assert "10/10" in captured.err  # the progress bar ran to the end


def test_rate_sweep_finds_the_knee_where_the_slo_breaks(
    synthetic_server: StartServer, tmp_path: Path
) -> None:
    # 4 slots x (20 ms + 7 x 10 ms) per request: about 44 requests/s before requests queue.
    url = synthetic_server("--ttft", "20ms", "--itl", "10ms", "--max-running", "4")
    out = tmp_path / "sweep.json"
    code = bench_main([
        "--url", url, "--num-requests", "20", "--input-len", "8", "--output-len", "8", "--no-progress",
        "--request-rate", "8,16,150", "--slo", "ttft.p95=150ms", "--json", str(out),
        "--plot", str(tmp_path / "s"),
    ])  # fmt: skip
    assert code == 0
    document = json.loads(out.read_text())
    verdicts = [(p["rate"], p["slo"]["met"]) for p in document["points"]]
    assert verdicts == [(8.0, True), (16.0, True), (150.0, False)]
    assert document["knee"]["rate"] == 16.0 and document["knee"]["rule"] == "slo"
    assert document["points"][2]["ttft"]["p95"] > 0.15  # queueing for a slot shows as TTFT
    for name in ("s-cdf.png", "s-knee.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_auto_sweep_spaces_rates_up_to_the_measured_maximum(
    synthetic_server: StartServer, tmp_path: Path
) -> None:
    url = synthetic_server("--ttft", "10ms", "--itl", "5ms", "--max-running", "4")
    out = tmp_path / "auto.json"
    code = bench_main([
        "--url", url, "--num-requests", "16", "--input-len", "8", "--output-len", "4", "--no-progress",
        "--sweep", "2", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    points = json.loads(out.read_text())["points"]
    ceiling = points[-1]["request_throughput"]
    assert [p["rate"] for p in points] == [pytest.approx(ceiling / 2), pytest.approx(ceiling), "inf"]


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["--url", f"http://127.0.0.1:{free_port()}", "--no-progress"]) == 2
    assert "kubeinfer bench: error: http://127.0.0.1:" in capsys.readouterr().err


def test_plan_calibrates_against_a_live_endpoint(synthetic_server: StartServer, tmp_path: Path) -> None:
    from kubeinfer_operator.bench.plan_command import main as plan_main

    url = synthetic_server("--ttft", "10ms", "--itl", "5ms", "--max-running", "4")
    out = tmp_path / "plan.json"
    code = plan_main([
        "--model", "llama-3-8b", "--gpu", "h100-80gb", "--slo", "ttft.p95=300ms", "--json", str(out),
        "--calibrate", url, "--calibrate-steps", "2", "--num-requests", "12", "--input-len", "8",
        "--output-len", "4", "--no-progress",
    ])  # fmt: skip
    assert code == 0
    calibration = json.loads(out.read_text())["calibration"]
    assert calibration["knee_rule"] == "slo"
    assert 0 < calibration["max_request_throughput_at_slo"] <= calibration["max_throughput_unconstrained"]
