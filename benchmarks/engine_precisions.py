"""The engine in float32, weight-only int8 and bfloat16 on CPU, side by side in one run.

The same checkpoint (default: a fresh bench-60m) loaded once per variant; the variants take turns
step by step (decode) or call by call (prefill), round after round (--repeats), so all of them see
the same machine; medians over the rounds are reported, every round is in the JSON.

  decode-1    the batch-1 decode step (a 128-token prompt), against its floor: the bytes the step
              reads (models/roofline.py) over the read bandwidth sampled between the rounds
  prefill     prompt tokens per second over 4 prompts of 512 tokens in one step (prefix cache off;
              the best of three turns per round)
  decode-64   output tokens per second of 64 sequences decoding together (128-token prompts)

Targets (issue 19): int8's batch-1 step at most 0.35x float32's, its prefill and batch-64
throughput no worse than float32's.

Usage: python benchmarks/engine_precisions.py [--quick] [--repeats N] [--json out.json] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from engine_throughput import BandwidthProbe, cpu_name, machine, write_report

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models import fused_ops
from kubeinfer_runtime.models.roofline import decode_step_bytes
from kubeinfer_runtime.tiny_model import make_tiny_model

VARIANTS: dict[str, dict[str, str]] = {
    "fp32": {},
    "int8": {"quantization": "int8"},
    "bf16": {"dtype": "bfloat16"},
    "bf16-int8": {"dtype": "bfloat16", "quantization": "int8"},
}
TARGET_INT8_STEP = 0.35  # int8 batch-1 step / fp32's, at most
PROMPT, PREFILL_PROMPT, PREFILL_PROMPTS, BATCH = 128, 512, 4, 64


def _prompts(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(5, vocab) for _ in range(length)] for _ in range(n)]


def _start(engine: LLMEngine, prompts: list[list[int]], tag: str) -> list[str]:
    """Requests that decode far longer than measured; stepped until every one is past its prefill."""
    ids = [f"{tag}-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(
            request_id, prompt, SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
        )
    while any(
        seq.num_computed_tokens < len(prompt) for seq, prompt in zip(_seqs(engine, ids), prompts, strict=True)
    ):
        engine.step()
    return ids


def _seqs(engine: LLMEngine, ids: list[str]) -> list:
    return [engine.sequences[i] for i in ids]


def decode_steps(
    engines: dict[str, LLMEngine], prompts: list[list[int]], steps: int
) -> dict[str, tuple[list[float], list[int]]]:
    """Per engine: the times of `steps` decode steps of these sequences together, and the context of
    the first one. The engines take turns step by step, so a burst of load from the machine's other
    users falls on all of them alike."""
    ids = {name: _start(engine, prompts, "decode") for name, engine in engines.items()}
    for engine in engines.values():
        engine.step()  # the first decode after prefills: its logits rows differ
    out: dict[str, tuple[list[float], list[int]]] = {name: ([], []) for name in engines}
    for _ in range(steps):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.step()
            out[name][0].append(time.perf_counter() - start)
            out[name][1].append(_seqs(engine, ids[name])[0].num_computed_tokens)
    for name, engine in engines.items():
        for request_id in ids[name]:
            engine.abort_request(request_id)
    return out


def prefill_seconds(engine: LLMEngine, prompts: list[list[int]]) -> float:
    """One step that prefills every prompt (the budget holds them all), timed alone."""
    ids = [f"prefill-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    start = time.perf_counter()
    engine.step()
    seconds = time.perf_counter() - start
    assert all(seq.num_computed_tokens >= len(p) for seq, p in zip(_seqs(engine, ids), prompts, strict=True))
    for request_id in ids:
        engine.abort_request(request_id)
    return seconds


def measure_round(
    engines: dict[str, LLMEngine], vocab: int, rng: random.Random, probe: BandwidthProbe, steps: int
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {name: {} for name in engines}
    probe.best_gbs, probe.best_by = 0.0, {"sum": 0.0, "kernel": 0.0}  # this round's machine
    probe.sample()
    one = decode_steps(engines, _prompts(1, PROMPT, vocab, rng), steps)
    probe.sample()
    for name, (times, contexts) in one.items():
        model, dtype = engines[name].model_runner.model, engines[name].model_runner.dtype
        read = statistics.mean(decode_step_bytes(model, [c], dtype).total for c in contexts)
        floor_ms = read / probe.best_gbs / 1e6
        median_ms = statistics.median(times) * 1e3
        out[name] |= {
            "decode1_ms": median_ms,
            "decode1_bytes": read,
            "decode1_floor_ms": floor_ms,
            "decode1_vs_floor": median_ms / floor_ms,
        }
    prefill = _prompts(PREFILL_PROMPTS, PREFILL_PROMPT, vocab, rng)
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(3):  # in turns, the best of three: noise only ever adds time
        for name, engine in engines.items():
            seconds[name].append(prefill_seconds(engine, prefill))
    for name, values in seconds.items():
        out[name]["prefill_tokens_per_s"] = PREFILL_PROMPTS * PREFILL_PROMPT / min(values)
    for name, (times, _) in decode_steps(engines, _prompts(BATCH, PROMPT, vocab, rng), steps // 2).items():
        out[name]["decode64_tokens_per_s"] = BATCH / statistics.median(times)
    for metrics in out.values():
        metrics["bandwidth_gbs"] = probe.best_gbs
        metrics["load_average_1m"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model directory (default: a fresh bench-60m tiny model)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps = 8 if args.quick else 32
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or make_tiny_model(Path(tmp) / "bench-60m", preset="bench-60m")
        engines = {
            name: LLMEngine.from_model_dir(
                model_dir,
                num_threads=args.threads,
                max_num_seqs=BATCH,
                max_num_batched_tokens=PREFILL_PROMPTS * PREFILL_PROMPT,
                kv_cache_tokens=BATCH * (PROMPT + steps + 32) + PREFILL_PROMPTS * (PREFILL_PROMPT + 16),
                max_model_len=PREFILL_PROMPT + 64,
                enable_prefix_caching=False,
                **settings,
            )
            for name, settings in VARIANTS.items()
        }
    vocab = next(iter(engines.values())).tokenizer.vocab_size
    rng = random.Random(args.seed)
    probe = BandwidthProbe(gib=1 if args.quick else 2)
    rounds = []
    with torch.inference_mode():
        decode_steps(engines, _prompts(2, 16, vocab, rng), 2)  # warm-up: kernels, allocator, threads
        for i in range(1 if args.quick else args.repeats):
            print(f"round {i + 1}", flush=True)
            rounds.append(measure_round(engines, vocab, rng, probe, steps))
    del probe

    keys = list(rounds[0]["fp32"])
    median = {name: {k: statistics.median(r[name][k] for r in rounds) for k in keys} for name in engines}
    fp32 = median["fp32"]
    ratios = {
        name: {
            "decode1_step": m["decode1_ms"] / fp32["decode1_ms"],
            "prefill_throughput": m["prefill_tokens_per_s"] / fp32["prefill_tokens_per_s"],
            "decode64_throughput": m["decode64_tokens_per_s"] / fp32["decode64_tokens_per_s"],
            "bytes_read": m["decode1_bytes"] / fp32["decode1_bytes"],
        }
        for name, m in median.items()
    }
    int8 = ratios["int8"]
    targets = {
        "int8_decode1_step_vs_fp32": {
            "value": int8["decode1_step"],
            "target": TARGET_INT8_STEP,
            "at_most": True,
        },
        "int8_prefill_vs_fp32": {"value": int8["prefill_throughput"], "target": 1.0, "at_most": False},
        "int8_decode64_vs_fp32": {"value": int8["decode64_throughput"], "target": 1.0, "at_most": False},
    }
    for t in targets.values():
        t["met"] = t["value"] <= t["target"] if t["at_most"] else t["value"] >= t["target"]

    params = sum(p.numel() for p in engines["fp32"].model_runner.model.parameters())
    print(
        f"\n{params / 1e6:.1f}M-parameter model, {cpu_name()}, kernels {fused_ops.cpu_isa()}, {args.threads} "
        f"threads; medians of {len(rounds)} round(s)\n"
    )
    header = f"{'':<10}{'MB/step':>9}{'floor ms':>10}{'decode-1 ms':>13}{'x floor':>9}{'x fp32':>8}"
    print(header + f"{'prefill tok/s':>15}{'x fp32':>8}{'decode-64 tok/s':>17}{'x fp32':>8}")
    for name, m in median.items():
        r = ratios[name]
        print(
            f"{name:<10}{m['decode1_bytes'] / 1e6:>9.1f}{m['decode1_floor_ms']:>10.2f}"
            f"{m['decode1_ms']:>13.2f}"
            f"{m['decode1_vs_floor']:>8.2f}x{r['decode1_step']:>7.2f}x{m['prefill_tokens_per_s']:>15.0f}"
            f"{r['prefill_throughput']:>7.2f}x{m['decode64_tokens_per_s']:>17.0f}{r['decode64_throughput']:>7.2f}x"
        )
    for name, t in targets.items():
        op = "<=" if t["at_most"] else ">="
        print(f"{name}: {t['value']:.2f}x (target {op} {t['target']:g}x: {'met' if t['met'] else 'NOT met'})")
    loads = ", ".join(f"{r['fp32']['load_average_1m']:.1f}" for r in rounds)
    print(
        f"bandwidth {fp32['bandwidth_gbs']:.1f} GB/s (median of the rounds' best); "
        f"load average per round: {loads}"
    )
    report = {
        "machine": machine(args.threads, [r["fp32"]["load_average_1m"] for r in rounds]),
        "workload": {
            "model_params": params,
            "decode1_prompt_tokens": PROMPT,
            "decode_steps": steps,
            "prefill": f"{PREFILL_PROMPTS} x {PREFILL_PROMPT} tokens in one step",
            "decode64": f"{BATCH} sequences of {PROMPT}-token prompts",
            "variants": VARIANTS,
        },
        "median": median,
        "vs_fp32": ratios,
        "targets": targets,
        "rounds": rounds,
    }
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
