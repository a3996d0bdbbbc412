"""What happens to a step's logits around sampling: log-probabilities read from the raw logits, then
the per-request rules (repetition penalty, min_tokens, a grammar's mask) applied before sampling."""

from __future__ import annotations

import torch

from kubeinfer_runtime.engine.sequence import Sequence
from kubeinfer_runtime.engine.structured import allowed_tokens
from kubeinfer_runtime.engine.types import TokenLogprob


def token_logprobs(logprobs: torch.Tensor, token_ids: list[int], num_top: list[int]) -> list[TokenLogprob]:
    """Row i's log-probability of token_ids[i] and its num_top[i] most likely tokens.

    `logprobs` [rows, vocab] is log_softmax of float32 logits.
    """
    chosen = logprobs.gather(1, torch.tensor(token_ids, device=logprobs.device)[:, None])[:, 0].tolist()
    k = max(num_top, default=0)
    if k == 0:
        return [TokenLogprob(t, c) for t, c in zip(token_ids, chosen, strict=True)]
    values, ids = (part.tolist() for part in logprobs.topk(k, dim=-1))
    return [
        TokenLogprob(t, c, tuple(zip(ids[i][:n], values[i][:n], strict=True)))
        for i, (t, c, n) in enumerate(zip(token_ids, chosen, num_top, strict=True))
    ]


def constrain(
    logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int], parallel_masks: bool = False
) -> torch.Tensor:
    """Row i of `logits` (sequence seqs[i]'s next token) after its request's rules (penalties,
    min_tokens, a grammar's mask); the input is kept.

    `parallel_masks`: compute the grammars' masks on a thread pool (see `allowed_tokens`)."""
    penalized = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
    counted = [i for i, s in enumerate(seqs) if s.params.presence_penalty or s.params.frequency_penalty]
    # A grammar decides by itself when the output may end, so min_tokens leaves its rows alone.
    too_short = [
        i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens and s.matcher is None
    ]
    constrained = [i for i, s in enumerate(seqs) if s.matcher is not None]
    if not (penalized or counted or too_short or constrained):
        return logits
    logits = logits.float().clone()
    for i in penalized:
        # vLLM's rule over prompt and output tokens: positive logits are divided, negative multiplied.
        seen = torch.tensor(seqs[i].token_ids, device=logits.device).unique()
        values, penalty = logits[i, seen], seqs[i].params.repetition_penalty
        logits[i, seen] = torch.where(values > 0, values / penalty, values * penalty)
    for i in counted:
        params, vocab = seqs[i].params, logits.shape[-1]
        output = torch.tensor(seqs[i].output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.bincount(output, minlength=vocab)[:vocab].to(logits.dtype)
        logits[i] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    for i in too_short:
        ends = sorted(eos_token_ids | set(seqs[i].params.stop_token_ids))
        logits[i, ends] = float("-inf")
    if constrained:
        vocab = logits.shape[-1]
        allowed = allowed_tokens([seqs[i].matcher for i in constrained], vocab, parallel_masks)  # type: ignore[misc]
        index = torch.tensor(constrained, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits
