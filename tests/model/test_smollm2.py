"""SmolLM2-135M (the real model): splits agree, and one stage agrees with numpy in float64."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.model.paths import default_model_path
from swactor.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TOKENS = 32
SPLITS = {1: [(0, 30)], 2: [(0, 15), (15, 30)], 3: [(0, 10), (10, 20), (20, 30)]}


@pytest.fixture(scope="module")
def model_path() -> Path:
    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    return path


@pytest.fixture(scope="module")
def prompt_ids(model_path: Path) -> list[int]:
    # task G's tokenizer; the file says add_bos_token is false, and no chat template is used
    return list(Tokenizer.from_gguf(model_path).encode("hello world"))


def _generate(
    path: Path, split: list[tuple[int, int]], prompt: list[int], blocks: bool = False
) -> list[int]:
    reader = open_reader(path)
    roles = [
        StageRole(
            reader.load_stage(a, b, is_first=i == 0, is_last=i == len(split) - 1, dtype="f32",
                              keep_blocks=blocks),
            max_seq_len=64,
            quantised=blocks,
        )
        for i, (a, b) in enumerate(split)
    ]
    out: list[int] = []
    payload: npt.NDArray[Any] = np.array(prompt, dtype=np.int32)
    for sequence in range(TOKENS):
        obj = payload
        for role in roles:
            obj = role.step(sequence, obj)
        out.append(int(obj[0]))
        payload = obj
    return out


@pytest.mark.soak  # `just test` keeps the block-decode test below: its splits and dense
def test_greedy_tokens_identical_for_one_two_three_stages(
    model_path: Path, prompt_ids: list[int]
) -> None:
    results = {n: _generate(model_path, split, prompt_ids) for n, split in SPLITS.items()}
    text = Tokenizer.from_gguf(model_path).decode(results[1])
    print(f"\nprompt ids {prompt_ids}\ngreedy ids {results[1]}\ncontinuation {text!r}")
    assert results[2] == results[1]
    assert results[3] == results[1]
    words = set(re.findall(r"[a-z]+", text.lower()))
    assert len(words & {"the", "of", "and", "a", "is", "to", "in", "that", "it", "are"}) >= 3


def test_block_decode_greedy_tokens_identical_for_one_two_three_stages_and_dense(
    model_path: Path, prompt_ids: list[int]
) -> None:
    """Decode from the file's Q4_1/Q8_0 blocks: the same 32 tokens for every split, and
    (measured, not guaranteed by construction) the same as the dense f32 decode."""
    results = {n: _generate(model_path, split, prompt_ids, blocks=True)
               for n, split in SPLITS.items()}
    assert results[2] == results[1]
    assert results[3] == results[1]
    assert results[1] == _generate(model_path, SPLITS[1], prompt_ids)


def test_one_stage_agrees_with_numpy_float64(model_path: Path, prompt_ids: list[int]) -> None:
    from tests.model.numpy_reference import NumpyLlama

    reference = NumpyLlama(model_path)
    reader = open_reader(model_path)
    role = StageRole(
        reader.load_stage(0, 30, is_first=True, is_last=True, dtype="f32"), max_seq_len=64
    )
    sequence = list(prompt_ids)
    payload: npt.NDArray[Any] = np.array(prompt_ids, dtype=np.int32)
    for step in range(6):
        token = int(role.step(step, payload)[0])
        assert role.last_logits is not None
        want = reference.logits(sequence)
        diff = np.abs(role.last_logits - want).max() / np.abs(want).max()
        assert diff < 1e-4, step
        assert token == int(np.argmax(want)), step
        sequence.append(token)
        payload = np.array([token], dtype=np.int32)


def test_short_prompts_compute_the_same_at_8_and_16_row_buckets(
        model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last two blocks of the model over Q4_1/Q8_0 blocks (random activation rows
    in): prompts of 5, 20 and 50 rows padded to multiples of 8 (the CPU short-prompt
    bucket) and of 16 give bit-identical logits, keys and values (the tiny models'
    test in test_stage_role.py, on SmolLM2's heads and widths)."""
    from swactor.model import llama_role

    reader = open_reader(model_path)
    role = StageRole(reader.load_stage(28, 30, is_first=False, is_last=True, dtype="f32",
                                       keep_blocks=True), max_seq_len=64, quantised=True)
    rng = np.random.default_rng(3)
    for length in (5, 20, 50):
        rows = rng.standard_normal((length, role.facts.hidden_dim)).astype(np.float32)
        seen = []
        for bucket in (8, 16):
            monkeypatch.setattr(llama_role, "SHORT_PREFILL_BUCKET", bucket)
            role.step(0, rows)
            kv = [view[0, :, :length].copy() for pair in role._cache_views for view in pair]
            seen.append((np.array(role.last_logits), *kv))
        for got, want in zip(seen[1], seen[0], strict=True):
            np.testing.assert_array_equal(got, want)
    assert sorted(role._prefill) == [8, 16, 24, 32, 56, 64]
