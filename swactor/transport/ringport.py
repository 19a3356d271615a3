"""The ring operations the pumps use (a structural type over `swactor.ring.Ring`).

The pumps are byte-blind and never do cursor arithmetic: they ask the ring for a
contiguous writable (or readable) span, copy into (or out of) it, and advance the cursor
through the native helper. Wake coalescing uses the header's pending bits: a producer that
committed bytes sends `RingReadable` only when `mark_readable_pending()` says the bit was
clear; a consumer that was woken clears the bit *before* re-checking the cursors, so no
transition from empty to readable (or full to writable) can be lost (spec §21).
"""

from __future__ import annotations

from typing import Protocol


class RingPort(Protocol):
    def writable_span(self, max_len: int | None = None) -> memoryview: ...

    def advance_commit(self, n: int) -> None: ...

    def readable_span(self, max_len: int | None = None) -> memoryview: ...

    def advance_consume(self, n: int) -> None: ...

    def close_producer(self) -> None: ...

    def producer_closed(self) -> bool: ...

    def mark_readable_pending(self) -> bool: ...

    def clear_readable_pending(self) -> None: ...

    def mark_writable_pending(self) -> bool: ...

    def clear_writable_pending(self) -> None: ...
