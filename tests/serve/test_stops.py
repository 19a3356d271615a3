"""StopMatcher against a reference written here: generation stops at the first token
whose text completes a stop string; the output is the text before that stop's start."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.serve.stops import StopMatcher

ALPHABET = "ab c"


def reference(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    text = ""
    for piece in pieces:
        text += piece
        starts = [text.find(s) for s in stops if s in text]
        if starts:
            return text[: min(starts)], True
    return text, False


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4),
)
def test_matches_reference(pieces: list[str], stops: list[str]) -> None:
    matcher = StopMatcher(stops)
    out = ""
    for piece in pieces:
        out += matcher.push(piece)
        if matcher.stopped:
            break
    out += matcher.flush()
    assert (out, matcher.stopped) == reference(pieces, stops)


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4),
)
def test_holds_back_only_possible_stop_prefixes(pieces: list[str], stops: list[str]) -> None:
    matcher = StopMatcher(stops)
    sent = ""
    text = ""
    for piece in pieces:
        sent += matcher.push(piece)
        text += piece
        if matcher.stopped:
            return
        held = text[len(sent):]
        assert text.startswith(sent)
        # what is held is a proper prefix of some stop string, or nothing
        assert held == "" or any(s.startswith(held) and s != held for s in stops)


def test_no_stops_passes_everything_through() -> None:
    matcher = StopMatcher([])
    assert [matcher.push(p) for p in ("Hel", "lo")] == ["Hel", "lo"]
    assert matcher.flush() == ""
