"""`kubeinfer-runtime serve` options: every flag `--some-flag` may also be set as `KUBEINFER_SOME_FLAG`.

A flag on the command line wins over its environment variable, which wins over the default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeinfer_runtime.api_keys import DEFAULT_RELOAD_S, read_keys
from kubeinfer_runtime.http_edge import EdgeLimits, add_edge_arguments, edge_limits_from

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class ServerConfig:
    model: str
    served_model_name: str
    host: str
    port: int
    max_num_seqs: int
    max_queue: int
    queue_timeout: float
    max_model_len: int | None
    max_num_batched_tokens: int | None
    kv_cache_tokens: int | None
    kv_cache_memory_fraction: float | None
    enable_prefix_caching: bool
    scheduling_policy: str
    dtype: str | None
    device: str | None
    seed: int | None
    cpu_kernels: bool
    quantization: str | None
    speculative: str | None
    num_speculative_tokens: int | None
    ngram_min: int | None
    ngram_max: int | None
    api_key_file: str | None
    api_key_reload_seconds: float
    warmup: bool
    drain_timeout: float
    log_format: str
    fault_token_latency_ms: float
    fault_error_rate: float
    fault_fail_load: bool
    otlp_endpoint: str | None
    serving_revision: str | None
    max_body_bytes: int
    header_timeout: float
    body_timeout: float
    idle_timeout: float

    @property
    def edge_limits(self) -> EdgeLimits:
        return EdgeLimits(self.max_body_bytes, self.header_timeout, self.body_timeout, self.idle_timeout)

    def engine_overrides(self) -> dict[str, Any]:
        """Keyword arguments for LLMEngine.from_model_dir; unset options keep the engine's defaults."""
        overrides = {
            "max_num_seqs": self.max_num_seqs,
            "enable_prefix_caching": self.enable_prefix_caching,
            "scheduling_policy": self.scheduling_policy,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_memory_fraction": self.kv_cache_memory_fraction,
            "dtype": self.dtype,
            "device": self.device,
            "seed": self.seed,
            "cpu_kernels": self.cpu_kernels,
            "quantization": self.quantization,
            "speculative": self.speculative,
            "num_speculative_tokens": self.num_speculative_tokens,
            "ngram_min": self.ngram_min,
            "ngram_max": self.ngram_max,
        }
        return {key: value for key, value in overrides.items() if value is not None}


def env_name(flag: str) -> str:
    return "KUBEINFER_" + flag.lstrip("-").replace("-", "_").upper()


