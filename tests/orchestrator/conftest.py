"""Fixtures of the orchestrator tests: a tiny GGUF on disk and planning facts without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from swactor.orchestrator.model_info import ModelInfo
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

TINY = TinyConfig(blocks=6, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=128)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-block random llama GGUF (hidden 64, context 128, no tokenizer vocabulary)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("orchestrator") / "tiny.gguf", TINY)


def synthetic_model(
    blocks: int = 30, hidden: int = 576, context: int = 8192, block_params: int = 1000
) -> ModelInfo:
    """Planning facts of an imaginary model (every block the same size)."""
    return ModelInfo(
        model_id="imaginary",
        path=Path("/models/imaginary.gguf"),
        architecture="llama",
        block_count=blocks,
        hidden_dim=hidden,
        context_length=context,
        head_count_kv=3,
        head_dim=64,
        eos_token_id=2,
        stop_token_ids=frozenset({0, 2}),
        block_params=(block_params,) * blocks,
        embedding_params=5000,
        head_params=6000,
    )
