"""`kubeinfer plan` and the capacity arithmetic the operator's KV check shares."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kubeinfer_operator.bench.plan_command import main as plan_main
from kubeinfer_operator.capacity import GIB, NAMED_CONFIGS, ModelShape, plan

LLAMA_3_8B = NAMED_CONFIGS["llama-3-8b"]


def test_llama_3_8b_numbers_match_its_published_shape() -> None:
    shape = ModelShape.named("llama-3-8b")
    assert (
        shape.kv_bytes_per_token() == 32 * 8 * 128 * 2 * 2 == 131072
    )  # layers x kv heads x head_dim x K,V x bf16
    assert shape.kv_bytes_per_token("fp8") == 65536
    assert shape.param_count() == 8_030_261_248  # Meta's 8.03 B
    assert ModelShape.named("llama-3-70b").param_count() == pytest.approx(70.55e9, rel=1e-3)
    assert ModelShape.named("llama-3.2-1b").param_count() == pytest.approx(
        1.236e9, rel=1e-3
    )  # tied embeddings
    assert ModelShape.named("qwen2.5-32b").param_count() == 32_763_876_352  # qkv biases included
    assert ModelShape.named("mixtral-8x7b").param_count() == pytest.approx(46.70e9, rel=1e-3)


def test_plan_budgets_memory_left_after_weights_and_reserve() -> None:
    shape = ModelShape.named("llama-3-8b")
    p = plan(shape, 80 * GIB, context_length=8192, avg_seq_tokens=2048)
    assert p.weights_bytes == 2 * 8_030_261_248
    assert p.kv_budget_bytes == int(80 * GIB * 0.9) - p.weights_bytes - p.reserve_bytes
    assert p.kv_tokens == p.kv_budget_bytes // 131072 // 16 * 16  # whole 16-token blocks
    assert (p.seqs_at_context, p.seqs_at_avg) == (p.kv_tokens // 8192, p.kv_tokens // 2048)
    assert p.suggested_max_num_seqs == min(p.seqs_at_avg, 256)
    assert p.suggested_kv_cache_tokens == p.kv_tokens and p.fits
    # Two GPUs pool their memory (tensor parallel): the weights are paid once.
    assert plan(shape, 80 * GIB, gpus=2, context_length=8192).kv_tokens > 2 * p.kv_tokens


def test_tpot_slo_caps_the_batch_by_the_decode_roofline() -> None:
    shape = ModelShape.named("llama-3-8b")
    p = plan(shape, 80 * GIB, context_length=8192, avg_seq_tokens=2048, bandwidth_bytes_s=3350e9,
             tpot_target_s=0.02)  # fmt: skip
    bandwidth = 3350e9 * 0.6
    assert p.tpot_batch1_s == pytest.approx((p.weights_bytes + 2048 * 131072) / bandwidth)
    assert p.seqs_within_tpot == int((0.02 * bandwidth - p.weights_bytes) / (2048 * 131072))
    assert p.suggested_max_num_seqs == p.seqs_within_tpot < p.seqs_at_avg
    hopeless = plan(shape, 80 * GIB, bandwidth_bytes_s=300e9, tpot_target_s=0.01)
    assert hopeless.seqs_within_tpot == 0 and hopeless.suggested_max_num_seqs == 1
    assert "even one sequence misses TPOT 10 ms" in hopeless.notes[-1]


def test_a_sequence_longer_than_the_kv_budget_does_not_fit() -> None:
    shape = ModelShape.named("llama-3.1-8b")
    p = plan(shape, 24 * GIB, context_length=131072)
    assert not p.fits and p.kv_tokens < 131072
    assert (p.suggested_max_num_seqs, p.suggested_kv_cache_tokens) == (0, 0)
    assert p.notes == (
        f"one 131072-token sequence needs 16.00 GiB of KV cache; {p.kv_budget_bytes / GIB:.2f} GiB is left "
        "after weights and reserve",
    )
    weights_only = plan(shape, 16 * GIB, context_length=1024)  # the weights alone fill it
    assert not weights_only.fits and weights_only.kv_tokens == 0
    assert weights_only.notes[0].startswith("weights 14.96 GiB + reserve")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, "x.json: missing 'num_hidden_layers'"),
        ({"hidden_size": "4096"}, "'hidden_size' must be a positive integer, got '4096'"),
        ({"num_attention_heads": 7}, "hidden_size 4096 is not divisible by num_attention_heads 7"),
        ({"torch_dtype": "float13"}, "torch_dtype: unknown dtype 'float13'"),
        ({"num_experts": 64}, "'num_experts': only dense Llama-family and Mixtral-style MoE"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(change: dict, message: str) -> None:
    config = {k: v for k, v in {**LLAMA_3_8B, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        ModelShape.from_config(config, "x.json")


def test_plan_refuses_impossible_inputs() -> None:
    shape = ModelShape.named("llama-3-8b")
    with pytest.raises(ValueError, match="memory utilization must be in"):
        plan(shape, 80 * GIB, memory_utilization=1.5)
    with pytest.raises(ValueError, match="gpus must be at least 1"):
        plan(shape, 80 * GIB, gpus=0)
    with pytest.raises(ValueError, match="no max_position_embeddings; give --context-length"):
        plan(
            ModelShape.from_config({k: v for k, v in LLAMA_3_8B.items() if k != "max_position_embeddings"}),
            GIB,
        )


def test_plan_command_prints_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_3_8B))
    out = tmp_path / "plan.json"
    code = plan_main(["--config", str(model_dir), "--gpu", "h100-80gb", "--avg-seq-tokens", "2048",
                      "--slo", "tpot.p95=30ms", "--json", str(out)])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "131,072 B = 2 x 32 layers x 8 kv heads x 128 head_dim x 2 B (bfloat16)" in table
    assert "suggested      maxNumSeqs" in table
    document = json.loads(out.read_text())
    assert document["plan"]["kv_bytes_per_token"] == 131072
    assert document["slo"] == "tpot.p95<=30ms"
    assert document["plan"]["suggested_max_num_seqs"] == document["plan"]["seqs_within_tpot"]


def test_plan_command_errors_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["--config", str(tmp_path / "missing.json"), "--gpu-memory-gib", "24"]) == 2
    assert "--config: cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plan_main(["--model", "llama-9", "--gpu", "l4"])
    assert "argument --model: invalid choice: 'llama-9'" in capsys.readouterr().err
    assert (
        plan_main(["--model", "llama-3-70b", "--gpu", "l4"]) == 0
    )  # a plan that does not fit is still a plan
    assert "does not fit" in capsys.readouterr().out


def test_kubeinfer_cli_dispatches_without_importing_the_runtime() -> None:
    code = (
        "import sys; from kubeinfer_operator.cli import main; import kubeinfer_operator.bench.command; "
        "rc = main(['plan', '--model', 'llama-3-8b', '--gpu', 'l4']); "
        "print('HEAVY', [m for m in ('torch', 'kubeinfer_runtime', 'matplotlib') if m in sys.modules]); "
        "sys.exit(rc)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout
    unknown = subprocess.run([sys.executable, "-m", "kubeinfer_operator.cli", "deploy"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert (
        unknown.returncode == 2 and "unknown command 'deploy'" in unknown.stderr and "bench" in unknown.stderr
    )
