"""Sequence tags through one real worker: the input header's flags reach the role and
the output header (`swactor.wire.tags`); a candidates step writes the candidates object;
a batch object (or prompt batch) on an activation edge is its tag table padded to one
row plus its rows; a mixed step answers its prompt and its decode rows in table order."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole, candidates
from swactor.testing.worker_rig import WorkerRig, grant, read_all, record, write_all
from swactor.wire import (
    ConfigureRole,
    DTypeFamily,
    GrantSteps,
    LayoutRule,
    ObjectHeader,
    ObjectKind,
    ObjectSpec,
    RingDirection,
    RoleConfigured,
    RoleFailed,
    RoleFailure,
    RoleId,
    SequencePolicy,
    ShapeRule,
    StepCompleted,
    StepFailed,
    StepFailure,
)
from swactor.wire.tags import (
    CANDIDATES_K,
    SequenceTag,
    batch_flags,
    mixed_flags,
    prompt_flags,
)
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

TINY = TinyConfig(blocks=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=96, context=32,
                  seed=7)
MAX_SEQ = 16


def _token_spec() -> ObjectSpec:
    return ObjectSpec(kind=ObjectKind.TokenIds, max_extent=4 * MAX_SEQ * 16,
                      dtype_family=DTypeFamily.UInt, dtype_width_bytes=4,
                      shape=ShapeRule.Vector, layout=LayoutRule.RowMajor, alignment=4,
                      sequence_policy=SequencePolicy.Contiguous)


def _granted(rig: WorkerRig, role: int, step: int, sequence: int) -> None:
    """Grant `role` one step per object of ring 1 from `sequence`, step ids from `step`,
    each writing one 4-byte answer (object id step + 100) on ring 2 (the worker makes it
    a candidates object or a batch's answers where the tag asks)."""
    rig.send(grant(role, step, sequence=sequence, object_id=step + 100, extent=4))


def _ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def test_echo_output_carries_the_input_flags_and_a_bad_tag_fails(rig: WorkerRig) -> None:
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096)
    egress = rig.add_ring(2, RingDirection.Egress, 4096)
    rig.send(ConfigureRole(RoleId(5), {"kind": "echo"}))
    rig.expect(RoleConfigured)
    payload = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    tag = SequenceTag(3, 7).pack()
    rig.send(grant(5, 1, object_id=101))  # one 4-byte row out per row in
    write_all(rig, ingress, record(11, 0, payload, flags=tag))
    data = read_all(rig, egress, ObjectHeader.LEN + len(payload))
    header = ObjectHeader.unpack(data)
    assert (header.object_id, header.extent, header.flags) == (101, len(payload), tag)
    assert data[ObjectHeader.LEN:] == payload
    assert rig.expect(StepCompleted).step_id == 1

    write_all(rig, ingress, record(12, 1, payload, flags=0x5))  # set, but not TAGGED
    failed = rig.expect(StepFailed)
    assert (failed.step_id, failed.reason) == (2, StepFailure.OutputExtentInvalid)

    # a batch of 2 rows on an edge of 16-byte rows: the 8-byte tag table is padded to
    # one row, so the object is 3 whole rows (the ring's alignment check admits it) and
    # the output, per input row, is the same 3 rows
    rows_in = rig.add_ring(3, RingDirection.Ingress, 4096, _row_spec())
    rows_out = rig.add_ring(4, RingDirection.Egress, 4096, _row_spec())
    table = _ids([SequenceTag(0, 5).pack(), SequenceTag(1, 9).pack()])
    body = struct.pack("<8f", *range(8))
    batch = table + bytes(ROW - len(table)) + body
    rig.send(_granted_rows(3, 0))
    write_all(rig, rows_in, record(13, 0, batch, flags=batch_flags(2)))
    data = read_all(rig, rows_out, ObjectHeader.LEN + 3 * ROW)
    header = ObjectHeader.unpack(data)
    assert (header.extent, header.flags) == (3 * ROW, batch_flags(2))
    assert data[ObjectHeader.LEN:] == batch
    done = rig.expect(StepCompleted)
    assert done.step_id == 3 and done.record is not None
    assert done.record.input_extent == 3 * ROW
    # a batch that says 2 rows but holds its table and 3: not exactly table + 2 rows
    write_all(rig, rows_in, record(14, 1, batch + body[:ROW], flags=batch_flags(2)))
    failed = rig.expect(StepFailed)
    assert (failed.step_id, failed.reason) == (4, StepFailure.OutputExtentInvalid)
    # a prompt batch of 2 prompts (1 and 2 rows): its table is padded to one row the
    # same way, then the 3 rows; the output is the same 4 rows, flags copied
    table = _ids([SequenceTag(0, 1).pack(), SequenceTag(1, 2).pack()])
    prompts = table + bytes(ROW - len(table)) + struct.pack("<12f", *range(12))
    rig.send(_granted_rows(5, 2))  # the failed step ended the grant: a new one
    write_all(rig, rows_in, record(15, 2, prompts, flags=prompt_flags(2)))
    data = read_all(rig, rows_out, ObjectHeader.LEN + 4 * ROW)
    header = ObjectHeader.unpack(data)
    assert (header.extent, header.flags) == (4 * ROW, prompt_flags(2))
    assert data[ObjectHeader.LEN:] == prompts
    done = rig.expect(StepCompleted)
    assert done.step_id == 5 and done.record is not None
    assert done.record.input_extent == 4 * ROW


