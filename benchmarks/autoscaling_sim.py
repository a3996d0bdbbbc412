"""Autoscaling simulation: the operator's policy against the field's, on the same load traces.

Replicas are simulated engines (batching whose step time grows with the batch, prefill, model-load delay)
behind a FIFO router; autoscalers read what they would read in a cluster (Prometheus scrapes every 15 s,
queue-time percentile over a 1 m rate window). Compared on each trace: ours (kubeinfer_operator's real
`decide`), a concurrency target (Knative KPA, KServe's default), a waiting-requests threshold (KEDA on
vLLM's num_requests_waiting), a reactive bound that sees the true arrival rate at once, and an oracle that
knows the future. Reported: SLO attainment (share of requests whose TTFT meets the target) and
replica-seconds, also as a ratio to the oracle's.

Beyond that table: what standing capacity buys (ours with headroom, the reactive bound at lower
utilizations), and ours and the reactive bound with shorter model loads.

    python benchmarks/autoscaling_sim.py [--traces step,bursts] [--json out.json] [--plot-dir plots/]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from kubeinfer_operator.autoscaling import Predictive, ScalingConfig, Targets
from kubeinfer_operator.autoscaling.sim.cluster import Cluster, Policy, Result, ServerModel
from kubeinfer_operator.autoscaling.sim.policies import (
    ORACLE_UTILIZATIONS,
    ConcurrencyTarget,
    Fixed,
    Ours,
    ReactiveBound,
    WaitingThreshold,
    cheapest_oracle,
)
from kubeinfer_operator.autoscaling.sim.workload import TRACES, Shape, load_profile, make_requests

HEADLINE = (
    "ours",
    "router",
    "predictive",
    "predictive+router",
    "concurrency",
    "waiting",
    "reactive",
    "oracle",
)
# With the forecast floor holding what the forecast needs, replicas above it can go after a minute.
PREDICTIVE_SCALE_DOWN_WINDOW_S = 60
# Sized from the router's counts: decisions every 5 s, replicas above the rate's need go after 15 s.
ROUTER_INTERVAL_S = 5
ROUTER_SCALE_DOWN_WINDOW_S = 15


@dataclass(frozen=True)
class Row:
    load_delay_s: float
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

    def requests_per_replica(self) -> float:
        """What a replica serves at the utilization the KV target is calibrated at (as an SRE reads
        requestsPerReplica off a load test)."""
        return self.replica_rps * self.calibration.utilization

    def predictive_config(self) -> ScalingConfig:
        """Ours with the forecast floor (Prometheus signals only)."""
        return replace(
            self.our_config(),
            requests_per_replica=self.requests_per_replica(),
            predictive=Predictive(),
            scale_down_window_s=PREDICTIVE_SCALE_DOWN_WINDOW_S,
        )

    def router_config(self) -> ScalingConfig:
        """Ours sized from the router's arrival counts (read every ROUTER_INTERVAL_S): the count follows the
        rate, so replicas above it can go after a short window."""
        return replace(
            self.our_config(),
            requests_per_replica=self.requests_per_replica(),
            scale_down_window_s=ROUTER_SCALE_DOWN_WINDOW_S,
        )

    def our_config(self, headroom: float = 0.0) -> ScalingConfig:
        # Queue time and the oldest wait get a quarter and a half of the TTFT budget; prefill needs the rest.
        targets = Targets(
            queue_time_p95_s=self.ttft_slo_s / 4,
            oldest_wait_s=self.ttft_slo_s / 2,
            kv_usage=self.calibration.kv_usage,
            waiting_per_replica=2,
        )
        return ScalingConfig(
            min_replicas=1, max_replicas=self.max_replicas, targets=targets, headroom=headroom
        )

    def bound(self, load: np.ndarray, utilization: float) -> ReactiveBound:
        return ReactiveBound(load, self.replica_rps, utilization, 1, self.max_replicas)


# The policies each run builds for one trace's load profile, by name.
Lineup = Callable[[Setup, np.ndarray], dict[str, Policy]]


def headline(setup: Setup, load: np.ndarray) -> dict[str, Policy]:
    return {
        "ours": Ours(setup.our_config()),
        "router": Ours(setup.router_config(), interval_s=ROUTER_INTERVAL_S, router=True),
        "predictive": Ours(setup.predictive_config()),
        "predictive+router": Ours(
            replace(setup.router_config(), predictive=Predictive()), interval_s=ROUTER_INTERVAL_S, router=True
        ),
        "concurrency": ConcurrencyTarget(setup.calibration.in_flight, 1, setup.max_replicas),
        "waiting": WaitingThreshold(setup.waiting_threshold, 1, setup.max_replicas),
        "reactive": setup.bound(load, setup.calibration.utilization),
    }


def with_standing_capacity(headrooms: list[float], utilizations: list[float]) -> Lineup:
    """The headline, and what standing capacity buys: ours with headroom, the reactive bound at other
    utilizations."""

    def lineup(setup: Setup, load: np.ndarray) -> dict[str, Policy]:
        ours = {f"ours+{h:g}": Ours(setup.our_config(h)) for h in headrooms}
        return headline(setup, load) | ours | {f"reactive@{u:g}": setup.bound(load, u) for u in utilizations}

    return lineup


def reactive_pair(setup: Setup, load: np.ndarray) -> dict[str, Policy]:
    return {"ours": Ours(setup.our_config()), "reactive": setup.bound(load, setup.calibration.utilization)}


def simulate_trace(
    trace: str, setup: Setup, seed: int, duration: float | None, lineup: Lineup, progress: tqdm
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

    search = cheapest_oracle(requests, setup.model, seconds, setup.ttft_slo_s, setup.goal, run)
    progress.update(len(ORACLE_UTILIZATIONS) - search.runs)
    oracle = search.result

    initial = math.ceil(load[:60].mean() / setup.calibration.utilization)
    results = {name: run(policy, initial) for name, policy in lineup(setup, load).items()} | {
        "oracle": oracle
    }
    rows = [
        Row(
            setup.model.load_delay_s,
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


def summarize(rows: list[Row]) -> dict[tuple[float, str, str], dict[str, float]]:
    """Means over seeds per (load delay, trace, policy), and the worst seed's attainment."""
    groups: dict[tuple[float, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.load_delay_s, r.trace, r.policy), []).append(r)
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


