"""Shared helpers for the engine tests (imported by name; pytest puts this directory on sys.path)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.engine.sequence import Sequence
from kubeinfer_runtime.engine.types import SamplingParams


def random_prompts(lengths: list[int], seed: int = 0, shared_prefix: int = 0) -> list[list[int]]:
    """Prompts of the given lengths over ordinary (non-special) token ids; every other prompt starts
    with the same `shared_prefix` tokens so the prefix cache has something to find."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 900, (shared_prefix,), generator=gen).tolist()
    prompts = []
    for i, n in enumerate(lengths):
        head = prefix[:n] if i % 2 else []
        prompts.append(head + torch.randint(5, 900, (n - len(head),), generator=gen).tolist())
    return prompts


def assert_all_blocks_free(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats.num_blocks_free == stats.num_blocks_total
    assert all(count == 0 for count in engine.block_manager.ref_counts)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def make_seq(
    token_ids: list[int], priority: int = 0, arrival: float = 0.0, index: int = 0, max_tokens: int = 16
) -> Sequence:
    """A bare sequence for block-manager and scheduler tests (no detokenizer: they never decode)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Sequence(f"seq-{index}", token_ids, params, priority, arrival, index, None, None)  # type: ignore[arg-type]


class Reference:
    """transformers' greedy continuations and last-position prompt logits for a list of prompts.

    A plain argmax loop over the model's forward (no KV cache): `generate` would add nothing to
    the comparison but seconds of overhead, and min_new_tokens would suppress EOS where the
    engine's ignore_eos only keeps going.
    """

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], max_tokens: int) -> None:
        self.model = model
        self.tokens: list[list[int]] = []
        self.last_logits: list[torch.Tensor] = []
        with torch.inference_mode():
            for prompt in prompts:
                ids = list(prompt)
                for _ in range(max_tokens):
                    logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
                    if len(ids) == len(prompt):
                        self.last_logits.append(logits)
                    ids.append(int(logits.argmax()))
                self.tokens.append(ids[len(prompt) :])

    def logits_along(self, prompt: list[int], continuation: list[int]) -> torch.Tensor:
        """[len(continuation), vocab]: the logits before each continuation token, teacher-forced."""
        with torch.inference_mode():
            ids = torch.tensor([prompt + continuation])
            return self.model(ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()


def prefill_logits(engine: LLMEngine, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Each prompt's last-position logits from one batched prefill step, in prompt order."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    scheduled = engine.scheduler.schedule(now=0.0)
    assert len(scheduled.seqs) == len(prompts)  # one batched prefill of every prompt
    seqs, logits, _ = engine.model_runner.execute(scheduled.seqs, scheduled.num_new_tokens)
    by_request = {int(seq.request_id): row for seq, row in zip(seqs, logits, strict=True)}
    return [by_request[i] for i in range(len(prompts))]


def references(
    model_dir: Callable[[str], Path], prompts: list[list[int]], max_tokens: int
) -> Callable[[str], Reference]:
    """preset -> transformers' Reference for `prompts` on that preset's weights, made once each."""

    @functools.cache
    def get(preset: str) -> Reference:
        model = AutoModelForCausalLM.from_pretrained(model_dir(preset), dtype=torch.float32)
        return Reference(model, prompts, max_tokens)

    return get
