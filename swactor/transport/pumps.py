"""Byte-blind pumps between QUIC edge streams and rings (spec §25, §35).

Theory of operation
-------------------
`InboundStream` holds the bytes aioquic delivered for one edge stream that are not yet in
the ingress ring. Because `SwactorConnection` credits the peer only for consumed bytes,
that buffer never exceeds one stream window: it is the receive side's only copy outside
the ring.

`RecvPump` loop (ingress ring producer):

    buffered bytes?  -> take the ring's writable span; none: clear the writable pending
                        bit, re-check, else wait for `RingWritable` (Backpressured)
                     -> copy, `advance_commit`, credit QUIC (`consume`), coalesced
                        `RingReadable`
    no bytes, EOF    -> `close_producer`, `StreamClosed(offset)`
    no bytes, fault  -> `StreamFault(reason)`
    else             -> wait for stream bytes

A slow ring consumer therefore stops the pump, which stops crediting, which stalls the
remote sender through QUIC flow control (spec §35) — nothing is dropped and no
application-level credit exists.

`SendPump` loop (egress ring consumer):

    await a verified cached connection to the consumer node (DriverEdgeReady)
    readable span?   -> on first bytes open the uni-stream and write the 16-byte preamble;
                        write at most (high-water - unacked bytes) of the span,
                        `advance_consume`, coalesced `RingWritable`
                        no room: wait for link progress (ACKs) (Backpressured)
    none, producer closed -> FIN, `StreamClosed(offset)`
    none             -> clear readable pending bit, re-check, wait for `RingReadable`

Both pumps end with `PumpStopped(edge_id, ring_id)` whatever the cause (EOF, fault,
cancellation by `StopEdge`): after it, the pump never touches the ring again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.errors import ConnectionLostError, PeerRejectedError, TransportError
from swactor.transport.messages import (
    DriverEdgeReady,
    DriverEvent,
    PumpStopped,
    RingReadable,
    RingWritable,
    StreamClosed,
    StreamFault,
    WakeHint,
)
from swactor.transport.ringport import RingPort
from swactor.wire.enums import StreamFaultReason
from swactor.wire.ids import EdgeId
from swactor.wire.objects import EdgePreamble

EmitEvent = Callable[[DriverEvent], None]
EmitWake = Callable[[WakeHint], None]


def lost_reason(detail: str) -> StreamFaultReason:
    """Classify a connection loss: aioquic's idle timeout, or any other close."""
    if "idle timeout" in detail.lower():
        return StreamFaultReason.IdleTimeout
    return StreamFaultReason.ConnectionLost


class InboundStream:
    """Bytes of one edge stream received and not yet copied into the ring."""

    def __init__(self, link: QuicLink, stream_id: int) -> None:
        self.link = link
        self.stream_id = stream_id
        self.chunks: deque[memoryview] = deque()
        self.buffered = 0
        self.eof = False
        self.fault: tuple[StreamFaultReason, str] | None = None
        self.changed = asyncio.Event()

    def feed(self, data: bytes | memoryview, end: bool) -> None:
        if data:
            self.chunks.append(memoryview(data))
            self.buffered += len(data)
        if end:
            self.eof = True
        self.changed.set()

    def fail(self, reason: StreamFaultReason, detail: str) -> None:
        if self.fault is None and not self.eof:
            self.fault = (reason, detail)
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


class RecvPump:
    """Copies one inbound edge stream into its ingress ring (see module docstring)."""

    def __init__(
        self,
        edge_id: int,
        ring_id: int,
        ring: RingPort,
        inbound: InboundStream,
        emit: EmitEvent,
        wake: EmitWake,
        writable: asyncio.Event,
    ) -> None:
        self.edge_id = edge_id
        self.ring_id = ring_id
        self.ring = ring
        self.inbound = inbound
        self.offset = 0
        self._emit = emit
        self._wake = wake
        self._writable = writable

    async def run(self) -> None:
        try:
            await self._loop()
        except (TransportError, ValueError, OSError) as exc:
            self._emit(StreamFault(self.edge_id, StreamFaultReason.PumpFailed, str(exc)))
        finally:
            self._emit(PumpStopped(self.edge_id, self.ring_id))

    async def _loop(self) -> None:
        inbound, ring, link = self.inbound, self.ring, self.inbound.link
        while True:
            if inbound.buffered:
                span = ring.writable_span()
                if not len(span):
                    self._writable.clear()
                    ring.clear_writable_pending()
                    if not len(ring.writable_span()):
                        await self._writable.wait()
                    continue
                moved = inbound.read_into(span)
                ring.advance_commit(moved)
                self.offset += moved
                link.consume(inbound.stream_id, moved)
                if ring.mark_readable_pending():
                    self._wake(RingReadable(self.ring_id))
                continue
            if inbound.fault is not None:
                reason, detail = inbound.fault
                self._emit(StreamFault(self.edge_id, reason, detail))
                return
            if inbound.eof:
                ring.close_producer()
                if ring.mark_readable_pending():
                    self._wake(RingReadable(self.ring_id))
                link.quic.forget_stream(inbound.stream_id)
                self._emit(StreamClosed(self.edge_id, self.offset))
                return
            inbound.changed.clear()
            await inbound.changed.wait()


