"""Tokenizer wrapper and the tiny model directory: text round trips, streaming, chat templates."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from kubeinfer_runtime.tiny_model import PRESETS, main, make_tiny_model
from kubeinfer_runtime.tokenizer import Tokenizer

TEXT = "Hello 日本語, café 🙂 — the river runs past the old mill."
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What time is it?"},
    {"role": "assistant", "content": "Half past seven."},
    {"role": "user", "content": "Thanks!"},
]


def test_text_round_trips_and_bos_is_added_like_llama(gqa_dir: Path) -> None:
    tokenizer = Tokenizer(gqa_dir)
    ids = tokenizer.encode(TEXT)
    assert ids[0] == tokenizer.bos_token_id == tokenizer.token_to_id("<s>")
    assert tokenizer.encode(TEXT, add_special_tokens=False) == ids[1:]
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.eos_token_id == tokenizer.token_to_id("</s>")


def test_streamed_text_never_splits_a_character(gqa_dir: Path) -> None:
    tokenizer = Tokenizer(gqa_dir)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detokenizer = tokenizer.detokenizer(tokenizer.encode("Prompt:"))
    pieces = [detokenizer.step(i) for i in ids]
    assert "".join(pieces) == TEXT
    assert "" in pieces  # some characters took several byte-level tokens...
    assert all("\ufffd" not in p for p in pieces)  # ...and none was emitted half-done


def test_chat_template_renders_like_transformers(gqa_dir: Path) -> None:
    ours = Tokenizer(gqa_dir).apply_chat_template(MESSAGES)
    theirs = AutoTokenizer.from_pretrained(gqa_dir).apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
    assert (
        not Tokenizer(gqa_dir)
        .apply_chat_template(MESSAGES, add_generation_prompt=False)
        .endswith("assistant\n")
    )


def test_chat_template_can_raise_and_absence_is_an_error(tmp_path: Path) -> None:
    model_dir = make_tiny_model(tmp_path / "m")
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    with pytest.raises(Exception, match="user first"):
        Tokenizer(model_dir).apply_chat_template(MESSAGES)
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(model_dir).apply_chat_template(MESSAGES)


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"bench-60m"}))
def test_every_preset_loads_in_transformers(preset: str, tiny_model_dir: Callable[[str], Path]) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(preset))
    assert type(model).__name__ == PRESETS[preset][0]


def test_cli_writes_a_model_directory_and_rejects_unknown_presets(tmp_path: Path) -> None:
    assert main([str(tmp_path / "m"), "--preset", "llama-tied", "--seed", "3"]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert {p.name for p in (tmp_path / "m").iterdir()} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        make_tiny_model(tmp_path / "x", preset="nope")
