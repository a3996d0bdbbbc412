"""One request's state as it moves waiting -> running (-> preempted -> waiting ...) -> finished."""

from __future__ import annotations

from enum import Enum, auto
from typing import TYPE_CHECKING

import torch

from kubeinfer_runtime.engine.spec_decode import NgramIndex
from kubeinfer_runtime.engine.types import FinishReason, SamplingParams, TokenLogprob
from kubeinfer_runtime.tokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from kubeinfer_runtime.engine.structured import Matcher


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival_time: float,
        arrival_index: int,
        detokenizer: IncrementalDetokenizer,
        generator: torch.Generator | None,
        index: int = 0,
        matcher: Matcher | None = None,
    ) -> None:
        self.request_id = request_id
        self.index = index  # among the request's n sequences
        self.matcher = matcher  # the grammar's state, when the output is constrained
        self.params = params
        self.priority = priority
        self.arrival_time = arrival_time
        self.arrival_index = arrival_index  # breaks arrival-time ties in submission order
        self.detokenizer = detokenizer
        self.generator = generator  # per-request RNG when params.seed is set
        self.status = SequenceStatus.WAITING
        self.token_ids = list(prompt_token_ids)  # prompt, then outputs
        self.num_prompt_tokens = len(prompt_token_ids)
        # KV state: tokens whose keys/values are in the cache, and the blocks holding them.
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hash of each full block of token_ids, grown lazily
        self.num_cached_blocks = 0  # leading blocks of block_table registered in the prefix cache
        # Speculative decoding: tokens proposed to follow token_ids, verified in the next step (their
        # keys and values are written there, and rolled back where rejected), and the drafter's index.
        self.draft_token_ids: list[int] = []
        self.ngram_index: NgramIndex | None = None
        # Output bookkeeping.
        self.num_cached_prompt_tokens = 0
        self.num_preemptions = 0
        self.output_text = ""
        self.num_text_emitted = 0  # characters of output_text already returned to the caller
        self.finish_reason: FinishReason | None = None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.cumulative_logprob = 0.0
        self.prompt_logprobs: list[TokenLogprob | None] = []  # filled as the prompt is prefilled
        self.prompt_logprobs_sent = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether the prefill must keep the logits of every prompt position (echo + logprobs)."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
