"""`ChunkedSender`: aioquic's stream send buffer without its per-write reallocation.

Theory of operation
-------------------
aioquic 1.7's `QuicStreamSender` keeps a stream's unacknowledged bytes in one
`bytearray`: `write` appends (`+=`), `on_data_delivery` drops the acknowledged front
(`del buf[:n]`) and `get_frame` copies each frame's bytes out twice (a bytearray slice,
then `bytes()`). A send-pump that keeps the buffer near its high-water mark (megabytes)
pays for it on every write: CPython moves a bytearray whose front was cut into a fresh
allocation when it grows, and shrinks it again when half of it was acknowledged, so each
write copies the whole buffer into newly mapped (page-faulting) memory. Measured on the
16383-byte edge bench: write + get_frame + on_data_delivery took ~45% of the sender's CPU.

`ChunkedSender` keeps the same state machine (pending ranges, FIN, reset, acknowledged
ranges: every other method and attribute is aioquic's) but stores the bytes as a list of
immutable chunks of at most `CHUNK` bytes (one copy of the caller's bytes, which may be
a ring view that is released right after). `get_frame` returns a zero-copy `memoryview` slice of
one chunk (aioquic's packet builder pushes any read-only buffer), joining only the rare
frame that straddles two chunks; `on_data_delivery` drops whole chunks once they are
acknowledged. `held` is the count of unacknowledged bytes (what `len(_buffer)` was).

`install(stream)` swaps it in for a stream's fresh sender (before its first byte); a
sender that already holds or sent bytes is left alone. The aioquic names it relies on
are listed in `flow.PRIVATE_NAMES` and checked by `check_sender_names`.
"""

from __future__ import annotations

from bisect import bisect_right

from aioquic.quic.packet import QuicStreamFrame
from aioquic.quic.packet_builder import QuicDeliveryState
from aioquic.quic.stream import QuicStream, QuicStreamSender

CHUNK = 1 << 20
"""Largest chunk: a write of several MiB becomes several chunks, so acknowledged bytes
are freed a MiB at a time (and `heap.keep_free_pages` keeps chunks of this size on the
heap: a fresh mmapped multi-MiB `bytes` page-faults on every 4 KiB of its copy)."""

# QuicStreamSender attributes this module reads or writes (aioquic 1.7).
SENDER_NAMES: tuple[str, ...] = (
    "_buffer",
    "_buffer_start",
    "_buffer_stop",
    "_buffer_fin",
    "_pending",
    "_pending_eof",
    "_acked",
    "_acked_fin",
    "_reset_error_code",
    "_stream_id",
    "buffer_is_empty",
    "highest_offset",
    "is_finished",
)


class ChunkedSender(QuicStreamSender):
    """A `QuicStreamSender` whose buffer is a list of immutable chunks."""

    def __init__(self, stream_id: int | None, writable: bool) -> None:
        super().__init__(stream_id, writable)
        self._chunks: list[bytes] = []
        self._chunk_offsets: list[int] = []  # stream offset of each chunk's first byte

    @property
    def held(self) -> int:
        """Bytes written and not yet acknowledged."""
        stop: int = self._buffer_stop
        start: int = self._buffer_start
        return stop - start

    def write(self, data: bytes, end_stream: bool = False) -> None:
        if self._buffer_fin is not None:
            raise RuntimeError("Cannot send data after FIN")
        if self._reset_error_code is not None:
            raise RuntimeError("Cannot send data after the stream was reset")
        size = len(data)
        if size:
            self.buffer_is_empty = False
            self._pending.add(self._buffer_stop, self._buffer_stop + size)
            view = memoryview(data)
            for at in range(0, size, CHUNK):
                self._chunks.append(bytes(view[at : at + CHUNK]))
                self._chunk_offsets.append(self._buffer_stop + at)
            self._buffer_stop += size
        if end_stream:
            self.buffer_is_empty = False
            self._buffer_fin = self._buffer_stop
            self._pending_eof = True

    def get_frame(self, max_size: int, max_offset: int | None = None) -> QuicStreamFrame | None:
        assert self._reset_error_code is None, "cannot call get_frame() after reset()"
        if max_size < 0:
            return None
        try:
            r = self._pending[0]
        except IndexError:
            if self._pending_eof:
                self._pending_eof = False
                return QuicStreamFrame(fin=True, offset=self._fin_offset())
            self.buffer_is_empty = True
            return None
        start = r.start
        stop = min(r.stop, start + max_size)
        if max_offset is not None and stop > max_offset:
            stop = max_offset
        if stop <= start:
            return None
        frame = QuicStreamFrame(data=self._slice(start, stop), offset=start)
        self._pending.subtract(start, stop)
        if stop > self.highest_offset:
            self.highest_offset = stop
        if self._buffer_fin == stop:
            frame.fin = True
            self._pending_eof = False
        return frame

    def _fin_offset(self) -> int:
        fin = self._buffer_fin
        assert fin is not None  # only asked while a FIN is pending
        return fin

    def chunk_at(self, offset: int) -> tuple[bytes, int]:
        """The chunk holding stream byte `offset` (unacknowledged) and its first offset."""
        i = bisect_right(self._chunk_offsets, offset) - 1
        return self._chunks[i], self._chunk_offsets[i]

    def _slice(self, start: int, stop: int) -> bytes:
        """Stream bytes [start, stop) as one new `bytes` (a single copy: aioquic's
        `Buffer.push_bytes` takes only objects without a release hook, not views)."""
        offsets, chunks = self._chunk_offsets, self._chunks
        i = bisect_right(offsets, start) - 1
        base = offsets[i]
        chunk = chunks[i]
        if stop - base <= len(chunk):
            if start == base and stop - base == len(chunk):
                return chunk
            return bytes(memoryview(chunk)[start - base : stop - base])
        parts = [memoryview(chunk)[start - base :]]
        while True:
            i += 1
            base, chunk = offsets[i], chunks[i]
            if stop - base <= len(chunk):
                parts.append(memoryview(chunk)[: stop - base])
                return b"".join(parts)
            parts.append(memoryview(chunk))

    def on_data_delivery(
        self, delivery: QuicDeliveryState, start: int, stop: int, fin: bool
    ) -> None:
        assert not fin or stop == self._buffer_fin, (
            "on_data_delivered() was called with inconsistent fin / stop"
        )
        if self._reset_error_code is not None:
            return
        if delivery == QuicDeliveryState.ACKED:
            if start == self._buffer_start and stop > start and not len(self._acked):
                # the usual case: the oldest unacknowledged bytes, acknowledged in order
                self._buffer_start = stop
                self._drop_acknowledged()
            elif stop > start:
                self._acked.add(start, stop)
                first_range = self._acked[0]
                if first_range.start == self._buffer_start:
                    self._acked.shift()
                    self._buffer_start = first_range.stop
                    self._drop_acknowledged()
            if fin:
                self._acked_fin = True
            if self._buffer_start == self._buffer_fin and self._acked_fin:
                self.is_finished = True
        else:
            if stop > start:
                self.buffer_is_empty = False
                self._pending.add(start, stop)
            if fin:
                self.buffer_is_empty = False
                self._pending_eof = True

    def _drop_acknowledged(self) -> None:
        """Forget the chunks that lie wholly below `_buffer_start`."""
        offsets, chunks, start = self._chunk_offsets, self._chunks, self._buffer_start
        done = 0
        while done < len(chunks) and offsets[done] + len(chunks[done]) <= start:
            done += 1
        if done:
            del offsets[:done]
            del chunks[:done]


def install(stream: QuicStream) -> None:
    """Give `stream` a `ChunkedSender` if its sender is aioquic's and still unused."""
    sender = stream.sender
    if type(sender) is not QuicStreamSender:
        return
    if sender._buffer_stop or sender._buffer_fin is not None:
        return
    if sender._reset_error_code is not None:
        return
    replacement = ChunkedSender(sender._stream_id, writable=not sender.is_finished)
    stream.sender = replacement


def held_bytes(sender: QuicStreamSender) -> int:
    """Unacknowledged bytes of any sender (aioquic's own or a `ChunkedSender`)."""
    if isinstance(sender, ChunkedSender):
        return sender.held
    return len(sender._buffer)


def check_sender_names() -> list[str]:
    """`SENDER_NAMES` missing from a fresh aioquic `QuicStreamSender` (empty: all there)."""
    probe = QuicStreamSender(2, True)
    return [f"QuicStreamSender.{name}" for name in SENDER_NAMES if not hasattr(probe, name)]
