"""`kubeinfer bench`: load an OpenAI-compatible endpoint and report latency, throughput and goodput."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from kubeinfer_operator.bench.client import Target, discover_model, make_client
from kubeinfer_operator.bench.report import format_point, format_sweep, to_json, write_json
from kubeinfer_operator.bench.runner import (
    LoadPoint,
    PointResult,
    find_knee,
    run_auto_sweep,
    run_points,
    warm_up,
)
from kubeinfer_operator.bench.slo import Slo, parse_slo_flags, slo_from_manifest
from kubeinfer_operator.bench.workload import (
    LengthDistribution,
    RequestSpec,
    load_dataset,
    synthetic_requests,
)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be positive")
    return value


def rate_list(text: str) -> list[float]:
    """Requests/s: one rate ("4"), a comma list ("1,2,4,8") or "inf"."""
    return [positive_float(part) for part in text.split(",")]


def response_format(text: str) -> dict:
    """--response-format: "json_object", or a file with a response_format object or a JSON schema."""
    if text == "json_object":
        return {"type": "json_object"}
    try:
        value = json.loads(Path(text).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise argparse.ArgumentTypeError(f"{text}: {e}") from e
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text}: expected a JSON object")
    if value.get("type") in ("text", "json_object", "json_schema"):
        return value
    return {"type": "json_schema", "json_schema": {"name": "bench", "schema": value, "strict": True}}


def add_target_arguments(parser: argparse._ActionsContainer, model_flag: str = "--model") -> None:
    parser.add_argument(
        model_flag, dest="served_model", help="model name to request (default: the first at /v1/models)"
    )
    parser.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds per request (default 600)"
    )
    parser.add_argument(
        "--response-format",
        type=response_format,
        metavar="json_object|PATH",
        help="send a response_format with every request: json_object, or a JSON file holding a "
        "response_format object or a bare JSON schema (sent as a strict json_schema)",
    )
    parser.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos (for servers that reject it); outputs may end early",
    )


def add_workload_arguments(group: argparse._ActionsContainer, num_requests: int) -> None:
    group.add_argument(
        "--dataset", type=Path, help='JSONL, one request a line: {"prompt"|"messages", "max_tokens"?}'
    )
    group.add_argument(
        "--input-len",
        default="256",
        help="synthetic prompt tokens: N, uniform:LO:HI, "
        "normal:MEAN:STD or lognormal:MEDIAN:SIGMA (default 256)",
    )
    group.add_argument(
        "--output-len",
        default="128",
        help="max_tokens, same forms (default 128); for a dataset, used where a line has no max_tokens",
    )
    group.add_argument("--chat", action="store_true", help="send synthetic prompts to /v1/chat/completions")
    group.add_argument(
        "--num-requests",
        type=positive_int,
        default=num_requests,
        help=f"requests per load point (default {num_requests})",
    )
    group.add_argument("--seed", type=int, default=0, help="seed for prompts, lengths and arrivals")


def add_slo_arguments(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="e.g. ttft.p95=500ms, tpot.p95=60ms, e2e.p99=20s, errorRate=0.01 (repeatable)",
    )
    group.add_argument(
        "--slo-from",
        type=Path,
        metavar="MANIFEST",
        help="read spec.slo from an InferenceService YAML; --slo flags override it",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeinfer bench",
        description="Benchmark an OpenAI-compatible endpoint (the kubeinfer runtime, its router, or any "
        "other server): TTFT, ITL, TPOT, E2E percentiles, throughput, goodput against an SLO.",
    )
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    add_target_arguments(parser)
    add_workload_arguments(parser.add_argument_group("workload"), num_requests=100)
    load = parser.add_argument_group("load")
    load.add_argument(
        "--request-rate",
        type=rate_list,
        default=[math.inf],
        help="requests/s: one rate, a comma list to sweep, or inf (all at once; default)",
    )
    load.add_argument(
        "--burstiness",
        type=positive_float,
        default=1.0,
        help="gamma shape of arrival gaps: 1 Poisson (default), <1 burstier, >1 steadier",
    )
    load.add_argument("--max-concurrency", type=positive_int, help="never more than N requests in flight")
    load.add_argument(
        "--sweep",
        type=positive_int,
        metavar="STEPS",
        help="find the max throughput, then sweep STEPS Poisson rates up to it and report the knee",
    )
    add_slo_arguments(parser.add_argument_group("SLO (goodput and the knee)"))
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    out.add_argument(
        "--plot",
        metavar="PREFIX",
        help="write PREFIX-cdf.png (latency CDFs) and, for a sweep, PREFIX-knee.png (latency vs throughput)",
    )
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def read_slo(args: argparse.Namespace) -> Slo:
    base = slo_from_manifest(args.slo_from) if args.slo_from else Slo()
    return base.merged_with(parse_slo_flags(args.slo))


def request_factory(args: argparse.Namespace, rng: random.Random) -> Callable[[int], list[RequestSpec]]:
    """A function giving load point i its requests: fresh synthetic prompts per point (so no point
    hits the prefix cache warmed by the one before), or the dataset's first N lines each time."""
    output_len = LengthDistribution.parse(args.output_len, "--output-len")
    if args.dataset:
        dataset = load_dataset(args.dataset, output_len, rng)
        return lambda i: [dataset[j % len(dataset)] for j in range(args.num_requests)]
    input_len = LengthDistribution.parse(args.input_len, "--input-len")

    def synthetic(i: int) -> list[RequestSpec]:
        requests = synthetic_requests(
            args.num_requests, input_len, output_len, random.Random(f"{args.seed}/{i}")
        )
        if args.chat:
            requests = [
                RequestSpec(None, [{"role": "user", "content": r.prompt}], r.max_tokens) for r in requests
            ]
        return requests

    return synthetic


