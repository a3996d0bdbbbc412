"""Tiny random-weight Llama-family model directories, for tests, demos and benchmarks.

A directory looks exactly like one downloaded from the Hugging Face hub (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with a ChatML template, generation_config.json), so the engine,
the server and `transformers` all load it the same way. The tokenizer is a real byte-level BPE trained
on a built-in English text, so any text round-trips.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
TOKENIZER_VOCAB_SIZE = 1024

# ChatML, with tools rendered as Hermes / Qwen2.5 templates do: the signatures in the system turn,
# calls as <tool_call>{"name": ..., "arguments": ...}</tool_call>, results as <tool_response> turns.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call functions. Their signatures, in <tools></tools>:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    '{{ \'\\n</tools>\\n\\nFor each call, write <tool_call>\\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{ '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ call['function']['arguments'] | tojson }}{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
# Preset -> (architecture, config fields). Each covers one model feature the engine must get right.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-mha": ("LlamaForCausalLM", {**_TINY, "num_key_value_heads": 4}),
    "llama-gqa": ("LlamaForCausalLM", _TINY),
    "llama-tied": ("LlamaForCausalLM", {**_TINY, "tie_word_embeddings": True}),
    "llama3-rope": (
        "LlamaForCausalLM",
        {
            **_TINY,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        },
    ),
    "qwen2-bias": ("Qwen2ForCausalLM", _TINY),
    # ~58M parameters: the CPU benchmark model. Its vocabulary is padded past the tokenizer's, as real
    # checkpoints often are, so the embedding and LM head weigh what a real small model's do.
    "bench-60m": (
        "LlamaForCausalLM",
        {
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "max_position_embeddings": 2048,
            "vocab_size": 32000,
        },
    ),
}

_TRAINING_TEXT = """\
The river runs past the old mill and under the stone bridge before it reaches the sea. In the morning
the fishermen pull their boats onto the beach, and children run along the water to look for shells.
A small train climbs the hill behind the town twice a day. It carries letters, bread, tools and people
who work in the valley. When the weather is clear you can see the mountains from the last station,
white with snow even in the middle of summer.
The library opens at nine o'clock. Students read quietly at long wooden tables, and the librarian
keeps a list of every book that leaves the building. Some of the books are older than the town
itself; their pages are thin and yellow, and they smell of dust and glue.
Computers answer questions by turning words into numbers. A model reads a prompt one token at a time,
keeps a cache of what it has already seen, and predicts the next token again and again until it
reaches a stop. Serving many users at once means batching their requests together, sharing memory,
and deciding who goes first when the machine is busy. Latency is the time a user waits; throughput
is how much work the machine finishes each second. Good systems measure both, and they measure the
slow requests as carefully as the fast ones, because a promise about the ninety-fifth percentile is
only kept if someone checks it.
Bakers start work long before sunrise. They mix flour, water, salt and yeast, fold the dough, let it
rest, and shape it into loaves. The ovens are hot by four o'clock, and by six the first customers
are waiting at the door with baskets and coins. On holidays the bakery makes sweet bread with honey,
nuts and dried fruit, and the queue reaches the corner of the street.
Questions and answers: What time is it? It is half past seven. Where are you going? I am going to the
market to buy apples, carrots, potatoes and a little cheese. How much does it cost? Three dollars and
fifty cents. Thank you very much! You are welcome. Please write to me when you arrive, and tell me
everything about the journey, the weather, the food and the people you meet.
Numbers: zero, one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty,
thirty, forty, fifty, hundred, thousand, million. 0 1 2 3 4 5 6 7 8 9 10 42 100 256 512 1024 2048.
"""


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE (the GPT-2 / Llama 3 / Qwen kind) that adds <s> in front like Llama's does."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT.splitlines(), trainer=trainer)
    bos_id = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    return tokenizer


def _hf_config(architecture: str, fields: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "qwen2" if architecture == "Qwen2ForCausalLM" else "llama",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": tokenizer.get_vocab_size(),
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"),
        "pad_token_id": tokenizer.token_to_id("<pad>"),
        "torch_dtype": "float32",
        **fields,
    }
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    if architecture == "LlamaForCausalLM":
        config.setdefault("attention_bias", False)
        config.setdefault("mlp_bias", False)
    return config


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Weights scaled so activations stay near unit size and logits are far from ties."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    qwen2 = config["architectures"][0] == "Qwen2ForCausalLM"

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) / in_features**0.5

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hidden, generator=gen)

    weights = {"model.embed_tokens.weight": torch.randn(config["vocab_size"], hidden, generator=gen)}
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        weights[prefix + "input_layernorm.weight"] = norm()
        weights[prefix + "post_attention_layernorm.weight"] = norm()
        for name, out_features in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            weights[prefix + f"self_attn.{name}.weight"] = linear(out_features, hidden)
            if qwen2 or config.get("attention_bias"):
                weights[prefix + f"self_attn.{name}.bias"] = 0.5 * torch.randn(out_features, generator=gen)
        weights[prefix + "self_attn.o_proj.weight"] = linear(hidden, q_out)
        if config.get("attention_bias") and not qwen2:
            weights[prefix + "self_attn.o_proj.bias"] = 0.5 * torch.randn(hidden, generator=gen)
        weights[prefix + "mlp.gate_proj.weight"] = linear(inter, hidden)
        weights[prefix + "mlp.up_proj.weight"] = linear(inter, hidden)
        weights[prefix + "mlp.down_proj.weight"] = linear(hidden, inter)
    weights["model.norm.weight"] = norm()
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = linear(config["vocab_size"], hidden)
    return weights


def make_tiny_model(out_dir: str | Path, preset: str = "llama-gqa", seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight model directory for `preset`; `overrides` replace config.json fields."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    architecture, fields = PRESETS[preset]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = _hf_config(architecture, {**fields, **overrides}, tokenizer)
    if config["vocab_size"] < tokenizer.get_vocab_size():
        raise ValueError(
            f"vocab_size {config['vocab_size']} is smaller than the tokenizer's {tokenizer.get_vocab_size()}"
        )
    save_file(_random_weights(config, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": config["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": [config["eos_token_id"], tokenizer.token_to_id("<|im_end|>")],
        "pad_token_id": config["pad_token_id"],
    }
    (out / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kubeinfer-runtime make-tiny-model", description="Write a tiny random-weight model directory."
    )
    parser.add_argument("dir", type=Path, help="output directory (created if missing)")
    parser.add_argument("--preset", default="llama-gqa", choices=list(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = make_tiny_model(args.dir, preset=args.preset, seed=args.seed)
    print(f"wrote {args.preset} model to {path}")
    return 0
