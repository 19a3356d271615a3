"""`SwactorConnection`: aioquic's `QuicConnection` with consumer-driven flow control.

Theory of operation
-------------------
Stock aioquic (checked on 1.2-1.7) grants the peer new credit as soon as bytes *arrive*:
`_write_stream_limits` doubles MAX_STREAM_DATA once half the window has been received and
`_write_connection_limits` does the same for MAX_DATA. Arrived bytes are pushed to the
application as `StreamDataReceived` events whatever it does with them, so a slow consumer
makes memory grow without bound and the sender never stalls.

This subclass grants credit only for bytes the application *consumed* (copied into a
ring), calling `consume(stream_id, n)`:

    MAX_STREAM_DATA(stream) = consumed(stream) + stream_window
    MAX_DATA                = consumed(all streams) + connection_window

both monotonic, never doubled, and raised only once they would grow by at least a
quarter window (so a busy receiver sends one credit update per quarter window, not one
per packet; a blocked sender is always released, since the consumer frees the whole
window it holds). Bytes held between arrival and consumption are therefore at
most one window per stream (and one connection window in all): that is the receiver's
memory bound, and a stalled consumer stalls the remote sender through plain QUIC flow
control. The caller must transmit soon after `consume` (an idle connection otherwise never
sends the new limits, and both ends wait forever).

The sender side has `send_buffered(stream_id)`: the bytes written to a stream and not yet
acknowledged. A send-pump writes only while it is below its high-water mark. Streams we
send on get a `sendbuf.ChunkedSender` (aioquic's sender with a chunk list instead of one
reallocated bytearray: see `sendbuf.py`).

ACKs of a batch are not delayed (`_ack_delay = 0`): the endpoint's receive batch is the
coalescing unit, one ACK per batch, sent by the transmit that ends the batch. A lone
datagram (a token object) is different: what it sets off rarely answers on the same
connection at once (a stage's worker computes for milliseconds first), so `hold_ack`
lets the ACK of the only ack-eliciting packet not yet acknowledged wait up to `ack_hold`
seconds for data of ours to ride with. It does so only on a connection that answers in
time: one where this side sent an ack-eliciting packet between the latest two
ack-eliciting packets it received (a 1-stage run's link between orchestrator and node,
which carries the token both ways), and the latest such answer left within `ack_hold`
of the packet it answered. A connection that only receives (a middle stage's inbound
edge), or answers later than the hold (a stage computing longer), gains nothing by
waiting, since its ACK would leave alone anyway, and would pay a timer wake-up for it:
its ACK leaves once the loop is idle, as a batch's does.

Any packet this side sends meanwhile carries the held ACK (`_write_application` makes it
due when stream bytes or a PING are about to leave); a second ack-eliciting packet makes
it due at once (RFC 9000 §13.2.2: an ACK at least every second packet), and so does the
end or reset of a stream (teardown does not wait). Otherwise it leaves alone when its
hold ends, on the connection's timer. The peer allows for the hold: this side advertises
`max_ack_delay` = twice the hold (at least aioquic's 25 ms; RFC 9000 §13.2.1: every ACK
within it), and the peer's probe timeout adds it, so a held ACK that the event loop
sends somewhat late never looks like a loss. The ACK frame reports the real delay, which
the peer's RTT estimate subtracts. When an ACK is due and the streams' pending bytes are
few, aioquic's own loop writes both in one packet instead of the bulk path sending the
ACK alone (`_ack_due`).

Servers also ask for the client's certificate (mutual TLS): aioquic has no public switch,
so `_initialize` sets the TLS context's request flag. `peer_certificate()` exposes the
certificate the peer proved possession of (its CertificateVerify signature was checked by
aioquic), or None when a client sent none.

Every aioquic private name used here is listed in `PRIVATE_NAMES`; the transport tests
check each one exists, so an aioquic upgrade that renames them fails loudly.
"""

from __future__ import annotations

from typing import Any, cast

from aioquic import tls
from aioquic.buffer import UINT_VAR_MAX_SIZE
from aioquic.buffer import Buffer as QuicBuffer  # type: ignore[attr-defined]
from aioquic.quic import connection as _conn_module
from aioquic.quic.connection import QuicConnection, QuicConnectionState, QuicReceiveContext
from aioquic.quic.packet import (
    QuicFrameType,
    pull_quic_transport_parameters,
    push_quic_transport_parameters,
)
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketSpace
from cryptography import x509

from swactor.transport import bulk, sendbuf
from swactor.transport.config import ACK_HOLD_S
from swactor.transport.udp import Address, Buffer, Datagram, DatagramRun

# (owner, attribute) pairs this module relies on; see tests/transport/test_aioquic_pins.py.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("QuicConnection", "_initialize"),
    ("QuicConnection", "_write_stream_limits"),
    ("QuicConnection", "_write_connection_limits"),
    ("QuicConnection", "_on_max_stream_data_delivery"),
    ("QuicConnection", "_on_connection_limit_delivery"),
    ("QuicConnection", "_local_max_data"),
    ("QuicConnection", "_local_max_streams_bidi"),
    ("QuicConnection", "_local_max_streams_uni"),
    ("QuicConnection", "_streams"),
    ("QuicConnection", "_is_client"),
    ("tls.Context", "_request_client_certificate"),
    ("tls.Context", "_peer_certificate"),
    ("QuicStream", "max_stream_data_local"),
    ("QuicStream", "max_stream_data_local_sent"),
    ("QuicStreamReceiver", "highest_offset (public attribute, final size after a reset)"),
    ("QuicStreamSender", "_buffer"),
    ("QuicConnection", "_loss._pacer, _max_datagram_size"),
    ("QuicPacketPacer", "_max_datagram_size, packet_time, bucket_max (TickPacer)"),
    ("Limit", "used/value/sent"),
    ("QuicConnection", "_ack_delay (0: ACK at the end of each receive batch)"),
    ("QuicConnection", "_get_or_create_stream_for_send"),
    ("QuicStream", "sender (replaced by sendbuf.ChunkedSender)"),
    ("QuicStreamSender", "see sendbuf.SENDER_NAMES"),
    ("QuicConnection", "_write_application, _streams_queue; see bulk.PRIVATE_NAMES"),
    ("QuicConnection", "_packet_number, _cryptos, _spaces[...].largest_acked_packet"),
    ("CryptoPair", "_update_key_requested (a key update requested, not yet applied)"),
    ("QuicConnection", "_state, _close_event (closing or draining, see closing_reason)"),
    ("QuicConnection", "_payload_received, _write_ack_frame, _serialize_transport_parameters"),
    ("QuicConnection", "_ping_pending, _probe_pending (a frame about to leave: hold_ack)"),
    ("QuicConnection", "_ack_eliciting_sent_since_receipt (whether the connection answers)"),
)

_MAX_STREAM_DATA_FRAME_CAPACITY = 1 + 2 * UINT_VAR_MAX_SIZE
_CONNECTION_LIMIT_FRAME_CAPACITY = 1 + UINT_VAR_MAX_SIZE


_PIGGYBACK_BYTES = 1000
"""Pending stream bytes up to which a due ACK and the stream's data share one packet
(`SwactorConnection._write_application`): well inside one datagram with an ACK frame."""

AIOQUIC_MAX_ACK_DELAY_MS = 25
"""The max_ack_delay aioquic advertises (and RFC 9000's default)."""


def max_ack_delay_ms(ack_hold: float) -> int:
    """The max_ack_delay (ms) a side holding ACKs `ack_hold` seconds advertises: twice the
    hold, at least aioquic's 25 ms, below the 2^14 ms the transport parameter allows."""
    return min((1 << 14) - 1, max(AIOQUIC_MAX_ACK_DELAY_MS, int(2000 * ack_hold + 0.5)))


