"""What a grammar's token mask costs per engine step, measured side by side in one run.

Workload: B requests (default 16) decoding together on a random-weight model, free or each
constrained by a JSON schema (nested object, enum, array, bounded values), greedy; the two kinds
of round alternate (after a warm-up) so both see the same machine. Reported:

  step_ms        median over rounds of the mean decode step time with all B sequences running
  grammar_ms     of a constrained step, the CPU time the engine's thread spends on the grammar
                 (building and applying the batch's mask, advancing each matcher): thread CPU time,
                 not wall time, because on a shared machine whole steps vary several-fold between
                 rounds as other processes take the cores
  mask_us        the mask alone (thread CPU time): llguidance's bitmask for one sequence,
                 unpacked to a bool row
  xgrammar_us    the same mask from xgrammar (only when it is installed): the comparison that picked
                 llguidance, with each library's time to compile the schema

Usage: python benchmarks/structured_output_cost.py [--preset bench-60m] [--batch 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kubeinfer_runtime.engine import llm_engine
from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.structured import Matcher, allowed_tokens
from kubeinfer_runtime.engine.types import Grammar, SamplingParams
from kubeinfer_runtime.tiny_model import make_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 6},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}


class GrammarTimer:
    """Accumulates the CPU time the engine's thread spends in the grammar's code (wrapping it)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        constrain, advance = llm_engine.constrain, Matcher.advance

        def timed_constrain(*args: object) -> torch.Tensor:
            start = time.thread_time()
            out = constrain(*args)  # type: ignore[arg-type]
            self.seconds += time.thread_time() - start
            return out

        def timed_advance(matcher: Matcher, token_id: int) -> None:
            start = time.thread_time()
            advance(matcher, token_id)
            self.seconds += time.thread_time() - start

        llm_engine.constrain = timed_constrain  # type: ignore[assignment]
        Matcher.advance = timed_advance  # type: ignore[method-assign]


def full_batch_steps(
    engine: LLMEngine, batch: int, params: SamplingParams, timer: GrammarTimer
) -> tuple[float, float, int]:
    """Over the decode steps that ran all `batch` sequences: mean step time, mean grammar time (ms),
    and how many steps there were."""
    prompt = engine.tokenizer.encode("Describe a person as JSON:")
    for i in range(batch):
        engine.add_request(f"r{i}", prompt, params)
    times, grammar = [], []
    engine.step()  # the prefill
    while engine.has_unfinished_requests():
        running = engine.stats().num_running
        start, in_grammar = time.perf_counter(), timer.seconds
        engine.step()
        if running == batch:
            times.append(time.perf_counter() - start)
            grammar.append(timer.seconds - in_grammar)
    return 1e3 * statistics.mean(times), 1e3 * statistics.mean(grammar), len(times)


def mask_us(engine: LLMEngine, steps: int = 200) -> float:
    """One sequence's mask per step (thread CPU time) along a path through the grammar."""
    matcher = engine.grammars.matcher(Grammar("json_schema", json.dumps(SCHEMA)))
    vocab, times = engine.model_config.vocab_size, []
    for _ in range(steps):
        start = time.thread_time()
        allowed = allowed_tokens([matcher], vocab)
        times.append(time.thread_time() - start)
        matcher.advance(int(allowed[0].nonzero()[-1]))
        if matcher.is_finished:
            break
    return 1e6 * statistics.mean(times)


def xgrammar_us(model_dir: Path, vocab: int, steps: int = 200) -> dict[str, float] | None:
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"), eos_token="</s>")
    start = time.thread_time()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_ms = 1e3 * (time.thread_time() - start)
    matcher, bitmask, times = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, vocab), []
    bits = torch.arange(8, dtype=torch.uint8)
    for _ in range(steps):
        start = time.thread_time()
        matcher.fill_next_token_bitmask(bitmask)
        allowed = ((bitmask.view(torch.uint8)[:, :, None] >> bits) & 1).flatten(1)[:, :vocab].bool()
        times.append(time.thread_time() - start)
        matcher.accept_token(int(allowed[0].nonzero()[-1]))
        if matcher.is_terminated():
            break
    return {"mask_us": 1e6 * statistics.mean(times), "compile_ms": compile_ms}


def llguidance_compile_ms(engine: LLMEngine) -> float:
    start = time.thread_time()
    engine.grammars.matcher(Grammar("json_schema", json.dumps(SCHEMA)))
    return 1e3 * (time.thread_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench-60m")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / args.preset, preset=args.preset)
        engine = LLMEngine.from_model_dir(model_dir, kv_cache_tokens=16384, num_threads=args.threads)
        grammar = Grammar("json_schema", json.dumps(SCHEMA))
        free = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        constrained = SamplingParams(max_tokens=256, temperature=0.0, grammar=grammar)
        timer = GrammarTimer()
        full_batch_steps(engine, args.batch, free, timer)  # warm-up
        rounds: dict[str, list[tuple[float, float, int]]] = {"free": [], "constrained": []}
        for _ in range(args.rounds):
            rounds["free"].append(full_batch_steps(engine, args.batch, free, timer))
            rounds["constrained"].append(full_batch_steps(engine, args.batch, constrained, timer))
        step_ms = {kind: statistics.median(ms for ms, _, _ in runs) for kind, runs in rounds.items()}
        grammar_ms = statistics.median(g for _, g, _ in rounds["constrained"])
        grammar_share = statistics.median(g / ms for ms, g, _ in rounds["constrained"])
        result = {
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared, noisy)",
            "model": f"{args.preset} (random weights, vocab {engine.model_config.vocab_size})",
            "device": str(engine.model_runner.device),
            "batch": args.batch,
            "step_ms": step_ms,
            "grammar_ms_per_step": grammar_ms,
            "grammar_share_of_constrained_step": grammar_share,
            "constrained_over_free": step_ms["constrained"] / step_ms["free"],
            "rounds": {
                kind: [{"step_ms": ms, "grammar_ms": g, "steps": n} for ms, g, n in runs]
                for kind, runs in rounds.items()
            },
            "llguidance": {"mask_us": mask_us(engine), "compile_ms": llguidance_compile_ms(engine)},
            "xgrammar": xgrammar_us(model_dir, engine.model_config.vocab_size),
        }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
