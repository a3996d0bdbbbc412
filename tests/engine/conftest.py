from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.tiny_model import make_tiny_model

# Tiny models gain nothing from threads, and on a busy 2-core machine OpenMP's barriers turn every
# small op into a wait for a time slice (a 2 ms forward took 400 ms); one thread keeps tests fast.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """preset -> a model directory, written once per test session."""
    made: dict[str, Path] = {}

    def get(preset: str) -> Path:
        if preset not in made:
            made[preset] = make_tiny_model(tmp_path_factory.mktemp(preset), preset=preset)
        return made[preset]

    return get


@pytest.fixture(scope="session")
def gqa_dir(tiny_model_dir: Callable[[str], Path]) -> Path:
    return tiny_model_dir("llama-gqa")


@pytest.fixture
def make_engine(tiny_model_dir: Callable[[str], Path]) -> Callable[..., LLMEngine]:
    """make_engine(preset="llama-gqa", **EngineConfig overrides) with a small cache and one thread."""

    def make(preset: str = "llama-gqa", **overrides: object) -> LLMEngine:
        settings: dict[str, object] = {"kv_cache_tokens": 4096, "num_threads": 1, **overrides}
        return LLMEngine.from_model_dir(tiny_model_dir(preset), **settings)

    return make
