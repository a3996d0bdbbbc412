"""Choosing each sequence's next token from its logits: greedy, or temperature / top-k / top-p sampling.

Sampling uses the exponential race (argmax of p / E with E ~ Exp(1) draws the same distribution as
multinomial), so each row can take its noise from its own generator: a request with a seed gets the
same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from kubeinfer_runtime.engine.types import SamplingParams

GREEDY_TEMPERATURE = 1e-5  # below this, temperature sampling is argmax


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) every logit outside each row's top-k and top-p nucleus."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    sorted_logits.masked_fill_(rank[None, :] >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Keep a token while the mass before it is below top_p: the most likely one always survives.
    outside_nucleus = probs.cumsum(dim=-1) - probs > top_p[:, None]
    sorted_logits.masked_fill_(outside_nucleus, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each row [rows, vocab] samples from: softmax of logits / temperature over
    its top-k and top-p nucleus. Every row must sample (temperature >= GREEDY_TEMPERATURE)."""
    device, vocab = logits.device, logits.shape[-1]
    scaled = logits.float() / torch.tensor([p.temperature for p in params], device=device)[:, None]
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        scaled = _top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(dim=-1)


@torch.inference_mode()
def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    default_generator: torch.Generator,
) -> list[int]:
    """One token per row of `logits` [rows, vocab]; `generators[i]` is row i's own RNG, if seeded."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if p.temperature >= GREEDY_TEMPERATURE]
    if not rows:
        return tokens.tolist()
    index = torch.tensor(rows, device=logits.device)
    probs = sampling_probs(logits[index], [params[i] for i in rows])
    noise = torch.empty_like(probs).exponential_(generator=default_generator)
    for row, i in enumerate(rows):
        if generators[i] is not None:
            noise[row].exponential_(generator=generators[i])
    tokens[index] = (probs / noise).argmax(dim=-1)
    return tokens.tolist()
