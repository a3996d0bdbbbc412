"""Structured outputs: a grammar (a JSON schema, any JSON object, Lark, a regex) as a per-step token mask.

llguidance compiles the grammar lazily and computes each step's mask in tens of microseconds on
CPU, with no per-schema precompilation that would stall the step loop for a new schema (see
docs/notes/issue-21.md for the measurements that picked it over xgrammar and outlines-core). It
reads tokenizer.json directly, so the runtime needs no `transformers`.
"""

from __future__ import annotations

import json

import llguidance
import llguidance.torch
import torch

from kubeinfer_runtime.engine.types import Grammar

# Compact JSON: no whitespace between tokens, or a random model would pad forever.
_JSON_OPTIONS = {"whitespace_flexible": False}
_ANY_JSON_OBJECT = {"type": "object"}
_BITS = torch.arange(8, dtype=torch.uint8)
_EXECUTOR = llguidance.LLExecutor()  # computes a batch's masks on a pool of threads (see allowed_tokens)


class GrammarError(ValueError):
    """The grammar cannot be compiled (an unsupported or invalid schema)."""


def _grammar_text(grammar: Grammar) -> str:
    if grammar.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(_ANY_JSON_OBJECT), defaults=_JSON_OPTIONS
        )
    if grammar.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(grammar.source, defaults=_JSON_OPTIONS)
    if grammar.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    return llguidance.LLMatcher.grammar_from_lark(grammar.source)


class Matcher:
    """One sequence's position in its grammar: which tokens may come next, and where it ends."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    @property
    def llmatcher(self) -> llguidance.LLMatcher:
        return self._matcher

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}: {self._matcher.get_error()}")

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and only an end of sequence may follow."""
        return self._matcher.is_stopped()

    def fork(self) -> Matcher:
        return Matcher(self._matcher.deep_copy())


class GrammarCompiler:
    """Built once per engine from the model's tokenizer.json; hands each constrained sequence a Matcher."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos_token_ids)
        self.vocab_size = vocab_size

    def matcher(self, grammar: Grammar) -> Matcher:
        try:
            text = _grammar_text(grammar)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {grammar.kind}: {exc}") from exc
        matcher = llguidance.LLMatcher(self.tokenizer, text)
        if matcher.is_error():
            raise GrammarError(f"invalid {grammar.kind}: {matcher.get_error()}")
        return Matcher(matcher)


def allowed_tokens(matchers: list[Matcher], vocab_size: int, parallel: bool = False) -> torch.Tensor:
    """[len(matchers), vocab_size] bool: the tokens each grammar allows next.

    `parallel` spreads the batch over llguidance's thread pool: right for a GPU step, whose CPU cores
    are idle; on CPU, torch's OpenMP threads still spin on every core just after the forward pass,
    and the pool's threads fighting them made the masks some 50x slower than one thread's loop.
    """
    bitmask = llguidance.torch.allocate_token_bitmask(len(matchers), vocab_size)
    if parallel:
        rows = [(matcher.llmatcher, row) for row, matcher in enumerate(matchers)]
        llguidance.torch.fill_next_token_bitmask_par(_EXECUTOR, rows, bitmask)
    else:
        for row, matcher in enumerate(matchers):
            llguidance.torch.fill_next_token_bitmask(matcher.llmatcher, bitmask, row)
    # Bit i of 32-bit word w is token 32w + i: on a little-endian machine, bit i of byte j is token
    # 8j + i. Shifting bytes is also some 400x faster than shifting int32 words on CPU.
    bits = (bitmask.view(torch.uint8)[:, :, None] >> _BITS) & 1
    return bits.flatten(1)[:, :vocab_size].bool()
