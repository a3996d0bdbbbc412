"""The model's tokenizer: `tokenizers` for the text <-> ids work, jinja2 for the chat template.

Reads a Hugging Face model directory: tokenizer.json (required), tokenizer_config.json (special tokens,
chat template) and, as newer transformers write it, chat_template.jinja.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import llguidance
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

# How many prompt ids seed a detokenizer: enough context for decoders that treat the first token
# specially (SentencePiece's leading space), few enough to cost nothing.
_DETOKENIZER_CONTEXT_IDS = 4


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def _compile_chat_template(source: str) -> jinja2.Template:
    # The same environment transformers renders chat templates in, so templates behave identically.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _read_chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return template


class IncrementalDetokenizer:
    """Turns ids into text one id at a time, never splitting a multi-byte character."""

    def __init__(
        self, tokenizer: HFTokenizer, prompt_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(
            ids=prompt_ids[-_DETOKENIZER_CONTEXT_IDS:], skip_special_tokens=skip_special_tokens
        )

    def step(self, token_id: int) -> str:
        """The text `token_id` completes; "" while a character is still partial."""
        return self._stream.step(self._tokenizer, token_id) or ""


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model directory {model_dir}")
        self.path = path
        self._tokenizer = HFTokenizer.from_file(str(path))
        self._bytes_tokenizer: llguidance.LLTokenizer | None = None
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.bos_token: str | None = _token_text(config.get("bos_token"))
        self.eos_token: str | None = _token_text(config.get("eos_token"))
        self.bos_token_id = self.token_to_id(self.bos_token)
        self.eos_token_id = self.token_to_id(self.eos_token)
        self.chat_template: str | None = _read_chat_template(model_dir, config)
        self._compiled_template: jinja2.Template | None = None

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes of one token (a byte-level token may be part of a UTF-8 character)."""
        if self._bytes_tokenizer is None:
            # llguidance (also the grammar engine) knows each token's bytes for every tokenizer kind.
            self._bytes_tokenizer = llguidance.LLTokenizer(str(self.path))
        if not 0 <= token_id < self._bytes_tokenizer.vocab_size:
            return b""  # a padding id past the tokenizer's vocabulary
        return self._bytes_tokenizer.decode_bytes([token_id])

    def detokenizer(self, prompt_ids: list[int], skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self._tokenizer, prompt_ids, skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render `messages` to prompt text; encode it with add_special_tokens=False (it has its BOS)."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template (tokenizer_config.json has no 'chat_template')")
        if self._compiled_template is None:
            self._compiled_template = _compile_chat_template(self.chat_template)
        return self._compiled_template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )
