"""An in-process byte ring with the `RingPort` surface, for transport unit tests only.

It stands in for `swactor.ring.Ring` (cffi over shared memory) so that transport tests
exercise pumps, flow control and wake coalescing without an arena. Monotonic cursors,
contiguous spans up to the wrap point, pending bits for wake coalescing.
"""

from __future__ import annotations


class FakeRing:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data = bytearray(capacity)
        self.commit = 0
        self.consume = 0
        self.closed = False
        self.readable_pending = False
        self.writable_pending = False
        self.high_fill = 0

    def writable_span(self, max_len: int | None = None) -> memoryview:
        free = self.capacity - (self.commit - self.consume)
        start = self.commit % self.capacity
        n = min(free, self.capacity - start)
        if max_len is not None:
            n = min(n, max_len)
        return memoryview(self.data)[start : start + n]

    def advance_commit(self, n: int) -> None:
        assert 0 <= n <= self.capacity - (self.commit - self.consume)
        self.commit += n
        self.high_fill = max(self.high_fill, self.commit - self.consume)

    def readable_span(self, max_len: int | None = None) -> memoryview:
        used = self.commit - self.consume
        start = self.consume % self.capacity
        n = min(used, self.capacity - start)
        if max_len is not None:
            n = min(n, max_len)
        return memoryview(self.data)[start : start + n]

    def advance_consume(self, n: int) -> None:
        assert 0 <= n <= self.commit - self.consume
        self.consume += n

    def close_producer(self) -> None:
        self.closed = True

    def producer_closed(self) -> bool:
        return self.closed

    def mark_readable_pending(self) -> bool:
        was = self.readable_pending
        self.readable_pending = True
        return not was

    def clear_readable_pending(self) -> None:
        self.readable_pending = False

    def mark_writable_pending(self) -> bool:
        was = self.writable_pending
        self.writable_pending = True
        return not was

    def clear_writable_pending(self) -> None:
        self.writable_pending = False
