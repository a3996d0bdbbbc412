"""The engine's public data types: what the server hands in and what it gets back.

This file is the contract between the engine (``llm_engine.py`` and friends) and the HTTP server;
it holds plain dataclasses only, so importing it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


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
