"""The bytes a decode step reads (models/roofline.py), counted from the model's shape by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.models.roofline import decode_step_bytes

# tiny presets: hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads; the vocabulary is
# the tokenizer's (935 entries).
H, INTER, LAYERS, Q, KV, VOCAB = 64, 128, 2, 64, 32, 935
LAYER_WEIGHTS = H * (Q + 2 * KV) + Q * H + 3 * H * INTER
LAYER_ROWS = (Q + 2 * KV) + H + 2 * INTER + H
KV_PER_TOKEN = 2 * LAYERS * KV  # K and V of every layer, head_dim x kv_heads = 32 values each


@pytest.mark.parametrize(
    ("settings", "weight_bytes", "scale_rows"),
    [({}, 4, 0), ({"dtype": "bfloat16"}, 2, 0), ({"quantization": "int8"}, 1, LAYERS * LAYER_ROWS + VOCAB)],
    ids=["float32", "bfloat16", "int8"],
)
def test_untied_step_streams_matmul_weights_and_reads_one_embedding_row_per_sequence(
    make_engine: Callable[..., LLMEngine], settings: dict, weight_bytes: int, scale_rows: int
) -> None:
    engine = make_engine(**settings)
    assert engine.model_config.vocab_size == VOCAB
    dtype = engine.model_runner.dtype
    read = decode_step_bytes(engine.model_runner.model, [10, 30], dtype)
    assert read.matmul_weights == (LAYERS * LAYER_WEIGHTS + VOCAB * H) * weight_bytes + scale_rows * 4
    assert read.norms == (2 * LAYERS + 1) * H * dtype.itemsize
    assert read.embedding_rows == 2 * H * dtype.itemsize  # two sequences, one row each
    assert read.kv_cache == 40 * KV_PER_TOKEN * dtype.itemsize
    assert read.total == read.matmul_weights + read.norms + read.embedding_rows + read.kv_cache


def test_a_tied_head_streams_the_table_once_and_no_row_is_counted_twice(
    make_engine: Callable[..., LLMEngine],
) -> None:
    read = decode_step_bytes(make_engine("llama-tied").model_runner.model, [5], torch.float32)
    assert read.matmul_weights == (LAYERS * LAYER_WEIGHTS + VOCAB * H) * 4
    assert read.embedding_rows == 0
