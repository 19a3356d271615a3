"""Sequence tags in the object header's flags word (swactor.wire.tags)."""

from __future__ import annotations

import pytest

from swactor.wire.tags import (
    BATCH,
    CANDIDATES_K,
    MAX_POSITION,
    MAX_PROMPTS,
    MAX_SLOTS,
    MIXED,
    PROMPTS,
    SequenceTag,
    TagError,
    answer_words,
    batch_flags,
    batch_rows,
    batch_table,
    max_batch_answer_words,
    mixed_count,
    mixed_flags,
    mixed_table,
    prompt_count,
    prompt_flags,
    prompt_table,
    read_table,
    table_bytes,
    table_entries,
)


@pytest.mark.parametrize("tag", [
    SequenceTag(0, 0), SequenceTag(3, 17), SequenceTag(MAX_SLOTS - 1, MAX_POSITION, True),
    SequenceTag(1, 0, candidates=True),
])
def test_a_tag_round_trips_through_the_flags_word(tag: SequenceTag) -> None:
    flags = tag.pack()
    assert 0 < flags < 1 << 32
    assert SequenceTag.unpack(flags) == tag


def test_untagged_flags_mean_a_single_sequence_run() -> None:
    assert SequenceTag.unpack(0) is None


@pytest.mark.parametrize("flags", [1, 1 << 30, 1 << 32 | 1 << 31])
def test_flags_that_are_not_a_tag_are_refused(flags: int) -> None:
    with pytest.raises(TagError):
        SequenceTag.unpack(flags)


@pytest.mark.parametrize(("slot", "position"), [(-1, 0), (MAX_SLOTS, 0), (0, -1),
                                                (0, MAX_POSITION + 1)])
def test_fields_out_of_range_are_refused(slot: int, position: int) -> None:
    with pytest.raises(TagError, match="SequenceTag"):
        SequenceTag(slot, position)


def test_slot_and_position_do_not_overlap() -> None:
    assert SequenceTag(1, 0).pack() != SequenceTag(0, 1 << 19).pack()
    assert SequenceTag.unpack(SequenceTag(5, MAX_POSITION).pack()) == SequenceTag(5, MAX_POSITION)


# -- batch objects: flags + a tag table at the head of the payload ----------------------

def _table(*tags: SequenceTag) -> list[int]:
    return [tag.pack() for tag in tags]


def test_a_batch_table_round_trips() -> None:
    tags = (SequenceTag(2, 9), SequenceTag(0, 5, candidates=True), SequenceTag(3, 1))
    flags = batch_flags(len(tags))
    assert batch_rows(flags) == 3
    assert SequenceTag.unpack(0) is None and batch_rows(0) is None
    assert batch_rows(SequenceTag(1, 4).pack()) is None  # a single tag is no batch
    # the rows after the table are not the table's business
    assert batch_table(flags, [*_table(*tags), 7, 8, 9], slots=4) == tags
    assert [answer_words(t) for t in tags] == [1, 2 * CANDIDATES_K, 1]


def test_a_batch_is_neither_untagged_nor_a_single_tag() -> None:
    with pytest.raises(TagError):  # readers that know no batches refuse it
        SequenceTag.unpack(batch_flags(2))


@pytest.mark.parametrize("flags", [BATCH, BATCH | 1 << 12, BATCH | 1 << 30 | 2,
                                   BATCH | (MAX_SLOTS + 1), 1 << 32 | BATCH | 1])
def test_malformed_batch_flags_are_refused(flags: int) -> None:
    with pytest.raises(TagError, match="batch"):
        batch_rows(flags)


@pytest.mark.parametrize("rows", [0, MAX_SLOTS + 1])
def test_a_batch_of_no_rows_or_too_many_cannot_be_made(rows: int) -> None:
    with pytest.raises(TagError):
        batch_flags(rows)