class SendPump:
    """Drains one egress ring into a uni-stream to the consumer node."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        edge_id: int,
        rx_node_id: int,
        ring_id: int,
        ring: RingPort,
        emit: EmitEvent,
        wake: EmitWake,
        readable: asyncio.Event,
        high_water: int,
    ) -> None:
        self.endpoint = endpoint
        self.edge_id = edge_id
        self.rx_node_id = rx_node_id
        self.ring_id = ring_id
        self.ring = ring
        self.offset = 0
        self.link: QuicLink | None = None
        self.stream_id: int | None = None
        self._emit = emit
        self._wake = wake
        self._readable = readable
        self._high_water = high_water

    async def run(self) -> None:
        try:
            self.link = await self.endpoint.connect(self.rx_node_id, "swactor/edge/1")
            self._emit(DriverEdgeReady(self.edge_id))
            await self._loop(self.link)
        except PeerRejectedError as exc:
            self._emit(StreamFault(self.edge_id, StreamFaultReason.PeerNotAllowed, str(exc)))
        except ConnectionLostError as exc:
            self._emit(StreamFault(self.edge_id, lost_reason(str(exc)), str(exc)))
        except RuntimeError as exc:
            # aioquic refuses writes to a stream the peer stopped (STOP_SENDING -> reset).
            self._emit(StreamFault(self.edge_id, StreamFaultReason.PeerReset, str(exc)))
        except (TransportError, ValueError, OSError) as exc:
            self._emit(StreamFault(self.edge_id, StreamFaultReason.PumpFailed, str(exc)))
        except asyncio.CancelledError:
            if self.link is not None and self.stream_id is not None:
                self.link.reset_stream(self.stream_id)
            raise
        finally:
            self._emit(PumpStopped(self.edge_id, self.ring_id))

    def wake(self) -> None:
        """Make the pump re-check its ring and connection (e.g. after connection loss)."""
        self._readable.set()

    def _open(self, link: QuicLink) -> int:
        stream_id = link.open_uni_stream()
        link.send(stream_id, EdgePreamble(edge_id=EdgeId(self.edge_id)).pack())
        self.stream_id = stream_id
        return stream_id

    async def _loop(self, link: QuicLink) -> None:
        ring, quic, high_water = self.ring, link.quic, self._high_water
        stream_id = self.stream_id
        while True:
            if link.closed:
                raise ConnectionLostError(f"edge {self.edge_id}: {link.close_reason}")
            span = ring.readable_span()
            if not len(span):
                if ring.producer_closed():
                    if not len(ring.readable_span()):
                        if stream_id is None:
                            stream_id = self._open(link)
                        link.send(stream_id, b"", end=True)
                        self._emit(StreamClosed(self.edge_id, self.offset))
                        return
                    continue
                self._readable.clear()
                ring.clear_readable_pending()
                if not len(ring.readable_span()) and not ring.producer_closed():
                    await self._readable.wait()
                continue
            if stream_id is None:
                stream_id = self._open(link)
            room = high_water - quic.send_buffered(stream_id)
            if room <= 0:
                link.progress.clear()
                await link.progress.wait()
                continue
            moved = min(len(span), room)
            link.send(stream_id, span[:moved])
            ring.advance_consume(moved)
            self.offset += moved
            if ring.mark_writable_pending():
                self._wake(RingWritable(self.ring_id))
