"""The native bulk path at connection level: sans I/O, then over real loopback sockets.

Theory of operation
-------------------
Two `SwactorConnection`s exchange datagrams in memory as in `test_flow.py`, but each
receive batch goes through `SwactorConnection.receive_bulk` the way the endpoint feeds
it: the batch's datagrams back to back in one buffer, described by `qf_msg` records in
which runs of equal-size datagrams share one record with a GRO segment size (what the
kernel hands over after a GSO send). Whatever `receive_bulk` gives back (other
connection ids) and whole batches it refuses (None) go to `receive_datagram`, as the
endpoint's router would. The `Link` between them can drop, duplicate and reorder
datagrams on the client -> server direction.

The reference is the same transfer with `native_path=False` (aioquic alone): the bytes
the receiver gets (their digest and count) must be identical, and the counters
`bulk_sent` / `bulk_received` show whether the C path actually carried the packets.
Time only moves when both ends are quiet (to the earliest timer), so pacing, loss
detection and PTOs run as they would, just faster.

The last test moves 32 MiB between two real `QuicEndpoint`s on loopback (UDP GSO/GRO,
`qf_recv`, the endpoint's batching) through the shared `harness` (rings, drivers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aioquic._crypto import CryptoError
from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic import events
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import QuicErrorCode, pull_quic_header
from aioquic.quic.recovery import QuicPacketRecovery
from swactor.transport._quicfast_cffi import ffi, lib  # type: ignore[import-not-found]

from swactor.transport import bulk
from swactor.transport.config import EDGE_ALPN, TransportConfig
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.flow import SwactorConnection
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import EstablishRecv, EstablishSend
from tests.transport.harness import (
    Consumer,
    Node,
    fail_on_fault,
    make_pair,
    payload_chunks,
    produce,
)

pytestmark = pytest.mark.timeout(120)

CLIENT_ADDR = ("10.0.0.1", 1000)
SERVER_ADDR = ("10.0.0.2", 2000)
WINDOW = 1 << 20
SMALL_WINDOW = 256 << 10
GSO_SEGMENTS = 64
GSO_BYTES = 65000

Datagrams = list[bytes]
Fault = Callable[[int, Datagrams], Datagrams]
"""Rewrites one client -> server batch (its sequence number, its datagrams)."""


def _config(
    size: int, window: int = WINDOW, edges: int = 2, idle_timeout: float = 30.0
) -> TransportConfig:
    return TransportConfig(
        max_datagram_size=size,
        stream_window=window,
        edges_per_connection=edges,
        connection_window=edges * window,
        idle_timeout=idle_timeout,
        keepalive_interval=idle_timeout / 2,
    )


def _pair(
    size: int, native: bool, window: int = WINDOW, edges: int = 2, idle_timeout: float = 30.0
) -> tuple[SwactorConnection, SwactorConnection]:
    config = _config(size, window, edges, idle_timeout)
    client = SwactorConnection(
        configuration=config.quic_configuration(NodeIdentity.generate(), is_client=True),
        stream_window=window,
        connection_window=edges * window,
        native_path=native,
    )
    client.connect(SERVER_ADDR, now=0.0)
    initial = [bytes(data) for data, _ in client.datagrams_to_send(now=0.0)]
    odcid = pull_quic_header(Buffer(data=initial[0]), host_cid_length=8).destination_cid
    server = SwactorConnection(
        configuration=config.quic_configuration(NodeIdentity.generate(), is_client=False),
        original_destination_connection_id=odcid,
        stream_window=window,
        connection_window=edges * window,
        native_path=native,
    )
    for data in initial:
        server.receive_datagram(data, CLIENT_ADDR, now=0.0)
    return client, server


def _messages(datagrams: Datagrams) -> tuple[bytearray, Any, int]:
    """The datagrams as a GRO receive would hand them over: back to back in one buffer,
    one `qf_msg` per run of equal-size datagrams (the last of a run may be shorter)."""
    buf = bytearray(b"".join(datagrams))
    runs: list[tuple[int, int, int]] = []  # (at, len, seg)
    at = i = 0
    while i < len(datagrams):
        size = len(datagrams[i])
        j, total = i + 1, size
        while (
            j < len(datagrams)
            and j - i < GSO_SEGMENTS
            and len(datagrams[j]) <= size
            and total + len(datagrams[j]) <= GSO_BYTES
        ):
            total += len(datagrams[j])
            j += 1
            if len(datagrams[j - 1]) < size:
                break
        runs.append((at, total, size if j - i > 1 else 0))
        at += total
        i = j
    msgs = ffi.new("qf_msg[]", max(1, len(runs)))
    for k, (start, length, seg) in enumerate(runs):
        msgs[k].at, msgs[k].len, msgs[k].seg = start, length, seg
    return buf, msgs, len(runs)


def _deliver(conn: SwactorConnection, datagrams: Datagrams, addr: Any, now: float) -> None:
    """Feed one receive batch to `conn` as the endpoint does (16 messages per recvmmsg)."""
    while datagrams:
        buf, msgs, count = _messages(datagrams)
        taken = min(count, 16)
        used = sum(int(msgs[k].len) for k in range(taken))
        consumed = 0
        left = used
        while left > 0:
            left -= len(datagrams[consumed])
            consumed += 1
        rest = conn.receive_bulk(memoryview(buf)[:used], msgs, taken, addr, now)
        if rest is None:
            for data in datagrams[:consumed]:
                conn.receive_datagram(data, addr, now)
        else:
            for view in rest:
                conn.receive_datagram(bytes(view), addr, now)
        datagrams = datagrams[consumed:]


@dataclass
class Transfer:
    """Client sends on uni streams; the server records what arrives per stream."""

    client: SwactorConnection
    server: SwactorConnection
    fault: Fault | None = None
    client_addr: Any = CLIENT_ADDR  # where the client's datagrams come from
    server_addr: Any = SERVER_ADDR
    consume: Callable[[int], bool] = lambda stream_id: True
    now: float = 0.0
    batches: int = 0
    data_packets: int = 0
    received: dict[int, hashlib._Hash] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    ended: list[int] = field(default_factory=list)

    def step(self) -> bool:
        """One exchange at `now`: client batch to server, server batch to client."""
        moved = False
        sent = [bytes(d) for d, _ in self.client.datagrams_to_send(now=self.now)]
        if sent:
            moved = True
            self.data_packets += sum(1 for d in sent if len(d) > 200)
            if self.fault is not None:
                sent = self.fault(self.batches, sent)
            self.batches += 1
            _deliver(self.server, sent, self.client_addr, self.now)
        self._drain_server()
        back = [bytes(d) for d, _ in self.server.datagrams_to_send(now=self.now)]
        if back:
            moved = True
            _deliver(self.client, back, self.server_addr, self.now)
        while self.client.next_event() is not None:
            pass
        return moved

    def _drain_server(self) -> None:
        while (event := self.server.next_event()) is not None:
            if isinstance(event, events.StreamDataReceived):
                sid = event.stream_id
                self.received.setdefault(sid, hashlib.sha256()).update(event.data)
                self.counts[sid] = self.counts.get(sid, 0) + len(event.data)
                if self.consume(sid):
                    self.server.consume(sid, len(event.data))
                if event.end_stream:
                    self.ended.append(sid)

    def run(self, until: Callable[[], bool], max_time: float = 60.0) -> None:
        """Exchange, advancing time to the next timer whenever both ends are quiet,
        until `until()` holds (an AssertionError when it never does by `max_time`)."""
        if not self._exchange(until, max_time):
            raise AssertionError(f"transfer incomplete at t={self.now:.3f}: {self.counts}")

    def idle(self, seconds: float) -> None:
        """Let `seconds` pass, exchanging whatever the two ends have to say."""
        self._exchange(lambda: False, self.now + seconds)

    def _exchange(self, until: Callable[[], bool], max_time: float) -> bool:
        for _ in range(200_000):
            if until():
                return True
            if self.step():
                continue
            if self.now >= max_time:
                return False
            timers = [t for t in (self.client.get_timer(), self.server.get_timer()) if t]
            due = min(timers) if timers else self.now + 0.01
            self.now = min(max_time, max(self.now + 1e-4, due))
            for conn in (self.client, self.server):
                timer = conn.get_timer()
                if timer is not None and timer <= self.now:  # None: terminated
                    conn.handle_timer(self.now)
        raise AssertionError("connections never went quiet")


def _connected(size: int, native: bool, **kw: Any) -> Transfer:
    client, server = _pair(size, native, **kw)
    transfer = Transfer(client, server)
    transfer.run(lambda: client._handshake_confirmed and server._handshake_confirmed)
    while transfer.step():  # until both sides are quiet
        pass
    return transfer


def _send(transfer: Transfer, payload: bytes) -> int:
    sid = transfer.client.get_next_available_stream_id(is_unidirectional=True)
    transfer.client.send_stream_data(sid, payload)
    return sid


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reached(transfer: Transfer, sid: int, count: int) -> Callable[[], bool]:
    return lambda: transfer.counts.get(sid, 0) >= count


def _complete(transfer: Transfer, sid: int, total: int) -> Callable[[], bool]:
    return lambda: transfer.counts.get(sid, 0) >= total and transfer.client.send_buffered(sid) == 0


PAYLOAD = random.Random(5).randbytes(8 << 20)
PAYLOAD_DIGEST = _digest(PAYLOAD)


# -- 6: equivalence -----------------------------------------------------------------------


@pytest.mark.parametrize("size", [16383, 4001, 1452, 1200])
@pytest.mark.parametrize("native", [True, False], ids=["native", "aioquic"])
def test_same_bytes_with_and_without_the_native_path(size: int, native: bool) -> None:
    transfer = _connected(size, native)
    sid = _send(transfer, PAYLOAD)
    transfer.run(_complete(transfer, sid, len(PAYLOAD)))
    assert transfer.counts[sid] == len(PAYLOAD)
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    packets = transfer.data_packets
    assert packets >= len(PAYLOAD) // size
    if native:
        assert transfer.client.bulk_sent > 0.9 * packets
        assert transfer.server.bulk_received > 0.9 * packets
    else:
        assert transfer.client.bulk_sent == 0 and transfer.server.bulk_received == 0


def test_a_suite_without_a_native_path_still_sends_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ChaCha20 has no C path: the streams stay aioquic's (hidden from aioquic's loop
    and then not sealed, the transfer would stall for good)."""
    from aioquic.tls import CipherSuite

    from swactor.transport import config as config_module

    monkeypatch.setattr(config_module, "CIPHER_SUITES", (CipherSuite.CHACHA20_POLY1305_SHA256,))
    transfer = _connected(16383, True)
    assert transfer.client.tls.key_schedule.cipher_suite == CipherSuite.CHACHA20_POLY1305_SHA256
    sid = _send(transfer, PAYLOAD[: 1 << 20])
    transfer.run(_complete(transfer, sid, 1 << 20), max_time=transfer.now + 10)
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[: 1 << 20])
    assert transfer.client.bulk_sent == 0 and transfer.server.bulk_received == 0


