"""Autoscaling simulation: the operator's policy against the field's, on the same load traces.

Replicas are simulated engines (batching whose step time grows with the batch, prefill, model-load delay)
behind a FIFO router; autoscalers read what they would read in a cluster (Prometheus scrapes every 15 s,
queue-time percentile over a 1 m rate window). Compared on each trace: ours (kubeinfer_operator's real
`decide`), a concurrency target (Knative KPA, KServe's default), a waiting-requests threshold (KEDA on
vLLM's num_requests_waiting), and an oracle that knows the future. Reported: SLO attainment (share of
requests whose TTFT meets the target) and replica-seconds, also as a ratio to the oracle's.

    python benchmarks/autoscaling_sim.py [--traces step,bursts] [--json out.json] [--plot-dir plots/]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))  # the sim package next to this script

from kubeinfer_operator.autoscaling import ScalingConfig, Targets
from sim.cluster import Cluster, Policy, Result, ServerModel
from sim.policies import ConcurrencyTarget, Fixed, Oracle, Ours, WaitingThreshold
from sim.workload import TRACES, Shape, load_profile, make_requests

ORACLE_UTILIZATIONS = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5, 0.4)


@dataclass(frozen=True)
class Row:
    trace: str
    seed: int
    policy: str
    attainment: float
    replica_s: float
    vs_oracle: float
    scale_events: int


@dataclass(frozen=True)
class Calibration:
    """Per-replica in-flight requests and KV use in a steady load test at the target utilization: how an
    operator picks a concurrency target (Knative) or a KV target (ours), so both aim at the same headroom."""

    utilization: float
    in_flight: float
    kv_usage: float

    @classmethod
    def measure(cls, model: ServerModel, shape: Shape, replica_rps: float, utilization: float) -> Calibration:
        replicas, duration = 8, 900
        rng = np.random.default_rng(12345)
        requests = make_requests(np.full(duration, replicas * utilization), replica_rps, shape, rng)
        cluster = Cluster(model, requests, max_replicas=replicas)
        probe = Fixed(replicas)
        cluster.run(probe, replicas, duration)
        kv = [s.kv_usage for s in cluster.scrapes if probe.after_s < s.time < duration]
        return cls(utilization, float(np.mean(probe.in_flight)), float(np.mean(kv)))


@dataclass(frozen=True)
class Setup:
    model: ServerModel
    shape: Shape
    replica_rps: float  # requests/s one replica serves at full batch
    calibration: Calibration
    ttft_slo_s: float
    goal: float
    max_replicas: int
    waiting_threshold: float
    dt: float

    def our_config(self) -> ScalingConfig:
        # Queue time and the oldest wait get a quarter and a half of the TTFT budget; prefill needs the rest.
        targets = Targets(
            queue_time_p95_s=self.ttft_slo_s / 4,
            oldest_wait_s=self.ttft_slo_s / 2,
            kv_usage=self.calibration.kv_usage,
            waiting_per_replica=2,
        )
        return ScalingConfig(min_replicas=1, max_replicas=self.max_replicas, targets=targets)


def simulate_trace(
    trace: str, setup: Setup, seed: int, duration: float | None, progress: tqdm
) -> tuple[list[Row], dict[str, Result], np.ndarray]:
    rng = np.random.default_rng(seed)
    load = load_profile(trace, rng, duration)
    requests = make_requests(load, setup.replica_rps, setup.shape, rng)
    seconds = float(len(load))

    def run(policy: Policy, initial: int) -> Result:
        cluster = Cluster(setup.model, requests, max_replicas=setup.max_replicas, dt=setup.dt)
        result = cluster.run(policy, initial, seconds)
        progress.update()
        return result

    # The oracle: the highest utilization (cheapest plan) that still meets the attainment goal.
    oracle: Result | None = None
    for u in ORACLE_UTILIZATIONS:
        plan = Oracle.build(requests, setup.model, seconds, u, min_replicas=1)
        result = run(plan, plan.initial())
        if oracle is None or result.attainment(setup.ttft_slo_s) > oracle.attainment(setup.ttft_slo_s):
            oracle = result
        if result.attainment(setup.ttft_slo_s) >= setup.goal:
            oracle = result
            break
    progress.update(len(ORACLE_UTILIZATIONS) - 1 - ORACLE_UTILIZATIONS.index(u))
    assert oracle is not None

    initial = math.ceil(load[:60].mean() / setup.calibration.utilization)
    results = {
        "ours": run(Ours(setup.our_config()), initial),
        "concurrency": run(ConcurrencyTarget(setup.calibration.in_flight, 1, setup.max_replicas), initial),
        "waiting": run(WaitingThreshold(setup.waiting_threshold, 1, setup.max_replicas), initial),
        "oracle": oracle,
    }
    rows = [
        Row(
            trace,
            seed,
            name,
            r.attainment(setup.ttft_slo_s),
            r.replica_s,
            r.replica_s / oracle.replica_s,
            r.scale_events,
        )
        for name, r in results.items()
    ]
    return rows, results, load


def summarize(rows: list[Row]) -> dict[tuple[str, str], dict[str, float]]:
    """Means over seeds per (trace, policy), and the worst seed's attainment."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.trace, r.policy), []).append(r)
    return {
        key: {
            "attainment": float(np.mean([r.attainment for r in group])),
            "worst": min(r.attainment for r in group),
            "replica_s": float(np.mean([r.replica_s for r in group])),
            "vs_oracle": float(np.mean([r.vs_oracle for r in group])),
            "scale_events": float(np.mean([r.scale_events for r in group])),
        }
        for key, group in groups.items()
    }


