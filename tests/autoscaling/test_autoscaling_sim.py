"""Smoke tests of the autoscaling simulation: replicas behave like servers; the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from sim.cluster import Cluster, Result, ServerModel  # noqa: E402
from sim.policies import Fixed  # noqa: E402
from sim.workload import Shape, make_requests  # noqa: E402


def steady(load: float, replicas: int, seconds: int = 300) -> Result:
    model, shape, rng = ServerModel(), Shape(), np.random.default_rng(0)
    prompt, output = shape.draw(20_000, rng)
    replica_rps = 1 / float(model.work_s(prompt, output).mean())
    requests = make_requests(np.full(seconds, load), replica_rps, shape, rng)
    return Cluster(model, requests, max_replicas=replicas).run(Fixed(replicas), replicas, seconds)


def test_replicas_meet_the_ttft_target_under_capacity_and_miss_it_over() -> None:
    under, over = steady(load=2.0, replicas=4), steady(load=6.0, replicas=4)
    assert under.attainment(1.0) > 0.99
    assert over.attainment(1.0) < 0.5
    assert under.replica_s == pytest.approx(4 * 300, rel=0.01)


def test_the_cli_compares_every_policy_on_a_short_step(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    command = [sys.executable, str(BENCHMARKS / "autoscaling_sim.py"), "--traces", "step", "--seeds", "1"]
    command += ["--duration", "720", "--json", str(out), "--plot-dir", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    summary = {row["policy"]: row for row in json.loads(out.read_text())["summary"]}
    assert set(summary) == {"ours", "concurrency", "waiting", "oracle"}
    assert summary["oracle"]["attainment"] >= 0.99 and summary["oracle"]["vs_oracle"] == 1
    assert all(0 < row["attainment"] <= 1 and row["replica_s"] > 0 for row in summary.values())
    assert summary["ours"]["scale_events"] >= 1  # the load doubles at 600 s
    assert (tmp_path / "autoscaling-step.png").stat().st_size > 10_000
