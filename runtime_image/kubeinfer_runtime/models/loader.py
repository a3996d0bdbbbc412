"""Build a model from a Hugging Face directory: config.json picks the class, *.safetensors fill it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm import tqdm

from kubeinfer_runtime.models import fused_ops
from kubeinfer_runtime.models.llama import LlamaConfig, LlamaForCausalLM
from kubeinfer_runtime.models.registry import build_model, parse_model_config

QUANTIZATIONS = ("int8",)  # weight-only schemes `load_model` applies
log = logging.getLogger(__name__)


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in model directory {model_dir}")
    return json.loads(path.read_text())


def load_model_config(model_dir: str | Path) -> LlamaConfig:
    return parse_model_config(read_hf_config(model_dir))


def load_model(
    model_dir: str | Path,
    config: LlamaConfig,
    dtype: torch.dtype,
    device: torch.device,
    cpu_threads: int = 1,
    quantization: str | None = None,
) -> LlamaForCausalLM:
    """The model in `dtype` on `device`; with quantization "int8" its matmul weights are quantized as
    they are loaded (symmetric, one scale per output row, see `fused_ops.quantize_int8`)."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in model directory {model_dir}")
    # Build on the meta device so no memory is touched until the checkpoint's tensors arrive.
    with torch.device("meta"):
        model = build_model(config).to(dtype)
    model.to_empty(device=device)
    model.tie_weights()
    filled: set[str] = set()
    handles = [safe_open(str(f), framework="pt", device=str(device)) for f in files]
    total = sum(len(h.keys()) for h in handles)
    with tqdm(total=total, desc=f"Loading {Path(model_dir).name}", unit="tensor") as bar:
        for path, handle in zip(files, handles, strict=True):
            bar.set_postfix_str(path.name)
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                filled |= model.load_weights([(name, handle.get_tensor(name))])
                bar.update()
    missing = model.expected_weights() - filled
    if missing:
        raise ValueError(f"checkpoint in {model_dir} lacks weights: {', '.join(sorted(missing)[:8])}")
    if quantization == "int8":
        # After the whole checkpoint is in: fused q/k/v and gate/up rows arrive from separate tensors.
        # Each row's scale depends on that row alone, so the order of the shards does not matter.
        model.quantize_int8()
    if device.type == "cpu":
        with torch.no_grad():
            for param in model.parameters():  # a tied head shares its parameter: moved once
                param.data = fused_ops.on_huge_pages(param.data)
        model.pack_for_cpu(cpu_threads)
    weight_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    log.info(
        "weights: %.1f MiB (%s%s) on %s",
        weight_bytes / 2**20,
        str(dtype).removeprefix("torch."),
        f", {quantization} matmul weights" if quantization else "",
        device,
    )
    return model.eval()
