"""Sequence tags in the object header's flags word (swactor.wire.tags)."""

from __future__ import annotations

import pytest

from swactor.wire.tags import MAX_POSITION, MAX_SLOTS, SequenceTag, TagError


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
