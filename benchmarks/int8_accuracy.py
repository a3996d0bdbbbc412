"""How far weight-only int8 (and, for scale, bfloat16) moves the engine's next-token distributions
from float32, on the oracle prompts of tests/engine/test_engine_vs_transformers.py.

For each model: float32 generates 32 greedy tokens per prompt; then both engines score the prompt
plus that continuation in one teacher-forced prefill, and at each of the 32 positions we take
KL(p_fp32 || p_variant) of the next-token distributions and whether the argmax agrees. Free-running
greedy agreement: the variant's own 32 greedy tokens against float32's (identical sequences, and the
mean length of the common prefix). Random-weight models (the tiny presets and bench-60m): their
distributions are flatter than a trained model's, so these are numbers about the arithmetic, not
about a real model's quality.

Usage: python benchmarks/int8_accuracy.py [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from engine_throughput import write_report

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.types import SamplingParams
from kubeinfer_runtime.models.attention import AttentionBatch, PrefillSpan
from kubeinfer_runtime.tiny_model import make_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
from test_engine_vs_transformers import PROMPTS  # the oracle prompts themselves

PRESETS = ["llama-gqa", "llama-mha", "llama-tied", "qwen2-bias", "llama3-rope", "bench-60m"]
VARIANTS = {"int8": {"quantization": "int8"}, "bf16": {"dtype": "bfloat16"}}
TOKENS = 32


def teacher_forced_logits(engine: LLMEngine, tokens: list[int], first_row: int) -> torch.Tensor:
    """float32 logits [len(tokens) - first_row, vocab] at rows first_row.. of one prefill of `tokens`
    (written to cache slots 0.., so the engine must be idle and keep no prefix cache)."""
    runner = engine.model_runner
    n = len(tokens)
    batch = AttentionBatch(
        slot_mapping=torch.arange(n),
        cos=runner.cos[:n],
        sin=runner.sin[:n],
        block_size=runner.block_size,
        num_decodes=0,
        decode_block_tables=None,
        decode_context_lens=None,
        prefills=[PrefillSpan(0, n, None)],
    )
    with torch.inference_mode():
        return runner.model(torch.tensor(tokens), batch, torch.arange(first_row, n)).float()


def compare(model_dir: Path, settings: dict[str, str]) -> dict[str, float]:
    make = lambda **kw: LLMEngine.from_model_dir(  # noqa: E731
        model_dir, kv_cache_tokens=8192, num_threads=1, enable_prefix_caching=False, **kw
    )
    fp32, variant = make(), make(**settings)
    greedy = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    reference, own = fp32.generate(PROMPTS, greedy), variant.generate(PROMPTS, greedy)
    kls, agree = [], []
    for prompt, continuation in zip(PROMPTS, reference, strict=True):
        # The rows before each of the 32 continuation tokens: the last prompt position onwards.
        tokens, first = prompt + continuation[:-1], len(prompt) - 1
        p = F.log_softmax(teacher_forced_logits(fp32, tokens, first), dim=-1)
        q = F.log_softmax(teacher_forced_logits(variant, tokens, first), dim=-1)
        kls += F.kl_div(q, p, log_target=True, reduction="none").sum(-1).tolist()
        agree += (p.argmax(-1) == q.argmax(-1)).tolist()
    pairs = list(zip(reference, own, strict=True))
    prefixes = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), TOKENS) for x, y in pairs
    ]
    kls_sorted = sorted(kls)
    return {
        "kl_mean": statistics.mean(kls),
        "kl_p95": kls_sorted[int(0.95 * (len(kls) - 1))],
        "kl_max": kls_sorted[-1],
        "kl_first_token_mean": statistics.mean(kls[i * TOKENS] for i in range(len(PROMPTS))),
        "teacher_forced_top1_agreement": sum(agree) / len(agree),
        "greedy_identical_sequences": sum(x == y for x, y in pairs),
        "greedy_mean_common_prefix": statistics.mean(prefixes),
        "positions": len(kls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--presets", nargs="*", default=PRESETS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            model_dir = make_tiny_model(Path(tmp) / preset, preset=preset)
            results[preset] = {name: compare(model_dir, settings) for name, settings in VARIANTS.items()}
    print(f"\n{len(PROMPTS)} oracle prompts x {TOKENS} positions, against float32 (KL in nats)\n")
    print(
        f"{'model':<13}{'variant':<9}{'KL mean':>10}{'KL p95':>10}{'KL max':>10}{'KL 1st tok':>12}"
        f"{'top-1 agree':>13}{'greedy same':>13}{'common prefix':>15}"
    )
    for preset, by_variant in results.items():
        for name, r in by_variant.items():
            print(
                f"{preset:<13}{name:<9}{r['kl_mean']:>10.2e}{r['kl_p95']:>10.2e}{r['kl_max']:>10.2e}"
                f"{r['kl_first_token_mean']:>12.2e}{r['teacher_forced_top1_agreement']:>12.1%}"
                f"{r['greedy_identical_sequences']:>8d} / {len(PROMPTS):<3}"
                f"{r['greedy_mean_common_prefix']:>12.1f}"
            )
    write_report(args.json, {"prompts": len(PROMPTS), "tokens": TOKENS, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
