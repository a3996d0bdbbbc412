"""The engine's public data types: what the server hands in and what it gets back.

This file is the contract between the engine (``llm_engine.py`` and friends) and the HTTP server;
it holds plain dataclasses only, so importing it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal


class FinishReason(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context length reached
    ABORT = "abort"  # aborted by the caller (client went away, queue timeout, drain)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS and stop tokens are masked out until this many tokens are out
    repetition_penalty: float = 1.0  # vLLM's (CTRL's): >1 discourages every token already seen
    # OpenAI's: subtracted from the logit of every token already in the output, once (presence) and
    # per occurrence (frequency).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    skip_special_tokens: bool = True  # in the output text
    # Log-probabilities, from the model's raw logits (before temperature, penalties or a grammar's
    # mask, as vLLM reports them): None is off, k >= 0 adds the k most likely tokens to each one.
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for every prompt token after the first
    n: int = 1  # sequences sampled from the one prompt, which is prefilled once
    grammar: Grammar | None = None  # constrains every output token (structured outputs)


@dataclass(frozen=True)
class Grammar:
    """A constraint on the output, in a form llguidance compiles (see engine/structured.py)."""

    kind: Literal["json_schema", "json_object", "lark", "regex"]
    source: str  # the JSON schema as JSON text, the Lark grammar or the regular expression


@dataclass(frozen=True)
class TokenLogprob:
    """One position's log-probability and, if asked for, its most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass
class RequestOutput:
    """What one ``step()`` produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # detokenized delta; a stop string and anything after it never appear
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_prompt_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int
    # Timings (time.monotonic()): set once known.
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # the times of new_token_ids
    index: int = 0  # which of the request's n sequences this is
    request_finished: bool = True  # every one of the request's sequences has finished
    new_logprobs: list[TokenLogprob] = field(default_factory=list)  # of new_token_ids, if asked for
    # Once, with a sequence's first output, if asked for: None for the first prompt token.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    cumulative_logprob: float = 0.0  # of the output so far (tracked when logprobs are asked for)


@dataclass
class EngineStats:
    """A snapshot for /metrics and /ready."""

    num_waiting: int
    num_running: int
    oldest_waiting_age_s: float
    kv_usage: float  # used blocks / total blocks, 0..1
    num_blocks_total: int
    num_blocks_free: int
    kv_capacity_tokens: int
    prefix_cache_queries_total: int  # prompt tokens looked up
    prefix_cache_hits_total: int  # prompt tokens found
    preemptions_total: int
    spec_draft_tokens_total: int = 0  # draft tokens verified (speculative decoding)
    spec_accepted_tokens_total: int = 0  # of those, accepted
