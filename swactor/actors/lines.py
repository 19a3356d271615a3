"""Bounded line splitting of a byte stream (sans-I/O).

`LineSplitter(max_line_bytes)` is fed chunks as they arrive and returns the complete
lines they finish, newline removed, each with a `truncated` flag. A line longer than
`max_line_bytes` yields its first `max_line_bytes` bytes with `truncated=True` as soon as
that many bytes without a newline are buffered; the rest of it, up to and including the
next newline, is dropped. So the buffer never holds more than `max_line_bytes` plus one
chunk, whatever the input: an endless line cannot grow memory. `finish()` returns the
unterminated last line, if any (never the dropped tail of a truncated one).

Chunk boundaries do not matter: any split of the same bytes gives the same lines.
"""

from __future__ import annotations


class LineSplitter:
    """Splits a byte stream into lines of at most `max_line_bytes` bytes."""

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._discarding = False  # inside the dropped tail of a truncated line

    @property
    def buffered(self) -> int:
        """Bytes held between calls (never more than `max_line_bytes`)."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """The (line, truncated) pairs that `chunk` completes."""
        limit = self.max_line_bytes
        buffer = self._buffer
        buffer += chunk
        out: list[tuple[bytes, bool]] = []
        while (newline := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:newline])
            del buffer[: newline + 1]
            if self._discarding:
                self._discarding = False
            elif len(line) > limit:
                out.append((line[:limit], True))
            else:
                out.append((line, False))
        if len(buffer) > limit:
            if not self._discarding:
                out.append((bytes(buffer[:limit]), True))
                self._discarding = True
            buffer.clear()
        return out

    def finish(self) -> list[tuple[bytes, bool]]:
        """At end of stream: the unterminated last line, if there is one."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        if not rest or self._discarding:
            return []
        if len(rest) > self.max_line_bytes:
            return [(rest[: self.max_line_bytes], True)]
        return [(rest, False)]