async def resolve_target(client: httpx.AsyncClient, args: argparse.Namespace, url: str) -> Target:
    base_url = url.rstrip("/").removesuffix("/v1")
    model = args.served_model or await discover_model(client, base_url)
    return Target(base_url, model, args.timeout, args.ignore_eos, args.api_key, args.response_format)


async def bench(args: argparse.Namespace, slo: Slo) -> tuple[Target, list[PointResult]]:
    rng = random.Random(args.seed)
    make_requests = request_factory(args, rng)
    async with make_client(args.timeout) as client:
        target = await resolve_target(client, args, args.url)
        await warm_up(client, target, make_requests(-1)[0])  # -1: a prompt no load point sends
        if args.sweep:
            base = LoadPoint(math.inf, args.burstiness, args.max_concurrency)
            runs = await run_auto_sweep(
                client, target, args.sweep, base, make_requests, rng, slo, args.progress
            )
        else:
            points = [LoadPoint(rate, args.burstiness, args.max_concurrency) for rate in args.request_rate]
            runs = await run_points(client, target, points, make_requests, rng, slo, args.progress)
    return target, runs


def describe_workload(args: argparse.Namespace) -> str:
    source = (
        f"dataset {args.dataset}"
        if args.dataset
        else f"input {args.input_len} tok, output {args.output_len} tok"
    )
    return f"{source}, {args.num_requests} requests/point"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.sweep and len(args.request_rate) > 1:
        parser.error("--sweep finds its own rates; do not also give several --request-rate values")
    try:
        slo = read_slo(args)
        target, runs = asyncio.run(bench(args, slo))
    except (ValueError, OSError) as e:
        print(f"kubeinfer bench: error: {e}", file=sys.stderr)
        return 2
    except httpx.HTTPError as e:
        print(f"kubeinfer bench: error: {args.url}: {e}", file=sys.stderr)
        return 2
    knee = find_knee(runs, slo) if len(runs) > 1 else None
    print(
        f"target: {target.base_url} model {target.model}; workload: {describe_workload(args)}; "
        f"SLO: {slo.describe()}"
    )
    if len(runs) > 1:
        print(format_sweep(runs, knee) + "\n")
    if len(runs) == 1 or knee:  # a single point, or the knee of a sweep, in full
        print(format_point(runs[knee.index] if knee else runs[0]))
    if args.json:
        config = {
            "url": target.base_url,
            "model": target.model,
            "workload": describe_workload(args),
            "burstiness": args.burstiness,
            "max_concurrency": args.max_concurrency,
            "seed": args.seed,
            "response_format": args.response_format,
        }
        write_json(args.json, to_json(runs, knee, slo, config))
    if args.plot:
        from kubeinfer_operator.bench.plots import plot_latency_cdfs, plot_sweep

        plot_latency_cdfs(runs, Path(f"{args.plot}-cdf.png"), slo)
        if len(runs) > 1:
            title = f"{target.model} @ {target.base_url}: {describe_workload(args)}"
            plot_sweep(runs, knee, Path(f"{args.plot}-knee.png"), slo, title)
    return 0