PACING_TICK = 0.002
"""Seconds of sending the pacer lets out in one burst (see `TickPacer`)."""
PACING_GAIN = 1.25
"""Pacing rate over congestion window / smoothed RTT (quinn's choice)."""
_MIN_BURST, _MAX_BURST = 10, 256  # datagrams per burst, as in quinn's pacer
_MIN_PACKET_TIME = 1e-6  # aioquic clamps packet_time to at least 1 us as well


class TickPacer(QuicPacketPacer):
    """aioquic's token-bucket pacer with a burst sized for the event loop's timers.

    aioquic lets out at most 16 datagrams (and a quarter congestion window) per burst,
    then asks for a timer one packet-time later: microseconds on a fast path. asyncio's
    epoll selector rounds every timeout up to a whole millisecond, so each such timer
    sleeps 1 ms and the rate collapses to 16 datagrams per millisecond (23 MB/s at 1452
    bytes) whatever the congestion window allows. This pacer holds `PACING_TICK` worth
    of the pacing rate, 10 to 256 datagrams, as quinn does: after a burst it sleeps a tick
    the loop can actually time. The rate is `PACING_GAIN` x congestion window / smoothed
    RTT (quinn's 1.25; aioquic paces at exactly cwnd/RTT, so any lateness of the loop
    left the window unused and the RTT estimate grew with it)."""

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        super().update_rate(congestion_window, smoothed_rtt)
        packet_time = self.packet_time
        assert packet_time is not None  # update_rate always sets it
        packet_time = max(_MIN_PACKET_TIME, packet_time / PACING_GAIN)
        self.packet_time = packet_time
        size: int = self._max_datagram_size
        rate = size / packet_time  # bytes per second, as aioquic clamps it
        burst = min(max(rate * PACING_TICK, _MIN_BURST * size), _MAX_BURST * size)
        self.bucket_max = burst / rate


class _NoPacer(QuicPacketPacer):
    """Stands in for aioquic's packet pacer when pacing is off: never delays a packet."""

    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        return None

    def update_after_send(self, now: float) -> None:
        return None

    def update_bucket(self, now: float) -> None:
        return None

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        return None


