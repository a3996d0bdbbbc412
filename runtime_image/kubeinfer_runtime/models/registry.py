"""Which `architectures` (config.json) the engine runs, and how each maps onto a model class."""

from __future__ import annotations

from typing import Any

from kubeinfer_runtime.models.llama import LlamaConfig, LlamaForCausalLM

# Qwen2 is Llama with q/k/v biases; `LlamaConfig.from_hf` reads the flags from the architecture name.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def parse_model_config(hf_config: dict[str, Any]) -> LlamaConfig:
    architectures = hf_config.get("architectures") or []
    if not architectures:
        raise ValueError("config.json has no 'architectures' entry; cannot tell which model this is")
    architecture = architectures[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return LlamaConfig.from_hf(hf_config)


def build_model(config: LlamaConfig) -> LlamaForCausalLM:
    return LlamaForCausalLM(config)
