"""Aligned first-fit free list over the arena's byte range, coalescing on release.

Theory of operation
-------------------
The free list is a sorted list of disjoint `(offset, length)` extents that covers every
arena byte not held by a live lease.  `find(size, align, skew)` looks for the lowest
start `s` inside one extent with `(s + skew) % align == 0` and `s + size` still inside
it; the skew lets a lease put its header page *before* an aligned data region.
`take(start, size)` carves that range out (leaving up to two pieces), and `give(start,
size)` puts a range back and merges it with touching neighbours, so that a run of
releases always restores the largest possible extents.  `find` is pure, which lets the
ArenaManager's `fits_now` guard ask it without changing anything.

Invariants (checked by `check()` and by the tests): extents are sorted, non-empty,
inside `[0, size)`, and never touch or overlap (touching extents are always merged).
"""

from __future__ import annotations

import bisect


class AllocatorError(ValueError):
    """A take or give that does not match the free list (a binding bug)."""


def align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


class FreeList:
    """Free extents of a `size`-byte address range."""

    __slots__ = ("_lens", "_starts", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0] if size > 0 else []
        self._lens: list[int] = [size] if size > 0 else []

    @property
    def extents(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._lens, strict=True))

    @property
    def free_bytes(self) -> int:
        return sum(self._lens)

    @staticmethod
    def placement(offset: int, align: int, skew: int) -> int:
        """Lowest `s >= offset` with `(s + skew) % align == 0`."""
        return align_up(offset + skew, align) - skew

    def find(self, size: int, align: int, skew: int = 0) -> int | None:
        """Start of the first fitting aligned range, or None (pure)."""
        for start, length in zip(self._starts, self._lens, strict=True):
            s = self.placement(start, align, skew)
            if s + size <= start + length:
                return s
        return None

    def can_ever_fit(self, size: int, align: int, skew: int = 0) -> bool:
        """Whether the range would fit if everything were free."""
        return self.placement(0, align, skew) + size <= self.size

    def take(self, start: int, size: int) -> None:
        """Remove `[start, start+size)`, which must lie inside one free extent."""
        i = bisect.bisect_right(self._starts, start) - 1
        if size <= 0 or i < 0 or start + size > self._starts[i] + self._lens[i]:
            raise AllocatorError(f"[{start}, {start + size}) is not free")
        ext_start, ext_len = self._starts[i], self._lens[i]
        del self._starts[i], self._lens[i]
        tail = ext_start + ext_len - (start + size)
        if tail > 0:
            self._starts.insert(i, start + size)
            self._lens.insert(i, tail)
        if start > ext_start:
            self._starts.insert(i, ext_start)
            self._lens.insert(i, start - ext_start)

    def give(self, start: int, size: int) -> None:
        """Return `[start, start+size)` (must be wholly allocated) and coalesce."""
        end = start + size
        if size <= 0 or start < 0 or end > self.size:
            raise AllocatorError(f"[{start}, {end}) is outside the arena")
        i = bisect.bisect_right(self._starts, start)
        if i > 0 and self._starts[i - 1] + self._lens[i - 1] > start:
            raise AllocatorError(f"[{start}, {end}) overlaps a free extent")
        if i < len(self._starts) and self._starts[i] < end:
            raise AllocatorError(f"[{start}, {end}) overlaps a free extent")
        if i < len(self._starts) and self._starts[i] == end:  # merge with the next
            size += self._lens[i]
            del self._starts[i], self._lens[i]
        if i > 0 and self._starts[i - 1] + self._lens[i - 1] == start:  # and the previous
            self._lens[i - 1] += size
        else:
            self._starts.insert(i, start)
            self._lens.insert(i, size)

    def check(self) -> None:
        """Raise AllocatorError if an invariant is broken."""
        prev_end = -1
        for start, length in self.extents:
            if length <= 0 or start < 0 or start + length > self.size or start <= prev_end:
                raise AllocatorError(f"free list broken at [{start}, {start + length})")
            prev_end = start + length
