"""`kubeinfer backtest`: try a scaling config on recorded load before turning it on.

The load, from a trace file or a service's served-rate history in Prometheus, is replayed through the
autoscaling simulation (autoscaling/sim: replicas with batching and a model load behind a FIFO router,
Prometheus-style scrapes) under the operator's own policy with the config of an InferenceService manifest.
Printed as the simulation prints it: the share of requests meeting the TTFT target and replica-seconds,
beside the reactive bound (sees the arrivals at once) and an oracle (knows the future).

Trace files are CSV with a header: either `time_s,rps` (a load profile, e.g. an exported range query;
interpolated to each second) or `arrival_s[,prompt_tokens,output_tokens]` (one row per request).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from kubeinfer_operator.api import InferenceServiceSpec, parse_duration
from kubeinfer_operator.autoscaling.signals import fetch_arrivals_history
from kubeinfer_operator.autoscaling.sim.cluster import Cluster, Policy, Result, ServerModel
from kubeinfer_operator.autoscaling.sim.policies import (
    ORACLE_UTILIZATIONS,
    Ours,
    ReactiveBound,
    cheapest_oracle,
)
from kubeinfer_operator.autoscaling.sim.workload import Requests, Shape, make_requests
from kubeinfer_operator.autoscaling.tick import scaling_config
from kubeinfer_operator.engine_metrics import engine_metrics
from kubeinfer_operator.prometheus import MetricsUnavailable, connect

# A scaling config to try when no manifest is given: the API's defaults with room to scale.
DEFAULT_SPEC = {
    "model": {"name": "backtest", "source": {"hostPath": {"path": "/unused"}}},  # only spec.scaling is
    "scaling": {"minReplicas": 1, "maxReplicas": 40},
}


class TraceError(ValueError):
    """A trace file that cannot be read as either format."""


@dataclass(frozen=True)
class Trace:
    requests: Requests
    seconds: float
    rate_rps: np.ndarray  # the arrival rate at each second, as the reactive bound sees it


def read_trace(path: Path, shape: Shape, rng: np.random.Generator) -> Trace:
    """Requests from a trace file (see the module's docstring for the two formats)."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror}") from e
    if not rows:
        raise TraceError(f"{path}: no rows (want a header and time_s,rps or arrival_s rows)")
    columns = set(rows[0])
    try:
        if {"time_s", "rps"} <= columns:
            times = np.array([float(r["time_s"]) for r in rows])
            rps = np.array([float(r["rps"]) for r in rows])
            return profile_trace(times, rps, shape, rng)
        if "arrival_s" in columns:
            return request_trace(rows, shape, rng)
    except (TypeError, ValueError) as e:
        raise TraceError(f"{path}: {e}") from e
    raise TraceError(f"{path}: want columns time_s,rps or arrival_s[,prompt_tokens,output_tokens]")


def profile_trace(times: np.ndarray, rps: np.ndarray, shape: Shape, rng: np.random.Generator) -> Trace:
    """Poisson arrivals following a rate sampled at `times` (seconds, any origin), interpolated per second;
    request sizes drawn from `shape`. Gaps (NaN) count as no requests."""
    if len(times) < 2 or np.any(np.diff(times) <= 0):
        raise ValueError("time_s must increase, over at least two rows")
    rps = np.nan_to_num(rps, nan=0.0)
    if np.any(rps < 0):
        raise ValueError("rps must be >= 0")
    seconds = np.arange(math.ceil(times[-1] - times[0]))
    load = np.interp(seconds, times - times[0], rps)
    return Trace(make_requests(load, 1.0, shape, rng), float(len(seconds)), load)


def request_trace(rows: list[dict[str, str]], shape: Shape, rng: np.random.Generator) -> Trace:
    arrival = np.array([float(r["arrival_s"]) for r in rows])
    arrival -= arrival.min()
    prompt, output = shape.draw(len(rows), rng)
    if rows[0].get("prompt_tokens"):
        prompt = np.array([float(r["prompt_tokens"]) for r in rows])
    if rows[0].get("output_tokens"):
        output = np.array([float(r["output_tokens"]) for r in rows])
    order = np.argsort(arrival, kind="stable")
    seconds = math.floor(arrival.max()) + 1
    # One request per row: the rate is the trailing minute's mean (what a perfect observer knows now).
    counts = np.bincount(arrival.astype(int), minlength=seconds).astype(float)
    rate = np.convolve(counts, np.ones(60) / 60)[:seconds]
    rate[:60] = counts[:60].mean()
    return Trace(Requests(arrival[order], prompt[order], output[order]), float(seconds), rate)


def load_spec(path: Path | None) -> InferenceServiceSpec:
    if path is None:
        return InferenceServiceSpec.model_validate(DEFAULT_SPEC)
    try:
        manifest = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TraceError(f"{path}: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("spec"), dict):
        raise TraceError(f"{path}: want an InferenceService manifest with a spec")
    return InferenceServiceSpec.model_validate(manifest["spec"])


def backtest(
    trace: Trace, spec: InferenceServiceSpec, model: ServerModel, ttft_slo_s: float, goal: float = 0.99
) -> dict[str, Result]:
    """The config, the reactive bound and the oracle on one trace."""
    # dryRun or a pinned spec.replicas would only watch: the backtest shows what the config would do.
    config = replace(scaling_config(spec), mode="active")
    requests, seconds = trace.requests, trace.seconds
    replica_rps = 1 / float(model.work_s(requests.prompt, requests.output).mean())
    load = trace.rate_rps / replica_rps  # replicas' worth per second, as the bound reads it

    # Room for what the oracle runs too: it is not bound by maxReplicas (it shows what the load needs).
    slots = max(config.max_replicas, math.ceil(load.max() / min(ORACLE_UTILIZATIONS)) + 1)

    def run(policy: Policy, initial: int) -> Result:
        return Cluster(model, requests, max_replicas=slots).run(policy, initial, seconds)

    initial = min(max(math.ceil(load[:60].mean() / 0.85), config.min_replicas), config.max_replicas)
    interval = parse_duration(spec.scaling.interval)
    bound = ReactiveBound(load, replica_rps, 0.85, config.min_replicas, config.max_replicas)
    return {
        "config": run(Ours(config, interval_s=interval), initial),
        "reactive bound": run(bound, initial),
        "oracle": cheapest_oracle(requests, model, seconds, ttft_slo_s, goal, run).result,
    }


def report(results: dict[str, Result], ttft_slo_s: float) -> list[dict[str, float | str]]:
    oracle = results["oracle"].replica_s
    return [
        {
            "policy": name,
            "attainment": r.attainment(ttft_slo_s),
            "replica_s": r.replica_s,
            "vs_oracle": r.replica_s / oracle,
            "scale_events": r.scale_events,
        }
        for name, r in results.items()
    ]


def prometheus_trace(args: argparse.Namespace, spec: InferenceServiceSpec, shape: Shape) -> Trace:
    step_s = 30.0
    history = fetch_arrivals_history(
        connect(args.prometheus),
        engine_metrics(spec.runtime.engine),
        args.namespace,
        args.name,
        args.until or time.time(),
        parse_duration(args.since),
        step_s,
    )
    if not history:
        raise TraceError(f"Prometheus has no served-rate series for {args.namespace}/{args.name}")
    times = np.arange(len(history)) * step_s
    return profile_trace(times, np.array(history), shape, np.random.default_rng(args.seed))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubeinfer backtest",
        description="Replay recorded load through the autoscaler with a chosen config, in the simulation.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="CSV trace: time_s,rps rows or arrival_s rows")
    source.add_argument("--prometheus", metavar="URL", help="replay a service's served rate from here")
    p.add_argument("-f", "--filename", type=Path, help="InferenceService manifest: its spec.scaling is tried")
    p.add_argument("--namespace", default="default", help="with --prometheus")
    p.add_argument("--name", help="with --prometheus: the InferenceService")
    p.add_argument("--since", default="6h", help="with --prometheus: how much history (default 6h)")
    p.add_argument("--until", type=float, help="with --prometheus: end, epoch seconds (default now)")
    p.add_argument("--ttft-slo", type=float, help="seconds (default: the manifest's slo.ttft.p95, else 1)")
    p.add_argument("--load-delay", type=float, default=60, help="seconds a new replica takes to serve")
    p.add_argument(
        "--step-base-ms", type=float, default=8.3, help="decode step at batch 0 (this engine, CPU)"
    )
    p.add_argument("--step-per-seq-ms", type=float, default=1.67, help="added step time per sequence")
    p.add_argument("--prefill-tok-s", type=float, default=2400)
    p.add_argument(
        "--max-batch", type=int, help="maxNumSeqs (default: the manifest's runtime.maxNumSeqs, else 16)"
    )
    p.add_argument("--prompt-mean", type=float, default=256, help="tokens, where the trace has no sizes")
    p.add_argument("--output-mean", type=float, default=128, help="tokens, where the trace has no sizes")
    p.add_argument("--seed", type=int, default=0, help="for arrivals and request sizes drawn from a rate")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.prometheus and not args.name:
        p.error("--prometheus needs --name (and --namespace)")
    try:
        spec = load_spec(args.filename)
        shape = Shape(prompt_mean=args.prompt_mean, output_mean=args.output_mean)
        if args.trace:
            trace = read_trace(args.trace, shape, np.random.default_rng(args.seed))
        else:
            trace = prometheus_trace(args, spec, shape)
    except (TraceError, ValueError, MetricsUnavailable) as e:
        print(f"kubeinfer backtest: {e}", file=sys.stderr)
        return 2
    if len(trace.requests.arrival) == 0:
        print("kubeinfer backtest: the trace has no requests", file=sys.stderr)
        return 2
    max_batch = args.max_batch or (spec.runtime.max_num_seqs if args.filename else 16)  # 16: the sim's
    model = ServerModel(
        step_base_s=args.step_base_ms / 1000,
        step_per_seq_s=args.step_per_seq_ms / 1000,
        prefill_tok_s=args.prefill_tok_s,
        max_batch=max_batch,
        kv_capacity_tokens=max_batch * (shape.prompt_mean + shape.output_mean),
        load_delay_s=args.load_delay,
    )
    slo = spec.slo.ttft.p95 if spec.slo.ttft is not None else None
    ttft = args.ttft_slo or (parse_duration(slo) if slo else 1.0)
    rows = report(backtest(trace, spec, model, ttft), ttft)
    if args.json:
        print(json.dumps({"ttft_slo_s": ttft, "seconds": trace.seconds, "rows": rows}, indent=2))
        return 0
    n = len(trace.requests.arrival)
    print(
        f"{trace.seconds:.0f} s, {n} requests ({n / trace.seconds:.2f} req/s), TTFT target {ttft:g} s, "
        f"model load {args.load_delay:g} s, maxNumSeqs {max_batch}, "
        f"replicas {spec.scaling.min_replicas}-{spec.scaling.max_replicas} (the oracle is not bound by them)"
    )
    print(f"{'policy':<16}{'attainment':>11}{'replica-s':>11}{'vs oracle':>10}{'scalings':>9}")
    for r in rows:
        print(
            f"{r['policy']:<16}{r['attainment']:>11.2%}{r['replica_s']:>11.0f}"
            f"{r['vs_oracle']:>9.2f}x{r['scale_events']:>9}"
        )
    return 0
