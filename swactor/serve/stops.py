"""Stop strings on streamed text: emit as early as possible, never a stop string's text.

Theory of operation: generated text arrives piece by piece and a stop string may straddle
pieces (``"Hel"`` + ``"lo"`` for ``"Hello"``). :class:`StopMatcher` keeps back only the
tail of the text that is still a prefix of some stop string; everything before it is
final and goes out at once. When a stop string appears, the text before its first
occurrence goes out and the match ends the sequence; the stop text itself never does.
The held tail is shorter than the longest stop string, so the work per piece is bounded by
the piece and the stop strings, not by the whole output.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """Text that is final after ``piece``; sets :attr:`stopped` on a match."""
        if self.stopped:
            return ""
        text = self._held + piece
        if not self._stops:
            self._held = ""
            return text
        first = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if first >= 0:
            self.stopped = True
            self._held = ""
            return text[:first]
        keep = self._held_tail(text)
        self._held = text[len(text) - keep:]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held tail at the end of the sequence (no stop string completed)."""
        text, self._held = self._held, ""
        return "" if self.stopped else text

    def _held_tail(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