def test_spin_bit_follows_packets_the_native_path_took() -> None:
    """receive_datagram updates the spin bit from every newer 1-RTT packet (RFC 9000
    section 17.4); the bulk path does the same for the packets it takes."""
    transfer = _connected(16383, True)
    sid = _send(transfer, PAYLOAD[: 4 << 20])
    transfer.run(_complete(transfer, sid, 4 << 20))
    server = transfer.server
    assert server.bulk_received > 0
    largest = server._spaces[bulk._ONE_RTT].largest_received_packet
    assert server._spin_highest_pn == largest


# -- 10: key update -------------------------------------------------------------------------


def test_key_update_mid_transfer_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a key update, C-sealed packets still open with aioquic's keys: the ones
    loss and reordering send through aioquic's receive (retransmissions around a gap)
    decrypt there (the header-protection key is the one from before the update)."""
    failures = [0]
    original = CryptoPair.decrypt_packet

    def counting(self: CryptoPair, *args: Any) -> tuple[bytes, bytes, int]:
        try:
            return original(self, *args)
        except CryptoError:
            failures[0] += 1
            raise

    monkeypatch.setattr(CryptoPair, "decrypt_packet", counting)
    transfer = _connected(16383, True)
    sid = _send(transfer, PAYLOAD)
    transfer.run(lambda: transfer.counts.get(sid, 0) >= len(PAYLOAD) // 4)
    before = transfer.server.bulk_received
    assert before > 0
    phase = transfer.client._cryptos[bulk._ONE_RTT].send.key_phase
    transfer.client.request_key_update()
    transfer.run(lambda: transfer.server._cryptos[bulk._ONE_RTT].recv.key_phase != phase)
    seen = [0]

    def drop_every_7th(batch: int, datagrams: Datagrams) -> Datagrams:
        kept = []
        for data in datagrams:
            seen[0] += 1
            if seen[0] % 7:
                kept.append(data)
        return kept

    transfer.fault = drop_every_7th
    transfer.run(lambda: transfer.counts.get(sid, 0) >= len(PAYLOAD) // 2)
    transfer.fault = None
    transfer.run(_complete(transfer, sid, len(PAYLOAD)), max_time=transfer.now + 20)
    assert transfer.client._cryptos[bulk._ONE_RTT].send.key_phase != phase
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    assert transfer.server.bulk_received > before  # the path resumed with the new keys
    assert failures[0] == 0


def test_key_update_towards_a_peer_on_aioquic_alone() -> None:
    """The C path must keep the header-protection key across a key update (RFC 9001
    section 6: only the packet protection keys change): a peer without the native path
    opens its packets with aioquic's keys."""
    transfer = _connected(16383, True)
    transfer.server._bulk = False  # the receiver is aioquic alone (as native_path=False)
    sid = _send(transfer, PAYLOAD)
    transfer.run(lambda: transfer.counts.get(sid, 0) >= len(PAYLOAD) // 4)
    assert transfer.client.bulk_sent > 0
    transfer.client.request_key_update()
    transfer.run(_complete(transfer, sid, len(PAYLOAD)), max_time=transfer.now + 10)
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST


@pytest.mark.parametrize("native_sender", [True, False], ids=["c-to-aioquic", "aioquic-to-c"])
def test_one_native_end_talks_to_an_aioquic_end(native_sender: bool) -> None:
    transfer = _connected(1452, True)
    (transfer.server if native_sender else transfer.client)._bulk = False
    sid = _send(transfer, PAYLOAD[: 2 << 20])
    transfer.run(_complete(transfer, sid, 2 << 20))
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[: 2 << 20])
    if native_sender:
        assert transfer.client.bulk_sent > 0 and transfer.server.bulk_received == 0
    else:
        assert transfer.client.bulk_sent == 0 and transfer.server.bulk_received > 0


def test_server_to_client_bidi_stream_with_fin() -> None:
    """The roles swapped (the server sends, on a bidirectional stream it opened) and
    the data ends with FIN: every byte once, in order, then the end of the stream."""
    connected = _connected(16383, True)
    transfer = Transfer(
        connected.server,
        connected.client,
        now=connected.now,
        client_addr=SERVER_ADDR,
        server_addr=CLIENT_ADDR,
    )
    sid = transfer.client.get_next_available_stream_id(is_unidirectional=False)
    transfer.client.send_stream_data(sid, PAYLOAD[: 3 << 20])
    transfer.run(lambda: transfer.counts.get(sid, 0) >= 2 << 20)
    transfer.client.send_stream_data(sid, PAYLOAD[3 << 20 : 4 << 20], end_stream=True)
    transfer.run(_complete(transfer, sid, 4 << 20))
    transfer.idle(0.05)
    assert transfer.counts[sid] == 4 << 20
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[: 4 << 20])
    assert transfer.ended == [sid]
    assert transfer.client.bulk_sent > 0 and transfer.server.bulk_received > 0


# -- 7-9: loss, reordering, duplicates ------------------------------------------------------


def _count_losses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch-count the packets aioquic's recovery declares lost."""
    lost = [0]
    original = QuicPacketRecovery._on_packets_lost

    def counting(self: QuicPacketRecovery, *, packets: Any, **kw: Any) -> None:
        packets = list(packets)
        lost[0] += len(packets)
        original(self, packets=packets, **kw)

    monkeypatch.setattr(QuicPacketRecovery, "_on_packets_lost", counting)
    return lost


