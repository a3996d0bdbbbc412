"""The tiny model's chat template with tools, and each token's exact bytes (logprobs report them)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from kubeinfer_runtime.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_tools_and_tool_turns_render_like_transformers(gqa_dir: Path) -> None:
    ours = Tokenizer(gqa_dir).apply_chat_template(HISTORY, tools=TOOLS)
    theirs = AutoTokenizer.from_pretrained(gqa_dir).apply_chat_template(
        HISTORY, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ours == theirs
    assert ours.count("Be brief.") == 1  # the system turn is folded into the tools' system turn
    assert (
        '"name": "get_weather"' in ours
        and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in ours
    )
    assert "<tool_response>\nsunny\n</tool_response>" in ours


def test_token_bytes_rebuild_any_text(gqa_dir: Path) -> None:
    tokenizer = Tokenizer(gqa_dir)
    text = "café 🙂 日本"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = [tokenizer.token_bytes(i) for i in ids]
    assert b"".join(pieces).decode() == text
    assert any(_is_partial_utf8(p) for p in pieces)  # a byte-level token may split a character
    assert tokenizer.token_bytes(tokenizer.vocab_size + 5) == b""  # a padding id past the vocabulary


def _is_partial_utf8(piece: bytes) -> bool:
    try:
        piece.decode()
    except UnicodeDecodeError:
        return True
    return False