def print_grid(title: str, summary: dict[tuple[float, str, str], dict[str, float]], delay: float) -> None:
    """One row per policy, one column per trace: attainment / replica-s relative to the oracle."""
    cells = {(p, t): g for (d, t, p), g in summary.items() if d == delay}
    traces = list(dict.fromkeys(t for _, t in cells))
    print(f"\n{title}\n{'policy':<18}" + "".join(f"{t:>17}" for t in traces))
    for policy in dict.fromkeys(p for p, _ in cells):
        line = "".join(
            f"{cells[policy, t]['attainment']:>10.1%} /{cells[policy, t]['vs_oracle']:>4.2f}x" for t in traces
        )
        print(f"{policy:<18}{line}")


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


def plot_frontier(summary: dict[tuple[float, str, str], dict[str, float]], delay: float, path: Path) -> None:
    """Attainment against replica-seconds per trace, with the targets' corner shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(t for d, t, _ in summary if d == delay))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 4.4), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        cells = {p: g for (d, t, p), g in summary.items() if d == delay and t == trace}

        ax.fill_between(
            [0.8, 1.15], 0.99, 1.01, color="tab:green", alpha=0.3, label="targets: >=99%, <=1.15x"
        )
        ax.plot(*_curve(cells, "ours"), "o-", label="ours, headroom 0 and up")
        ax.plot(*_curve(cells, "reactive"), "s--", label="reactive bound, utilization 0.95 and down")
        markers = {
            "router": "P",
            "predictive": "D",
            "predictive+router": "X",
            "concurrency": "^",
            "waiting": "v",
        }
        markers["oracle"] = "*"
        for name, marker in markers.items():
            if name in cells:
                ax.plot(cells[name]["vs_oracle"], cells[name]["attainment"], marker, ms=9, label=name)
        ax.set_xscale("log")
        ticks = [1, 1.5, 2, 3, 4]
        ax.set_xticks(ticks, [f"{t:g}x" for t in ticks], minor=False)
        ax.set_xticks([], minor=True)
        ax.set(title=trace, xlabel="replica-seconds / oracle's", ylabel="TTFT attainment")
        ax.set(xlim=(0.8, 5), ylim=(0.4, 1.01))
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _curve(cells: dict[str, dict[str, float]], family: str) -> tuple[list[float], list[float]]:
    """(cost, attainment) of a policy and its variants ('ours', 'ours+0.5', ...), by cost."""
    points = sorted(
        (g["vs_oracle"], g["attainment"]) for p, g in cells.items() if p.split("+")[0].split("@")[0] == family
    )
    return [x for x, _ in points], [y for _, y in points]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


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
        help="steady utilization ours, the concurrency target and the reactive bound aim at",
    )
    p.add_argument("--max-replicas", type=int, default=40)
    p.add_argument("--waiting-threshold", type=float, default=5, help="KEDA baseline: waiting per replica")
    p.add_argument("--load-delay", type=float, default=60, help="seconds for a new replica to load the model")
    p.add_argument("--headrooms", type=floats, default="0.15,0.3,0.5,1", help="ours with this headroom")
    p.add_argument(
        "--bound-utilizations", type=floats, default="0.95,0.75,0.65,0.55", help="the reactive bound at these"
    )
    p.add_argument(
        "--load-delays", type=floats, default="10,30", help="also run ours and the bound with these loads"
    )
    p.add_argument("--step-base-ms", type=float, default=8.3, help="decode step time at batch 0")
    p.add_argument("--step-per-seq-ms", type=float, default=1.67, help="added step time per sequence")
    p.add_argument("--prefill-tok-s", type=float, default=2400)
    p.add_argument("--max-batch", type=int, default=16, help="maxNumSeqs")
    p.add_argument("--dt", type=float, default=0.1, help="simulation tick, seconds")
    p.add_argument("--json", type=Path, help="write the settings and rows here")
    p.add_argument("--plot-dir", type=Path, help="write one PNG per trace, and the frontier, here")
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
    lineup = with_standing_capacity(args.headrooms, args.bound_utilizations)
    oracle_runs = len(ORACLE_UTILIZATIONS)
    runs_per_seed = oracle_runs + 7 + len(args.headrooms) + len(args.bound_utilizations)
    runs_per_seed += len(args.load_delays) * (oracle_runs + 2)
    rows: list[Row] = []
    with tqdm(total=len(traces) * len(seeds) * runs_per_seed, desc="simulating", unit="run") as progress:
        for trace in traces:
            for seed in seeds:
                trace_rows, results, load = simulate_trace(
                    trace, setup, seed, args.duration, lineup, progress
                )
                rows += trace_rows
                if args.plot_dir and seed == args.seed:
                    args.plot_dir.mkdir(parents=True, exist_ok=True)
                    shown = {name: results[name] for name in HEADLINE}
                    plot(trace, load, shown, args.plot_dir / f"autoscaling-{trace}.png")
                for delay in args.load_delays:
                    shorter = replace(setup, model=replace(model, load_delay_s=delay))
                    rows += simulate_trace(trace, shorter, seed, args.duration, reactive_pair, progress)[0]

    summary = summarize(rows)
    print(f"\nTTFT target {args.ttft_slo:g} s, model load {args.load_delay:g} s, maxNumSeqs {args.max_batch}")
    print(
        f"a replica serves {replica_rps:.2f} req/s at full batch; at {args.utilization:.0%} of that it holds "
        f"{calibration.in_flight:.1f} requests in flight (the concurrency target) "
        f"and {calibration.kv_usage:.2f} KV use (our KV target)"
    )
    print(f"means over seeds {list(seeds)}")
    print(f"{'trace':<9}{'policy':<18}{'attainment':>11}{'worst':>8}", end="")
    print(f"{'replica-s':>11}{'vs oracle':>10}{'scalings':>9}")
    for (delay, trace, policy), g in summary.items():
        if delay == args.load_delay and policy in HEADLINE:
            print(f"{trace:<9}{policy:<18}{g['attainment']:>10.2%}{g['worst']:>8.1%}", end="")
            print(f"{g['replica_s']:>11.0f}{g['vs_oracle']:>10.2f}{g['scale_events']:>9.0f}")
    print_grid(
        f"Attainment / replica-s vs oracle, model load {args.load_delay:g} s", summary, args.load_delay
    )
    for delay in args.load_delays:
        print_grid(f"Model load {delay:g} s", summary, delay)
    if args.plot_dir:
        plot_frontier(summary, args.load_delay, args.plot_dir / "autoscaling-frontier.png")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        report = {
            "settings": settings,
            "calibration": asdict(calibration),
            "summary": [
                {"load_delay_s": d, "trace": t, "policy": p, **g} for (d, t, p), g in summary.items()
            ],
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