@pytest.mark.parametrize(("flags", "words", "rule"), [
    (batch_flags(5), _table(*(SequenceTag(i, 1) for i in range(5))), "exceed the 4 slots"),
    (batch_flags(3), _table(SequenceTag(0, 1), SequenceTag(1, 1)), "hold no table"),
    (batch_flags(2), [SequenceTag(0, 1).pack(), 12], "not a sequence tag"),
    (batch_flags(2), [SequenceTag(0, 1).pack(), batch_flags(1)], "not a sequence tag"),
    (batch_flags(2), [SequenceTag(0, 1).pack(), 1 << 33 | 1 << 31], "not a sequence tag"),
    (batch_flags(2), _table(SequenceTag(0, 1), SequenceTag(1, 0)), "position 0"),
    (batch_flags(2), _table(SequenceTag(0, 1), SequenceTag(4, 3)), "slot 4 outside"),
    (batch_flags(2), _table(SequenceTag(2, 1), SequenceTag(2, 3)), "appears twice"),
    (SequenceTag(0, 1).pack(), _table(SequenceTag(0, 1)), "not a batch object"),
    (0, [], "not a batch object"),
])
def test_a_malformed_table_is_a_typed_error(flags: int, words: list[int], rule: str) -> None:
    with pytest.raises(TagError, match=rule):
        batch_table(flags, words, slots=4)


def test_the_largest_answer_fits_a_full_batch_of_candidates() -> None:
    assert max_batch_answer_words(4) == 4 + 4 * 2 * CANDIDATES_K


@pytest.mark.parametrize(("rows", "row_bytes", "padded"), [
    (1, 4, 4), (3, 4, 12), (64, 4, 256),  # token edges: a u32 is a row, no padding
    (1, 2304, 2304), (4, 2304, 2304),     # SmolLM2 f32 rows (576 * 4): one row
    (2, 256, 256), (64, 256, 256), (65, 256, 512),  # 65 tags: 260 bytes, two rows
    (3, 10, 20),                          # 12 bytes in rows of 10: two rows
])
def test_a_batch_table_is_padded_to_whole_rows_of_its_edge(
        rows: int, row_bytes: int, padded: int) -> None:
    assert table_bytes(rows, row_bytes) == padded
    # with B rows after it, the object is a whole number of the edge's rows
    assert (table_bytes(rows, row_bytes) + rows * row_bytes) % row_bytes == 0


@pytest.mark.parametrize(("rows", "row_bytes"), [(0, 4), (2, 0)])
def test_a_table_of_no_rows_or_in_empty_rows_is_refused(rows: int, row_bytes: int) -> None:
    with pytest.raises(TagError):
        table_bytes(rows, row_bytes)


# -- prompt batches: several prompts, a table of (slot, row count) ----------------------

def test_a_prompt_batch_table_round_trips_and_is_no_decode_batch() -> None:
    tags = (SequenceTag(2, 9), SequenceTag(0, 1, candidates=True), SequenceTag(3, 40))
    flags = prompt_flags(len(tags))
    assert prompt_count(flags) == 3 and table_entries(flags) == 3
    assert batch_rows(flags) is None, "a decode batch reader does not take it for one"
    assert prompt_count(batch_flags(3)) is None and table_entries(batch_flags(3)) == 3
    assert prompt_count(0) is None and table_entries(0) is None
    assert table_entries(SequenceTag(1, 4).pack()) is None
    words = [*_table(*tags), 7, 8, 9]  # the rows after the table are not its business
    assert prompt_table(flags, words, slots=4) == tags == read_table(flags, words, slots=4)
    assert read_table(batch_flags(1), _table(SequenceTag(0, 5)), 4) == (SequenceTag(0, 5),)
    with pytest.raises(TagError):  # a reader that knows only single tags refuses it
        SequenceTag.unpack(flags)


@pytest.mark.parametrize("count", [0, MAX_PROMPTS + 1])
def test_a_prompt_batch_of_no_prompts_or_too_many_cannot_be_made(count: int) -> None:
    with pytest.raises(TagError):
        prompt_flags(count)