class SwactorConnection(QuicConnection):
    """A QUIC connection whose receive windows advance only on `consume()`."""

    def __init__(
        self,
        *,
        stream_window: int,
        connection_window: int,
        pacing: bool = True,
        native_path: bool = True,
        key_update_packets: int = 1 << 22,
        ack_hold: float = ACK_HOLD_S,
        **kwargs: Any,
    ) -> None:
        self._ack_hold = ack_hold
        self._eliciting_unacked = 0
        """1-RTT ack-eliciting packets received since this side last wrote an ACK."""
        self._answers = False
        """Whether this side sent an ack-eliciting packet between the latest two
        ack-eliciting packets it received, within `ack_hold` of the first of them: the
        connection answers what it gets, in time for the ACK to ride along."""
        self._sent_since_eliciting = False
        """An ack-eliciting packet left since the last ack-eliciting one came."""
        self._eliciting_at = 0.0
        """When the last ack-eliciting packet came."""
        self._answer_s: float | None = None
        """Seconds from an ack-eliciting packet's arrival to this side's next
        ack-eliciting packet, the latest measured."""
        self.acks_held = 0
        """ACKs `hold_ack` held; of them, `acks_ridden` left in a packet with other frames."""
        self.acks_ridden = 0
        super().__init__(**kwargs)
        self._ku_limit = key_update_packets
        self._ku_secret: bytes | None = None
        self._ku_first_pn = 0
        self.key_updates = 0
        """Key updates this side started (RFC 9001 §6; see `_maybe_update_keys`)."""
        # The C bulk path (bulk.py) for steady-state STREAM packets, both directions.
        self._bulk = native_path and bulk.AVAILABLE
        self._bulk_send_keys = bulk.PacketKeys()
        self._bulk_recv_keys = bulk.PacketKeys()
        self._bulk_tx = bulk.new_tx_records()
        self._bulk_rx = bulk.new_rx_records()
        self.bulk_sent = 0
        """Packets this connection sealed on the C bulk path (the rest: aioquic's)."""
        self.bulk_received = 0
        """Packets this connection took from the C bulk path (the rest: aioquic's)."""
        # aioquic schedules an ACK 1 ms (K_GRANULARITY) after the first ack-eliciting
        # packet. The endpoint already coalesces: it feeds a whole receive batch, then
        # transmits once, so with no delay that transmit carries one ACK per batch at
        # once instead of a timer later (the sender's unacknowledged bytes, bounded by
        # its high-water mark, drain a timer tick earlier on every round).
        self._ack_delay = 0.0
        pacer = TickPacer if pacing else _NoPacer
        self._loss._pacer = pacer(max_datagram_size=self._max_datagram_size)
        self._sw_stream_window = stream_window
        self._sw_connection_window = connection_window
        self._sw_consumed: dict[int, int] = {}
        self._sw_consumed_total = 0
        self._sw_step = max(1, stream_window // 4)
        self._sw_connection_step = max(1, connection_window // 4)

    # -- receive side ---------------------------------------------------------------

    def consume(self, stream_id: int, nbytes: int) -> bool:
        """Record that the application took `nbytes` of `stream_id`. True when a credit
        update is due now (the caller should transmit soon)."""
        if nbytes <= 0:
            return False
        consumed = self._sw_consumed.get(stream_id, 0) + nbytes
        self._sw_consumed[stream_id] = consumed
        self._sw_consumed_total += nbytes
        stream = self._streams.get(stream_id)
        if (stream is not None and stream.max_stream_data_local
                and consumed + self._sw_stream_window - stream.max_stream_data_local
                >= self._sw_step):
            return True
        target = self._sw_consumed_total + self._sw_connection_window
        return bool(target - self._local_max_data.value >= self._sw_connection_step)

    def settle_stream(self, stream_id: int) -> None:
        """The peer reset `stream_id`: count every byte up to its final size as consumed,
        so that the connection-wide credit the stream held (bytes never read, or never
        even sent) comes back. Call it when the StreamReset event is handled."""
        stream = self._streams.get(stream_id)
        consumed = self._sw_consumed.pop(stream_id, 0)
        if stream is not None:
            owed = stream.receiver.highest_offset - consumed
            if owed > 0:
                self._sw_consumed_total += owed

    def consumed(self, stream_id: int) -> int:
        return self._sw_consumed.get(stream_id, 0)

    def received_unconsumed(self) -> int:
        """Bytes that arrived on all streams and were not consumed yet (memory held)."""
        used: int = self._local_max_data.used
        return used - self._sw_consumed_total

    # -- ACK hold (module doc) -------------------------------------------------------

    def hold_ack(self, now: float, end: bool = False) -> None:
        """After a lone datagram: if the only ack-eliciting packet not yet acknowledged is
        its own and the connection answers, let its ACK wait up to `ack_hold` for data of
        ours to ride with; from the second such packet on (or when `end`: a stream ended
        or was reset) the ACK is due now."""
        space = self._spaces.get(tls.Epoch.ONE_RTT)
        if space is None or space.ack_at is None:
            return
        if end or self._eliciting_unacked > 1:
            space.ack_at = min(space.ack_at, now)
        elif (self._eliciting_unacked == 1 and self._answers and space.ack_at <= now
              and self._ack_hold > 0):
            space.ack_at = now + self._ack_hold
            self.acks_held += 1

    def _ack_held(self, now: float) -> bool:
        space = self._spaces[tls.Epoch.ONE_RTT]
        return space.ack_at is not None and space.ack_at > now

    def _sending_soon(self) -> bool:
        """Whether a 1-RTT packet is about to leave anyway: stream bytes, a FIN, a reset
        or a STOP_SENDING queued, or a PING (a held ACK rides with it). May miss rarer
        frames; the ACK then leaves when its hold ends, as it would have."""
        if self._ping_pending or self._probe_pending:
            return True
        for stream in self._streams_queue:
            sender = stream.sender
            if (not sender.buffer_is_empty or sender.reset_pending
                    or stream.receiver.stop_pending):
                return True
        return False

    def _payload_received(self, context: QuicReceiveContext, plain: bytes,
                          crypto_frame_required: bool = False) -> tuple[bool, bool]:
        eliciting, probing = super()._payload_received(context, plain, crypto_frame_required)
        if eliciting and context.epoch == tls.Epoch.ONE_RTT:
            self.eliciting_received(1, context.time)
        return eliciting, probing

    def eliciting_received(self, count: int, now: float) -> None:
        """`count` 1-RTT ack-eliciting packets came (aioquic's parser, or the bulk path)."""
        self._eliciting_unacked += count
        answer = self._answer_s
        self._answers = (self._sent_since_eliciting and answer is not None
                         and answer < self._ack_hold)
        self._sent_since_eliciting = False
        self._eliciting_at = now

    def _write_ack_frame(self, builder: QuicPacketBuilder, space: QuicPacketSpace,
                         now: float) -> None:
        if space is self._spaces.get(tls.Epoch.ONE_RTT):
            self._eliciting_unacked = 0
        super()._write_ack_frame(builder, space, now)

    def _serialize_transport_parameters(self) -> bytes:
        """aioquic's transport parameters with this side's `max_ack_delay` (module doc)."""
        params = pull_quic_transport_parameters(
            QuicBuffer(data=super()._serialize_transport_parameters()))
        params.max_ack_delay = max_ack_delay_ms(self._ack_hold)
        buf = QuicBuffer(capacity=3 * self._max_datagram_size)
        push_quic_transport_parameters(buf, params)
        return bytes(buf.data)

    # -- send side ------------------------------------------------------------------

    def send_buffered(self, stream_id: int) -> int:
        """Bytes written to `stream_id` and not yet acknowledged by the peer."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return sendbuf.held_bytes(stream.sender)

    def _get_or_create_stream_for_send(self, stream_id: int) -> Any:
        stream = super()._get_or_create_stream_for_send(stream_id)
        sendbuf.install(stream)
        return stream

    def _write_application(self, builder: Any, network_path: Any, now: float) -> None:
        if self._ack_held(now) and self._sending_soon():
            self._spaces[tls.Epoch.ONE_RTT].ack_at = now  # the held ACK rides along
            self.acks_ridden += 1
        streams = bulk.bulk_streams(self) if self._bulk else []
        if not streams or (self._ack_due(now) and sum(
                span.stop - span.start for stream in streams
                for span in stream.sender._pending) <= _PIGGYBACK_BYTES):
            # nothing for the bulk path, or a due ACK and a few bytes: one packet of
            # aioquic's (ACK and STREAM frames), not the ACK alone ahead of a sealed one
            super()._write_application(builder, network_path, now)
            return
        # aioquic's loop writes everything else first (ACKs, credit, control streams);
        # the bulk streams are hidden from it and sealed in C afterwards.
        queue = self._streams_queue
        self._streams_queue = [s for s in queue if s not in streams]
        try:
            super()._write_application(builder, network_path, now)
        finally:
            self._streams_queue.extend(streams)
        bulk.write_bulk(self, builder, streams, now)

    def _ack_due(self, now: float) -> bool:
        """Whether an ACK of 1-RTT packets is due now: then a token object and the ACK
        of the one before it leave in one datagram (`_write_application`)."""
        space = self._spaces[tls.Epoch.ONE_RTT]
        return space.ack_at is not None and space.ack_at <= now

    def datagrams_to_send(self, now: float) -> list[tuple[Any, Any]]:
        """aioquic's datagrams, one per item (the bulk path's `DatagramRun`s cut into
        views): aioquic's contract, for sans-I/O callers."""
        out: list[tuple[Any, Any]] = []
        for data, addr in self.transmissions(now):
            if type(data) is DatagramRun:
                out.extend((view, addr) for view in data.datagrams())
            else:
                out.append((data, addr))
        return out

    def transmissions(self, now: float) -> list[Datagram]:
        """What to send now, the bulk path's packets as `DatagramRun`s (one GSO send
        each): what the endpoint's socket takes."""
        self._maybe_update_keys()
        # aioquic types its list as bytes; the bulk path's runs are in it too.
        datagrams = cast("list[Datagram]", super().datagrams_to_send(now))
        if self._ack_eliciting_sent_since_receipt and not self._sent_since_eliciting:
            # the first ack-eliciting packet since the last that came: the answer
            self._sent_since_eliciting = True
            self._answer_s = now - self._eliciting_at
        return datagrams

    def _maybe_update_keys(self) -> None:
        """Start a key update once `key_update_packets` packets went out under the
        current 1-RTT send key (RFC 9001 §6.6: AES-GCM may protect 2^23 packets per
        key; a link lives across runs). Packets are counted by packet number, which
        aioquic and the bulk path share (it counts every packet, bulk ones included).
        Not before the peer acknowledged a packet of the current key phase (RFC 9001
        §6.1). A new send secret, ours or one the peer's update brought, restarts the
        count. aioquic applies a requested update when it next seals a packet; until
        then the bulk path leaves the sending to aioquic (`bulk.bulk_streams`). A key
        thus protects at most `key_update_packets` plus two transmits' packets (the
        one a new key began in is not counted, and the one that applies the update),
        far below 2^23 with the default of 2^22."""
        if not self._handshake_confirmed:
            return
        pair = self._cryptos.get(tls.Epoch.ONE_RTT)
        if pair is None:
            return
        secret = pair.send.secret
        if secret is not self._ku_secret:
            self._ku_secret = secret
            self._ku_first_pn = self._packet_number
            return
        if pair._update_key_requested or self._packet_number - self._ku_first_pn < self._ku_limit:
            return
        if self._spaces[tls.Epoch.ONE_RTT].largest_acked_packet < self._ku_first_pn:
            return
        self.request_key_update()
        self.key_updates += 1

    def receive_datagram(self, data: Buffer, addr: Address, now: float) -> None:
        """aioquic's receive, also for a datagram that is a view (this class's own
        `datagrams_to_send` returns views of the buffers the bulk path sealed into;
        aioquic's parser takes only `bytes`)."""
        super().receive_datagram(data if type(data) is bytes else bytes(data), addr, now)

    def receive_bulk(
        self, buf: memoryview, msgs: Any, nmsgs: int, addr: Address, now: float
    ) -> list[memoryview] | None:
        """Received messages through the C bulk path (see `bulk.receive_bulk`); None when
        this connection cannot take them now (the caller routes each datagram instead)."""
        if not self._bulk or not bulk.receive_ready(self, addr):
            return None
        return bulk.receive_bulk(self, buf, msgs, nmsgs, addr, now)

    def closing_reason(self) -> str | None:
        """The close's reason once the connection is closing or draining (this side or
        the peer closed it, e.g. the peer's CONNECTION_CLOSE arrived), else None.

        aioquic reports `ConnectionTerminated` only when the closing or draining period
        (three probe timeouts, RFC 9000 section 10.2) ends, which on a young link under
        load is seconds later; the connection carries nothing in that period."""
        if self._state not in (QuicConnectionState.CLOSING, QuicConnectionState.DRAINING):
            return None
        event = self._close_event
        if event is None:
            return "connection closing"
        return str(event.reason_phrase or f"error code {event.error_code:#x}")

    # -- identity -------------------------------------------------------------------

    def peer_certificate(self) -> x509.Certificate | None:
        """The certificate the peer proved it holds the key of (None if none was sent)."""
        cert: x509.Certificate | None = self.tls._peer_certificate
        return cert

    def _initialize(self, peer_cid: bytes) -> None:
        super()._initialize(peer_cid)
        if not self._is_client:
            self.tls._request_client_certificate = True

    # -- flow-control overrides (replace aioquic's doubling) ------------------------

    def _write_stream_limits(self, builder: Any, space: Any, stream: Any) -> None:
        # Zero means a locally opened uni stream: it has nothing to receive.
        if not stream.max_stream_data_local:
            return
        target = self._sw_consumed.get(stream.stream_id, 0) + self._sw_stream_window
        if target - stream.max_stream_data_local >= self._sw_step:
            stream.max_stream_data_local = target
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=_MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(stream.stream_id)
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    def _write_connection_limits(self, builder: Any, space: Any) -> None:
        max_data = self._local_max_data
        target = self._sw_consumed_total + self._sw_connection_window
        if target - max_data.value >= self._sw_connection_step:
            max_data.value = target
        for limit in (max_data, self._local_max_streams_bidi, self._local_max_streams_uni):
            if limit is not max_data and limit.sent - limit.used >= limit.value - limit.sent:
                continue  # batch MAX_STREAMS as aioquic does
            if limit.value != limit.sent:
                buf = builder.start_frame(
                    limit.frame_type,
                    capacity=_CONNECTION_LIMIT_FRAME_CAPACITY,
                    handler=self._on_connection_limit_delivery,
                    handler_args=(limit,),
                )
                buf.push_uint_var(limit.value)
                limit.sent = limit.value


def check_private_names() -> list[str]:
    """Names from `PRIVATE_NAMES` that the installed aioquic lacks (empty: all present)."""
    from aioquic.quic.stream import QuicStream, QuicStreamSender

    missing: list[str] = []
    for name in (
        "_initialize",
        "_payload_received",
        "_write_ack_frame",
        "_serialize_transport_parameters",
        "_get_or_create_stream_for_send",
        "_write_stream_limits",
        "_write_connection_limits",
        "_on_max_stream_data_delivery",
        "_on_connection_limit_delivery",
    ):
        if not callable(getattr(QuicConnection, name, None)):
            missing.append(f"QuicConnection.{name}")
    if not hasattr(_conn_module, "Limit"):
        missing.append("aioquic.quic.connection.Limit")
    stream = QuicStream(stream_id=2, max_stream_data_local=7, writable=True, readable=True)
    for attr in ("max_stream_data_local", "max_stream_data_local_sent"):
        if not hasattr(stream, attr):
            missing.append(f"QuicStream.{attr}")
    if not isinstance(getattr(QuicStreamSender(2, True), "_buffer", None), bytearray):
        missing.append("QuicStreamSender._buffer")
    pacer = QuicPacketPacer(max_datagram_size=1200)
    for attr in ("_max_datagram_size", "packet_time", "bucket_max"):
        if not hasattr(pacer, attr):
            missing.append(f"QuicPacketPacer.{attr}")
    if not hasattr(stream, "sender"):
        missing.append("QuicStream.sender")
    missing += sendbuf.check_sender_names()
    from swactor.transport.config import TransportConfig
    from swactor.transport.identity import NodeIdentity

    config = TransportConfig().quic_configuration(NodeIdentity.generate(), is_client=True)
    conn = SwactorConnection(configuration=config, stream_window=1 << 16, connection_window=1 << 20)
    missing += bulk.check_private_names(conn)
    from aioquic.quic.crypto import CryptoPair

    if not isinstance(getattr(CryptoPair(), "_update_key_requested", None), bool):
        missing.append("CryptoPair._update_key_requested")
    if not isinstance(getattr(conn, "_packet_number", None), int):
        missing.append("QuicConnection._packet_number")
    for attr in ("_close_event", "_ping_pending", "_probe_pending",
                 "_ack_eliciting_sent_since_receipt"):
        if attr not in vars(conn):
            missing.append(f"QuicConnection.{attr}")
    ctx = tls.Context(is_client=False)
    for attr in ("_request_client_certificate", "_peer_certificate"):
        if not hasattr(ctx, attr):
            missing.append(f"tls.Context.{attr}")
    return missing
