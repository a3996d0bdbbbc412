"""The engine's token log-probabilities in OpenAI's two shapes: chat's list of entries, and the legacy
completions' parallel lists (tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

from functools import lru_cache

from kubeinfer_runtime.engine.types import TokenLogprob
from kubeinfer_runtime.server.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from kubeinfer_runtime.tokenizer import Tokenizer


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._bytes = lru_cache(maxsize=65536)(tokenizer.token_bytes)

    def _text(self, token_id: int) -> str:
        # A token holding part of a UTF-8 character shows U+FFFD, as OpenAI's do; `bytes` is exact.
        return self._bytes(token_id).decode("utf-8", errors="replace")

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(token=self._text(token_id), logprob=logprob, bytes=list(self._bytes(token_id)))

    def chat(self, logprobs: list[TokenLogprob]) -> ChatLogprobs:
        return ChatLogprobs(
            content=[
                ChatTokenLogprob(
                    **self._top(lp.token_id, lp.logprob).model_dump(),
                    top_logprobs=[self._top(t, v) for t, v in lp.top],
                )
                for lp in logprobs
            ]
        )

    def completion(
        self, token_ids: list[int], logprobs: list[TokenLogprob | None], offset: int
    ) -> CompletionLogprobs:
        """Entries for `token_ids`, whose text starts at character `offset` of the choice's text.

        As in OpenAI's (and vLLM's) legacy shape, each top_logprobs dict also holds the chosen token.
        """
        out = CompletionLogprobs()
        for token_id, lp in zip(token_ids, logprobs, strict=True):
            text = self._text(token_id)
            out.tokens.append(text)
            out.text_offset.append(offset)
            offset += len(text)
            if lp is None:  # a prompt's first token
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(lp.logprob)
            top = {self._text(t): v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            out.top_logprobs.append(top)
        return out
