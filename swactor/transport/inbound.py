"""`InboundStream`: bytes of one edge stream that arrived and are not in the ring yet.

Because `SwactorConnection` credits the peer only for consumed bytes, this buffer never
holds more than one stream window: it is the receiving node's only copy of edge bytes
outside the ingress ring. The recv-pump copies from it into ring spans (`read_into`) and
credits exactly what it copied.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from swactor.transport.endpoint import ABORTED_CODE
from swactor.wire import StreamFaultReason

if TYPE_CHECKING:
    from swactor.transport.endpoint import QuicLink


def lost_reason(detail: str) -> StreamFaultReason:
    """Classify a connection loss: aioquic's idle timeout, or any other close."""
    if "idle timeout" in detail.lower():
        return StreamFaultReason.IdleTimeout
    return StreamFaultReason.ConnectionLost


class InboundStream:
    """Received, unconsumed bytes of one peer uni-stream, plus its EOF flag."""

    def __init__(self, link: QuicLink, stream_id: int) -> None:
        self.link = link
        self.stream_id = stream_id
        self.chunks: deque[memoryview] = deque()
        self.buffered = 0
        self.eof = False
        self.discarding = False
        self.changed = asyncio.Event()

    def feed(self, data: bytes | memoryview, end: bool) -> None:
        if self.discarding:
            # Stopped: nobody will read these bytes, but the connection-wide credit they
            # took must come back, or every stopped edge would shrink MAX_DATA for good.
            self.link.consume(self.stream_id, len(data))
            return
        if data:
            self.chunks.append(memoryview(data))
            self.buffered += len(data)
        if end:
            self.eof = True
        self.changed.set()

    def read_into(self, span: memoryview) -> int:
        """Copy as many buffered bytes as fit into `span`; returns the count."""
        done = 0
        room = len(span)
        chunks = self.chunks
        while chunks and done < room:
            chunk = chunks[0]
            take = min(len(chunk), room - done)
            span[done : done + take] = chunk[:take]
            done += take
            if take == len(chunk):
                chunks.popleft()
            else:
                chunks[0] = chunk[take:]
        self.buffered -= done
        return done

    def stop(self, error_code: int = ABORTED_CODE) -> None:
        """Stop reading: STOP_SENDING with `error_code` to the peer (STOPPED_CODE: a
        graceful stop; the abort code: a fault); drop (and credit back) what is buffered
        and whatever still arrives."""
        self.link.stop_stream(self.stream_id, error_code)
        if self.buffered:
            self.link.consume(self.stream_id, self.buffered)
        self.chunks.clear()
        self.buffered = 0
        self.discarding = True
        self.changed.set()
