"""Batched decode: ``StageRole.run_batch`` runs B sequences' decode rows as one step, and
each row's logits are bit-identical to the same row run alone (``run_tagged``).

One role holds every sequence twice: slots ``0..n-1`` step alone, slots ``n..2n-1`` (the
same prompts, prefilled by the same kernels, so the same KV entries) step in batches, so
one load and one set of one-row kernels serve both sides. ``warm_up(rows=...)`` builds
each batch size's JIT first (its eager call and capture), so the steps replay it.
Each check builds a decode JIT per batch size (minutes on a loaded 2-core machine), so
all are ``soak``; ``tests/model/test_slots.py`` checks bad batches and greedy tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole, StepError
from swactor.wire.tags import SequenceTag
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf


def _role(path: Path, *, dtype: str, blocks: bool, slots: int, max_seq_len: int,
          split: tuple[int, int] | None = None, first: bool = True, last: bool = True
          ) -> StageRole:
    reader = open_reader(path)
    start, end = split or (0, reader.facts.block_count)
    weights = reader.load_stage(start, end, is_first=first, is_last=last, dtype=dtype,
                                keep_blocks=blocks)
    return StageRole(weights, max_seq_len=max_seq_len, quantised=blocks, slots=slots)


def _bits(array: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.int32)


class _Twins:
    """``n`` prompts, each prefilled in slot ``s`` (alone) and slot ``s + n`` (batched)."""

    def __init__(self, role: StageRole, prompts: Sequence[list[int]]) -> None:
        self.role, self.n = role, len(prompts)
        self.ids: list[int] = []
        self.positions: list[int] = []
        for slot, prompt in enumerate(prompts):
            ids = np.array(prompt, dtype=np.int32)
            alone = role.run_tagged(SequenceTag(slot, 0), ids)
            logits = role.last_logits
            twin = role.run_tagged(SequenceTag(slot + self.n, 0), ids)
            assert role.last_logits is not None and logits is not None
            assert np.array_equal(_bits(logits), _bits(role.last_logits))
            assert int(alone[0]) == int(twin[0])
            self.ids.append(int(alone[0]))
            self.positions.append(len(prompt))

    def step(self, members: Sequence[int], candidates: Sequence[bool] = ()) -> None:
        """One decode step of ``members`` alone, then the same rows as one batch; every
        row's logits and answer must be the same."""
        asks = list(candidates) or [False] * len(members)
        role = self.role
        alone_logits, alone_answers = [], []
        for member, ask in zip(members, asks, strict=True):
            tag = SequenceTag(member, self.positions[member], ask)
            alone_answers.append(role.run_tagged(tag, np.array([self.ids[member]],
                                                               dtype=np.int32)))
            assert role.last_logits is not None
            alone_logits.append(role.last_logits.copy())
        tags = [SequenceTag(m + self.n, self.positions[m], ask)
                for m, ask in zip(members, asks, strict=True)]
        answer = role.run_batch(tags, np.array([self.ids[m] for m in members],
                                               dtype=np.int32))
        batch_logits = role.last_logits
        assert batch_logits is not None and batch_logits.shape[0] == len(members)
        for row, (member, logits) in enumerate(zip(members, alone_logits, strict=True)):
            same = np.array_equal(_bits(logits), _bits(batch_logits[row]))
            assert same, (f"batch of {len(members)}: row {row} (position "
                          f"{self.positions[member]}) differs by up to "
                          f"{np.abs(logits - batch_logits[row]).max()}")
        assert np.array_equal(answer, np.concatenate(alone_answers))
        for member, alone in zip(members, alone_answers, strict=True):
            self.ids[member] = int(alone[0])
            self.positions[member] += 1


# -- soak: bit-identity on tiny files (every weight mode and block type) ----------------

@pytest.fixture(scope="module")
def tiny_every_type(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One block per type: every block kernel, F16 and Q2_K included."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-every-type.gguf"
    kinds = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.Q2_K]
    return write_tiny_gguf(path, TinyConfig(blocks=len(kinds), seed=3, tied=False,
                                            types_by_layer=dict(enumerate(kinds)),
                                            embd_type=Q.Q8_0))


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize(("dtype", "blocks"), [("f32", True), ("f16", True), ("f16", False)],
                         ids=["blocks-f32", "blocks-f16", "dense-f16"])
