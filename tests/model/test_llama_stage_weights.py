"""The llama_stage role's optional ``weights`` key: "blocks" decodes from file blocks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q
from tinygrad.device import Device

from swactor.worker.llama_stage import LlamaStageRole
from swactor.worker.roles import RoleConfigError, build_role
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf


def _config(path: Path, **extra: Any) -> dict[str, Any]:
    return {"kind": "llama_stage", "gguf": str(path), "layer_start": 0, "layer_end": 1,
            "first": True, "last": True, "dtype": "f32", "max_seq_len": 16,
            **extra}


@pytest.fixture(scope="module")
def q4_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = TinyConfig(blocks=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64,
                     context=32, seed=13, matrix_type=Q.Q4_1, embd_type=Q.Q8_0)
    return write_tiny_gguf(tmp_path_factory.mktemp("weights") / "q.gguf", cfg)


@pytest.mark.parametrize(("weights", "quantised"), [(None, False), ("dense", False),
                                                ("blocks", True)])
def test_weights_key_selects_the_decode_weights(
    q4_gguf: Path, weights: str | None, quantised: bool
) -> None:
    extra = {} if weights is None else {"weights": weights}
    role = build_role(_config(q4_gguf, **extra), Device.DEFAULT)
    assert isinstance(role, LlamaStageRole)
    assert role.stage.quantised is quantised
    assert role.stage.output is not None and role.stage.output.quantised is quantised


def test_unknown_weights_mode_is_a_role_config_error(q4_gguf: Path) -> None:
    with pytest.raises(RoleConfigError, match="weights 'q2'"):
        build_role(_config(q4_gguf, weights="q2"), Device.DEFAULT)