def test_loss_is_recovered_by_aioquic(monkeypatch: pytest.MonkeyPatch) -> None:
    lossless = _connected(16383, True)
    sid = _send(lossless, PAYLOAD)
    lossless.run(_complete(lossless, sid, len(PAYLOAD)))
    needed = lossless.client.bulk_sent

    lost = _count_losses(monkeypatch)
    transfer = _connected(16383, True)
    seen = [0]
    dropping = [True]

    def drop_every_7th(batch: int, datagrams: Datagrams) -> Datagrams:
        kept = []
        for data in datagrams:
            seen[0] += 1
            if not (dropping[0] and seen[0] % 7 == 0):
                kept.append(data)
        return kept

    transfer.fault = drop_every_7th
    sid = _send(transfer, PAYLOAD)
    transfer.run(lambda: transfer.counts.get(sid, 0) >= len(PAYLOAD) // 2)
    dropping[0] = False
    transfer.run(_complete(transfer, sid, len(PAYLOAD)))
    assert transfer.counts[sid] == len(PAYLOAD)
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    assert lost[0] > 0
    assert transfer.client.bulk_sent > needed  # the lost ranges went out again
    assert transfer.server.bulk_received < transfer.client.bulk_sent
    assert transfer.server.bulk_received > 0


def test_reordered_datagrams_arrive_in_order() -> None:
    def swap_pairs(batch: int, datagrams: Datagrams) -> Datagrams:
        out = list(datagrams)
        for i in range(0, len(out) - 1, 2):
            out[i], out[i + 1] = out[i + 1], out[i]
        return out

    transfer = _connected(1452, True)
    transfer.fault = swap_pairs
    sid = _send(transfer, PAYLOAD[: 4 << 20])
    transfer.run(_complete(transfer, sid, 4 << 20))
    assert transfer.counts[sid] == 4 << 20
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[: 4 << 20])


