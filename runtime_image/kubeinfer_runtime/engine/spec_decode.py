"""Speculative decoding by prompt lookup: draft tokens copied from earlier in the sequence, verified
exactly by the target model in one forward over the draft.

Drafting (as vLLM's n-gram proposer and transformers' prompt_lookup_num_tokens): find the latest
earlier occurrence of the sequence's last n tokens (the longest n in [min_n, max_n] that occurs) in
the prompt and output so far, and propose the k tokens that followed it. An incremental index of
every n-gram's latest end makes that O(new tokens) per step instead of a scan of the whole context.

Verification keeps the target distribution exactly. The draft is deterministic (q is one-hot on the
draft token), so the rejection rule of Leviathan et al. / Chen et al. reduces to: accept draft token
d with probability p(d); on rejection, sample from p with d removed and renormalized; if every draft
token is accepted, sample one more ("bonus") token from the position after the draft. Greedy is the
limit: accept while the draft token is the argmax, then emit the argmax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # sequence.py imports this module
    from kubeinfer_runtime.engine.sequence import Sequence


class NgramIndex:
    """For each n-gram (min_n <= n <= max_n) of a token list: the position just after its latest
    occurrence that has a token after it. Grows with the list (`update`), never rescans it."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}
        self.num_indexed = 0  # n-grams ending before this position are in `latest`

    def update(self, token_ids: list[int]) -> None:
        # An n-gram ending at position end - 1 is indexed once the token at `end` exists, so the
        # sequence's current suffix never matches itself.
        for end in range(max(self.num_indexed, 1), len(token_ids)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.latest[tuple(token_ids[end - n : end])] = end
        self.num_indexed = max(self.num_indexed, len(token_ids))

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix."""
        self.update(token_ids)
        for n in range(min(self.max_n, len(token_ids)), self.min_n - 1, -1):
            start = self.latest.get(tuple(token_ids[-n:]))
            if start is not None:
                return token_ids[start : start + k]
        return []


def verify_greedy(target_ids: list[int], draft: list[int]) -> list[int]:
    """The tokens greedy decoding emits given the target's argmax at each of the len(draft) + 1
    positions: the agreeing draft prefix, then the target's own token at the first disagreement
    (or the bonus token after a fully accepted draft)."""
    out = []
    for target, proposed in zip(target_ids, draft, strict=False):
        out.append(target)
        if target != proposed:
            return out
    out.append(target_ids[len(draft)])
    return out


def verify_sampled(probs: torch.Tensor, draft: list[int], generator: torch.Generator | None) -> list[int]:
    """Rejection sampling of a one-hot draft: `probs` [len(draft) + 1, vocab] is the target's sampling
    distribution (temperature, top-k, top-p applied) at each position. The emitted tokens are
    distributed exactly as sampling one token at a time from the target would be."""
    k = len(draft)
    draft_t = torch.tensor(draft, dtype=torch.long, device=probs.device)
    accept_probs = probs[torch.arange(k, device=probs.device), draft_t]
    uniforms = torch.rand(k, device=probs.device, generator=generator)
    rejected = (uniforms >= accept_probs).nonzero()
    num_accepted = int(rejected[0, 0]) if rejected.numel() else k
    if num_accepted == k:
        return [*draft, int(torch.multinomial(probs[k], 1, generator=generator))]
    # A rejection means u >= p(d) for some u < 1, so p(d) < 1 and the residual has mass left.
    residual = probs[num_accepted].clone()
    residual[draft[num_accepted]] = 0.0  # max(p - q, 0) with q one-hot on the draft token
    return [*draft[:num_accepted], int(torch.multinomial(residual, 1, generator=generator))]


def may_speculate(seq: Sequence) -> bool:
    """Whether `seq` may take a draft this step: it is decoding (its last token is its only one left
    to compute), and nothing about its next token depends on where in the draft it stands: no
    grammar, no penalties over the output so far, no min_tokens still to reach, no logprobs asked."""
    params = seq.params
    return (
        seq.num_computed_tokens + 1 == seq.num_tokens
        and seq.matcher is None
        and params.logprobs is None
        and params.repetition_penalty == 1.0
        and not params.presence_penalty
        and not params.frequency_penalty
        and seq.num_output_tokens >= params.min_tokens
    )


def draft_room(seq: Sequence, k: int, max_model_len: int) -> int:
    """Draft tokens worth proposing: at most k, and no more than the sequence could still emit (a
    verified draft of d tokens emits up to d + 1)."""
    left = min(seq.params.max_tokens - seq.num_output_tokens, max_model_len - seq.num_tokens)
    return max(0, min(k, left - 1))
