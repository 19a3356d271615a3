"""KV slots: a role with K slots runs K tagged sequences interleaved, each as if alone.

The tiny random GGUF checks the mechanics (interleaving, candidates, bad tags) fast;
the SmolLM2 tests (slow) check greedy tokens of real prompts, one stage and a split.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest

from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole, StepError
from swactor.wire.tags import CANDIDATES_K, SequenceTag

MAX_SEQ = 16
TINY_PROMPTS = [[5, 17, 42, 99, 7, 250], [3, 1, 4], [250, 8, 8, 9, 1, 2, 3, 4, 5, 6], [11]]


def _roles(path: Path, split: Sequence[tuple[int, int]], slots: int, max_seq_len: int,
           blocks: bool = False) -> list[StageRole]:
    reader = open_reader(path)
    return [
        StageRole(reader.load_stage(a, b, is_first=i == 0, is_last=i == len(split) - 1,
                                    dtype="f32", keep_blocks=blocks),
                  max_seq_len=max_seq_len, quantised=blocks, slots=slots)
        for i, (a, b) in enumerate(split)
    ]


def _alone(roles: list[StageRole], prompt: list[int], steps: int,
           logits: list[npt.NDArray[np.float32]] | None = None) -> list[int]:
    """Greedy tokens of ``prompt`` through the untagged single-sequence API (each
    step's logits appended to ``logits``)."""
    tokens: list[int] = []
    payload: npt.NDArray[Any] = np.array(prompt, dtype=np.int32)
    for sequence in range(steps):
        for role in roles:
            payload = role.step(sequence, payload)
        tokens.append(int(payload[0]))
        if logits is not None:
            assert roles[-1].last_logits is not None
            logits.append(roles[-1].last_logits.copy())
    return tokens


def _tagged(roles: list[StageRole], tag: SequenceTag, payload: npt.NDArray[Any]
            ) -> npt.NDArray[Any]:
    for role in roles:
        payload = role.run_tagged(tag, payload)
    return payload


def _interleaved(roles: list[StageRole], prompts: list[list[int]], steps: int,
                 candidates_every: int = 0,
                 logits: list[list[npt.NDArray[np.float32]]] | None = None
                 ) -> list[list[int]]:
    """Every prompt in its own slot, steps interleaved: the prefills in reverse order,
    then decode rounds visiting the slots in a rotating order. With ``candidates_every``
    every n-th step asks for candidates (and checks them against the greedy id)."""
    tokens: list[list[int]] = [[] for _ in prompts]
    count = 0

    def run(slot: int, position: int, payload: npt.NDArray[Any]) -> None:
        nonlocal count
        count += 1
        ask = bool(candidates_every) and count % candidates_every == 0
        out = _tagged(roles, SequenceTag(slot, position, ask), payload)
        if logits is not None:
            assert roles[-1].last_logits is not None
            logits[slot].append(roles[-1].last_logits.copy())
        if ask:
            assert out.dtype == np.int32 and out.shape == (2 * CANDIDATES_K,)
            ids, values = out[:CANDIDATES_K], out[CANDIDATES_K:].view(np.float32)
            greedy = _tagged_greedy_of(roles[-1])
            assert int(ids[0]) == greedy
            assert np.all(np.diff(values) <= 0)
            assert len(set(ids.tolist())) == CANDIDATES_K
            last = roles[-1].last_logits
            assert last is not None
            np.testing.assert_array_equal(values, last[ids])
            tokens[slot].append(int(ids[0]))
        else:
            assert out.dtype == np.int32 and out.shape == (1,)
            tokens[slot].append(int(out[0]))

    for slot in reversed(range(len(prompts))):
        run(slot, 0, np.array(prompts[slot], dtype=np.int32))
    for step in range(1, steps):
        order = list(range(len(prompts)))
        order = order[step % len(order):] + order[: step % len(order)]
        for slot in order:
            run(slot, len(prompts[slot]) + step - 1, np.array([tokens[slot][-1]], np.int32))
    return tokens


def _tagged_greedy_of(role: StageRole) -> int:
    assert role.last_logits is not None
    return int(np.argmax(role.last_logits))


def test_interleaved_slots_match_each_prompt_alone(tiny_llama: Path) -> None:
    """Tokens equal, and logits too (a random model's tokens barely depend on the
    context, its logits do)."""
    steps = 5
    want: list[list[npt.NDArray[np.float32]]] = [[] for _ in TINY_PROMPTS]
    alone = [_alone(_roles(tiny_llama, [(0, 4)], 1, MAX_SEQ), p, steps, want[i])
             for i, p in enumerate(TINY_PROMPTS)]
    (role,) = _roles(tiny_llama, [(0, 4)], len(TINY_PROMPTS), MAX_SEQ)
    assert role.kv_cache_bytes == 4 * _roles(tiny_llama, [(0, 4)], 1, MAX_SEQ)[0].kv_cache_bytes
    got: list[list[npt.NDArray[np.float32]]] = [[] for _ in TINY_PROMPTS]
    assert _interleaved([role], TINY_PROMPTS, steps, candidates_every=3, logits=got) == alone
    for slot_got, slot_want in zip(got, want, strict=True):
        for step_got, step_want in zip(slot_got, slot_want, strict=True):
            np.testing.assert_allclose(step_got, step_want, rtol=1e-5, atol=1e-5)
    split = _roles(tiny_llama, [(0, 1), (1, 4)], len(TINY_PROMPTS), MAX_SEQ)
    assert _interleaved(split, TINY_PROMPTS, steps) == alone
    # the untagged API is slot 0 of a many-slot role
    assert _alone([role], TINY_PROMPTS[2], steps) == alone[2]


def test_a_slot_restarts_at_position_zero_and_warm_up_keeps_every_slot(tiny_llama: Path
                                                                       ) -> None:
    fresh = _roles(tiny_llama, [(0, 4)], 1, MAX_SEQ)
    want_new = _alone(fresh, TINY_PROMPTS[1], 3)
    want_old = _alone(fresh, TINY_PROMPTS[0], 6)
    (role,) = _roles(tiny_llama, [(0, 4)], 3, MAX_SEQ)
    role.warm_up()
    first = _interleaved([role], [TINY_PROMPTS[0], TINY_PROMPTS[3], TINY_PROMPTS[2]], 4)
    assert first[0] == want_old[:4]
    # slot 2 takes a new sequence while slot 0 goes on with its own
    new: list[int] = []
    old = first[0]
    for step in range(3):
        ids = TINY_PROMPTS[1] if step == 0 else [new[-1]]
        new.append(int(role.run_tagged(SequenceTag(2, 0 if step == 0 else
                                                    len(TINY_PROMPTS[1]) + step - 1),
                                       np.array(ids, dtype=np.int32))[0]))
        if step < 2:
            position = len(TINY_PROMPTS[0]) + len(old) - 1
            old.append(int(role.run_tagged(SequenceTag(0, position),
                                           np.array([old[-1]], dtype=np.int32))[0]))
    assert new == want_new
    assert old == want_old


def test_bad_tags_are_step_errors(tiny_llama: Path) -> None:
    (role,) = _roles(tiny_llama, [(0, 4)], 2, MAX_SEQ)
    one = np.array([5], dtype=np.int32)
    with pytest.raises(StepError, match="slot 2 outside"):
        role.run_tagged(SequenceTag(2, 0), one)
    with pytest.raises(StepError, match="not the slot's next position 0"):
        role.run_tagged(SequenceTag(0, 3), one)
    role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    with pytest.raises(StepError, match="carries 2 rows"):
        role.run_tagged(SequenceTag(1, 3), np.array([5, 6], dtype=np.int32))
    with pytest.raises(StepError, match="not the slot's next position 3"):
        role.run_tagged(SequenceTag(1, 4), one)
    with pytest.raises(StepError, match="exceed max_seq_len"):
        role.run_tagged(SequenceTag(0, 0), np.arange(MAX_SEQ + 1, dtype=np.int32))
    role.run_tagged(SequenceTag(1, 3), one)  # the failed steps changed nothing


def _batched(roles: list[StageRole], prompts: list[list[int]], steps: int,
             candidates: frozenset[int] = frozenset()) -> list[list[int]]:
    """Every prompt prefilled in its own slot (single-tag objects), then each decode
    round as ONE batch of every slot's row, rows in a rotating order; the slots in
    ``candidates`` ask for candidates (their greedy id is the first candidate)."""
    tokens: list[list[int]] = []
    for slot, prompt in enumerate(prompts):
        out = _tagged(roles, SequenceTag(slot, 0), np.array(prompt, dtype=np.int32))
        tokens.append([int(out[0])])
    for step in range(1, steps):
        order = list(range(len(prompts)))
        order = order[step % len(order):] + order[: step % len(order)]
        tags = [SequenceTag(slot, len(prompts[slot]) + step - 1, slot in candidates)
                for slot in order]
        payload: npt.NDArray[Any] = np.array([tokens[slot][-1] for slot in order], np.int32)
        for role in roles:
            payload = role.run_batch(tags, payload)
            if role is not roles[-1]:
                assert payload.shape == (len(tags), role.facts.hidden_dim)
        offset = 0
        for tag in tags:
            width = 2 * CANDIDATES_K if tag.candidates else 1
            tokens[tag.slot].append(int(payload[offset]))
            offset += width
        assert offset == payload.shape[0]
    return tokens


def test_a_batch_of_decode_rows_equals_each_row_alone(tiny_llama: Path) -> None:
    steps = 5
    alone = [_alone(_roles(tiny_llama, [(0, 4)], 1, MAX_SEQ), p, steps) for p in TINY_PROMPTS]
    (role,) = _roles(tiny_llama, [(0, 4)], len(TINY_PROMPTS), MAX_SEQ)
    assert _batched([role], TINY_PROMPTS, steps, frozenset({1, 3})) == alone
    split = _roles(tiny_llama, [(0, 1), (1, 4)], len(TINY_PROMPTS), MAX_SEQ)
    assert _batched(split, TINY_PROMPTS, steps) == alone


def test_a_batch_larger_than_its_kernels_runs_in_chunks_equal_to_rows_alone(
        tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With only the 2-row decode JIT ready, batches of 3 and 4 rows run as 2 + 1 and
    2 + 2 and every row still equals its prompt run alone."""
    steps = 4
    alone = [_alone(_roles(tiny_llama, [(0, 4)], 1, MAX_SEQ), p, steps) for p in TINY_PROMPTS]
    for count, chunks in ((3, [2]), (4, [2, 2])):
        (role,) = _roles(tiny_llama, [(0, 4)], count, MAX_SEQ)
        role.warm_up(rows=[2])
        sizes: list[int] = []
        rows = role._decode_rows

        def spy(array: npt.NDArray[Any], slots: Sequence[int], starts: Sequence[int],
                rows: Any = rows, sizes: list[int] = sizes) -> npt.NDArray[Any]:
            sizes.append(len(slots))
            return rows(array, slots, starts)

        monkeypatch.setattr(role, "_decode_rows", spy)
        assert _batched([role], TINY_PROMPTS[:count], steps) == alone[:count]
        assert sizes == chunks * (steps - 1)  # each decode round: its 2-row chunks
        assert count not in role._rows  # no JIT of the whole batch's size was built


def test_a_bad_batch_is_a_step_error_that_changes_no_slot(tiny_llama: Path) -> None:
    (role,) = _roles(tiny_llama, [(0, 4)], 3, MAX_SEQ)
    for slot in range(3):
        role.run_tagged(SequenceTag(slot, 0), np.array([5, 6], dtype=np.int32))
    two = np.array([7, 8], dtype=np.int32)
    bad = [
        ([SequenceTag(0, 2), SequenceTag(0, 2)], two, "appears twice"),
        ([SequenceTag(0, 2), SequenceTag(3, 2)], two, "slot 3 outside"),
        ([SequenceTag(0, 2), SequenceTag(1, 0)], two, "not the slot's next position"),
        ([SequenceTag(0, 2), SequenceTag(1, 3)], two, "not the slot's next position 2"),
        ([SequenceTag(0, 2)], two, "1 tags carries 2 rows"),
        ([], np.array([7], dtype=np.int32), "0 tags carries 1 rows"),
    ]
    for tags, payload, rule in bad:
        with pytest.raises(StepError, match=rule):
            role.run_batch(tags, payload)
    # nothing moved: every slot still takes position 2, in one batch
    out = role.run_batch([SequenceTag(2, 2), SequenceTag(0, 2), SequenceTag(1, 2)],
                         np.array([7, 8, 9], dtype=np.int32))
    assert out.shape == (3,)


def test_a_prompt_batch_prefills_each_prompt_as_alone(tiny_llama: Path,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """Three prompts (6 + 3 + 10 rows) in one prompt batch, through a split, every
    bucket ready: each prompt's prefill is its bucket's JIT, as alone (three prefills
    per stage, nothing built); each answer and logits bit for bit as the prompt alone,
    and each slot's cache as alone (the decode steps after it give each prompt's
    tokens)."""
    steps, seq = 4, 32
    prompts = TINY_PROMPTS[:3]
    want: list[list[npt.NDArray[np.float32]]] = [[] for _ in prompts]
    alone = [_alone(_roles(tiny_llama, [(0, 4)], 1, seq), p, steps, want[i])
             for i, p in enumerate(prompts)]
    roles = _roles(tiny_llama, [(0, 1), (1, 4)], 4, seq)
    for role in roles:
        role.warm_up(prompt_tokens=seq)
    slots = [2, 0, 3]
    tags = [SequenceTag(slot, len(p), candidates=i == 1)
            for i, (slot, p) in enumerate(zip(slots, prompts, strict=True))]
    built = [dict(role._prefill) for role in roles]
    calls: list[tuple[int, int]] = []
    for role in roles:
        def spy(array: npt.NDArray[Any], slot: int, step: Any = role._prefill_step
                ) -> npt.NDArray[Any]:
            calls.append((len(array), slot))
            return cast("npt.NDArray[Any]", step(array, slot))
        monkeypatch.setattr(role, "_prefill_step", spy)
    payload: npt.NDArray[Any] = np.concatenate([np.array(p, np.int32) for p in prompts])
    for role in roles:
        payload = role.run_prompts(tags, payload)
    assert calls == [(6, 2), (3, 0), (10, 3)] * 2, "each prompt as alone"
    assert [dict(role._prefill) for role in roles] == built
    assert payload.shape == (1 + 2 * CANDIDATES_K + 1,)
    firsts = [int(payload[0]), int(payload[1]), int(payload[-1])]
    assert firsts == [tokens[0] for tokens in alone]
    logits = roles[-1].last_logits
    assert logits is not None and logits.shape[0] == 3
    for got, steps_want in zip(logits, want, strict=True):
        np.testing.assert_array_equal(got, steps_want[0])
    tokens = [[first] for first in firsts]
    for step in range(1, steps):
        for i, prompt in enumerate(prompts):
            out = _tagged(roles, SequenceTag(slots[i], len(prompt) + step - 1),
                          np.array([tokens[i][-1]], dtype=np.int32))
            tokens[i].append(int(out[0]))
    assert tokens == alone


def test_a_bad_prompt_batch_is_a_step_error_that_changes_no_slot(tiny_llama: Path) -> None:
    (role,) = _roles(tiny_llama, [(0, 4)], 2, MAX_SEQ)
    role.run_tagged(SequenceTag(1, 0), np.array([5, 6, 7], dtype=np.int32))
    ids = np.array([1, 2, 3, 4], dtype=np.int32)
    bad = [
        ([SequenceTag(0, 2), SequenceTag(0, 2)], "appears twice"),
        ([SequenceTag(0, 1), SequenceTag(1, 2)], "of 3 rows carries 4"),
        ([SequenceTag(2, 4)], "slot 2 outside"),
        ([SequenceTag(0, 0), SequenceTag(1, 4)], "a prompt of 0 rows"),
        ([SequenceTag(0, 1), SequenceTag(1, 1), SequenceTag(1, 2)], "takes 1..2"),
        ([], "takes 1..2"),
    ]
    for tags, rule in bad:
        with pytest.raises(StepError, match=rule):
            role.run_prompts(tags, ids)
    role.run_tagged(SequenceTag(1, 3), np.array([5], dtype=np.int32))  # slot 1 as it was


@pytest.mark.slow
@pytest.mark.soak
def test_smollm2_batched_decode_equals_each_prompt_alone() -> None:
    """The real model, split in two stages: four prompts decoded as one batch per step
    (two of them sampled, so their rows answer candidates) give each its greedy tokens."""
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    tokenizer = Tokenizer.from_gguf(path)
    texts = ["hello world", "The capital of France is", "1, 2, 3, 4,",
             "Once upon a time there was a little"]
    prompts = [list(tokenizer.encode(t)) for t in texts]
    split = [(0, 13), (13, 30)]
    steps = 6
    alone_roles = _roles(path, split, 1, 64, blocks=True)
    alone = [_alone(alone_roles, p, steps) for p in prompts]
    assert len({tuple(a) for a in alone}) == len(prompts)
    roles = _roles(path, split, len(prompts), 64, blocks=True)
    assert _batched(roles, prompts, steps, frozenset({0, 2})) == alone


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("split", [[(0, 30)], [(0, 13), (13, 30)]], ids=["1-stage", "2-stage"])
def test_smollm2_four_slots_give_each_prompt_its_greedy_tokens(
        split: list[tuple[int, int]]) -> None:
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    tokenizer = Tokenizer.from_gguf(path)
    texts = ["hello world", "The capital of France is", "1, 2, 3, 4,",
             "Once upon a time there was a little"]
    prompts = [list(tokenizer.encode(t)) for t in texts]
    steps = 12
    alone_roles = _roles(path, split, 1, 64, blocks=True)
    alone = [_alone(alone_roles, p, steps) for p in prompts]
    assert len({tuple(a) for a in alone}) == len(prompts)  # four different continuations
    roles = _roles(path, split, len(prompts), 64, blocks=True)
    assert _interleaved(roles, prompts, steps, candidates_every=5) == alone


def _slot_kv(role: StageRole, slot: int, rows: int) -> list[npt.NDArray[Any]]:
    """Copies of every block's keys and values at positions ``0..rows-1`` of ``slot``."""
    return [view[slot, :, :rows].copy() for pair in role._cache_views for view in pair]


@pytest.mark.slow
@pytest.mark.soak
def test_smollm2_prompt_batch_is_bit_identical_to_each_prompt_alone() -> None:
    """The real model, split in two stages, every prefill bucket a prompt batch could
    use ready (warm-up): three prompts of a prompt batch (a serving run's migrated or
    held streams) give stage 0's activation rows, the last stage's logits and each
    slot's keys and values bit for bit as each prompt prefilled alone in a slot. A
    greedy near-tie would otherwise pick another token than the prompt alone."""
    from swactor.model.paths import default_model_path
    from swactor.model.tokenizer import Tokenizer

    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"{path} missing: run scripts/setup.sh")
    tokenizer = Tokenizer.from_gguf(path)
    texts = ["The capital of France is",
             "Once upon a time, a small robot found a flower in the ruins of a city",
             "1, 2, 3, 4,"]
    prompts = [np.array(tokenizer.encode(t), dtype=np.int32) for t in texts]
    counts = [len(p) for p in prompts]
    assert sum(counts) <= 48 and len(set(counts)) == 3
    roles = _roles(path, [(0, 13), (13, 30)], 4, 64, blocks=True)
    for role in roles:
        role.warm_up(prompt_tokens=48)
    rows, logits, kv = [], [], []
    for slot, prompt in enumerate(prompts):  # alone, each in its own slot
        hidden = roles[0].run_tagged(SequenceTag(slot, 0), prompt)
        roles[1].run_tagged(SequenceTag(slot, 0), hidden)
        assert roles[1].last_logits is not None
        rows.append(hidden)
        logits.append(roles[1].last_logits.reshape(-1).copy())
        kv.append([_slot_kv(role, slot, len(prompt)) for role in roles])
    slots = [3, 1, 0]
    tags = [SequenceTag(slot, n) for slot, n in zip(slots, counts, strict=True)]
    hidden = roles[0].run_prompts(tags, np.concatenate(prompts))
    answers = roles[1].run_prompts(tags, hidden)
    batch_logits = roles[1].last_logits
    assert batch_logits is not None and batch_logits.shape[0] == 3
    offsets = np.cumsum([0, *counts])
    for i, slot in enumerate(slots):
        assert np.array_equal(hidden[offsets[i] : offsets[i + 1]], rows[i]), i
        assert np.array_equal(batch_logits[i], logits[i]), (
            i, float(np.max(np.abs(batch_logits[i] - logits[i]))))
        assert int(answers[i]) == int(np.argmax(logits[i]))
        for stage, role in enumerate(roles):
            got = _slot_kv(role, slot, counts[i])
            assert all(np.array_equal(a, b) for a, b in zip(got, kv[i][stage], strict=True)
                       ), (i, stage)
