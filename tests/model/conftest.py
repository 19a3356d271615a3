"""Fixtures for the model tests: tiny random GGUF files written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf


def int8_inputs() -> frozenset[str]:
    """The block types whose products a block-mode role computes from int8-rounded inputs
    on this machine (decode_gemv's integer path): the numpy reference's ``int8_inputs``."""
    from gguf import GGMLQuantizationType as Q
    from tinygrad.device import Device

    from swactor.model import decode_gemv

    if not (Device.DEFAULT.startswith("CPU") and decode_gemv.integer_path(Device.DEFAULT)):
        return frozenset()
    return frozenset(Q(t).name for t in decode_gemv.TYPES
                     if decode_gemv.activation_bits(int(t)) == 8)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 blocks, f32, tied embeddings, llama rope permutation."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return write_tiny_gguf(path, TinyConfig(blocks=4, seed=1))


@pytest.fixture(scope="session")
def tiny_mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 blocks whose matrices use a different quantisation each, untied output."""
    from gguf import GGMLQuantizationType as Q

    path = tmp_path_factory.mktemp("gguf") / "tiny-mixed.gguf"
    types = {0: Q.Q4_1, 1: Q.Q8_0, 2: Q.Q4_0, 3: Q.Q4_K, 4: Q.Q6_K, 5: Q.F16}
    cfg = TinyConfig(blocks=6, seed=2, types_by_layer=types, tied=False, embd_type=Q.Q8_0)
    return write_tiny_gguf(path, cfg)
