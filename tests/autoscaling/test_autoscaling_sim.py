"""Smoke tests of the autoscaling simulation: replicas behave like servers, the reactive bound tracks the
load it sees, the CLI runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kubeinfer_operator.autoscaling import Predictive, ScalingConfig
from kubeinfer_operator.autoscaling.sim.cluster import Cluster, Policy, Result, ServerModel
from kubeinfer_operator.autoscaling.sim.policies import Fixed, Ours, ReactiveBound
from kubeinfer_operator.autoscaling.sim.workload import Shape, make_requests

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def simulate(
    load: np.ndarray, replicas: int, policy: Policy | None = None, load_delay_s: float = 60
) -> Result:
    model, shape, rng = ServerModel(load_delay_s=load_delay_s), Shape(), np.random.default_rng(0)
    prompt, output = shape.draw(20_000, rng)
    replica_rps = 1 / float(model.work_s(prompt, output).mean())
    requests = make_requests(load, replica_rps, shape, rng)
    chosen = policy or Fixed(replicas)
    return Cluster(model, requests, max_replicas=40).run(chosen, replicas, float(len(load)))


def test_replicas_meet_the_ttft_target_under_capacity_and_miss_it_over() -> None:
    under, over = simulate(np.full(300, 2.0), 4), simulate(np.full(300, 6.0), 4)
    assert under.attainment(1.0) > 0.99
    assert over.attainment(1.0) < 0.5
    assert under.replica_s == pytest.approx(4 * 300, rel=0.01)


def test_the_reactive_bound_misses_only_while_new_replicas_load() -> None:
    step = np.where(np.arange(900) >= 300, 8.0, 4.0)  # the load doubles at 300 s

    def bound(load_delay_s: float) -> Result:
        shape, model = Shape(), ServerModel()
        prompt, output = shape.draw(20_000, np.random.default_rng(0))
        replica_rps = 1 / float(model.work_s(prompt, output).mean())
        return simulate(step, 5, ReactiveBound(step, replica_rps, 0.85, 1, 40), load_delay_s)

    instant, slow = bound(1), bound(60)
    assert instant.attainment(1.0) > 0.99
    # What arrives in the minute the new replicas load (8% of the requests), and some behind it, misses.
    assert 0.85 < slow.attainment(1.0) < 0.95
    assert slow.pods.max() >= 10  # 8 replicas' worth at 85% and the backlog


@pytest.mark.slow
def test_the_cli_compares_every_policy_on_a_short_step(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    command = [sys.executable, str(BENCHMARKS / "autoscaling_sim.py"), "--traces", "step", "--seeds", "1"]
    command += [
        "--duration",
        "720",
        "--headrooms",
        "1",
        "--bound-utilizations",
        "0.65",
        "--load-delays",
        "10",
    ]
    command += ["--json", str(out), "--plot-dir", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    summary = {(row["load_delay_s"], row["policy"]): row for row in json.loads(out.read_text())["summary"]}
    headline = {
        "ours",
        "router",
        "predictive",
        "predictive+router",
        "concurrency",
        "waiting",
        "reactive",
        "oracle",
    }
    assert set(summary) == {(60, p) for p in headline | {"ours+1", "reactive@0.65"}} | {
        (10, p) for p in ("ours", "reactive", "oracle")
    }
    assert summary[60, "oracle"]["attainment"] >= 0.99 and summary[60, "oracle"]["vs_oracle"] == 1
    assert all(0 < row["attainment"] <= 1 and row["replica_s"] > 0 for row in summary.values())
    assert summary[60, "ours"]["scale_events"] >= 1  # the load doubles at 600 s
    # Standing capacity buys attainment: twice what the signals ask for serves the step, at a price.
    assert summary[60, "ours+1"]["attainment"] > summary[60, "ours"]["attainment"]
    assert summary[60, "ours+1"]["replica_s"] > summary[60, "ours"]["replica_s"]
    for name in ("autoscaling-step.png", "autoscaling-frontier.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_the_forecast_floor_orders_replicas_ahead_of_a_ramp() -> None:
    # 2 -> 10 replicas' worth over 10 minutes: the reactive signals order replicas once they see a queue,
    # the floor a model load before the forecast rate arrives.
    ramp = np.interp(np.arange(1200), [0, 300, 900, 1200], [2, 2, 10, 10])
    shape, model = Shape(), ServerModel()
    prompt, output = shape.draw(20_000, np.random.default_rng(0))
    replica_rps = 1 / float(model.work_s(prompt, output).mean())
    reactive = ScalingConfig(max_replicas=40)
    predictive = replace(reactive, requests_per_replica=replica_rps * 0.85, predictive=Predictive())
    plain, floored = simulate(ramp, 3, Ours(reactive)), simulate(ramp, 3, Ours(predictive))
    assert floored.attainment(1.0) > 0.99
    assert floored.attainment(1.0) > plain.attainment(1.0)
    # Ahead of the load: at 600 s (6 replicas' worth arriving) the floor has already loaded more.
    assert floored.ready[600] > plain.ready[600]