ROW = 16  # four f32 per activation row


def _row_spec() -> ObjectSpec:
    return ObjectSpec(kind=ObjectKind.Activation, max_extent=ROW * 16,
                      dtype_family=DTypeFamily.Float, dtype_width_bytes=4,
                      shape=ShapeRule.Rows, layout=LayoutRule.RowMajor, alignment=ROW,
                      sequence_policy=SequencePolicy.Contiguous)


def _granted_rows(step: int, sequence: int) -> GrantSteps:
    """An echo grant on ring 3's objects from `sequence`, one output row per input row on
    ring 4 (as a stage controller grants an activation stage)."""
    return grant(5, step, ring=3, sequence=sequence, row_bytes=ROW, out_ring=4,
                 object_id=step + 100)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tagged") / "tiny.gguf", TINY)


@pytest.fixture
def llama_rig(gguf: Path) -> Iterator[WorkerRig]:
    worker = WorkerRig(env={"SWACTOR_KERNEL_CACHE": "off"})
    worker.initialize()
    try:
        yield worker
    finally:
        worker.close()


def _config(gguf: Path, slots: object) -> dict[str, object]:
    return {"kind": "llama_stage", "gguf": str(gguf), "layer_start": 0, "layer_end": 2,
            "first": True, "last": True, "dtype": "f32", "max_seq_len": MAX_SEQ,
            "slots": slots}


