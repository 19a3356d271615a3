"""Mixed steps: ``StageRole.run_mixed`` runs a prompt and other sequences' decode rows as
one step, and every answer, logit, activation row and KV entry is bit-identical to the
prompt prefilled alone and the rows decoded alone.

One role holds every sequence twice: slots ``0..D-1`` decode their rows apart (a batch),
slots ``D..2D-1`` the same rows inside mixed steps, and the prompt goes to slot ``2D``
alone and ``2D + 1`` mixed; the steps after a mixed step must stay identical too (the
KV entries it wrote). A tiny Q4_1 model, whose every product is the decode kernel at
any row count, takes the one-graph path; the same checks hold where the step runs apart
(a prompt too long to mix, the portable path, dense weights).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType as Q
from tinygrad.helpers import GlobalCounters

from swactor.model import llama_role
from swactor.model.decode_gemv import PREFILL_ROWS
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole, StepError
from swactor.wire.tags import CANDIDATES_K, SequenceTag
from swactor.worker.llama_stage import LlamaStageRole
from swactor.worker.roles import build_role
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf

MAX_SEQ = 80
CONTEXTS = [[5, 17, 42, 99, 7], [3, 1, 4], [250, 8, 8, 9, 1, 2, 3, 4, 5, 6]]


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 blocks of Q4_1 matrices (the block type of the project's model)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-q4_1.gguf"
    return write_tiny_gguf(path, TinyConfig(blocks=3, seed=11, matrix_type=Q.Q4_1,
                                            tied=False, context=128))


def _roles(path: Path, split: Sequence[tuple[int, int]], slots: int, *,
           blocks: bool = True, portable: bool = False, dtype: str = "f32"
           ) -> list[StageRole]:
    reader = open_reader(path)
    return [
        StageRole(reader.load_stage(a, b, is_first=i == 0, is_last=i == len(split) - 1,
                                    dtype=dtype, keep_blocks=blocks),
                  max_seq_len=MAX_SEQ, quantised=blocks, slots=slots, device="CPU",
                  portable=portable)
        for i, (a, b) in enumerate(split)
    ]


def _bits(array: npt.NDArray[Any] | None) -> npt.NDArray[np.int32]:
    assert array is not None
    return np.ascontiguousarray(array, dtype=np.float32).view(np.int32)


def _through(roles: list[StageRole], run: Any, payload: npt.NDArray[Any]
             ) -> tuple[npt.NDArray[Any], list[npt.NDArray[Any]]]:
    """``payload`` through every stage by ``run(role, payload)``: the last output and
    every non-last stage's activation rows."""
    rows = []
    for role in roles:
        payload = run(role, payload)
        if not role.is_last:
            rows.append(payload.copy())
    return payload, rows


class _Sides:
    """The contexts prefilled twice: slot ``i`` (apart) and ``i + D`` (mixed)."""

    def __init__(self, roles: list[StageRole], count: int) -> None:
        self.roles, self.count = roles, count
        self.positions = [len(c) for c in CONTEXTS[:count]]
        self.ids: list[int] = []
        for slot, context in enumerate(CONTEXTS[:count]):
            ids = np.array(context, dtype=np.int32)
            apart, _ = _through(roles, lambda r, p, s=slot: r.run_tagged(SequenceTag(s, 0), p),
                                ids)
            mixed, _ = _through(roles, lambda r, p, s=slot: r.run_tagged(
                SequenceTag(s + count, 0), p), ids)
            assert int(apart[0]) == int(mixed[0])
            self.ids.append(int(apart[0]))

    def tags(self, mixed: bool, candidates: bool = False) -> list[SequenceTag]:
        shift = self.count if mixed else 0
        return [SequenceTag(b + shift, self.positions[b], candidates and b == 0)
                for b in range(self.count)]

    def rows(self) -> npt.NDArray[np.int32]:
        return np.array(self.ids, dtype=np.int32)


