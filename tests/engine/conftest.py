from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kubeinfer_runtime.engine.llm_engine import LLMEngine
from kubeinfer_runtime.tiny_model import make_tiny_model


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
def make_engine(gqa_dir: Path) -> Callable[..., LLMEngine]:
    """A small engine over the GQA tiny model; keyword arguments override EngineConfig fields."""

    def make(**overrides: object) -> LLMEngine:
        overrides.setdefault("kv_cache_tokens", 4096)
        return LLMEngine.from_model_dir(gqa_dir, **overrides)

    return make