def test_llama_stage_runs_tagged_steps_in_slots(llama_rig: WorkerRig, gguf: Path) -> None:
    rig = llama_rig
    ingress = rig.add_ring(1, RingDirection.Ingress, 4096, _token_spec())
    egress = rig.add_ring(2, RingDirection.Egress, 4096, _token_spec())
    for bad in (0, 65, "2"):
        rig.send(ConfigureRole(RoleId(4), _config(gguf, bad)))
        assert rig.expect(RoleFailed, timeout=120).reason is RoleFailure.ConfigInvalid
        _logged(rig, "slots")
    rig.send(ConfigureRole(RoleId(4), _config(gguf, 2)))
    rig.expect(RoleConfigured, timeout=300)
    reference = StageRole(open_reader(gguf).load_stage(0, 2, is_first=True, is_last=True,
                                                       dtype="f32"), max_seq_len=MAX_SEQ)
    prompt = [5, 17, 42, 9]
    want = [int(reference.step(0, np.array(prompt, np.int32))[0])]
    want.append(int(reference.step(1, np.array(want[-1:], np.int32))[0]))
    assert reference.last_logits is not None
    want_candidates = candidates(reference.last_logits)

    steps = [  # (tag, ids in, candidates out); slot 0 gets an unrelated prompt between
        (SequenceTag(1, 0), prompt, False),
        (SequenceTag(0, 0), [60, 61, 62], False),
        (SequenceTag(1, len(prompt), candidates=True), want[:1], True),
    ]
    got: list[bytes] = []
    _granted(rig, 4, 1, 0)  # step k runs the object of sequence k - 1
    for index, (tag, ids, ask) in enumerate(steps, start=1):
        write_all(rig, ingress, record(10 + index, index - 1, _ids(ids), flags=tag.pack()))
        extent = 2 * CANDIDATES_K * 4 if ask else 4
        data = read_all(rig, egress, ObjectHeader.LEN + extent, timeout=120)
        header = ObjectHeader.unpack(data)
        assert (header.flags, header.extent) == (tag.pack(), extent)
        done = rig.expect(StepCompleted)
        assert done.step_id == index and done.record is not None
        assert done.record.output_extent == extent
        got.append(data[ObjectHeader.LEN:])
    assert struct.unpack("<I", got[0]) == (want[0],)
    assert got[2] == want_candidates.astype("<i4").tobytes()
    assert struct.unpack("<I", got[2][:4]) == (want[1],)

    # slot 2 is not the stage's; a decode position that is not the slot's next (each
    # failed step ends its grant: the next object gets a grant of its own)
    for index, tag in ((4, SequenceTag(2, 0)), (5, SequenceTag(1, 9))):
        if index > 4:
            _granted(rig, 4, index, index - 1)
        write_all(rig, ingress, record(10 + index, index - 1, _ids([1]), flags=tag.pack()))
        failed = rig.expect(StepFailed, timeout=60)
        assert (failed.step_id, failed.reason) == (index, StepFailure.OutputExtentInvalid)
    _logged(rig, "slot 2 outside this stage's slots 0..1")
    _logged(rig, "position 9 is not the slot's next position 5")

    # a batch object: slot 0's and slot 1's next decode rows in one step; its output is
    # the table, then each row's answer as run_tagged alone gives it
    twin = StageRole(open_reader(gguf).load_stage(0, 2, is_first=True, is_last=True,
                                                  dtype="f32"), max_seq_len=MAX_SEQ, slots=2)
    for tag, ids, _ask in steps:
        twin.run_tagged(tag, np.array(ids, np.int32))
    rows = [(SequenceTag(1, len(prompt) + 1, candidates=True), 33), (SequenceTag(0, 3), 34)]
    answers = b"".join(twin.run_tagged(tag, np.array([token], np.int32)).astype("<i4").tobytes()
                       for tag, token in rows)
    table = _ids([tag.pack() for tag, _ in rows])
    _granted(rig, 4, 6, 5)
    write_all(rig, ingress, record(16, 5, table + _ids([t for _, t in rows]),
                                   flags=batch_flags(2)))
    extent = len(table) + len(answers)
    data = read_all(rig, egress, ObjectHeader.LEN + extent, timeout=120)
    header = ObjectHeader.unpack(data)
    assert (header.flags, header.extent) == (batch_flags(2), extent)
    assert data[ObjectHeader.LEN:] == table + answers
    assert rig.expect(StepCompleted).step_id == 6
    # a malformed table (one slot twice) fails the step; the worker keeps serving
    twice = _ids([SequenceTag(0, 4).pack()] * 2)
    write_all(rig, ingress, record(17, 6, twice + _ids([1, 2]), flags=batch_flags(2)))
    failed = rig.expect(StepFailed, timeout=60)
    assert (failed.step_id, failed.reason) == (7, StepFailure.OutputExtentInvalid)
    _logged(rig, "slot 0 appears twice")

    # a mixed step: a new prompt in slot 0 and slot 1's next decode row in one object;
    # its output is the table, then the prompt's answer and the row's, as alone
    mixed = [(SequenceTag(0, 3), [7, 8, 9]), (SequenceTag(1, len(prompt) + 2), [35])]
    answers = b"".join(twin.run_tagged(SequenceTag(tag.slot, 0) if tag.slot == 0 else tag,
                                       np.array(ids, np.int32)).astype("<i4").tobytes()
                       for tag, ids in mixed)
    table = _ids([tag.pack() for tag, _ in mixed])
    _granted(rig, 4, 8, 7)
    write_all(rig, ingress, record(18, 7, table + _ids([7, 8, 9, 35]), flags=mixed_flags(2)))
    extent = len(table) + len(answers)
    data = read_all(rig, egress, ObjectHeader.LEN + extent, timeout=120)
    header = ObjectHeader.unpack(data)
    assert (header.flags, header.extent) == (mixed_flags(2), extent)
    assert data[ObjectHeader.LEN:] == table + answers
    assert rig.expect(StepCompleted).step_id == 8


def _logged(rig: WorkerRig, text: str) -> None:
    """The worker's stderr says `text` (read by the rig's thread: allow it a moment)."""
    deadline = time.monotonic() + 10
    while not any(text in line for line in rig.stderr):
        assert time.monotonic() < deadline, f"{text!r} not in {rig.stderr[-5:]}"
        time.sleep(0.05)