@pytest.mark.parametrize("flags", [BATCH | PROMPTS, BATCH | PROMPTS | (MAX_PROMPTS + 1),
                                   BATCH | PROMPTS | 1 << 12 | 1,
                                   BATCH | PROMPTS | 1 << 30 | 1, 1 << 32 | BATCH | PROMPTS | 1])
def test_malformed_prompt_batch_flags_are_refused(flags: int) -> None:
    with pytest.raises(TagError, match="prompt batch"):
        prompt_count(flags)


@pytest.mark.parametrize(("flags", "words", "rule"), [
    (prompt_flags(3), _table(*(SequenceTag(i, 1) for i in range(3))), "exceed the 2 slots"),
    (prompt_flags(2), _table(SequenceTag(0, 3)), "hold no table"),
    (prompt_flags(2), [SequenceTag(0, 3).pack(), 12], "not a sequence tag"),
    (prompt_flags(2), _table(SequenceTag(0, 3), SequenceTag(1, 0)), "no rows"),
    (prompt_flags(1), _table(SequenceTag(2, 3)), "slot 2 outside"),
    (prompt_flags(2), _table(SequenceTag(1, 3), SequenceTag(1, 5)), "appears twice"),
    (batch_flags(1), _table(SequenceTag(0, 3)), "not a prompt batch"),
])
def test_a_malformed_prompt_table_is_a_typed_error(flags: int, words: list[int],
                                                   rule: str) -> None:
    with pytest.raises(TagError, match=rule):
        prompt_table(flags, words, slots=2)


def test_a_mixed_table_round_trips_and_is_no_other_kind() -> None:
    tags = (SequenceTag(2, 9, candidates=True), SequenceTag(0, 14), SequenceTag(3, 40))
    flags = mixed_flags(len(tags))
    assert mixed_count(flags) == 3 and table_entries(flags) == 3
    assert batch_rows(flags) is None and prompt_count(flags) is None
    assert mixed_count(batch_flags(3)) is None and mixed_count(prompt_flags(3)) is None
    assert mixed_count(0) is None and mixed_count(SequenceTag(1, 4).pack()) is None
    words = [*_table(*tags), 7, 8, 9]
    assert mixed_table(flags, words, slots=4) == tags == read_table(flags, words, slots=4)
    with pytest.raises(TagError):  # a reader that knows only single tags refuses it
        SequenceTag.unpack(flags)


@pytest.mark.parametrize("entries", [0, 1, MAX_SLOTS + 1])
def test_a_mixed_step_without_rows_or_too_large_cannot_be_made(entries: int) -> None:
    with pytest.raises(TagError):
        mixed_flags(entries)


@pytest.mark.parametrize("flags", [BATCH | MIXED | 1, BATCH | MIXED | (MAX_SLOTS + 1),
                                   BATCH | MIXED | PROMPTS | 2, BATCH | MIXED | 1 << 30 | 2,
                                   1 << 32 | BATCH | MIXED | 2])
def test_malformed_mixed_flags_are_refused(flags: int) -> None:
    with pytest.raises(TagError):
        table_entries(flags)


@pytest.mark.parametrize(("flags", "words", "rule"), [
    (mixed_flags(3), _table(*(SequenceTag(i, 1) for i in range(3))), "exceed the 2 slots"),
    (mixed_flags(2), _table(SequenceTag(0, 3)), "hold no table"),
    (mixed_flags(2), [SequenceTag(0, 3).pack(), 12], "not a sequence tag"),
    (mixed_flags(2), _table(SequenceTag(0, 3), SequenceTag(1, 0)), "decode row at 0"),
    (mixed_flags(2), _table(SequenceTag(1, 3), SequenceTag(1, 5)), "appears twice"),
    (mixed_flags(2), _table(SequenceTag(0, 3), SequenceTag(2, 5)), "slot 2 outside"),
    (prompt_flags(2), _table(SequenceTag(0, 3), SequenceTag(1, 5)), "not a mixed step"),
])
def test_a_malformed_mixed_table_is_a_typed_error(flags: int, words: list[int],
                                                  rule: str) -> None:
    with pytest.raises(TagError, match=rule):
        mixed_table(flags, words, slots=2)
