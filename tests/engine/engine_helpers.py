"""Shared helpers for the engine tests (imported by name; pytest puts this directory on sys.path)."""

from __future__ import annotations

import torch

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
