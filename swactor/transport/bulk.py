"""The bulk data path: edge-stream packets sealed and opened in C, bookkept in Python.

Theory of operation
-------------------
Profiled at 16383-byte datagrams, aioquic spends ~25 us of Python on every packet each
side (packet builder, frame loop, eight copies of the payload, header protection,
frame parsing), which caps an edge at ~500 MiB per CPU-second against TCP's 5 GiB. Yet
an edge's steady state is one kind of packet: a 1-RTT short-header packet holding one
STREAM frame. `native/quicfast.c` builds and parses exactly those with the connection's
own 1-RTT keys (OpenSSL AES-GCM), a batch per call; this module does the aioquic
bookkeeping for them, so that for aioquic they are packets like any other:

Send (`write_bulk`, called by `SwactorConnection._write_application` after aioquic's
own loop wrote ACKs, flow-control and other frames): for each stream that has only
plain data pending (no FIN, no reset, not blocked), take the first pending range, cut
to the peer's stream and connection credit, the congestion window left in this
transmit and the pacer's burst, and seal it from the `ChunkedSender` chunk that holds
it into one buffer of back-to-back datagrams. Each packet becomes an aioquic
`QuicSentPacket` whose delivery handler is the stream sender's `on_data_delivery`, as
aioquic's own STREAM frames are: ACKs, loss detection, retransmission of lost ranges
(back in `_pending`, sent again by this path), congestion control and flow-control
accounting are aioquic's, unchanged.

Receive (`receive_bulk`, called by the endpoint for a whole GRO buffer): C opens every
datagram it can (short header, this connection id, current key phase, authentic, new
packet number, one STREAM frame without FIN plus padding) into a plaintext buffer;
Python accepts a frame only where aioquic's own fast path would (stream known and
readable, data exactly at the next in-order offset, within stream and connection
credit), then records the packet number for ACKs and hands the bytes on as a
`StreamDataReceived` event holding a view of the plaintext (no copy). Anything else,
including every packet C declined and every frame Python declined, goes through
`receive_datagram` untouched, in arrival order: aioquic remains the judge of every
unusual case (duplicates, key updates, reordering, protocol errors).

A connection uses this path only while it is in its steady state (handshake confirmed,
path validated, AES-GCM, no qlog): `SwactorConnection` checks that once per transmit and
per receive batch. `TransportConfig.native_path` turns it off (aioquic alone), which is
what the tests compare it with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aioquic import tls
from aioquic.quic import events
from aioquic.quic.connection import QuicConnectionState
from aioquic.quic.crypto import CryptoContext, derive_key_iv_hp
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicPacketBuilder, QuicSentPacket

from swactor.transport.sendbuf import ChunkedSender
from swactor.transport.udp import DatagramRun

if TYPE_CHECKING:
    from swactor.transport.flow import SwactorConnection

try:
    from swactor.transport._quicfast_cffi import ffi, lib  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - the package build compiles it
    ffi = lib = None

AVAILABLE = lib is not None
"""Whether the native module is built (it is, by any install of the package)."""

SUITES = {
    tls.CipherSuite.AES_128_GCM_SHA256: 1,
    tls.CipherSuite.AES_256_GCM_SHA384: 2,
}
MAX_BATCH = 64  # packets per seal call (at most): one DatagramRun, several GSO sends
# Largest per-packet overhead of a sealed packet: short header (first byte, 8-byte
# connection id, 2-byte packet number), STREAM frame header (type, stream id, offset,
# length: 1 + 8 + 8 + 4), AEAD tag.
_MAX_OVERHEAD = 1 + 8 + 2 + 1 + 8 + 8 + 4 + 16
MAX_RUNS = 256  # records per open call
_ONE_RTT = tls.Epoch.ONE_RTT
_QF_STREAM = 1
_QF_OTHER_CID = 2

# aioquic 1.7 private names this module relies on (checked by the pin tests).
PRIVATE_NAMES: tuple[str, ...] = (
    "QuicConnection._cryptos",
    "QuicConnection._spaces",
    "QuicConnection._streams",
    "QuicConnection._streams_queue",
    "QuicConnection._events",
    "QuicConnection._handshake_confirmed",
    "QuicConnection._quic_logger",
    "QuicConnection._network_paths",
    "QuicConnection._peer_cid",
    "QuicConnection._spin_bit, _spin_highest_pn, _is_client",
    "QuicConnection._remote_max_data",
    "QuicConnection._remote_max_data_used",
    "QuicConnection._local_max_data",
    "QuicConnection._max_datagram_size",
    "QuicConnection._close_at",
    "QuicConnection._idle_timeout",
    "QuicConnection._ack_eliciting_sent_since_receipt",
    "QuicConnection._ack_delay",
    "QuicConnection._pacing_at",
    "QuicConnection._state",
    "QuicConnection._loss._pacer",
    "QuicPacketBuilder._packet, _end_packet, _datagrams, _packets, _packet_number, "
    "_flight_bytes, _total_bytes, max_flight_bytes",
    "QuicPacketSpace.ack_queue, received_packets (.add(pn)), largest_received_packet, "
    "largest_received_time, expected_packet_number, ack_at, discarded",
    "QuicStreamReceiver._buffer, _buffer_start, _final_size, highest_offset, is_finished",
    "QuicStream.is_blocked, max_stream_data_local, max_stream_data_remote",
    "CryptoContext.secret, cipher_suite, version, key_phase, hp (kept across key updates)",
    "CryptoPair._update_key_requested",
)


class PacketKeys:
    """One direction's 1-RTT keys in C form, rebuilt when aioquic's keys change.

    A key update (RFC 9001 section 6) changes the packet-protection key and iv, never
    the header-protection key: aioquic keeps the `hp` object of the first 1-RTT
    secret and replaces `aead` and `secret`. So the header-protection key is derived
    once per `hp` object, from the secret seen with it, and checked against aioquic's
    own header protection (one mask computed both ways); if the first secret seen was
    already an updated one the check fails and this direction stays on aioquic's path.
    Later secrets with the same `hp` object only give a new key and iv."""

    def __init__(self) -> None:
        self._secret: bytes | None = None
        self._keys: Any = None
        self._hp_owner: object = None
        self._hp_key: bytes | None = None  # None with an owner: its key is not ours

    def get(self, context: CryptoContext) -> Any:
        """The C keys of `context`, or None when it has no native path."""
        secret = context.secret
        if secret is None or lib is None or context.hp is None:
            return None
        if secret is not self._secret:
            self._secret, self._keys = secret, self._build(context, secret)
        return self._keys

    def _build(self, context: CryptoContext, secret: bytes) -> Any:
        suite = SUITES.get(context.cipher_suite) if context.cipher_suite else None
        if suite is None or context.version is None:
            return None
        key, iv, hp = derive_key_iv_hp(
            cipher_suite=context.cipher_suite,  # type: ignore[arg-type]
            secret=secret,
            version=context.version,
        )
        if context.hp is not self._hp_owner:
            self._hp_owner = context.hp
            self._hp_key = hp if _same_mask(context, suite, key, iv, hp) else None
        if self._hp_key is None:
            return None
        raw = lib.qf_keys_new(suite, key, iv, self._hp_key)
        return ffi.gc(raw, lib.qf_keys_free) if raw != ffi.NULL else None


def _same_mask(context: CryptoContext, suite: int, key: bytes, iv: bytes, hp: bytes) -> bool:
    """Whether `hp` is the key of aioquic's header protection in `context`: one short
    header (2-byte packet number) masked by both."""
    assert context.hp is not None
    header = bytes([0x41]) + bytes(10)
    payload = bytes(range(1, 21))
    theirs = context.hp.apply(header, payload)
    raw = lib.qf_keys_new(suite, key, iv, hp)
    if raw == ffi.NULL:
        return False
    keys = ffi.gc(raw, lib.qf_keys_free)
    mask = ffi.new("uint8_t[16]")
    if lib.qf_hp_mask(keys, payload[2:18], mask) != 0:
        return False
    ours = bytes(mask)
    return bool(
        theirs[0] ^ header[0] == ours[0] & 0x1F
        and theirs[9] == ours[1]
        and theirs[10] == ours[2]
    )


# -- send --------------------------------------------------------------------------------


def bulk_streams(conn: SwactorConnection) -> list[Any]:
    """Streams whose pending bytes this path may send now (empty: aioquic alone)."""
    if not conn._handshake_confirmed or conn._quic_logger is not None:
        return []
    if not conn._network_paths or not conn._network_paths[0].is_validated:
        return []
    pair = conn._cryptos[_ONE_RTT]
    if pair._update_key_requested:
        return []  # aioquic's next sealed packet applies the key update (flow.py)
    if conn._bulk_send_keys.get(pair.send) is None:
        return []  # a suite without a native path (ChaCha20), or keys C cannot match
    found = []
    for stream in conn._streams_queue:
        sender = stream.sender
        if (
            type(sender) is ChunkedSender
            and not sender.buffer_is_empty
            and sender._buffer_fin is None
            and sender._reset_error_code is None
            and not sender.reset_pending
            and not stream.receiver.stop_pending
            and not stream.is_blocked
            and len(sender._pending)
        ):
            found.append(stream)
    return found


def write_bulk(
    conn: SwactorConnection, builder: QuicPacketBuilder, streams: list[Any], now: float
) -> None:
    """Seal the pending data of `streams` into packets of `builder` (see module doc)."""
    if builder._packet is not None:
        builder._end_packet()  # aioquic's loop leaves an empty packet open: cancel it
    crypto = conn._cryptos[_ONE_RTT].send  # (read after: sealing may update the keys)
    keys = conn._bulk_send_keys.get(crypto)
    if keys is None:
        return
    size = conn._max_datagram_size
    flight = builder.max_flight_bytes
    allowance = MAX_BATCH * 64 if flight is None else (flight - builder._flight_bytes) // size
    pacer = conn._loss._pacer
    packet_time = pacer.packet_time
    if packet_time is not None:
        pacer.update_bucket(now=now)
        bucket = pacer.bucket_time
        paced = int(-(-bucket // packet_time)) if bucket > 0 else 0
        if paced < allowance:
            allowance = paced
            if paced == 0:
                conn._pacing_at = now + packet_time
    if allowance <= 0:
        return
    payload = size - _MAX_OVERHEAD
    first_byte = 0x40 | (conn._spin_bit << 5) | (crypto.key_phase << 2)
    dcid = conn._peer_cid.cid
    tx = conn._bulk_tx
    pn = builder._packet_number
    sent = 0
    datagrams = builder._datagrams
    packets = builder._packets
    for stream in streams:
        sender: ChunkedSender = stream.sender
        sid = stream.stream_id
        handler = sender.on_data_delivery
        while allowance > 0 and len(sender._pending):
            first = sender._pending[0]
            start, stop = first.start, first.stop
            credit = min(
                sender.highest_offset + conn._remote_max_data - conn._remote_max_data_used,
                stream.max_stream_data_remote,
            )
            if stop > credit:
                stop = credit
            if stop <= start:
                break
            count = min(allowance, MAX_BATCH, -(-(stop - start) // payload))
            if stop > start + count * payload:
                stop = start + count * payload
            chunk, base = sender.chunk_at(start)
            if stop > base + len(chunk):  # straddles two chunks: join just this run
                chunk, base = sender._slice(start, stop), start
            # one GSO run per call, into an exact-size buffer
            out = bytearray(count * size)
            source = ffi.from_buffer(chunk)
            built = lib.qf_seal_stream(
                keys, first_byte, dcid, len(dcid), pn, sid, start,
                source + (start - base), stop - start, size, count,
                ffi.from_buffer(out), len(out), tx,
            )  # fmt: skip
            if built <= 0:  # cannot seal (no room, or OpenSSL failed): aioquic's turn
                allowance = 0
                break
            at = 0
            for i in range(built):
                record = tx[i]
                length = record.size
                offset = record.offset
                at += length
                packet = QuicSentPacket(
                    epoch=_ONE_RTT,
                    in_flight=True,
                    is_ack_eliciting=True,
                    is_crypto_packet=False,
                    packet_number=pn,
                    packet_type=QuicPacketType.ONE_RTT,
                    sent_bytes=length,
                )
                packet.delivery_handlers.append(
                    (handler, (offset, offset + record.length, False))
                )
                packets.append(packet)
                pn += 1
            # every packet but the last is exactly `size` bytes: one GSO send
            datagrams.append(DatagramRun(memoryview(out)[:at], size, built))  # type: ignore[arg-type]
            end = tx[built - 1].offset + tx[built - 1].length
            sender._pending.subtract(start, end)
            if end > sender.highest_offset:
                conn._remote_max_data_used += end - sender.highest_offset
                sender.highest_offset = end
            builder._flight_bytes += at
            builder._total_bytes += at
            allowance -= built
            sent += built
        if not len(sender._pending) and not sender._pending_eof:
            sender.buffer_is_empty = True
    builder._packet_number = pn
    conn.bulk_sent += sent
    if sent and packet_time is not None:
        pacer.bucket_time = max(0.0, pacer.bucket_time - sent * packet_time)


# -- receive -----------------------------------------------------------------------------


def receive_ready(conn: SwactorConnection, addr: Any) -> bool:
    """Whether a batch from `addr` may go through `receive_bulk` (else aioquic alone)."""
    if conn._state is not QuicConnectionState.CONNECTED or conn._quic_logger is not None:
        return False
    if not conn._handshake_confirmed or not conn._network_paths:
        return False
    path = conn._network_paths[0]
    return bool(path.is_validated and path.addr == addr)


def receive_bulk(
    conn: SwactorConnection, buf: memoryview, msgs: Any, nmsgs: int, addr: Any, now: float
) -> list[memoryview] | None:
    """Feed received messages (`qf_msg` records: datagrams back to back in `buf`, cut by
    GRO) from `addr` to `conn`. Returns the datagrams that are not this connection's
    1-RTT packets, for the endpoint to route; None when the native path cannot open
    this connection's packets (the endpoint then routes every datagram itself)."""
    crypto = conn._cryptos[_ONE_RTT].recv
    keys = conn._bulk_recv_keys.get(crypto)
    space = conn._spaces[_ONE_RTT]
    if keys is None or space.discarded:
        return None
    total = sum(msgs[m].len for m in range(nmsgs))
    plain = bytearray(total)
    rx = conn._bulk_rx
    dcid = conn.host_cid
    runs = lib.qf_open(
        keys, ffi.from_buffer(buf), msgs, nmsgs, dcid, len(dcid),
        space.largest_received_packet, crypto.key_phase, ffi.from_buffer(plain), rx,
        MAX_RUNS,
    )  # fmt: skip
    plain_view = memoryview(plain)
    others: list[memoryview] = []
    streams = conn._streams
    max_data = conn._local_max_data
    append_event = conn._events.append
    position = (0, 0)  # (message, datagram index) after the runs handled so far
    for i in range(runs):
        if conn._state is not QuicConnectionState.CONNECTED:
            break  # closed by a datagram before: the rest goes back to the endpoint
        run = rx[i]
        status = run.status
        start = (run.msg, run.index)
        position = _advance(msgs, start, run.count)
        if status == _QF_STREAM:
            stream = streams.get(run.stream_id)
            if stream is not None:
                receiver = stream.receiver
                offset = run.offset
                length = run.length
                end = offset + length
                newly = end - receiver.highest_offset if end > receiver.highest_offset else 0
                if (
                    offset == receiver._buffer_start
                    and not receiver.is_finished
                    and not receiver._buffer
                    and receiver._final_size is None
                    and end <= stream.max_stream_data_local
                    and max_data.used + newly <= max_data.value
                ):
                    receiver._buffer_start = end
                    if newly:
                        receiver.highest_offset = end
                        max_data.used += newly
                    data_at = run.data_at
                    append_event(
                        events.StreamDataReceived(
                            data=plain_view[data_at : data_at + length],  # type: ignore[arg-type]
                            end_stream=False,
                            stream_id=run.stream_id,
                        )
                    )
                    last = run.pn + run.count - 1
                    _record_packets(conn, space, run.pn, last + 1, now)
                    if last > conn._spin_highest_pn:  # as receive_datagram does
                        spin = bool(run.first & 0x20)
                        conn._spin_bit = not spin if conn._is_client else spin
                        conn._spin_highest_pn = last
                    conn.bulk_received += run.count
                    continue
        elif status == _QF_OTHER_CID:
            others.extend(datagram_views(buf, msgs, nmsgs, start, run.count))
            continue
        # aioquic decides (C declined these datagrams, or Python did), in arrival order
        for datagram in datagram_views(buf, msgs, nmsgs, start, run.count):
            conn.receive_datagram(bytes(datagram), addr, now)
    others.extend(datagram_views(buf, msgs, nmsgs, position, -1))  # not opened (closed, or
    return others  # more runs than MAX_RUNS)


def _advance(msgs: Any, at: tuple[int, int], count: int) -> tuple[int, int]:
    """The (message, datagram index) `count` datagrams after `at`."""
    m, index = at
    while count:
        record = msgs[m]
        step = record.seg or record.len or 1  # an empty datagram holds no packet
        left = -(-record.len // step) - index
        if count < left:
            return m, index + count
        count -= left
        m, index = m + 1, 0
    return m, index


def datagram_views(
    buf: memoryview, msgs: Any, nmsgs: int, at: tuple[int, int], count: int
) -> list[memoryview]:
    """`count` datagrams of the `qf_msg` records from `at` = (message, datagram index) on
    (-1: all that are left), as views of `buf` (the endpoint's receive buffer)."""
    m, index = at
    found: list[memoryview] = []
    while m < nmsgs and count:
        record = msgs[m]
        step = record.seg or record.len or 1  # an empty datagram holds no packet
        for k in range(record.at + index * step, record.at + record.len, step):
            if not count:
                break
            found.append(buf[k : min(k + step, record.at + record.len)])
            count -= 1
        m, index = m + 1, 0
    return found


def message_records(buf: memoryview, datagrams: Sequence[memoryview]) -> object:
    """`qf_msg` records for `datagrams`, slices of `buf` (as `datagram_views` and
    `receive_bulk` return them): one record per datagram, no GRO segment size, so that
    what one connection left of a receive can be offered to another without a copy."""
    base = int(ffi.cast("uintptr_t", ffi.from_buffer(buf)))
    msgs = ffi.new("qf_msg[]", max(1, len(datagrams)))
    for k, datagram in enumerate(datagrams):
        record = msgs[k]
        record.len = len(datagram)
        if record.len:  # an empty view's address is not necessarily inside `buf`
            record.at = int(ffi.cast("uintptr_t", ffi.from_buffer(datagram))) - base
    return msgs


def _record_packets(conn: SwactorConnection, space: Any, start: int, stop: int, now: float) -> None:
    """What aioquic's receive_datagram records for ack-eliciting packets start..stop-1."""
    if stop - 1 > space.largest_received_packet:
        space.largest_received_packet = stop - 1
        space.largest_received_time = now
    if stop > space.expected_packet_number:
        space.expected_packet_number = stop
    space.ack_queue.add(start, stop)
    received = space.received_packets.add
    for pn in range(start, stop):
        received(pn)
    while len(space.ack_queue) > _MAX_ACK_RANGES:
        space.ack_queue.shift()
    if space.ack_at is None:
        space.ack_at = now + conn._ack_delay
    conn.eliciting_received(stop - start, now)
    conn._close_at = now + conn._idle_timeout()
    conn._ack_eliciting_sent_since_receipt = False


def _max_ack_ranges() -> int:
    from aioquic.quic import connection

    value: int = connection.MAX_ACK_RANGES  # type: ignore[attr-defined]
    return value


_MAX_ACK_RANGES = _max_ack_ranges()


def new_tx_records() -> Any:
    return ffi.new("qf_tx[]", MAX_BATCH) if ffi is not None else None


def new_rx_records() -> Any:
    return ffi.new("qf_rx[]", MAX_RUNS) if ffi is not None else None


def check_private_names(conn: SwactorConnection) -> list[str]:
    """`PRIVATE_NAMES` missing from aioquic, checked on `conn` (a fresh connection)
    and fresh instances of the other classes (empty: all present)."""
    from aioquic.quic import connection as connection_module
    from aioquic.quic.recovery import QuicPacketNumberWindow, QuicPacketSpace
    from aioquic.quic.stream import QuicStream

    missing: list[str] = []
    for name in (
        "_cryptos", "_spaces", "_streams", "_streams_queue", "_events",
        "_handshake_confirmed", "_quic_logger", "_network_paths", "_peer_cid", "_spin_bit",
        "_spin_highest_pn", "_is_client",
        "_remote_max_data", "_remote_max_data_used", "_local_max_data",
        "_max_datagram_size", "_close_at", "_idle_timeout",
        "_ack_eliciting_sent_since_receipt", "_ack_delay", "_pacing_at", "_state",
        "_write_application",
    ):  # fmt: skip
        if not hasattr(conn, name):
            missing.append(f"QuicConnection.{name}")
    if not hasattr(getattr(conn, "_loss", None), "_pacer"):
        missing.append("QuicConnection._loss._pacer")
    if not hasattr(connection_module, "MAX_ACK_RANGES"):
        missing.append("aioquic.quic.connection.MAX_ACK_RANGES")
    builder = QuicPacketBuilder(
        host_cid=bytes(8), peer_cid=bytes(8), version=1, is_client=True,
        max_datagram_size=1200,
    )  # fmt: skip
    for name in (
        "_packet", "_end_packet", "_datagrams", "_packets", "_packet_number",
        "_flight_bytes", "_total_bytes", "max_flight_bytes",
    ):  # fmt: skip
        if not hasattr(builder, name):
            missing.append(f"QuicPacketBuilder.{name}")
    space = QuicPacketSpace()
    for name in (
        "ack_queue", "received_packets", "largest_received_packet", "largest_received_time",
        "expected_packet_number", "ack_at", "discarded",
    ):  # fmt: skip
        if not hasattr(space, name):
            missing.append(f"QuicPacketSpace.{name}")
    if not isinstance(space.received_packets, QuicPacketNumberWindow):
        missing.append("QuicPacketSpace.received_packets (a QuicPacketNumberWindow)")
    stream = QuicStream(stream_id=3, max_stream_data_local=7, readable=True, writable=False)
    for name in ("is_blocked", "max_stream_data_local", "max_stream_data_remote"):
        if not hasattr(stream, name):
            missing.append(f"QuicStream.{name}")
    for name in ("_buffer", "_buffer_start", "_final_size", "highest_offset", "is_finished"):
        if not hasattr(stream.receiver, name):
            missing.append(f"QuicStreamReceiver.{name}")
    context = CryptoContext()
    for name in ("secret", "cipher_suite", "version", "key_phase", "hp", "aead"):
        if not hasattr(context, name):
            missing.append(f"CryptoContext.{name}")
    return missing

