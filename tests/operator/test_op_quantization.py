"""spec.model.quantization: rendered to the runtime's flag, counted by the KV check and `kubeinfer plan`."""

from __future__ import annotations

import copy
import json

import pytest
from op_fixtures import OWNER, example, spec_of

from kubeinfer_operator.bench.plan_command import main as plan_main
from kubeinfer_operator.capacity import GIB, ModelShape, plan
from kubeinfer_operator.kv_capacity import check, device_memory, model_shape
from kubeinfer_operator.render import render_pod_template
from kubeinfer_operator.settings import Settings

SETTINGS = Settings(runtime_image="registry.example/kubeinfer-runtime:1.2.3")


def quantized(manifest: dict) -> dict:
    manifest = copy.deepcopy(manifest)
    manifest["spec"]["model"]["quantization"] = "int8"
    return manifest


def _args(manifest: dict) -> list[str]:
    pod = render_pod_template(OWNER, spec_of(manifest), SETTINGS).template
    (container,) = pod["spec"]["containers"]
    return container["args"]


def test_int8_is_rendered_as_the_runtime_flag_and_absent_by_default() -> None:
    args = _args(quantized(example("tiny-cpu.yaml")))
    assert args[args.index("--quantization") + 1] == "int8"
    assert "--quantization" not in _args(example("tiny-cpu.yaml"))


def test_int8_weights_of_llama_3_8b_are_one_byte_per_matmul_weight() -> None:
    shape = ModelShape.named("llama-3-8b")
    # Matmul weights: 32 layers x (4096 x 6144 qkv + 4096 x 4096 o + 3 x 4096 x 14336 mlp) + the
    # untied 128256 x 4096 head = 7,504,658,432 at 1 byte; the rest (embedding table, norms) in bf16;
    # a float32 scale per output row: 32 x (6144 + 4096 + 2 x 14336 + 4096) + 128256 rows.
    matmul, rows = 7_504_658_432, 32 * (6144 + 4096 + 2 * 14336 + 4096) + 128256
    expected = matmul + (shape.param_count() - matmul) * 2 + rows * 4
    assert shape.weight_bytes("bfloat16", "int8") == expected
    assert shape.weight_bytes("bfloat16") == 2 * shape.param_count()
    p8, p16 = (plan(shape, 80 * GIB, context_length=8192, quantization=q) for q in ("int8", None))
    assert p8.weights_bytes == expected and p8.quantization == "int8"
    assert p8.kv_budget_bytes - p16.kv_budget_bytes == p16.weights_bytes - p8.weights_bytes
    assert p8.kv_tokens > p16.kv_tokens


def test_a_tied_head_stays_in_the_model_dtype() -> None:
    tied = ModelShape.named("llama-3.2-1b")
    untied = ModelShape(**{**tied.__dict__, "tie_word_embeddings": False})
    head = tied.vocab_size * tied.hidden_size
    # Untying adds a head the size of the embedding table: 1 byte + a scale per row when quantized.
    assert untied.weight_bytes("bfloat16", "int8") - tied.weight_bytes("bfloat16", "int8") == (
        head + tied.vocab_size * 4
    )


def test_kv_check_counts_the_smaller_weights() -> None:
    manifest = example("llama-8b-gpu.yaml")
    plain, small = spec_of(manifest), spec_of(quantized(manifest))
    (cap16, cond16), (cap8, cond8) = (check(s, model_shape(s), device_memory(s)) for s in (plain, small))
    assert cap8["tokensFit"] > cap16["tokensFit"]
    assert cap8["bytesPerToken"] == cap16["bytesPerToken"]  # weight-only: the KV cache keeps its dtype
    assert "8.0 GiB of weights" in cond8.message and "15.0 GiB of weights" in cond16.message


def test_plan_command_takes_quantization(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    out = tmp_path / "plan.json"
    args = ["--model", "llama-3-8b", "--gpu", "h100-80gb", "--context-length", "8192", "--json", str(out)]
    assert plan_main([*args, "--quantization", "int8"]) == 0
    assert "bfloat16, int8 weights" in capsys.readouterr().out
    quantized_plan = json.loads(out.read_text())["plan"]
    assert plan_main(args) == 0
    plain_plan = json.loads(out.read_text())["plan"]
    assert quantized_plan["weights_bytes"] < plain_plan["weights_bytes"] / 1.8
    assert quantized_plan["quantization"] == "int8" and plain_plan["quantization"] is None
