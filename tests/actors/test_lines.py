"""LineSplitter: any chunking of a stream gives the reference lines; memory stays bounded."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.actors.lines import LineSplitter


def reference(data: bytes, limit: int) -> list[tuple[bytes, bool]]:
    """Whole-stream model: split on newlines, cut each line to `limit`."""
    *complete, last = data.split(b"\n")
    pieces = complete + ([last] if last else [])
    return [(piece[:limit], len(piece) > limit) for piece in pieces]


@st.composite
def chunked(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    alphabet = st.sampled_from([b"a", b"b", b"\n", b"\xff"])
    data = b"".join(draw(st.lists(alphabet, max_size=300)))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    bounds = [0, *cuts, len(data)]
    return data, [data[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=400, deadline=None)
@given(chunked(), st.integers(1, 40))
def test_any_chunking_gives_the_reference_lines(
    stream: tuple[bytes, list[bytes]], limit: int
) -> None:
    data, chunks = stream
    splitter = LineSplitter(limit)
    got: list[tuple[bytes, bool]] = []
    for chunk in chunks:
        got += splitter.feed(chunk)
        assert splitter.buffered <= limit
    got += splitter.finish()
    assert got == reference(data, limit)


def test_an_endless_line_is_cut_once_and_never_buffered() -> None:
    splitter = LineSplitter(10)
    first = splitter.feed(b"x" * 25)
    assert first == [(b"x" * 10, True)]
    for _ in range(1000):
        assert splitter.feed(b"y" * 4096) == []
        assert splitter.buffered == 0
    assert splitter.feed(b"tail\nnext\n") == [(b"next", False)]
    assert splitter.finish() == []


def test_rejects_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="max_line_bytes must be >= 1, got 0"):
        LineSplitter(0)
