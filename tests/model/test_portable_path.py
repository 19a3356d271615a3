"""The portable path (``StageRole(portable=True)``): the graphs a GPU runs, checked on a CPU.

Every device other than a CPU runs tinygrad's own kernels, with no C kernel and no CPU
replay, and each decode step copies its rows into the JIT's kept input buffer and its
output out through the device's allocator (``llama_role`` module doc). These tests run
that path on the CPU device, so CI checks it without a GPU: its logits follow an
independent float64 reference over a prefill and several decode steps, a split into two
stages hands activation rows across, a batched step's rows are bit-identical to the
same rows run alone (what serving several sequences on a GPU relies on), and few of a
decode graph's kernels read its position (each such kernel is a GPU graph node whose
arguments are rewritten at every step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from tinygrad.uop import Ops

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.wire.tags import SequenceTag
from tests.model.numpy_reference import NumpyLlama
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

PROMPT = [1, 5, 17, 42]
FORCED = [11, 3, 200]
MAX_SEQ = 16


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 blocks of Q4_1 matrices (the block type of the project's model)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"
    return write_tiny_gguf(path, TinyConfig(blocks=2, seed=8, matrix_type=Q.Q4_1,
                                            tied=False))


def _roles(path: Path, split: list[tuple[int, int]], slots: int = 1) -> list[StageRole]:
    reader = open_reader(path)
    roles = []
    for index, (start, end) in enumerate(split):
        weights = reader.load_stage(start, end, is_first=index == 0,
                                    is_last=index == len(split) - 1, dtype="f32",
                                    keep_blocks=True)
        roles.append(StageRole(weights, max_seq_len=MAX_SEQ, quantised=True, slots=slots,
                               device="CPU", portable=True))
    return roles


def _rel(got: npt.NDArray[np.float32], want: npt.NDArray[np.float64]) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _bits(array: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.int32)


def _logits(roles: list[StageRole]) -> list[npt.NDArray[np.float32]]:
    """Prefill ``PROMPT``, then decode ``FORCED`` one token per step: every step's
    logits."""
    out = []
    payload: npt.NDArray[np.generic] = np.array(PROMPT, dtype=np.int32)
    for step in range(len(FORCED) + 1):
        for role in roles:
            payload = role.step(step, payload)
        assert roles[-1].last_logits is not None
        out.append(roles[-1].last_logits.copy())
        if step < len(FORCED):
            payload = np.array([FORCED[step]], dtype=np.int32)
    return out


@pytest.mark.parametrize("split", [[(0, 2)], [(0, 1), (1, 2)]], ids=["one-stage",
                                                                     "two-stages"])
def test_portable_path_matches_the_reference(tiny_q4_1: Path,
                                             split: list[tuple[int, int]]) -> None:
    roles = _roles(tiny_q4_1, split)
    assert not roles[0]._cpu  # the portable path, on the CPU device
    reference = NumpyLlama(tiny_q4_1)
    sequence = list(PROMPT)
    for step, got in enumerate(_logits(roles)):
        assert _rel(got, reference.logits(sequence)) < 2e-5, f"step {step}"
        if step < len(FORCED):
            sequence.append(FORCED[step])


def test_portable_batches_equal_rows_alone(tiny_q4_1: Path) -> None:
    """Two prompts prefilled twice each (slots 0, 1 alone; 2, 3 batched); each decode
    step runs the rows alone, then as one batch: logits bit for bit the same."""
    (role,) = _roles(tiny_q4_1, [(0, 2)], slots=4)
    role.warm_up(rows=[2])
    prompts = [[1, 5, 17], [1, 250, 8, 9, 3]]
    ids, positions = [], []
    for slot, prompt in enumerate(prompts):
        for twin in (slot, slot + 2):
            answer = role.run_tagged(SequenceTag(twin, 0), np.array(prompt, dtype=np.int32))
        ids.append(int(answer[0]))
        positions.append(len(prompt))
    for _ in range(3):
        alone = []
        for slot in (0, 1):
            answer = role.run_tagged(SequenceTag(slot, positions[slot]),
                                     np.array([ids[slot]], dtype=np.int32))
            assert role.last_logits is not None
            alone.append((int(answer[0]), role.last_logits.copy()))
        batch = role.run_batch([SequenceTag(2 + s, positions[s]) for s in (0, 1)],
                               np.array(ids, dtype=np.int32))
        assert role.last_logits is not None and role.last_logits.shape[0] == 2
        for row, (token, logits) in enumerate(alone):
            assert np.array_equal(_bits(logits), _bits(role.last_logits[row])), row
            assert int(batch[row]) == token
        ids = [token for token, _ in alone]
        positions = [p + 1 for p in positions]


def test_portable_decode_reads_the_position_in_the_attention_only(tiny_q4_1: Path) -> None:
    """On a GPU every kernel of the decode graph that reads the position or slot
    variable is a graph node whose arguments are updated at each replay, host time of
    every step. The rotary rows are sliced at the position once per graph (two
    kernels), so per block only the attention's own kernels read it: its key and value
    writes, the scores, the softmax and the weighted values (7 per block on tinygrad
    0.14), not its two rotations as well."""
    (role,) = _roles(tiny_q4_1, [(0, 2)], slots=2)
    role.warm_up()
    captured = role._decode.captured
    assert captured is not None
    calls = [u for u in captured.linear.toposort()
             if u.op is Ops.CALL and u.src[0].op is Ops.PROGRAM]
    reading = [c for c in calls
               if {v.expr for v in c.src[0].arg.vars} & {"start_pos", "slot"}]
    assert len(reading) == 7 * role.facts.block_count + 2
