"""Iteration-level scheduling: which sequences run in the next step, and how many tokens each.

Like vLLM's scheduler there are no separate prefill and decode phases, just one token budget per
step: running sequences are served first (a decode costs one token, an unfinished prompt its next
chunk), then waiting ones are admitted while budget, sequence slots and KV blocks last. When a
running sequence needs a block and none is free, the least important running sequence (lowest
priority, latest arrival) is preempted: its blocks are freed and it is recomputed later.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from kubeinfer_runtime.engine.block_manager import BlockManager
from kubeinfer_runtime.engine.config import EngineConfig
from kubeinfer_runtime.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens each sequence computes this step


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.by_priority = config.scheduling_policy == "priority"
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # kept sorted, most important first
        self.running: list[Sequence] = []
        self.prefix_cache_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found
        self.num_preemptions = 0

    def order(self, seq: Sequence) -> tuple[int, float, int]:
        """Sort key: most important first. FCFS ignores priority; both break ties by arrival."""
        return (seq.priority if self.by_priority else 0, seq.arrival_time, seq.arrival_index)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=self.order)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.draft_token_ids.clear()
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=self.order)
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            pending = seq.num_tokens - seq.num_computed_tokens
            # A draft (speculative decoding) rides along with its sequence's last token, cut to the
            # budget; when blocks are short it is dropped before anyone is preempted for it.
            del seq.draft_token_ids[max(budget - pending, 0) :]
            num_new = min(pending + len(seq.draft_token_ids), budget)
            allocated = self.block_manager.allocate(seq, seq.num_computed_tokens + num_new)
            if seq.draft_token_ids and not allocated:
                seq.draft_token_ids.clear()
                num_new = min(pending, budget)
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + num_new):
                victim = self.running.pop()  # sorted, so this is the least important one
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            out.seqs.append(seq)
            out.num_new_tokens.append(num_new)
            budget -= num_new
            i += 1

        # Admitting new work right after preempting would only thrash the cache.
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.block_manager.lookup(seq)
            num_cached = len(hits) * self.block_manager.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self.block_manager.allocate(seq, num_cached + num_new, hits):
                break
            self.waiting.pop(0)
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
                seq.num_cached_prompt_tokens = num_cached
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += num_cached
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.seqs.append(seq)
            out.num_new_tokens.append(num_new)
            budget -= num_new
        return out