def _mixed_equals_apart(roles: list[StageRole], prompt: list[int], count: int,
                        candidates: bool = False, steps: int = 2) -> None:
    """One mixed step against the same prompt and rows apart, then ``steps`` decode
    steps of every sequence on both sides: all bit for bit the same."""
    sides = _Sides(roles, count)
    apart_slot, mixed_slot = 2 * count, 2 * count + 1
    ids = np.array(prompt, dtype=np.int32)
    first, prompt_rows = _through(roles, lambda r, p: r.run_tagged(
        SequenceTag(apart_slot, 0, candidates), p), ids)
    prompt_logits = roles[-1].last_logits
    assert prompt_logits is not None
    prompt_logits = prompt_logits.copy()
    rows, batch_rows = _through(
        roles, lambda r, p: r.run_batch(sides.tags(False, candidates), p), sides.rows())
    batch_logits = roles[-1].last_logits
    assert batch_logits is not None
    batch_logits = batch_logits.copy()
    prompt_tag = SequenceTag(mixed_slot, len(prompt), candidates)
    answer, mixed_rows = _through(
        roles, lambda r, p: r.run_mixed(prompt_tag, sides.tags(True, candidates), p),
        np.concatenate([ids, sides.rows()]))
    logits = roles[-1].last_logits
    assert logits is not None and logits.shape[0] == 1 + count
    assert np.array_equal(_bits(logits[0]), _bits(prompt_logits)), "the prompt's logits"
    assert np.array_equal(_bits(logits[1:]), _bits(batch_logits)), "the decode rows' logits"
    np.testing.assert_array_equal(answer, np.concatenate([first, rows]))
    for got, alone, batch in zip(mixed_rows, prompt_rows, batch_rows, strict=True):
        assert got.shape == (len(prompt) + count, alone.shape[1])
        assert np.array_equal(_bits(got[: len(prompt)]), _bits(alone[: len(prompt)]))
        assert np.array_equal(_bits(got[len(prompt):]), _bits(batch))
    # the KV entries the step wrote: the next steps of every sequence stay the same
    token = int(np.argmax(prompt_logits))
    position = len(prompt)
    sides.ids = [int(np.argmax(row)) for row in batch_logits]
    for _ in range(steps):
        outs = []
        for slot in (apart_slot, mixed_slot):
            out, _ = _through(roles, lambda r, p, s=slot, at=position: r.run_tagged(
                SequenceTag(s, at), p), np.array([token], dtype=np.int32))
            assert roles[-1].last_logits is not None
            outs.append((int(out[0]), _bits(roles[-1].last_logits).copy()))
        assert outs[0][0] == outs[1][0] and np.array_equal(outs[0][1], outs[1][1])
        token, position = outs[0][0], position + 1
        sides.positions = [p + 1 for p in sides.positions]
        apart, _ = _through(roles, lambda r, p: r.run_batch(sides.tags(False), p),
                            sides.rows())
        apart_logits = _bits(roles[-1].last_logits).copy()
        mixed, _ = _through(roles, lambda r, p: r.run_batch(sides.tags(True), p),
                            sides.rows())
        np.testing.assert_array_equal(apart, mixed)
        assert np.array_equal(apart_logits, _bits(roles[-1].last_logits))
        sides.ids = [int(a) for a in apart]


