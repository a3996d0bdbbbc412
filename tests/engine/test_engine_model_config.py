"""Reading config.json and checkpoints: architectures, rope settings, missing weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig as HFLlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from kubeinfer_runtime.models.llama import LlamaConfig, rope_inv_freq
from kubeinfer_runtime.models.loader import load_model, load_model_config
from kubeinfer_runtime.models.registry import parse_model_config

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


def test_unknown_architecture_names_itself_and_the_supported_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"unsupported architecture 'MistralForCausalLM'; supported: "
        r"LlamaForCausalLM, Qwen2ForCausalLM",
    ):
        parse_model_config({**BASE, "architectures": ["MistralForCausalLM"]})


def test_legacy_and_transformers_5_rope_settings_read_the_same() -> None:
    legacy = LlamaConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": LLAMA3})
    current = LlamaConfig.from_hf({**BASE, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}})
    assert legacy == current
    assert legacy.rope_theta == 500000.0 and legacy.rope_scaling is not None


def test_qwen2_has_qkv_bias_and_llama_follows_attention_bias() -> None:
    qwen2 = LlamaConfig.from_hf({**BASE, "architectures": ["Qwen2ForCausalLM"]})
    assert (qwen2.qkv_bias, qwen2.o_bias) == (True, False)
    llama = LlamaConfig.from_hf({**BASE, "attention_bias": True})
    assert (llama.qkv_bias, llama.o_bias) == (True, True)


def test_unsupported_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        LlamaConfig.from_hf({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        LlamaConfig.from_hf({**BASE, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="use_sliding_window"):
        LlamaConfig.from_hf({**BASE, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True})
    with pytest.raises(ValueError, match=r"config\.json lacks 'intermediate_size'"):
        LlamaConfig.from_hf({k: v for k, v in BASE.items() if k != "intermediate_size"})


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 4.0}])
def test_rope_frequencies_equal_transformers(scaling: dict[str, object] | None) -> None:
    rope = {"rope_theta": 500000.0, **(scaling or {"rope_type": "default"})}
    ours = rope_inv_freq(LlamaConfig.from_hf({**BASE, "rope_parameters": rope}))
    hf_config = HFLlamaConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, rope_parameters=rope)
    torch.testing.assert_close(ours, LlamaRotaryEmbedding(hf_config).inv_freq, rtol=0, atol=0)


def test_missing_weights_are_named(gqa_dir: Path, tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text((gqa_dir / name).read_text())
    weights = load_file(gqa_dir / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    config = load_model_config(tmp_path)
    with pytest.raises(ValueError, match=r"lacks weights: model\.layers\.1\.mlp\.gate_up_proj\.weight#1"):
        load_model(tmp_path, config, torch.float32, torch.device("cpu"))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
