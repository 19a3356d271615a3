"""`Ring`: the Python face of the native SPSC ring helper (spec §20-§22).

Theory of operation
-------------------
All cursor arithmetic, atomics and span computation happen in C (`native/ring.c`,
compiled by cffi into `swactor.ring._ring_cffi` at install time).  This wrapper only
turns the helper's (offset, length) answers into zero-copy memoryview slices of the
arena mapping, and its error codes into typed exceptions.

- `Ring.init(arena, layout)`: the owner (the node process, after ArenaManager leased
  the range) writes a fresh header: cursors 0, state Open, wake bits clear.
- `Ring.open(arena, layout)`: either side (typically the worker after InstallRing)
  validates the header against the planned layout and gets its own handle.

A handle belongs to one side (producer or consumer) and one thread at a time: the
helper caches the peer's cursor in the handle.  The producer asks `writable_span()`,
fills a prefix of it, then `advance_commit(n)` publishes those n bytes (release).  The
consumer asks `readable_span()`, uses the bytes, then `advance_consume(n)` releases
them.  A span is contiguous, so at the wrap it may be shorter than what is free or
readable; asking again gives the rest.  A span must not be touched after its advance.

Wake hints: after publishing, call `mark_readable_pending()` (producer) or
`mark_writable_pending()` (consumer); send a hint only when it returns True.  A waiter
calls `clear_readable_pending()` / `clear_writable_pending()` *before* re-checking the
cursors, and sleeps only if there is still nothing to do (see `swactor.testing.ring_stream`).

The state word (Open / Closed / Faulted + reason) lives in shared memory, so a fault
recorded by either side, or by a watcher of the peer process, is seen by both.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, TypeAlias

from swactor.ring._ring_cffi import ffi, lib
from swactor.ring.errors import (
    RingAdvanceError,
    RingClosedError,
    RingError,
    RingLayoutInvalid,
    UnsupportedRingVersion,
)
from swactor.wire import RingFaultReason

U64_MAX = (1 << 64) - 1

BytesLike: TypeAlias = bytes | bytearray | memoryview

#: header versions (see native/ring.h): COMPACT is the spec's packed 64-byte layout,
#: SPLIT puts commit, consume and state+wake on their own cache lines (256 bytes).
#: SPLIT is the default: `just bench ring` measures both equal within noise for 64 KiB
#: spans, and it keeps each side's cursor stores off the line the other side writes.
VERSION_COMPACT: int = lib.RING_VERSION_COMPACT
VERSION_SPLIT: int = lib.RING_VERSION_SPLIT
DEFAULT_VERSION = VERSION_SPLIT
HEADER_ALIGN: int = lib.RING_HEADER_ALIGN

#: ABI numbering of RingFaultReason in the state word: spec §37 order, from 1.
FAULT_REASON_CODES: tuple[RingFaultReason, ...] = (
    RingFaultReason.UnsupportedRingVersion,
    RingFaultReason.RingLayoutInvalid,
    RingFaultReason.RingStateInvalid,
    RingFaultReason.DeviceOutOfMemory,
    RingFaultReason.DeviceCopyFailed,
    RingFaultReason.SequenceViolation,
    RingFaultReason.HeaderMalformed,
    RingFaultReason.WorkerProcessExited,
    RingFaultReason.WorkerShuttingDown,
    RingFaultReason.WorkerInternal,
)


#: the helper ABI this binding was written against (native/ring.h RING_ABI_VERSION)
ABI_VERSION = 1


def check_abi() -> None:
    """Raise UnsupportedRingVersion if the compiled helper is not the ABI this binding
    expects (the worker reports it as WorkerFatalReason.RingHelperAbiMismatch)."""
    found = int(lib.ring_abi_version())
    if found != ABI_VERSION:
        raise UnsupportedRingVersion(f"ring helper ABI {found}, binding expects {ABI_VERSION}")


def header_len(version: int = DEFAULT_VERSION) -> int:
    """Bytes the header of `version` occupies (0 for an unknown version)."""
    return int(lib.ring_header_len(version))


class RingState(enum.Enum):
    """The ring's shared lifecycle word (the fault reason is read separately)."""

    Open = 1  #: producing and consuming
    Closed = 2  #: producer EOF; committed bytes stay readable
    Faulted = 3  #: stop; see `Ring.fault_reason`


class ArenaLike(Protocol):
    """What a ring needs from an arena: its size and a writable view of the mapping."""

    @property
    def size(self) -> int: ...

    @property
    def view(self) -> memoryview: ...


