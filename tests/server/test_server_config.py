"""`kubeinfer-runtime serve` options: flags, their KUBEINFER_* environment variables, and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeinfer_runtime.server.config import parse_config


def test_environment_sets_what_the_command_line_does_not(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    env = {
        "KUBEINFER_MODEL": str(model),
        "KUBEINFER_PORT": "9000",
        "KUBEINFER_MAX_QUEUE": "7",
        "KUBEINFER_ENABLE_PREFIX_CACHING": "false",
        "KUBEINFER_FAULT_TOKEN_LATENCY_MS": "25",
    }
    config = parse_config(["--port", "9100"], env)
    assert config.model == str(model)
    assert config.port == 9100  # the command line wins
    assert config.max_queue == 7
    assert config.enable_prefix_caching is False
    assert config.fault_token_latency_ms == 25.0
    assert config.served_model_name == "my-model"
    assert config.fault_error_rate == 0.0 and config.fault_fail_load is False  # faults are off by default
    assert config.engine_overrides()["enable_prefix_caching"] is False
    assert "kv_cache_tokens" not in config.engine_overrides()  # unset: the engine's default
    assert config.engine_overrides()["cpu_kernels"] is True  # on unless turned off
    assert parse_config(["--no-cpu-kernels"], env).engine_overrides()["cpu_kernels"] is False


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--fault-error-rate", "1.5"], {}, "--fault-error-rate"),
        ([], {"KUBEINFER_MAX_NUM_SEQS": "0"}, "--max-num-seqs"),
        ([], {"KUBEINFER_WARMUP": "maybe"}, "KUBEINFER_WARMUP"),
        (["--model", "/nonexistent/model"], {}, "/nonexistent/model"),
        (["--api-key-file", "/nonexistent/key"], {}, "--api-key-file"),
    ],
)
def test_bad_values_name_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], env: dict, message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(argv if "--model" in argv else ["--model", str(tmp_path), *argv], env)
    assert message in capsys.readouterr().err + str(exited.value.code)


def test_quantization_flag_reaches_the_engine_and_refuses_unknown_schemes(tmp_path: Path) -> None:
    env = {"KUBEINFER_MODEL": str(tmp_path)}
    assert "quantization" not in parse_config([], env).engine_overrides()  # unset: full-precision weights
    assert parse_config(["--quantization", "int8"], env).engine_overrides()["quantization"] == "int8"
    assert parse_config([], {**env, "KUBEINFER_QUANTIZATION": "int8"}).quantization == "int8"
    with pytest.raises(SystemExit):
        parse_config(["--quantization", "int4"], env)


def test_speculative_flags_reach_the_engine_and_default_to_off(tmp_path: Path) -> None:
    env = {"KUBEINFER_MODEL": str(tmp_path)}
    assert "speculative" not in parse_config([], env).engine_overrides()  # off: the engine's default
    overrides = parse_config(
        ["--speculative", "ngram", "--num-speculative-tokens", "5", "--ngram-max", "3"], env
    ).engine_overrides()
    assert overrides["speculative"] == "ngram"
    assert overrides["num_speculative_tokens"] == 5 and overrides["ngram_max"] == 3
    assert "ngram_min" not in overrides
    assert parse_config([], {**env, "KUBEINFER_SPECULATIVE": "ngram"}).speculative == "ngram"
    for bad in (["--speculative", "medusa"], ["--num-speculative-tokens", "0"]):
        with pytest.raises(SystemExit):
            parse_config(bad, env)
