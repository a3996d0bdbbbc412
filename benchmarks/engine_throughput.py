"""Offline throughput of the kubeinfer engine against `transformers.generate`, side by side in one run.

Workload: N requests (default 64) with prompts of 64-512 random tokens and 16-256 output tokens
(mixed, seeded), every request generating exactly its output length (EOS ignored). Compared:

  engine          LLMEngine.generate over all requests at once (continuous batching)
  hf-sequential   transformers generate, one request at a time
  hf-static-B     transformers generate in static, left-padded batches of B requests (default: as
                  many as the engine runs at once, and a quarter of that, which suits transformers
                  better); a batch runs until its longest output is done, so only each request's
                  own output tokens count as useful

First, the batch-1 decode step against the floor set by memory bandwidth: the bytes the step reads
(models/roofline.py: the matmul weights streamed, the norms, one embedding row, the KV cache of the
context) divided by the read bandwidth of a warm sum over a buffer far larger than the caches (the
best of samples taken between the engine's decode steps, so both see the same machine); and
transformers' own batch-1 step.

Every measurement runs --repeats times (interleaved: engine, transformers, engine, ...); the report
gives medians, the JSON every run. Targets (issue 19) are printed with each ratio, met or not.

Usage: python benchmarks/engine_throughput.py [--quick] [--repeats N] [--json out.json] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models import fused_ops
from kubeinfer_runtime.models.roofline import decode_step_bytes
from kubeinfer_runtime.tiny_model import make_tiny_model

# Issue 19's targets, fp32 on 2 threads.
TARGET_FLOOR_RATIO = 1.15  # batch-1 decode step / the floor of the bytes it reads
TARGET_VS_HF_STEP = 1.5  # transformers' batch-1 step / ours
TARGET_VS_SEQUENTIAL = 8.0  # throughput per CPU-second over transformers one request at a time
TARGET_VS_STATIC = 3.0  # ... over the best static batching


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]


@dataclass
class Throughput:
    seconds: float  # wall clock
    cpu_seconds: float  # this process's CPU time: steadier than wall time on a shared machine
    output_tokens: int
    requests_measured: int

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_seconds


class Timer:
    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def make_workload(
    n: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int], vocab: int, seed: int
) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, vocab) for _ in range(rng.randint(*prompt_lens))] for _ in range(n)]
    return Workload(prompts, [rng.randint(*output_lens) for _ in range(n)])


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


class BandwidthProbe:
    """Read bandwidth of a buffer far larger than the last-level cache, by the two fastest readers at
    hand: torch's sum, and the engine's own streamed matmul kernel (four streams per thread, the
    buffer viewed as one matrix-vector product); keeps the best rate either reaches, so the floor is
    the strictest this machine supports."""

    WIDTH = 4096  # floats per matrix row

    def __init__(self, gib: int) -> None:
        # On 2 MB pages like the engine's weights (fused_ops.on_huge_pages): 4 KB pages read slower.
        self.buffer = fused_ops.on_huge_pages(torch.ones(gib * 2**30 // 4))
        threads = torch.get_num_threads()
        rows = self.buffer.numel() // self.WIDTH // threads // 4 * 4
        self.matrix = self.buffer[: threads * rows * self.WIDTH].view(threads, rows, self.WIDTH)
        self.x = torch.ones(1, self.WIDTH)
        self.best_gbs = 0.0
        self.best_by: dict[str, float] = {"sum": 0.0, "kernel": 0.0}
        self.sample()  # warm-up: pages faulted in, threads started
        self.best_gbs, self.best_by = 0.0, {"sum": 0.0, "kernel": 0.0}

    def _read(self, name: str, fn: Callable[[], object], nbytes: int) -> None:
        start = time.perf_counter()
        fn()
        gbs = nbytes / (time.perf_counter() - start) / 1e9
        self.best_by[name] = max(self.best_by[name], gbs)
        self.best_gbs = max(self.best_gbs, gbs)

    def sample(self, repeats: int = 1) -> None:
        for _ in range(repeats):
            self._read("sum", self.buffer.sum, self.buffer.numel() * 4)
            if fused_ops.cpu_isa() not in ("unbuilt", "none"):
                matmul = lambda: torch.ops.kubeinfer.packed_linear(self.x, self.matrix, None, None)  # noqa: E731
                self._read("kernel", matmul, self.matrix.numel() * 4)


def run_engine(engine: LLMEngine, work: Workload) -> Throughput:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in work.output_lens]
    with Timer() as t:
        outputs = engine.generate(work.prompts, params, use_tqdm=True)
    assert [len(o) for o in outputs] == work.output_lens
    return Throughput(t.wall, t.cpu, sum(work.output_lens), len(work.prompts))


def hf_generate(
    model: AutoModelForCausalLM, prompts: list[list[int]], max_new_tokens: int, pad_id: int
) -> torch.Tensor:
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)


def run_hf_sequential(
    model: AutoModelForCausalLM, work: Workload, sample: list[int], pad_id: int
) -> Throughput:
    with Timer() as t:
        for i in tqdm(sample, desc="hf one at a time", unit="req"):
            hf_generate(model, [work.prompts[i]], work.output_lens[i], pad_id)
    return Throughput(t.wall, t.cpu, sum(work.output_lens[i] for i in sample), len(sample))


def run_hf_static(model: AutoModelForCausalLM, work: Workload, batch_size: int, pad_id: int) -> Throughput:
    batches = [
        list(range(i, min(i + batch_size, len(work.prompts))))
        for i in range(0, len(work.prompts), batch_size)
    ]
    with Timer() as t:
        for batch in tqdm(batches, desc=f"hf static batches of {batch_size}", unit="batch"):
            hf_generate(
                model, [work.prompts[i] for i in batch], max(work.output_lens[i] for i in batch), pad_id
            )
    return Throughput(t.wall, t.cpu, sum(work.output_lens), len(work.prompts))


def engine_decode_steps_s(
    engine: LLMEngine, prompt: list[int], steps: int, probe: BandwidthProbe, rounds: int = 8
) -> tuple[list[float], list[int]]:
    """Batch-1 decode step times and the context each step attended to, with bandwidth samples taken
    between rounds of steps: this machine is shared, and a floor measured minutes apart from the
    steps would compare different machines. The step right after a sample is run untimed: the
    sample's sweep has just flushed every cache, which back-to-back serving steps never do."""
    per_round = max(8, steps // rounds)
    request_id = f"decode-probe-{time.monotonic_ns()}"
    engine.add_request(
        request_id,
        prompt,
        SamplingParams(max_tokens=steps + steps // per_round + 2, temperature=0.0, ignore_eos=True),
    )
    engine.step()  # the prefill
    context = len(prompt)  # the decode step k reads the prompt and k new tokens
    times: list[float] = []
    contexts: list[int] = []
    while len(times) < steps:
        if len(times) % per_round == 0:
            probe.sample()
            engine.step()
            context += 1
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
        context += 1
        contexts.append(context)
    probe.sample()
    engine.abort_request(request_id)
    return times, contexts


def hf_decode_step_s(model: AutoModelForCausalLM, prompt: list[int], steps: int, pad_id: int) -> float:
    start = time.perf_counter()
    hf_generate(model, [prompt], 1, pad_id)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    hf_generate(model, [prompt], steps + 1, pad_id)
    return (time.perf_counter() - start - prefill) / steps


def machine(threads: int, load_averages: list[float]) -> dict:
    """What the numbers were measured on, for the JSON: the shared machine's load included."""
    return {
        "cpu": cpu_name(),
        "kernel_isa": fused_ops.cpu_isa(),
        "threads": threads,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "load_average_1m_per_round": load_averages,
    }


def write_report(path: Path | None, report: dict) -> None:
    """The raw numbers as JSON (benchmarks/results/ keeps the README's), when a path is given."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")


def verdict(value: float, target: float, at_most: bool = False) -> str:
    met = value <= target if at_most else value >= target
    return f"target {'<=' if at_most else '>='} {target:g}x: {'met' if met else 'NOT met'}"


def measure_once(
    engine: LLMEngine,
    hf: AutoModelForCausalLM,
    work: Workload,
    sample: list[int],
    static_batches: list[int],
    pad_id: int,
    probe: BandwidthProbe,
    steps: int,
) -> dict:
    """One round of every measurement; the floor inputs (bandwidth, bytes) come with the steps."""
    results = {
        "engine": run_engine(engine, work),
        "hf_sequential": run_hf_sequential(hf, work, sample, pad_id),
        **{f"hf_static_{b}": run_hf_static(hf, work, b, pad_id) for b in static_batches},
    }
    prompt = work.prompts[0][:128]
    probe.best_gbs, probe.best_by = 0.0, {"sum": 0.0, "kernel": 0.0}  # this round's machine
    probe.sample(repeats=3)
    step_times, contexts = engine_decode_steps_s(engine, prompt, steps, probe)
    model = engine.model_runner.model
    dtype = engine.model_runner.dtype
    read = [decode_step_bytes(model, [c], dtype) for c in contexts]
    bytes_read = statistics.mean(r.total for r in read)
    floor_ms = bytes_read / probe.best_gbs / 1e6
    engine_ms = statistics.median(step_times) * 1e3
    hf_ms = hf_decode_step_s(hf, prompt, steps, pad_id) * 1e3
    first = read[0]
    decode = {
        "engine_ms": engine_ms,
        "engine_best_ms": min(step_times) * 1e3,
        "hf_ms": hf_ms,
        "bandwidth_gbs": probe.best_gbs,
        "bandwidth_by_reader_gbs": dict(probe.best_by),
        "bytes_read": bytes_read,
        "matmul_weight_bytes": first.matmul_weights,
        "norm_bytes": first.norms,
        "embedding_row_bytes": first.embedding_rows,
        "kv_bytes_mean": statistics.mean(r.kv_cache for r in read),
        "context_tokens": [contexts[0], contexts[-1]],
        "floor_ms": floor_ms,
        "engine_vs_floor": engine_ms / floor_ms,
        "hf_vs_engine": hf_ms / engine_ms,
    }
    engine_result = results["engine"]
    others = {name: r for name, r in results.items() if name != "engine"}
    return {
        "throughput": {
            name: {**asdict(r), "tokens_per_s": r.tokens_per_s, "tokens_per_cpu_s": r.tokens_per_cpu_s}
            for name, r in results.items()
        },
        "speedup": {name: engine_result.tokens_per_s / r.tokens_per_s for name, r in others.items()},
        "speedup_cpu_time": {
            name: engine_result.tokens_per_cpu_s / r.tokens_per_cpu_s for name, r in others.items()
        },
        "decode_batch1": decode,
        "load_average_1m": os.getloadavg()[0],
    }


def median_of(runs: list[dict], *keys: str) -> float:
    values = []
    for run in runs:
        node = run
        for key in keys:
            node = node[key]
        values.append(node)
    return statistics.median(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model directory (default: a fresh bench-60m tiny model)")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (seconds, not minutes)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds of every measurement (medians reported)"
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64, help="the engine's concurrent sequences")
    parser.add_argument(
        "--static-batch-size",
        type=int,
        action="append",
        help="repeatable (default: --max-num-seqs and a quarter of it)",
    )
    parser.add_argument(
        "--sequential-sample",
        type=int,
        default=16,
        help="requests measured one at a time (throughput extrapolates to all)",
    )
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads for both sides"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.sequential_sample, args.max_num_seqs = 8, 4, 8
    prompt_lens, output_lens = ((16, 64), (4, 16)) if args.quick else ((64, 512), (16, 256))
    static_batches = (
        args.static_batch_size or sorted({args.max_num_seqs, max(1, args.max_num_seqs // 4)})[::-1]
    )
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_model(Path(tmp) / "bench-60m", preset="bench-60m")
        engine = LLMEngine.from_model_dir(
            model_dir,
            num_threads=args.threads,
            max_num_seqs=args.max_num_seqs,
            kv_cache_tokens=args.max_num_seqs * (prompt_lens[1] + output_lens[1]),
            max_model_len=prompt_lens[1] + output_lens[1],
        )
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # like ignore_eos: every request runs its full length
    pad_id = engine.tokenizer.token_to_id("<pad>") or 0
    vocab = engine.tokenizer.vocab_size
    work = make_workload(args.requests, prompt_lens, output_lens, vocab, args.seed)
    sample = sorted(
        random.Random(args.seed).sample(range(args.requests), min(args.sequential_sample, args.requests))
    )
    warm = make_workload(2, (8, 16), (2, 4), vocab, args.seed + 1)
    steps = 16 if args.quick else 64

    runs = []
    with torch.inference_mode():
        engine.generate(warm.prompts, SamplingParams(max_tokens=4, temperature=0.0))
        hf_generate(hf, warm.prompts, 4, pad_id)
        probe = BandwidthProbe(gib=1 if args.quick else 2)
        for i in range(args.repeats):
            print(f"\nround {i + 1} of {args.repeats}")
            runs.append(measure_once(engine, hf, work, sample, static_batches, pad_id, probe, steps))
    del probe

    params = sum(p.numel() for p in engine.model_runner.model.parameters())
    names = list(runs[0]["throughput"])
    tput = {name: median_of(runs, "throughput", name, "tokens_per_s") for name in names}
    tput_cpu = {name: median_of(runs, "throughput", name, "tokens_per_cpu_s") for name in names}
    speedup = {name: median_of(runs, "speedup", name) for name in names if name != "engine"}
    speedup_cpu = {name: median_of(runs, "speedup_cpu_time", name) for name in names if name != "engine"}
    decode = {
        key: median_of(runs, "decode_batch1", key)
        for key, value in runs[0]["decode_batch1"].items()
        if isinstance(value, float | int)
    }
    readers = {
        name: median_of(runs, "decode_batch1", "bandwidth_by_reader_gbs", name)
        for name in runs[0]["decode_batch1"]["bandwidth_by_reader_gbs"]
    }
    best_static = max((n for n in names if n.startswith("hf_static")), key=lambda n: tput_cpu[n])
    targets = {
        "engine_vs_floor": (decode["engine_vs_floor"], TARGET_FLOOR_RATIO, True),
        "hf_step_vs_engine_step": (decode["hf_vs_engine"], TARGET_VS_HF_STEP, False),
        "cpu_time_vs_sequential": (speedup_cpu["hf_sequential"], TARGET_VS_SEQUENTIAL, False),
        "cpu_time_vs_best_static": (speedup_cpu[best_static], TARGET_VS_STATIC, False),
    }
    report = {
        "machine": machine(args.threads, [r["load_average_1m"] for r in runs]),
        "workload": {
            "requests": args.requests,
            "prompt_tokens": prompt_lens,
            "output_tokens": output_lens,
            "total_prompt_tokens": sum(map(len, work.prompts)),
            "total_output_tokens": sum(work.output_lens),
            "engine_max_num_seqs": args.max_num_seqs,
            "static_batch_sizes": static_batches,
            "sequential_sample": len(sample),
            "model_params": params,
            "seed": args.seed,
            "repeats": args.repeats,
        },
        "median": {
            "tokens_per_s": tput,
            "tokens_per_cpu_s": tput_cpu,
            "speedup": speedup,
            "speedup_cpu_time": speedup_cpu,
            "decode_batch1": decode,
        },
        "targets": {
            name: {
                "value": value,
                "target": target,
                "at_most": at_most,
                "met": value <= target if at_most else value >= target,
            }
            for name, (value, target, at_most) in targets.items()
        },
        "runs": runs,
    }

    print(
        f"\nmodel: {params / 1e6:.1f}M params fp32, {cpu_name()}, kernels {fused_ops.cpu_isa()}, "
        f"{args.threads} threads; medians of {args.repeats} round(s)"
    )
    ctx = runs[0]["decode_batch1"]["context_tokens"]
    d = decode
    print(
        f"\nbatch-1 decode floor: a step reads {d['bytes_read'] / 1e6:.1f} MB (matmul weights "
        f"{d['matmul_weight_bytes'] / 1e6:.1f} MB, norms {d['norm_bytes'] / 1e3:.1f} kB, one embedding row "
        f"{d['embedding_row_bytes'] / 1e3:.1f} kB, KV cache of {ctx[0]}-{ctx[1]} tokens "
        f"{d['kv_bytes_mean'] / 1e6:.1f} MB) at {d['bandwidth_gbs']:.1f} GB/s = {d['floor_ms']:.2f} ms"
    )
    print(
        "(read bandwidth, the best of two readers sampled between the engine's steps: "
        + ", ".join(f"{name} {gbs:.1f} GB/s" for name, gbs in readers.items())
        + ")"
    )
    floor_verdict = verdict(d["engine_vs_floor"], TARGET_FLOOR_RATIO, at_most=True)
    print(
        f"engine step {d['engine_ms']:.2f} ms median ({d['engine_best_ms']:.2f} best) = "
        f"{d['engine_vs_floor']:.2f}x the floor ({floor_verdict})"
    )
    print(
        f"transformers step {decode['hf_ms']:.2f} ms = {decode['hf_vs_engine']:.2f}x ours "
        f"({verdict(decode['hf_vs_engine'], TARGET_VS_HF_STEP)})"
    )
    print(
        f"\nworkload: {args.requests} requests, prompts {prompt_lens[0]}-{prompt_lens[1]} tokens, "
        f"outputs {output_lens[0]}-{output_lens[1]} tokens\n"
    )
    print(f"{'method':<48}{'tok/s':>9}{'speedup':>9}{'tok/CPU-s':>11}{'speedup':>9}")
    labels = {
        "engine": f"kubeinfer engine (up to {args.max_num_seqs} sequences)",
        "hf_sequential": f"transformers, one at a time ({len(sample)}/{args.requests} run)",
        **{f"hf_static_{b}": f"transformers, static batches of {b}" for b in static_batches},
    }
    for name in names:
        print(
            f"{labels[name]:<48}{tput[name]:>9.1f}{speedup.get(name, 1.0):>8.2f}x"
            f"{tput_cpu[name]:>11.1f}{speedup_cpu.get(name, 1.0):>8.2f}x"
        )
    print("(speedup: the engine's throughput over that row's; CPU-s: per second of this process's CPU time)")
    print(
        f"per CPU-second: {speedup_cpu['hf_sequential']:.2f}x one at a time "
        f"({verdict(speedup_cpu['hf_sequential'], TARGET_VS_SEQUENTIAL)}), "
        f"{speedup_cpu[best_static]:.2f}x the best static batching, {labels[best_static]} "
        f"({verdict(speedup_cpu[best_static], TARGET_VS_STATIC)})"
    )
    loads = ", ".join(f"{r['load_average_1m']:.1f}" for r in runs)
    print(f"load average (1 min) after each round: {loads} on {os.cpu_count()} CPUs")
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
