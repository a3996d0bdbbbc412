"""`kubeinfer plan`: size a deployment before buying GPUs, optionally calibrated on a live endpoint."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from dataclasses import asdict
from pathlib import Path

import httpx

from kubeinfer_operator.bench.client import make_client
from kubeinfer_operator.bench.command import (
    add_slo_arguments,
    add_target_arguments,
    add_workload_arguments,
    positive_float,
    positive_int,
    read_slo,
    request_factory,
    resolve_target,
)
from kubeinfer_operator.bench.report import format_sweep, json_safe
from kubeinfer_operator.bench.runner import LoadPoint, PointResult, find_knee, run_auto_sweep, warm_up
from kubeinfer_operator.bench.slo import Slo
from kubeinfer_operator.capacity import GIB, GPUS, NAMED_CONFIGS, ModelShape, Plan, dtype_bytes, plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeinfer plan",
        description="Weights, KV bytes per token, the tokens and sequences that fit, and suggested "
        "maxNumSeqs and KV budget, for a model on given GPUs.",
    )
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--config", type=Path, help="a model's config.json, or the directory holding it")
    model.add_argument(
        "--model",
        choices=sorted(NAMED_CONFIGS),
        metavar="NAME",
        help=f"a named size: {', '.join(NAMED_CONFIGS)}",
    )
    gpu = parser.add_mutually_exclusive_group(required=True)
    gpu.add_argument("--gpu", choices=sorted(GPUS), metavar="GPU", help=f"a known GPU: {', '.join(GPUS)}")
    gpu.add_argument("--gpu-memory-gib", type=positive_float, help="memory of one GPU, GiB")
    parser.add_argument("--gpus", type=positive_int, default=1, help="GPUs per replica (tensor parallel)")
    parser.add_argument(
        "--memory-bandwidth-gbs",
        type=positive_float,
        help="GPU memory bandwidth in GB/s for the TPOT roofline (known GPUs have it)",
    )
    parser.add_argument("--dtype", help="weights dtype (default: the config's torch_dtype)")
    parser.add_argument("--kv-dtype", help="KV cache dtype (default: the weights dtype)")
    parser.add_argument(
        "--quantization",
        choices=["int8"],
        help="weight-only quantization of the matmul weights (the builtin engine's int8)",
    )
    parser.add_argument(
        "--context-length",
        type=positive_int,
        help="maxModelLen (default: the config's max_position_embeddings)",
    )
    parser.add_argument(
        "--avg-seq-tokens",
        type=positive_int,
        help="prompt + output tokens of a typical request (default: the context length)",
    )
    parser.add_argument(
        "--memory-utilization",
        type=positive_float,
        default=0.9,
        help="fraction of GPU memory the engine may use (default 0.9)",
    )
    parser.add_argument(
        "--reserve-gib",
        type=float,
        default=1.0,
        help="per-GPU overhead outside weights, activations and KV (default 1)",
    )
    add_slo_arguments(parser.add_argument_group("SLO (a TPOT target caps maxNumSeqs by the decode roofline)"))
    parser.add_argument("--json", metavar="PATH", help="write the plan as JSON ('-' for stdout)")
    calibrate = parser.add_argument_group("calibration against a live endpoint")
    calibrate.add_argument(
        "--calibrate",
        metavar="URL",
        help="run a short rate sweep against URL and report the measured throughput at the SLO",
    )
    calibrate.add_argument(
        "--calibrate-steps", type=positive_int, default=4, help="rates in the sweep (default 4)"
    )
    add_target_arguments(calibrate, model_flag="--served-model")
    add_workload_arguments(calibrate, num_requests=30)
    calibrate.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def load_shape(args: argparse.Namespace) -> tuple[str, ModelShape]:
    if args.model:
        return args.model, ModelShape.named(args.model)
    path = args.config / "config.json" if args.config.is_dir() else args.config
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--config: cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"--config: {path} is not a JSON object")
    return str(path), ModelShape.from_config(config, str(path))


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


def format_plan(name: str, shape: ModelShape, gpu: str, p: Plan) -> str:
    params = f"{p.params / 1e9:.2f} B" if p.params >= 1e9 else f"{p.params / 1e6:.2f} M"
    kv_formula = (
        f"2 x {shape.num_layers} layers x {shape.num_kv_heads} kv heads x {shape.head_dim} head_dim"
        f" x {dtype_bytes(p.kv_dtype):g} B ({p.kv_dtype})"
    )
    rows = [
        (
            "model",
            f"{name}: {params} parameters, {p.dtype}"
            + (f", {p.quantization} weights" if p.quantization else ""),
        ),
        ("GPUs", f"{p.gpus} x {gpu} ({_gib(p.gpu_memory_bytes)}), {p.memory_utilization:.0%} for the engine"),
        ("weights", _gib(p.weights_bytes)),
        ("KV per token", f"{p.kv_bytes_per_token:,} B = {kv_formula}"),
        ("reserve", f"{_gib(p.reserve_bytes)} (runtime overhead + activations of one batched step)"),
        ("KV budget", f"{_gib(p.kv_budget_bytes)} = {p.kv_tokens:,} tokens"),
        ("at context", f"{p.context_length:,} tokens/sequence -> {p.seqs_at_context:,} sequences"),
        ("at average", f"{p.avg_seq_tokens:,} tokens/sequence -> {p.seqs_at_avg:,} sequences"),
    ]
    if p.tpot_batch1_s is not None:
        within = (
            "" if p.seqs_within_tpot is None else f"; {p.seqs_within_tpot:,} sequences within the TPOT SLO"
        )
        rows.append(("TPOT roofline", f"{p.tpot_batch1_s * 1000:.1f} ms at batch 1{within}"))
    suggested = f"maxNumSeqs {p.suggested_max_num_seqs}, kvCacheTokens {p.suggested_kv_cache_tokens:,}"
    rows.append(("suggested", suggested if p.fits else "does not fit"))
    rows += [("note", note) for note in p.notes]
    return "\n".join(f"{key:<15}{value}" for key, value in rows)


def calibrate(args: argparse.Namespace, slo: Slo) -> dict:
    """A short auto sweep; the knee's achieved throughput is what one replica sustains at the SLO."""

    async def sweep() -> list[PointResult]:
        rng = random.Random(args.seed)
        async with make_client(args.timeout) as client:
            target = await resolve_target(client, args, args.calibrate)
            make_requests = request_factory(args, rng)
            await warm_up(client, target, make_requests(-1)[0])
            return await run_auto_sweep(
                client,
                target,
                args.calibrate_steps,
                LoadPoint(),
                make_requests,
                rng,
                slo,
                args.progress,
            )

    runs = asyncio.run(sweep())
    knee = find_knee(runs, slo)
    print(format_sweep(runs, knee))
    best = runs[knee.index].stats if knee else None
    return {
        "url": args.calibrate,
        "knee_rule": knee.rule if knee else None,
        "max_request_throughput_at_slo": best.request_throughput if best else None,
        "max_output_token_throughput_at_slo": best.output_token_throughput if best else None,
        "ttft_p95_s": best.ttft.p95 if best else None,
        "tpot_p95_s": best.tpot.p95 if best else None,
        "max_throughput_unconstrained": max(r.stats.request_throughput for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        name, shape = load_shape(args)
        slo = read_slo(args)
        tpot = slo.per_request_threshold("tpot")
        known = GPUS.get(args.gpu) if args.gpu else None
        memory = known.memory_bytes if known else int(args.gpu_memory_gib * GIB)
        bandwidth = (
            args.memory_bandwidth_gbs * 1e9
            if args.memory_bandwidth_gbs
            else known and known.bandwidth_bytes_s
        )
        result = plan(
            shape,
            memory,
            gpus=args.gpus,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            quantization=args.quantization,
            context_length=args.context_length,
            avg_seq_tokens=args.avg_seq_tokens,
            memory_utilization=args.memory_utilization,
            reserve_bytes=int(args.reserve_gib * GIB),
            bandwidth_bytes_s=bandwidth,
            tpot_target_s=tpot,
        )
    except ValueError as e:
        print(f"kubeinfer plan: error: {e}", file=sys.stderr)
        return 2
    print(format_plan(name, shape, args.gpu or f"{args.gpu_memory_gib:g} GiB GPU", result))
    document: dict = {"model": name, "gpu": args.gpu, "slo": slo.describe(), "plan": asdict(result)}
    if args.calibrate:
        print()
        try:
            document["calibration"] = calibrate(args, slo)
        except (httpx.HTTPError, ValueError, OSError) as e:
            print(f"kubeinfer plan: calibration against {args.calibrate} failed: {e}", file=sys.stderr)
            return 1
        c = document["calibration"]
        if c["max_request_throughput_at_slo"] is None:
            print("calibration: no swept rate met the SLO")
        else:
            print(
                f"calibration: {c['max_request_throughput_at_slo']:.2f} req/s, "
                f"{c['max_output_token_throughput_at_slo']:.1f} output tok/s per replica at the SLO"
            )
    if args.json:
        text = json.dumps(json_safe(document), indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0