def plot(trace: str, load: np.ndarray, results: dict[str, Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    ax.fill_between(np.arange(len(load)) / 60, load, color="0.85", label="offered load (replicas' worth)")
    for name, r in results.items():
        ax.plot(r.times / 60, r.pods, label=f"{name} replicas", lw=1.2)
    ax.set(xlabel="minutes", ylabel="replicas", title=f"{trace} trace")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=",".join(TRACES), help=f"comma-separated, of {list(TRACES)}")
    p.add_argument("--duration", type=float, help="cut every trace to this many seconds")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds per trace (load and request sizes)")
    p.add_argument("--ttft-slo", type=float, default=1.0, help="TTFT target, seconds")
    p.add_argument("--goal", type=float, default=0.99, help="attainment the oracle must reach")
    p.add_argument(
        "--utilization",
        type=float,
        default=0.85,
        help="steady utilization ours and the concurrency target aim at",
    )
    p.add_argument("--max-replicas", type=int, default=40)
    p.add_argument("--waiting-threshold", type=float, default=5, help="KEDA baseline: waiting per replica")
    p.add_argument("--load-delay", type=float, default=60, help="seconds for a new replica to load the model")
    p.add_argument("--step-base-ms", type=float, default=8.3, help="decode step time at batch 0")
    p.add_argument("--step-per-seq-ms", type=float, default=1.67, help="added step time per sequence")
    p.add_argument("--prefill-tok-s", type=float, default=2400)
    p.add_argument("--max-batch", type=int, default=16, help="maxNumSeqs")
    p.add_argument("--dt", type=float, default=0.1, help="simulation tick, seconds")
    p.add_argument("--json", type=Path, help="write the settings and rows here")
    p.add_argument("--plot-dir", type=Path, help="write one PNG per trace here")
    args = p.parse_args(argv)
    traces = args.traces.split(",")
    if unknown := set(traces) - set(TRACES):
        p.error(f"--traces: unknown {sorted(unknown)}")

    shape = Shape()
    model = ServerModel(
        step_base_s=args.step_base_ms / 1000,
        step_per_seq_s=args.step_per_seq_ms / 1000,
        prefill_tok_s=args.prefill_tok_s,
        max_batch=args.max_batch,
        kv_capacity_tokens=args.max_batch * (shape.prompt_mean + shape.output_mean),
        load_delay_s=args.load_delay,
    )
    prompt, output = shape.draw(200_000, np.random.default_rng(12345))
    replica_rps = 1 / float(model.work_s(prompt, output).mean())
    calibration = Calibration.measure(model, shape, replica_rps, args.utilization)
    setup = Setup(
        model,
        shape,
        replica_rps,
        calibration,
        args.ttft_slo,
        args.goal,
        args.max_replicas,
        args.waiting_threshold,
        args.dt,
    )
    seeds = range(args.seed, args.seed + args.seeds)
    rows: list[Row] = []
    total = len(traces) * len(seeds) * (3 + len(ORACLE_UTILIZATIONS))
    with tqdm(total=total, desc="simulating", unit="run") as progress:
        for trace in traces:
            for seed in seeds:
                trace_rows, results, load = simulate_trace(trace, setup, seed, args.duration, progress)
                rows += trace_rows
                if args.plot_dir and seed == args.seed:
                    args.plot_dir.mkdir(parents=True, exist_ok=True)
                    plot(trace, load, results, args.plot_dir / f"autoscaling-{trace}.png")

    print(f"\nTTFT target {args.ttft_slo:g} s, model load {args.load_delay:g} s, maxNumSeqs {args.max_batch}")
    print(
        f"a replica serves {replica_rps:.2f} req/s at full batch; at {args.utilization:.0%} of that it holds "
        f"{calibration.in_flight:.1f} requests in flight (the concurrency target) "
        f"and {calibration.kv_usage:.2f} KV use (our KV target)"
    )
    print(f"means over seeds {list(seeds)}")
    print(f"{'trace':<9}{'policy':<13}{'attainment':>11}{'worst':>8}", end="")
    print(f"{'replica-s':>11}{'vs oracle':>10}{'scalings':>9}")
    for (trace, policy), g in summarize(rows).items():
        print(f"{trace:<9}{policy:<13}{g['attainment']:>10.2%}{g['worst']:>8.1%}", end="")
        print(f"{g['replica_s']:>11.0f}{g['vs_oracle']:>10.2f}{g['scale_events']:>9.0f}")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        summary = [{"trace": t, "policy": p, **g} for (t, p), g in summarize(rows).items()]
        report = {
            "settings": settings,
            "calibration": asdict(calibration),
            "summary": summary,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