@pytest.mark.parametrize(("tokens", "count", "split", "candidates"), [
    (5, 3, [(0, 3)], False),  # the rows take the prompt's 3 padding rows: 8 in all
    (8, 1, [(0, 3)], True),  # a row past a full bucket: apart; candidates answered
    (13, 2, [(0, 1), (1, 3)], False),  # split: the middle stage's rows, 16 rows
    (1, 3, [(0, 2), (2, 3)], True),  # a one-token prompt
], ids=["fills-padding", "next-bucket", "split", "one-token"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_a_mixed_step_equals_the_prompt_and_rows_apart(
        tiny_q4_1: Path, tokens: int, count: int, split: list[tuple[int, int]],
        candidates: bool, dtype: str) -> None:
    """In f16 too: there the last stage's graphs never round their last block's output
    to f16 before the final norm (tinygrad folds the round trip), and a mixed step's
    graph must not either."""
    roles = _roles(tiny_q4_1, split, 2 * count + 2, dtype=dtype)
    prompt = [(7 * i + 3) % 250 + 1 for i in range(tokens)]
    _mixed_equals_apart(roles, prompt, count, candidates)
    bucket = -(-tokens // 8) * 8
    graphs = {(bucket, count)} if tokens + count <= bucket else set()
    for role in roles:
        assert set(role._mixed) == graphs, "one graph where the rows fit the padding"


def test_a_prompt_too_long_to_mix_runs_apart_and_equals(tiny_q4_1: Path) -> None:
    """Past PREFILL_ROWS rows the prompt is prefilled and the rows batched, one after
    the other, with the same results."""
    roles = _roles(tiny_q4_1, [(0, 3)], 4)
    prompt = [(5 * i + 1) % 250 + 1 for i in range(PREFILL_ROWS)]
    _mixed_equals_apart(roles, prompt, 1, steps=1)
    assert roles[0]._mixed == {}


@pytest.mark.parametrize("where", ["portable", "dense"])
def test_where_one_graph_would_differ_the_step_runs_apart_and_equals(
        tiny_q4_1: Path, where: str) -> None:
    """The portable path (tinygrad's attention), and dense f32 weights (a prefill's
    product is a matrix product there): apart, with the same results."""
    roles = _roles(tiny_q4_1, [(0, 3)], 6, blocks=where != "dense",
                   portable=where == "portable")
    _mixed_equals_apart(roles, [9, 8, 7, 6], 2, steps=1)
    assert roles[0]._mixed == {}


def test_a_bad_mixed_step_is_a_step_error_that_changes_no_slot(tiny_q4_1: Path) -> None:
    (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
    role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    role.run_tagged(SequenceTag(2, 0), np.array([9], dtype=np.int32))
    ids = np.array([1, 2, 3, 4, 5], dtype=np.int32)
    prompt = SequenceTag(0, 4)
    bad = [
        (prompt, [], ids[:4], "without decode rows"),
        (prompt, [SequenceTag(1, 3)], ids[:4], "carries 4"),
        (SequenceTag(1, 4), [SequenceTag(1, 3)], ids, "appears twice"),
        (prompt, [SequenceTag(1, 2)], ids, "not the slot's next position"),
        (prompt, [SequenceTag(1, 3), SequenceTag(1, 3)], np.arange(6, dtype=np.int32),
         "appears twice"),
        (SequenceTag(3, 4), [SequenceTag(1, 3)], ids, "slot 3 outside"),
        (SequenceTag(0, MAX_SEQ + 1), [SequenceTag(1, 3)],
         np.ones(MAX_SEQ + 2, dtype=np.int32), "a prompt of 81 rows"),
        (prompt, [SequenceTag(1, 3)], np.array([1, 2, 3, 4, 10**6], np.int32), "token id"),
    ]
    for tag, rows, payload, rule in bad:
        with pytest.raises(StepError, match=rule):
            role.run_mixed(tag, rows, payload)
    # every slot as it was: slot 1 takes position 3, slot 2 position 1
    role.run_mixed(prompt, [SequenceTag(1, 3), SequenceTag(2, 1, True)],
                   np.arange(1, 7, dtype=np.int32))
    logits = role.last_logits
    assert logits is not None and logits.shape[0] == 3
    assert role._positions == [4, 4, 2]
    answer = role.run_mixed(SequenceTag(1, 2), [SequenceTag(0, 4), SequenceTag(2, 2)],
                            np.array([3, 3, 1, 2], dtype=np.int32))
    assert answer.shape == (3,)


def test_candidates_rows_answer_their_candidates(tiny_q4_1: Path) -> None:
    (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
    role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    answer = role.run_mixed(SequenceTag(0, 2, True), [SequenceTag(1, 3)],
                            np.array([4, 4, 8], dtype=np.int32))
    assert answer.shape == (2 * CANDIDATES_K + 1,)
    logits = role.last_logits
    assert logits is not None
    assert int(answer[0]) == int(np.argmax(logits[0]))
    assert int(answer[-1]) == int(np.argmax(logits[1]))


def test_a_cached_mixed_graph_computes_what_the_built_one_did(
        tiny_q4_1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer builds the step's graph and keeps it (kind ``mixed-8-2``); a new role
    of the same structure loads it instead of building, and computes the same bits."""
    from swactor.model import jit_cache

    monkeypatch.setenv(jit_cache.CACHE_ENV, str(tmp_path / "kernels"))
    results = []
    for reader in (False, True):
        (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
        role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
        role.run_tagged(SequenceTag(2, 0), np.array([9], dtype=np.int32))
        role.run_mixed(SequenceTag(0, 5), [SequenceTag(1, 3), SequenceTag(2, 1)],
                       np.arange(1, 8, dtype=np.int32))
        assert role._kernels is not None
        if reader:
            assert "mixed-8-2" in role._kernels.loaded
            assert "mixed-8-2" not in role._kernels.saved
        else:
            assert "mixed-8-2" in role._kernels.saved
        step = role.run_mixed(SequenceTag(1, 2), [SequenceTag(0, 5), SequenceTag(2, 2)],
                              np.array([3, 3, 1, 2], dtype=np.int32))  # a replay
        results.append((_bits(role.last_logits).copy(), step.copy()))
    assert np.array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_warm_up_builds_each_short_buckets_mixed_graphs_and_leaves_the_role_new(
        tiny_q4_1: Path) -> None:
    """``warm_up(mixed=...)``: a graph per warmed short bucket and decode row count
    (fewer rows than slots, so the prompt has one), run once; then a mixed step replays
    one of them, with the results of the step apart."""
    (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
    role.warm_up(prompt_tokens=16, mixed=[1, 2, 3])
    assert set(role._mixed) == {(8, 1), (8, 2), (16, 1), (16, 2)}
    assert all(jit.captured is not None for jit, _ in role._mixed.values())
    assert role._positions == [0, 0, 0]
    (twin,) = _roles(tiny_q4_1, [(0, 3)], 3)
    for r in (role, twin):
        r.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    ids = np.array([1, 2, 3, 4, 5, 8], dtype=np.int32)
    role.run_mixed(SequenceTag(0, 5), [SequenceTag(1, 3)], ids)
    assert set(role._mixed) == {(8, 1), (8, 2), (16, 1), (16, 2)}, "nothing built"
    twin.run_tagged(SequenceTag(0, 0), ids[:5])
    want_prompt = _bits(twin.last_logits).copy()
    twin.run_batch([SequenceTag(1, 3)], ids[5:])
    logits = role.last_logits
    assert logits is not None
    assert np.array_equal(_bits(logits[0]), want_prompt)
    assert np.array_equal(_bits(logits[1:]), _bits(twin.last_logits))


def test_the_stage_role_warms_the_mixed_graphs_its_config_lists(tiny_q4_1: Path) -> None:
    """``llama_stage``'s ``mixed_rows`` (the plan's ``warm_mixed_rows``, which a serving
    run with mixed steps on asks for) reach ``warm_up``: the graphs are built while the
    role is configured; a config without them builds none."""
    config: dict[str, Any] = {
        "kind": "llama_stage", "gguf": str(tiny_q4_1), "layer_start": 0, "layer_end": 3,
        "first": True, "last": True, "dtype": "f32", "max_seq_len": MAX_SEQ,
        "sampling": None, "weights": "blocks", "slots": 3,
        "warm_prompt_tokens": 16}
    warm = build_role({**config, "mixed_rows": [1, 2]}, "CPU")
    assert isinstance(warm, LlamaStageRole)
    assert set(warm.stage._mixed) == {(8, 1), (8, 2), (16, 1), (16, 2)}
    cold = build_role(config, "CPU")
    assert isinstance(cold, LlamaStageRole) and not cold.stage._mixed


def test_a_mixed_graph_counts_with_its_bucket_and_goes_with_it(tiny_q4_1: Path) -> None:
    """A mixed step's graph and inputs count toward its bucket's bytes (what it
    allocated, as a prefill bucket's do), and dropping the bucket drops them."""
    (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
    role.warm_up(prompt_tokens=8)
    role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    before = role.bucket_bytes()
    gc.collect()
    used = GlobalCounters.mem_used
    role.run_mixed(SequenceTag(0, 5), [SequenceTag(1, 3)],
                   np.array([1, 2, 3, 4, 5, 8], dtype=np.int32))
    gc.collect()
    assert set(role._mixed) == {(8, 1)}
    after = role.bucket_bytes()
    allocated = GlobalCounters.mem_used - used
    # what it allocated, up to a scalar buffer tinygrad may already hold from an earlier
    # graph of the process (4 bytes each)
    assert allocated > 0 and abs((after[8] - before[8]) - allocated) <= 16
    role._drop_bucket(8)
    assert not role._mixed and 8 not in role.bucket_bytes()


def test_warm_up_builds_mixed_graphs_only_while_they_fit(
        tiny_q4_1: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Warm-up builds the mixed graphs bucket by bucket, shortest first, while the kept
    buckets' bytes (their mixed graphs counted) fit in PREFILL_KEEP_BYTES, and says
    where it stopped; the buckets themselves stay."""
    (plain,) = _roles(tiny_q4_1, [(0, 3)], 3)
    plain.warm_up(prompt_tokens=16)
    (full,) = _roles(tiny_q4_1, [(0, 3)], 3)
    full.warm_up(prompt_tokens=16, mixed=[1, 2])
    alone, mixed = plain.bucket_bytes(), full.bucket_bytes()
    assert mixed[8] > alone[8] and mixed[16] > alone[16]
    budget = mixed[8] + alone[16] + (mixed[16] - alone[16]) // 2  # 16's mixed do not fit
    monkeypatch.setattr(llama_role, "PREFILL_KEEP_BYTES", budget)
    (role,) = _roles(tiny_q4_1, [(0, 3)], 3)
    with caplog.at_level("WARNING", logger=llama_role.__name__):
        role.warm_up(prompt_tokens=16, mixed=[1, 2])
    assert set(role._mixed) == {(8, 1), (8, 2)} and sorted(role._prefill) == [8, 16]
    kept = role.bucket_bytes()  # 8's mixed graphs counted; 16's dropped with their bytes
    assert kept[8] > alone[8] and kept[16] == alone[16]
    assert "buckets below 16 rows only" in caplog.text