def _parse_bool(name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={value!r} is not a boolean (use true/false)")


def _fraction(value: str) -> float:
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not between 0 and 1")
    return number


def _non_negative(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return number


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return number


def _holds_keys(path: Path) -> bool:
    try:
        return bool(read_keys(path))
    except OSError:
        return False


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return number


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeinfer-runtime serve",
        description="Serve a model over an OpenAI-compatible HTTP API. Every --flag can also be set by "
        "the environment variable KUBEINFER_FLAG (dashes as underscores); the command line wins.",
    )

    def flag(name: str, help_: str, default: Any = None, **kwargs: Any) -> None:
        env = env_name(name)
        is_bool = kwargs.get("action") is argparse.BooleanOptionalAction
        if env in environ:
            # argparse runs `type` over string defaults, so a bad value is reported like a bad flag.
            default = _parse_bool(env, environ[env]) if is_bool else environ[env]
        parser.add_argument(name, default=default, help=f"{help_} [env {env}]", **kwargs)

    flag("--model", "model directory (Hugging Face layout: config.json, safetensors, tokenizer)")
    flag("--served-model-name", "the model name clients ask for (default: the directory's name)")
    flag("--host", "address to listen on", "0.0.0.0")
    flag("--port", "port to listen on", 8000, type=int)
    flag("--max-num-seqs", "most sequences running at once", 64, type=_positive_int)
    flag("--max-queue", "most requests admitted but waiting; more are answered 429", 256, type=int)
    flag(
        "--queue-timeout",
        "seconds a request may wait unscheduled before a 503 (0: forever)",
        60.0,
        type=float,
    )
    flag("--max-model-len", "context length (default: the model's)", type=_positive_int)
    flag("--max-num-batched-tokens", "token budget of one engine step", type=_positive_int)
    flag("--kv-cache-tokens", "KV-cache size in tokens (default: sized from memory)", type=_positive_int)
    flag("--kv-cache-memory-fraction", "fraction of free device memory for the KV cache", type=_fraction)
    flag("--enable-prefix-caching", "reuse KV blocks of shared prompt prefixes", True,
         action=argparse.BooleanOptionalAction)  # fmt: skip
    flag("--scheduling-policy", "order of the waiting queue", "priority", choices=["fcfs", "priority"])
    flag("--dtype", "weight dtype: float32, float16, bfloat16 (default: the engine's choice for the device)")
    flag("--device", "cpu or cuda (default: cuda when available)")
    flag("--seed", "engine-wide random seed", type=int)
    flag("--cpu-kernels", "fused C++ decode kernels on CPU (compiled on first use; off: eager PyTorch)", True,
         action=argparse.BooleanOptionalAction)  # fmt: skip
    flag("--quantization", "weight-only quantization applied at load: int8 (default: none)", choices=["int8"])
    flag("--speculative", "speculative decoding: ngram (prompt lookup; default: off)", choices=["ngram"])
    flag("--num-speculative-tokens", "most draft tokens verified per sequence and step (default 3)",
         type=_positive_int)  # fmt: skip
    flag("--ngram-min", "shortest context suffix the ngram drafter looks up (default 2)", type=_positive_int)
    flag("--ngram-max", "longest context suffix the ngram drafter looks up (default 4)", type=_positive_int)
    flag(
        "--api-key-file",
        "API keys clients must send as 'Authorization: Bearer <key>': a file (one per line) or a directory "
        "(one per file: a mounted Secret); re-read while serving, so keys rotate without a restart",
    )
    flag("--api-key-reload-seconds", "how often --api-key-file is re-read", DEFAULT_RELOAD_S, type=_positive)
    flag("--warmup", "run one generation before reporting ready", True, action=argparse.BooleanOptionalAction)
    flag(
        "--drain-timeout", "seconds in-flight requests get to finish after SIGTERM", 30.0, type=_non_negative
    )
    flag("--log-format", "log line format", "json", choices=["json", "text"])
    flag("--otlp-endpoint", "export traces to this OTLP/HTTP collector, e.g. http://jaeger:4318 (default: "
         "OTEL_EXPORTER_OTLP_ENDPOINT; unset: no tracing)")  # fmt: skip
    flag("--serving-revision", "the InferenceService revision this pod serves, recorded on its traces "
         "(the operator sets it from the pod's revision label)")  # fmt: skip
    flag(
        "--fault-token-latency-ms", "FAULT INJECTION: added latency per output token", 0.0, type=_non_negative
    )
    flag("--fault-error-rate", "FAULT INJECTION: fraction of requests answered 500", 0.0, type=_fraction)
    flag("--fault-fail-load", "FAULT INJECTION: fail the model load (the process exits non-zero)", False,
         action=argparse.BooleanOptionalAction)  # fmt: skip
    add_edge_arguments(lambda name, help_, default, type_: flag(name, help_, default, type=type_))
    return parser


def parse_config(argv: list[str], environ: Mapping[str, str] = os.environ) -> ServerConfig:
    try:
        parser = build_parser(environ)
    except ValueError as exc:  # a boolean environment variable that is not one
        raise SystemExit(f"kubeinfer-runtime serve: error: {exc}") from exc
    args = parser.parse_args(argv)
    if not args.model:
        parser.error(f"--model (or {env_name('--model')}) is required")
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: not a directory")
    if args.api_key_file and not _holds_keys(Path(args.api_key_file)):
        parser.error(f"--api-key-file {args.api_key_file}: not a file or directory holding a key")
    try:
        edge_limits_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    values = vars(args)
    values["served_model_name"] = args.served_model_name or Path(args.model).resolve().name
    return ServerConfig(**values)