def test_duplicated_datagrams_deliver_bytes_once() -> None:
    held: list[bytes] = []

    def duplicate(batch: int, datagrams: Datagrams) -> Datagrams:
        out: list[bytes] = list(held)  # last batch's, again (after newer packets)
        held.clear()
        for i, data in enumerate(datagrams):
            out.append(data)
            if i % 5 == 0:
                out.append(data)  # at once
            if i % 3 == 1:
                held.append(data)
        return out

    transfer = _connected(16383, True)
    transfer.fault = duplicate
    sid = _send(transfer, PAYLOAD)
    transfer.run(_complete(transfer, sid, len(PAYLOAD)))
    transfer.fault = None
    transfer.idle(0.1)
    assert transfer.counts[sid] == len(PAYLOAD)
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    assert transfer.server.bulk_received > 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_writes_and_random_network_faults(seed: int) -> None:
    """Writes of random sizes (send-buffer chunks every which way, so sealed runs
    straddle chunks), given while the transfer runs, over a link that drops, duplicates
    and reorders at random: every byte once, in order."""
    rng = random.Random(seed)

    def chaos(batch: int, datagrams: Datagrams) -> Datagrams:
        out: Datagrams = []
        for data in datagrams:
            roll = rng.random()
            if roll < 0.05:
                continue  # lost
            out.append(data)
            if roll < 0.08:
                out.append(data)  # duplicated
        for _ in range(len(out) // 8):  # a few swaps
            i, j = rng.randrange(len(out)), rng.randrange(len(out))
            out[i], out[j] = out[j], out[i]
        return out

    transfer = _connected(rng.choice((1452, 16383)), True, window=SMALL_WINDOW)
    transfer.fault = chaos
    total = 3 << 20
    sid = transfer.client.get_next_available_stream_id(is_unidirectional=True)
    written = 0
    while written < total:
        n = min(total - written, rng.choice((1, 777, 16383, 100_000, 1 << 20, 1_500_000)))
        transfer.client.send_stream_data(sid, PAYLOAD[written : written + n])
        written += n
        transfer.run(_reached(transfer, sid, written // 2), max_time=transfer.now + 30)
    transfer.run(_complete(transfer, sid, total), max_time=transfer.now + 60)
    assert transfer.counts[sid] == total
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[:total])
    assert transfer.client.bulk_sent > 0 and transfer.server.bulk_received > 0


@pytest.mark.parametrize("max_runs", [1, 2, 3])
def test_datagrams_past_the_run_limit_are_handed_back(
    monkeypatch: pytest.MonkeyPatch, max_runs: int
) -> None:
    """`qf_open` stops at MAX_RUNS records; the datagrams after them come back from
    `receive_bulk` for the endpoint to route (here: to aioquic), none lost or doubled."""
    monkeypatch.setattr(bulk, "MAX_RUNS", max_runs)
    rng = random.Random(max_runs)

    def shuffle_some(batch: int, datagrams: Datagrams) -> Datagrams:
        out = list(datagrams)
        for _ in range(len(out) // 6):
            i = rng.randrange(len(out))
            out.insert(rng.randrange(len(out)), out.pop(i))
        return out

    transfer = _connected(1452, True)
    transfer.fault = shuffle_some
    sid = _send(transfer, PAYLOAD[: 2 << 20])
    transfer.run(_complete(transfer, sid, 2 << 20))
    assert transfer.counts[sid] == 2 << 20
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[: 2 << 20])
    assert transfer.server.bulk_received > 0


def test_packets_taken_natively_keep_the_receiver_from_idling_out() -> None:
    """A receiver that hears only native-path STREAM packets for longer than its idle
    timeout stays open: each of them counts as activity, as in aioquic."""
    transfer = _connected(16383, True, idle_timeout=1.0)
    sid = transfer.client.get_next_available_stream_id(is_unidirectional=True)
    sent = 0
    for _ in range(10):  # 20 KB every 0.6 s, 6 s in all
        transfer.client.send_stream_data(sid, PAYLOAD[sent : sent + 20_000])
        sent += 20_000
        transfer.run(_complete(transfer, sid, sent), max_time=transfer.now + 0.5)
        transfer.idle(0.6)
    assert transfer.now > 5.0
    assert transfer.server._close_event is None and transfer.client._close_event is None
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[:sent])
    assert transfer.server.bulk_received >= 10


def test_a_new_connection_id_mid_transfer() -> None:
    """The client moves to another of the server's connection ids: the first packets
    for it are not this connection's to C (QF_OTHER_CID, handed back), aioquic takes
    them and switches, and the native path goes on with the new id."""
    transfer = _connected(16383, True)
    sid = _send(transfer, PAYLOAD)
    transfer.run(_reached(transfer, sid, len(PAYLOAD) // 3))
    old_cid = transfer.server.host_cid
    transfer.client.change_connection_id()
    transfer.run(_reached(transfer, sid, 2 * len(PAYLOAD) // 3))
    assert transfer.server.host_cid != old_cid
    before = transfer.server.bulk_received
    transfer.run(_complete(transfer, sid, len(PAYLOAD)))
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    assert transfer.server.bulk_received > before


def test_a_client_address_change_mid_transfer() -> None:
    """NAT rebinding: the client's packets come from a new address. Until the server
    validated it, aioquic alone handles the path; then the native path resumes."""
    transfer = _connected(16383, True)
    sid = _send(transfer, PAYLOAD)
    transfer.run(_reached(transfer, sid, len(PAYLOAD) // 3))
    transfer.client_addr = ("10.0.0.9", 999)
    transfer.run(_reached(transfer, sid, 2 * len(PAYLOAD) // 3))
    path = transfer.server._network_paths[0]
    assert path.addr == ("10.0.0.9", 999) and path.is_validated
    before = transfer.server.bulk_received
    transfer.run(_complete(transfer, sid, len(PAYLOAD)))
    assert transfer.received[sid].hexdigest() == PAYLOAD_DIGEST
    assert transfer.server.bulk_received > before


# -- a misbehaving peer: the native receiver closes as aioquic alone does ---------------------


def _forge(client: SwactorConnection, stream_id: int, offset: int, data: bytes) -> bytes:
    """One 1-RTT packet from `client` holding one STREAM frame it would never send,
    sealed with its own keys and next packet number (what a buggy peer could send)."""
    crypto = client._cryptos[bulk._ONE_RTT].send
    keys = bulk.PacketKeys().get(crypto)
    assert keys is not None
    dcid = client._peer_cid.cid
    out = bytearray(len(data) + 64)
    tx = ffi.new("qf_tx[]", 1)
    pn = client._packet_number
    built = lib.qf_seal_stream(
        keys, 0x40 | (crypto.key_phase << 2), dcid, len(dcid), pn, stream_id, offset,
        data, len(data), len(out), 1, ffi.from_buffer(out), len(out), tx,
    )  # fmt: skip
    assert built == 1 and tx[0].length == len(data)
    client._packet_number = pn + 1
    return bytes(out[: tx[0].size])


def _violations(transfer: Transfer) -> dict[str, tuple[int, int, bytes]]:
    """(stream id, offset, data) per protocol violation, on a connection where the
    client sent 1000 bytes with FIN on uni stream 2, a full window (never consumed) on
    uni stream 6, and the server opened uni stream 3."""
    return {
        "beyond-stream-credit": (6, SMALL_WINDOW, b"v" * 100),  # in order, one too far
        "on-a-send-only-stream": (3, 0, b"v" * 100),
        "beyond-the-final-size": (2, 1000, b"v" * 100),
        "over-the-stream-limit": (2 + 4 * 10_000, 0, b"v" * 100),
    }


_ERRORS: dict[str, int | None] = {
    "beyond-stream-credit": QuicErrorCode.FLOW_CONTROL_ERROR,
    "on-a-send-only-stream": QuicErrorCode.STREAM_STATE_ERROR,
    "over-the-stream-limit": QuicErrorCode.STREAM_LIMIT_ERROR,
    # aioquic discards a stream once it is finished, and ignores frames for it after
    "beyond-the-final-size": None,
}


@pytest.mark.parametrize("native", [True, False], ids=["native", "aioquic"])
@pytest.mark.parametrize("case", sorted(_ERRORS))
def test_a_protocol_violation_closes_the_connection(native: bool, case: str) -> None:
    """A peer's STREAM frame that breaks the rules, in a packet the C path can open:
    the native receiver hands it to aioquic, which closes with the same error as
    aioquic alone (or ignores it the same way)."""
    transfer = _connected(1452, native, window=SMALL_WINDOW)
    done = _send(transfer, b"f" * 1000)
    transfer.client.send_stream_data(done, b"", end_stream=True)
    transfer.consume = lambda stream_id: False
    open_stream = _send(transfer, b"o" * SMALL_WINDOW)  # stream 6: all its credit
    server_stream = transfer.server.get_next_available_stream_id(is_unidirectional=True)
    transfer.server.send_stream_data(server_stream, b"s")
    transfer.run(
        lambda: transfer.ended == [done] and transfer.counts.get(open_stream) == SMALL_WINDOW
    )
    assert (done, open_stream, server_stream) == (2, 6, 3)
    stream_id, offset, data = _violations(transfer)[case]
    _deliver(transfer.server, [_forge(transfer.client, stream_id, offset, data)],
             CLIENT_ADDR, transfer.now)  # fmt: skip
    close = transfer.server._close_event
    if _ERRORS[case] is None:
        assert close is None
        transfer._drain_server()
        assert transfer.counts == {2: 1000, 6: SMALL_WINDOW}
    else:
        assert close is not None and close.error_code == _ERRORS[case]


# -- 11, 12: consumer-paced flow control ---------------------------------------------------


def test_native_path_stalls_at_the_stream_window_until_consumed() -> None:
    transfer = _connected(16383, True, window=SMALL_WINDOW)
    transfer.consume = lambda stream_id: False
    payload = PAYLOAD[: 4 * SMALL_WINDOW]
    sid = _send(transfer, payload)
    transfer.idle(1.0)
    assert transfer.counts[sid] == SMALL_WINDOW
    assert transfer.server.received_unconsumed() == SMALL_WINDOW
    assert transfer.client.send_buffered(sid) == 3 * SMALL_WINDOW
    assert transfer.server.bulk_received > 0
    # consume everything: the rest flows
    transfer.consume = lambda stream_id: True
    transfer.server.consume(sid, transfer.counts[sid])
    transfer.run(_complete(transfer, sid, len(payload)), max_time=transfer.now + 10)
    assert transfer.received[sid].hexdigest() == _digest(payload)
    assert transfer.server.received_unconsumed() == 0


def test_an_unconsumed_stream_does_not_stop_another() -> None:
    transfer = _connected(16383, True, window=SMALL_WINDOW)
    stalled = _send(transfer, PAYLOAD[: 2 << 20])
    flowing = _send(transfer, PAYLOAD[2 << 20 :])
    transfer.consume = lambda stream_id: stream_id != stalled
    size = len(PAYLOAD) - (2 << 20)
    transfer.run(_complete(transfer, flowing, size), max_time=30)
    assert transfer.received[flowing].hexdigest() == _digest(PAYLOAD[2 << 20 :])
    assert transfer.counts[stalled] == SMALL_WINDOW
    assert transfer.client.send_buffered(stalled) == (2 << 20) - SMALL_WINDOW
    assert transfer.server.bulk_received > size // 16383


# -- 13: real loopback ----------------------------------------------------------------------

LOOPBACK = TransportConfig(
    max_datagram_size=16383,
    stream_window=1 << 20,
    edges_per_connection=4,
    connection_window=4 << 20,
    send_high_water=1 << 20,
)


async def _edge(src: Node, dst: Node, edge: int, total: int) -> tuple[str, str, int]:
    """Move `total` bytes over edge `edge` from `src` to `dst`: the digests sent and
    received, and the bytes the consumer took."""
    tx_id, tx_layout, tx = src.new_ring(1 << 20)
    rx_id, rx_layout, rx = dst.new_ring(1 << 20)
    dst.driver.handle(EstablishRecv(edge, src.identity.node_id, rx_id, rx_layout))
    src.driver.handle(EstablishSend(edge, dst.identity.node_id, tx_id, tx_layout))
    consumer = Consumer(dst, rx, rx_id)
    chunks = payload_chunks(total, seed=edge)
    sent, got = await asyncio.gather(produce(src, tx, tx_id, chunks), consumer.drain())
    return sent, got, consumer.received


def _links(node: Node, peer: Node) -> list[Any]:
    return [link for link in node.endpoint._links if link.peer_node_id == peer.identity.node_id]


@pytest.mark.parametrize(
    ("offload", "native"),
    [(True, True), (False, True), (True, False)],
    ids=["gro", "no-offload", "native-off"],
)
async def test_loopback_edge_moves_32_mib_on_the_native_path(offload: bool, native: bool) -> None:
    """Real endpoints on loopback. Without UDP offload the endpoint receives one
    datagram per call (no qf_recv batch): only the send side is native. With
    `native_path=False` neither side is."""
    total = 32 << 20
    config = dataclasses.replace(LOOPBACK, udp_offload=offload, native_path=native)
    a, b = await make_pair(config)
    try:
        sent, got, received = await fail_on_fault((a, b), _edge(a, b, 7, total), 60)
        assert got == sent
        assert received == total
        bulk_sent = sum(link.quic.bulk_sent for link in _links(a, b))
        bulk_received = sum(link.quic.bulk_received for link in _links(b, a))
        assert (bulk_sent > 0) is native
        assert (bulk_received > 0) is (native and offload)
    finally:
        await a.close()
        await b.close()


async def _both_ways(total: int) -> tuple[int, int]:
    """Two edges in opposite directions between the same two endpoints at once: each
    endpoint's receive batches mix both ways' packets (data one way, ACKs the other).
    Every byte must arrive; returns the packets each side's links took natively."""
    a, b = await make_pair(LOOPBACK)
    b.endpoint.address_book[a.identity.node_id] = a.endpoint.address
    try:
        both = asyncio.gather(_edge(a, b, 11, total), _edge(b, a, 12, total))
        results = await fail_on_fault((a, b), both, 60)
        for sent, got, received in results:
            assert got == sent
            assert received == total
        return (sum(link.quic.bulk_received for link in _links(a, b)),
                sum(link.quic.bulk_received for link in _links(b, a)))
    finally:
        await a.close()
        await b.close()


async def test_loopback_edges_both_ways_at_once_both_receive_natively() -> None:
    a_bulk, b_bulk = await _both_ways(8 << 20)
    assert a_bulk > 0 and b_bulk > 0, (a_bulk, b_bulk)


class _OneReceive:
    """Stands in for the endpoint's `UdpSocket` (the only fake here): one native receive
    of the given `qf_msg` records, all from `addr`; what the links send is kept."""

    def __init__(self, buf: bytearray, msgs: Any, count: int, addr: Any) -> None:
        self.batch: tuple[memoryview, Any, int] | None = (memoryview(buf), msgs, count)
        self.addr = addr
        self.sent: list[Any] = []

    def receive_messages(self) -> tuple[memoryview, Any, int] | None:
        batch, self.batch = self.batch, None
        return batch

    def receive(self) -> None:
        return None

    def source(self, message: Any) -> Any:
        return self.addr

    def send(self, datagrams: Any) -> None:
        self.sent.extend(datagrams)


class _Recorder:
    """The edge handler of the endpoint below: keeps each link's stream bytes."""

    def __init__(self) -> None:
        self.got: dict[QuicLink, bytearray] = {}

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        self.got.setdefault(link, bytearray()).extend(data)

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        raise AssertionError("no reset expected")

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        raise AssertionError("no STOP_SENDING expected")

    def link_closed(self, link: QuicLink, reason: str) -> None:
        raise AssertionError(f"link closed: {reason}")


def _paced(transfer: Transfer, count: int) -> Datagrams:
    """The client's next `count` datagrams, time moving on as its pacer asks."""
    sent: Datagrams = []
    while len(sent) < count:
        sent += [bytes(d) for d, _ in transfer.client.datagrams_to_send(now=transfer.now)]
        transfer.now += 0.001
    return sent


async def test_one_receive_mixing_two_links_packets_gives_each_its_own() -> None:
    """Two links to one peer (an edge each way, each dialled by its sender) share the
    peer's address, so one receive, even one GRO buffer, holds packets of both. The
    endpoint must offer each link its own packets on the native path, not only the link
    of the receive's first datagram: the other link's data would all go to aioquic."""
    transfers = [_connected(16383, True), _connected(16383, True)]
    sids = []
    for transfer in transfers:  # open the stream (its first packet is aioquic's)
        sids.append(_send(transfer, PAYLOAD[:1000]))
        transfer.run(_reached(transfer, sids[-1], 1000))
    endpoint = QuicEndpoint(NodeIdentity.generate(), LOOPBACK)
    recorder = _Recorder()
    endpoint.register_handler(EDGE_ALPN, recorder)
    links = [QuicLink(endpoint, t.server, CLIENT_ADDR, expected_peer=None) for t in transfers]
    for link in links:
        link.peer_node_id, link.alpn = 1, EDGE_ALPN  # as if verified
        endpoint.route(link.quic.host_cid, link)
    for transfer, sid in zip(transfers, sids, strict=True):
        transfer.client.send_stream_data(sid, PAYLOAD[1000 : 1 << 20])
    first, second = (_paced(t, 3) for t in transfers)
    mixed = [second[0], *first, *second[1:]]  # the second link's packet comes first
    buf, msgs, count = _messages(mixed)
    assert count < len(mixed)  # GRO records holding packets of both links
    endpoint._sock = _OneReceive(buf, msgs, count, CLIENT_ADDR)  # type: ignore[assignment]
    try:
        endpoint._read_ready()
        for link, sent in zip(links, (first, second), strict=True):
            assert link.quic.bulk_received == len(sent)
            got = bytes(recorder.got[link])
            assert len(got) > (len(sent) - 1) * 16000 and got == PAYLOAD[1000 : 1000 + len(got)]
    finally:
        for link in links:
            link.cancel_timer()


# -- malformed input on the receive path ----------------------------------------------------


def test_an_empty_datagram_in_a_batch_is_ignored_by_receive_bulk() -> None:
    """A zero-length UDP datagram (qf_msg len 0, seg 0) between two of the link's
    packets: no error (not a ZeroDivisionError in bulk._advance)."""
    transfer = _connected(1452, True)
    sid = _send(transfer, PAYLOAD[:2800])
    sent = [bytes(d) for d, _ in transfer.client.datagrams_to_send(now=transfer.now)]
    assert len(sent) == 2
    buf = bytearray(sent[0] + sent[1])
    msgs = ffi.new("qf_msg[]", 3)
    for k, (at, length) in enumerate(
        ((0, len(sent[0])), (len(sent[0]), 0), (len(sent[0]), len(sent[1])))
    ):
        msgs[k].at, msgs[k].len, msgs[k].seg = at, length, 0
    rest = transfer.server.receive_bulk(memoryview(buf), msgs, 3, CLIENT_ADDR, transfer.now)
    assert rest is not None
    assert all(len(view) == 0 for view in rest)  # nothing of this connection is left
    transfer.run(_complete(transfer, sid, 2800))
    assert transfer.received[sid].hexdigest() == _digest(PAYLOAD[:2800])


async def test_empty_datagrams_to_an_endpoint_raise_nothing() -> None:
    """Anyone can send empty datagrams to the port; none may raise out of the
    endpoint's receive batch (endpoint._split with a range step of 0 would raise
    ValueError) and lose the rest of the batch."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    a, b = await make_pair(LOOPBACK)
    rogue = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx_id, tx_layout, tx = a.new_ring(1 << 20)
        rx_id, rx_layout, rx = b.new_ring(1 << 20)
        b.driver.handle(EstablishRecv(8, a.identity.node_id, rx_id, rx_layout))
        a.driver.handle(EstablishSend(8, b.identity.node_id, tx_id, tx_layout))
        consumer = Consumer(b, rx, rx_id)

        async def spray() -> None:
            for _ in range(50):
                rogue.sendto(b"", b.endpoint.address)
                await asyncio.sleep(0.002)

        chunks = payload_chunks(4 << 20, seed=8)
        sent, got, _ = await fail_on_fault(
            (a, b),
            asyncio.gather(produce(a, tx, tx_id, chunks), consumer.drain(), spray()),
            30,
        )
        assert got == sent
        await asyncio.sleep(0.05)
        assert [str(e.get("exception") or e.get("message")) for e in errors] == []
    finally:
        rogue.close()
        await a.close()
        await b.close()