class LayoutLike(Protocol):
    """The offsets of spec §18 `RingLayout` (arena-relative, never pointers)."""

    @property
    def ring_id(self) -> int: ...
    @property
    def arena_offset(self) -> int: ...
    @property
    def total_len(self) -> int: ...
    @property
    def header_offset(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    @property
    def data_capacity(self) -> int: ...
    @property
    def alignment(self) -> int: ...


def _c_layout(layout: LayoutLike) -> Any:
    return ffi.new(
        "ring_layout *",
        {
            "ring_id": int(layout.ring_id),
            "arena_offset": layout.arena_offset,
            "total_len": layout.total_len,
            "header_offset": layout.header_offset,
            "data_offset": layout.data_offset,
            "data_capacity": layout.data_capacity,
            "alignment": layout.alignment,
        },
    )


def _exporter(view: memoryview) -> Any:
    """The object that owns `view`'s memory (the arena's mmap), to take the handle's base
    pointer from.

    The pointer pins the mapping with a buffer export for the handle's lifetime.  Taken
    from the arena's memoryview, that export would sit on a memoryview, and CPython 3.11
    crashes when its garbage collector breaks a reference cycle holding a memoryview that
    still has an export (gh-77894, fixed in 3.12 only): `tp_clear` drops the view's
    managed buffer, and freeing the view after the export is released dereferences it.
    An arena and its rings left for the collector (a busy `Arena.close()` suppressed on
    teardown) hit exactly that.  The mmap (or bytearray) has no such `tp_clear`, and it
    still refuses `close()` while the export lives.  A view that is only part of its
    owner keeps the view itself (offsets are relative to the view)."""
    owner = view.obj
    with memoryview(owner) as whole:
        same = whole.nbytes == view.nbytes and view.c_contiguous and whole.c_contiguous
    if same and ffi.from_buffer(owner) == ffi.from_buffer(view):
        return owner
    return view


def _check(rc: int, ring_id: int, what: str) -> None:
    if rc == lib.RING_OK:
        return
    if rc == lib.RING_E_VERSION:
        raise UnsupportedRingVersion(f"{what}: bad magic, version or header length", ring_id)
    if rc == lib.RING_E_LAYOUT:
        raise RingLayoutInvalid(
            f"{what}: offsets, alignment, capacity or ring id not as planned", ring_id
        )
    if rc == lib.RING_E_RANGE:
        raise RingAdvanceError(f"{what}: beyond the available bytes", ring_id)
    if rc == lib.RING_E_STATE:
        raise RingClosedError(f"{what}: not allowed in the ring's state", ring_id)
    raise RingError(f"{what}: helper error {rc}", ring_id)


class Ring:
    """A process-local handle on one ring in an arena."""

    __slots__ = ("_base", "_data", "_h", "_off", "_wake", "capacity", "ring_id")

    def __init__(self, arena: ArenaLike, layout: LayoutLike) -> None:
        self.ring_id = int(layout.ring_id)
        self.capacity = int(layout.data_capacity)
        check_abi()
        self._base = ffi.from_buffer("uint8_t[]", _exporter(arena.view), require_writable=True)
        self._h: Any = ffi.NULL
        self._data: memoryview | None = None
        self._off = ffi.new("uint64_t *")
        self._wake = ffi.new("int *")

    def _attach(self, arena: ArenaLike, layout: LayoutLike) -> None:
        c_layout = _c_layout(layout)
        out = ffi.new("ring_handle **")
        rc = lib.ring_open(self._base, arena.size, c_layout, out)
        if rc != lib.RING_OK:
            ffi.release(self._base)
            _check(rc, self.ring_id, "open")
        self._h = ffi.gc(out[0], lib.ring_close)
        start = int(layout.data_offset)
        self._data = arena.view[start : start + self.capacity]

    @classmethod
    def init(cls, arena: ArenaLike, layout: LayoutLike, version: int = DEFAULT_VERSION) -> Ring:
        """Write a fresh header for `layout` (owner side), then open a handle on it."""
        ring = cls(arena, layout)
        rc = lib.ring_init(ring._base, arena.size, _c_layout(layout), version)
        if rc != lib.RING_OK:
            ffi.release(ring._base)
            _check(rc, ring.ring_id, "init")
        ring._attach(arena, layout)
        return ring

    @classmethod
    def open(cls, arena: ArenaLike, layout: LayoutLike) -> Ring:
        """Validate an existing header against `layout` and open a handle on it."""
        ring = cls(arena, layout)
        ring._attach(arena, layout)
        return ring

    def _live(self) -> Any:
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        return self._h

    # -- spans and cursors ---------------------------------------------------------------

    def writable_span(self, max_len: int | None = None) -> memoryview:
        """A zero-copy view of free bytes at `commit` (contiguous; may be empty)."""
        data = self._data
        if data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        n = lib.ring_writable_span(self._h, U64_MAX if max_len is None else max_len, self._off)
        o = self._off[0]
        return data[o : o + n]

    def advance_commit(self, n: int) -> None:
        """Publish `n` written bytes to the consumer (release)."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        rc = lib.ring_advance_commit(self._h, n)
        if rc:
            _check(rc, self.ring_id, f"advance_commit({n})")

    def readable_span(self, max_len: int | None = None) -> memoryview:
        """A zero-copy view of committed, unconsumed bytes (contiguous; may be empty)."""
        data = self._data
        if data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        n = lib.ring_readable_span(self._h, U64_MAX if max_len is None else max_len, self._off)
        o = self._off[0]
        return data[o : o + n]

    def advance_consume(self, n: int) -> None:
        """Release `n` consumed bytes back to the producer (release)."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        rc = lib.ring_advance_consume(self._h, n)
        if rc:
            _check(rc, self.ring_id, f"advance_consume({n})")

    def commit_and_mark(self, n: int) -> bool:
        """`advance_commit(n)` then `mark_readable_pending()`, in one native call: True
        if the caller must send RingReadable."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        rc = lib.ring_commit_mark(self._h, n)
        if rc < 0:
            _check(rc, self.ring_id, f"advance_commit({n})")
        return bool(rc == 1)

    def consume_and_mark(self, n: int) -> bool:
        """`advance_consume(n)` then `mark_writable_pending()`, in one native call: True
        if the caller must send RingWritable."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        rc = lib.ring_consume_mark(self._h, n)
        if rc < 0:
            _check(rc, self.ring_id, f"advance_consume({n})")
        return bool(rc == 1)

    def write_from(self, src: BytesLike) -> tuple[int, bool]:
        """Copy as much of `src` as fits (across the wrap) in C, publish it, and mark
        RingReadable pending: (bytes written, whether to send RingReadable)."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        buf = ffi.from_buffer(src)
        n = lib.ring_write(self._h, buf, len(buf), self._wake)
        return int(n), bool(self._wake[0])

    def read_into(self, dst: bytearray | memoryview) -> tuple[int, bool]:
        """Copy up to len(dst) committed bytes out in C, release them, and mark
        RingWritable pending: (bytes read, whether to send RingWritable)."""
        if self._data is None:
            raise RingClosedError("handle is closed", self.ring_id)
        buf = ffi.from_buffer(dst, require_writable=True)
        n = lib.ring_read(self._h, buf, len(buf), self._wake)
        return int(n), bool(self._wake[0])

    @property
    def commit(self) -> int:
        """Acquire-loaded commit cursor (tests and metrics only)."""
        return int(lib.ring_commit(self._live()))

    @property
    def consume(self) -> int:
        """Acquire-loaded consume cursor (tests and metrics only)."""
        return int(lib.ring_consume(self._live()))

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> RingState:
        return RingState(lib.ring_state(self._live()) & 0xFF)

    @property
    def fault_reason(self) -> RingFaultReason | None:
        word = int(lib.ring_state(self._live()))
        if word & 0xFF != lib.RING_STATE_FAULTED:
            return None
        code = (word >> 8) & 0xFF
        if 1 <= code <= len(FAULT_REASON_CODES):
            return FAULT_REASON_CODES[code - 1]
        return RingFaultReason.RingStateInvalid

    def close_producer(self) -> None:
        """Producer EOF: Open -> Closed (idempotent; refused once Faulted)."""
        _check(lib.ring_close_producer(self._live()), self.ring_id, "close_producer")

    def fault(self, reason: RingFaultReason) -> bool:
        """Record a fault; the first reason wins.  True if this call recorded it."""
        return bool(lib.ring_fault(self._live(), FAULT_REASON_CODES.index(reason) + 1) == 0)

    # -- wake bits (spec §21) --------------------------------------------------------------

    def mark_readable_pending(self) -> bool:
        """Producer, after a commit: True if the caller must send RingReadable."""
        return bool(lib.ring_mark_pending(self._live(), lib.RING_WAKE_READABLE))

    def clear_readable_pending(self) -> None:
        """Consumer, before re-checking the cursors after a wake."""
        lib.ring_clear_pending(self._live(), lib.RING_WAKE_READABLE)

    def mark_writable_pending(self) -> bool:
        """Consumer, after a consume: True if the caller must send RingWritable."""
        return bool(lib.ring_mark_pending(self._live(), lib.RING_WAKE_WRITABLE))

    def clear_writable_pending(self) -> None:
        """Producer, before re-checking the cursors after a wake."""
        lib.ring_clear_pending(self._live(), lib.RING_WAKE_WRITABLE)

    # -- lifetime --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._data is None

    def close(self) -> None:
        """Drop this handle (ring_close) and its views into the arena; idempotent.

        Spans handed out earlier must be released by their holders before the arena
        can be closed."""
        if self._data is None:
            return
        self._data.release()
        self._data = None
        ffi.release(self._h)  # runs ring_close
        self._h = ffi.NULL
        ffi.release(self._base)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ring(ring_id={self.ring_id}, capacity={self.capacity}, closed={self.closed})"