def test_tiny_batches_equal_rows_alone(tiny_every_type: Path, dtype: str, blocks: bool
                                       ) -> None:
    max_seq = 12
    role = _role(tiny_every_type, dtype=dtype, blocks=blocks, slots=6, max_seq_len=max_seq)
    role.warm_up(rows=[2, 3])
    twins = _Twins(role, [[5, 17, 42], [3, 1, 4, 9, 9, 2, 6], [250, 8]])
    for step in range(4):
        twins.step([0, 1, 2], candidates=[step == 1, False, step == 2])
        twins.step([2, 0])
    assert twins.positions[1] == max_seq - 1  # the next step's row 1 is the last position
    twins.step([0, 1])


@pytest.mark.slow
@pytest.mark.soak
def test_a_middle_stage_returns_each_rows_activations(tiny_llama: Path) -> None:
    """A non-last stage's batch answers ``[B, hidden]`` rows equal to each row alone."""
    first = _role(tiny_llama, dtype="f32", blocks=False, slots=4, max_seq_len=8,
                  split=(0, 2), last=False)
    middle = _role(tiny_llama, dtype="f32", blocks=False, slots=4, max_seq_len=8,
                   split=(2, 4), first=False, last=False)
    middle.warm_up(rows=[2])
    prompts = [np.array([5, 6], dtype=np.int32), np.array([7, 8, 9], dtype=np.int32)]
    rows = []
    for slot, prompt in enumerate(prompts):
        for twin in (slot, slot + 2):
            middle.run_tagged(SequenceTag(twin, 0),
                              first.run_tagged(SequenceTag(twin, 0), prompt))
        rows.append(first.run_tagged(SequenceTag(slot, len(prompt)),
                                     np.array([11 + slot], dtype=np.int32)))
    acts = np.concatenate(rows)
    for _ in range(2):
        alone = np.concatenate([
            middle.run_tagged(SequenceTag(s, middle._positions[s]), acts[s : s + 1])
            for s in (0, 1)])
        batch = middle.run_batch([SequenceTag(2 + s, middle._positions[2 + s])
                                  for s in (0, 1)], acts)
        assert batch.shape == (2, middle.facts.hidden_dim) and batch.dtype == np.float32
        assert np.array_equal(alone.view(np.int32), batch.view(np.int32))
        acts = alone[::-1].copy()


# -- soak: the real model ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.soak
def test_smollm2_batches_of_one_to_four_equal_rows_alone() -> None:
    """SmolLM2 (blocks, f32, the defaults): batches of 1..4 rows at mixed positions,
    one row reaching ``max_seq_len - 1``."""
    from swactor.model.paths import default_model_path

    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    max_seq = 64  # bench batch's role: they share kernel cache entries
    role = _role(path, dtype="f32", blocks=True, slots=8, max_seq_len=max_seq)
    role.warm_up(rows=[3])  # bench batch builds 2 and 4 first: the cache may hold them
    role.warm_up(rows=[2, 4])
    prompts = [[1, 504, 3458], [1, 22, 333, 4444, 55, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
               [1, 9001, 12], [1, 88, 7, 6, 5, 4, 3]]
    twins = _Twins(role, prompts)
    rounds = [[0], [3, 1], [2, 0, 3], [1, 2, 3, 0]]
    for _ in range(2):
        for members in rounds:
            twins.step(members, candidates=[m == 2 for m in members])
    while twins.positions[1] < max_seq:  # slot 1 runs to the last position
        twins.step([1, 0] if twins.positions[1] % 2 else [1, 0, 3])
    assert twins.positions[1] == max_seq  # its last row was at max_seq_len - 1
    with pytest.raises(StepError, match="exceeds max_seq_len"):
        role.run_batch([SequenceTag(5, max_seq)], np.array([1], dtype=np.int32))
