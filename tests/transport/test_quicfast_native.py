"""`native/quicfast.c` against aioquic's own packet protection, at the C interface.

Theory of operation
-------------------
The reference for every byte is aioquic: a `CryptoContext` set up from a random 1-RTT
secret seals and opens packets, aioquic's `Buffer` writes and parses STREAM frames, and
its `QuicPacketBuilder` builds whole packets. The C keys are derived from the same
secret the way `bulk.PacketKeys` does (`derive_key_iv_hp`). So:

* `qf_seal_stream` output must decrypt with `CryptoContext.decrypt_packet` into one
  STREAM frame (type 0x0e) carrying exactly the input bytes at the right offsets;
* packets aioquic seals must come out of `qf_open` as QF_STREAM records with the
  packet number, stream id, offset and data aioquic put in, consecutive ones as one run;
* everything the C path must leave to aioquic (a bad tag, another key phase, other
  frames, FIN, trailing bytes, old packet numbers) is QF_SLOW with the receive buffer
  untouched, and other connections' packets are QF_OTHER_CID;
* random and mangled input never crashes `qf_open`, and its records always cover the
  datagrams once, in order;
* `qf_recv` reads real GRO-coalesced datagrams off a loopback UDP socket.

No expected value here comes from the code under test.
"""

from __future__ import annotations

import errno
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import pytest
from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic.crypto import CryptoContext, CryptoPair, derive_key_iv_hp
from aioquic.quic.packet import QuicFrameType, QuicPacketType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.tls import CipherSuite
from swactor.transport._quicfast_cffi import ffi, lib  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(60)

SUITES = {
    "aes128": (CipherSuite.AES_128_GCM_SHA256, lib.QF_SUITE_AES_128_GCM, 32),
    "aes256": (CipherSuite.AES_256_GCM_SHA384, lib.QF_SUITE_AES_256_GCM, 48),
}
DCID = bytes.fromhex("0102030405060708")
OTHER_DCID = bytes.fromhex("0102030405060709")
STATUSES = {lib.QF_SLOW, lib.QF_STREAM, lib.QF_OTHER_CID}
TAG = 16


@dataclass
class Keys:
    """One direction's keys: aioquic's context and the C keys derived from its secret."""

    context: CryptoContext
    c: Any
    suite: CipherSuite
    secret: bytes


def _keys(name: str, seed: int = 1, key_phase: int = 0) -> Keys:
    suite, c_suite, secret_len = SUITES[name]
    secret = random.Random(seed).randbytes(secret_len)
    context = CryptoContext(key_phase=key_phase)
    context.setup(cipher_suite=suite, secret=secret, version=1)
    key, iv, hp = derive_key_iv_hp(cipher_suite=suite, secret=secret, version=1)
    raw = lib.qf_keys_new(c_suite, key, iv, hp)
    assert raw != ffi.NULL
    return Keys(context, ffi.gc(raw, lib.qf_keys_free), suite, secret)


def _stream_frame(
    stream_id: int, offset: int, data: bytes, *, fin: bool = False, length: bool = True
) -> bytes:
    buf = Buffer(capacity=len(data) + 32)
    buf.push_uint_var(0x08 | 0x04 | (0x02 if length else 0) | (0x01 if fin else 0))
    buf.push_uint_var(stream_id)
    buf.push_uint_var(offset)
    if length:
        buf.push_uint_var(len(data))
    buf.push_bytes(data)
    return bytes(buf.data)


def _ack_frame(largest: int) -> bytes:
    buf = Buffer(capacity=32)
    buf.push_uint_var(QuicFrameType.ACK)
    buf.push_uint_var(largest)
    buf.push_uint_var(0)  # delay
    buf.push_uint_var(0)  # no further ranges
    buf.push_uint_var(0)  # first range: just `largest`
    return bytes(buf.data)


def _aioquic_packet(
    keys: Keys,
    pn: int,
    payload: bytes,
    *,
    dcid: bytes = DCID,
    pn_len: int = 2,
    key_phase: int = 0,
    first_bits: int = 0,
) -> bytes:
    """A short-header packet sealed by aioquic (header protection included)."""
    first = 0x40 | first_bits | (key_phase << 2) | (pn_len - 1)
    header = bytes([first]) + dcid + (pn % (1 << (8 * pn_len))).to_bytes(pn_len, "big")
    sealed: bytes = keys.context.encrypt_packet(header, payload, pn)
    return sealed


def _seal(
    keys: Keys,
    *,
    pn: int,
    stream_id: int,
    offset: int,
    data: bytes,
    size: int,
    first_byte: int = 0x40,
    max_packets: int = 64,
    out_cap: int | None = None,
) -> tuple[list[bytes], list[tuple[int, int, int]]]:
    """`qf_seal_stream`: the packets and their (offset, length, size) records."""
    cap = max_packets * size if out_cap is None else out_cap
    out = bytearray(max(1, cap))
    tx = ffi.new("qf_tx[]", max_packets)
    built = lib.qf_seal_stream(
        keys.c,
        first_byte,
        DCID,
        len(DCID),
        pn,
        stream_id,
        offset,
        data,
        len(data),
        size,
        max_packets,
        ffi.from_buffer(out),
        cap,
        tx,
    )
    packets, records, at = [], [], 0
    for i in range(built):
        record = (int(tx[i].offset), int(tx[i].length), int(tx[i].size))
        packets.append(bytes(out[at : at + record[2]]))
        records.append(record)
        at += record[2]
    return packets, records


@dataclass
class Opened:
    records: list[dict[str, int]]
    plain: bytes


def _open(
    keys: Keys,
    messages: list[tuple[bytes, int]],
    *,
    largest_pn: int = -1,
    key_phase: int = 0,
    dcid: bytes = DCID,
    max_out: int = 256,
) -> Opened:
    """`qf_open` over messages given as (bytes, GRO segment size); checks that the
    receive buffer comes back byte for byte."""
    buf = bytearray(b"".join(data for data, _ in messages))
    before = bytes(buf)
    msgs = ffi.new("qf_msg[]", max(1, len(messages)))
    at = 0
    for i, (data, seg) in enumerate(messages):
        msgs[i].at, msgs[i].len, msgs[i].seg = at, len(data), seg
        at += len(data)
    plain = bytearray(max(1, len(buf)))
    out = ffi.new("qf_rx[]", max(1, max_out))
    runs = lib.qf_open(
        keys.c,
        ffi.from_buffer(buf),
        msgs,
        len(messages),
        dcid,
        len(dcid),
        largest_pn,
        key_phase,
        ffi.from_buffer(plain),
        out,
        max_out,
    )
    assert bytes(buf) == before, "qf_open modified the receive buffer"
    assert 0 <= runs <= max_out
    fields = ("status", "msg", "index", "count", "pn", "stream_id", "offset")
    records = []
    for i in range(runs):
        record = {name: int(getattr(out[i], name)) for name in fields}
        record["data_at"], record["length"] = int(out[i].data_at), int(out[i].length)
        records.append(record)
    return Opened(records, bytes(plain))


def _single(datagrams: list[bytes]) -> list[tuple[bytes, int]]:
    return [(d, 0) for d in datagrams]


def _data_of(opened: Opened, record: dict[str, int]) -> bytes:
    return opened.plain[record["data_at"] : record["data_at"] + record["length"]]


# -- 1: qf_seal_stream -> aioquic -----------------------------------------------------------


@pytest.mark.parametrize("suite", sorted(SUITES))
@pytest.mark.parametrize("size", [1200, 1452, 16383])
@pytest.mark.parametrize("offset", [63, 16383, 2**30 - 1, 2**30 + 5])
def test_sealed_packets_open_with_aioquic(suite: str, size: int, offset: int) -> None:
    keys = _keys(suite, seed=size)
    data = random.Random(offset).randbytes(size * 5 // 2)
    for stream_id, pn in ((2, 0), (3, 65534), (1000, 1 << 20)):
        packets, records = _seal(
            keys, pn=pn, stream_id=stream_id, offset=offset, data=data, size=size
        )
        assert len(packets) == 3
        at = 0
        for i, packet in enumerate(packets):
            if i < len(packets) - 1:
                assert len(packet) == size
            assert len(packet) <= size
            header, payload, number, update = keys.context.decrypt_packet(packet, 9, pn + i)
            assert number == pn + i and not update
            assert header[0] & 0xC4 == 0x40 and header[1:9] == DCID  # short, phase 0
            frame = Buffer(data=payload)
            assert frame.pull_uint_var() == 0x0E
            assert frame.pull_uint_var() == stream_id
            assert frame.pull_uint_var() == offset + at
            length = frame.pull_uint_var()
            assert frame.pull_bytes(length) == data[at : at + length]
            assert frame.eof()
            assert records[i] == (offset + at, length, len(packet))
            at += length
        assert at == len(data)


def test_sealed_key_phase_and_spin_bits_reach_aioquic() -> None:
    keys = _keys("aes128", key_phase=1)
    packets, _ = _seal(
        keys,
        pn=7,
        stream_id=6,
        offset=0,
        data=b"x" * 3000,
        size=1452,
        first_byte=0x40 | 0x20 | 0x04,
    )
    for i, packet in enumerate(packets):
        header, _, number, update = keys.context.decrypt_packet(packet, 9, 7 + i)
        assert number == 7 + i and not update  # phase 1 matched the context's
        assert header[0] & 0x24 == 0x24


def test_seal_refuses_room_too_small_for_a_packet() -> None:
    keys = _keys("aes128")
    assert _seal(keys, pn=0, stream_id=2, offset=0, data=b"abc", size=30)[0] == []
    assert (
        _seal(keys, pn=0, stream_id=2, offset=0, data=b"abc" * 999, size=1452, out_cap=20)[0] == []
    )
    # max_packets bounds the batch; the rest of the data is left
    packets, records = _seal(
        keys, pn=0, stream_id=2, offset=0, data=bytes(10_000), size=1200, max_packets=2
    )
    assert len(packets) == 2 and records[1][0] + records[1][1] < 10_000


def test_unknown_suite_has_no_keys() -> None:
    assert lib.qf_keys_new(3, bytes(32), bytes(12), bytes(32)) == ffi.NULL


# -- 2: aioquic -> qf_open ------------------------------------------------------------------


@pytest.mark.parametrize("suite", sorted(SUITES))
@pytest.mark.parametrize("pn_len", [1, 2, 4])
def test_aioquic_packets_open_as_one_run(suite: str, pn_len: int) -> None:
    keys = _keys(suite)
    rng = random.Random(pn_len)
    chunks = [rng.randbytes(1400) for _ in range(5)] + [rng.randbytes(77)]
    pn0, offset = 300, 1 << 16
    packets, at = [], offset
    for i, chunk in enumerate(chunks):
        packets.append(_aioquic_packet(keys, pn0 + i, _stream_frame(6, at, chunk), pn_len=pn_len))
        at += len(chunk)
    # as one GRO message (5 equal datagrams, a shorter last one) and one message each
    size = len(packets[0])
    assert all(len(p) == size for p in packets[:-1])
    for messages in ([(b"".join(packets), size)], _single(packets)):
        opened = _open(keys, messages, largest_pn=pn0 - 1)
        assert len(opened.records) == 1
        run = opened.records[0]
        assert run["status"] == lib.QF_STREAM
        assert (run["msg"], run["index"], run["count"]) == (0, 0, len(packets))
        assert (run["pn"], run["stream_id"], run["offset"]) == (pn0, 6, offset)
        assert _data_of(opened, run) == b"".join(chunks)


def test_packet_builder_packets_with_padding_open() -> None:
    """aioquic's own builder: a tiny STREAM frame gets PADDING for the header sample."""
    keys = _keys("aes128")
    pair = CryptoPair()
    pair.send.setup(cipher_suite=keys.suite, secret=keys.secret, version=1)
    builder = QuicPacketBuilder(
        host_cid=OTHER_DCID,
        peer_cid=DCID,
        version=1,
        is_client=True,
        max_datagram_size=1452,
        packet_number=41,
    )
    pieces = [(0, b"ab"), (2, bytes(range(200)) * 5)]
    for offset, data in pieces:
        builder.start_packet(QuicPacketType.ONE_RTT, pair)
        frame = builder.start_frame(QuicFrameType.STREAM_BASE | 0x06, capacity=len(data) + 20)
        frame.push_uint_var(10)
        frame.push_uint_var(offset)
        frame.push_uint_var(len(data))
        frame.push_bytes(data)
    datagrams, sent = builder.flush()
    assert [p.packet_number for p in sent] == [41, 42]
    opened = _open(keys, _single(datagrams), largest_pn=40)
    statuses = [(r["status"], r["pn"], r["count"]) for r in opened.records]
    assert statuses == [(lib.QF_STREAM, 41, 2)] or statuses == [
        (lib.QF_STREAM, 41, 1),
        (lib.QF_STREAM, 42, 1),
    ]
    assert b"".join(_data_of(opened, r) for r in opened.records) == b"".join(d for _, d in pieces)


def test_gaps_and_other_streams_start_new_runs() -> None:
    keys = _keys("aes256")
    data = [bytes([i]) * 1000 for i in range(6)]
    packets = [
        _aioquic_packet(keys, 10, _stream_frame(2, 0, data[0])),
        _aioquic_packet(keys, 11, _stream_frame(2, 1000, data[1])),
        _aioquic_packet(keys, 12, _stream_frame(2, 3000, data[2])),  # offset gap
        _aioquic_packet(keys, 14, _stream_frame(2, 4000, data[3])),  # pn gap
        _aioquic_packet(keys, 15, _stream_frame(6, 5000, data[4])),  # another stream
        _aioquic_packet(keys, 16, _stream_frame(6, 6000, data[5])),
    ]
    opened = _open(keys, _single(packets), largest_pn=9)
    got = [
        (r["status"], r["msg"], r["count"], r["pn"], r["stream_id"], r["offset"], r["length"])
        for r in opened.records
    ]
    assert got == [
        (lib.QF_STREAM, 0, 2, 10, 2, 0, 2000),
        (lib.QF_STREAM, 2, 1, 12, 2, 3000, 1000),
        (lib.QF_STREAM, 3, 1, 14, 2, 4000, 1000),
        (lib.QF_STREAM, 4, 2, 15, 6, 5000, 2000),
    ]
    assert [_data_of(opened, r) for r in opened.records] == [
        data[0] + data[1],
        data[2],
        data[3],
        data[4] + data[5],
    ]


def test_max_out_leaves_later_datagrams_unopened() -> None:
    keys = _keys("aes128")
    packets = [_aioquic_packet(keys, i, _stream_frame(2 + 4 * i, 0, b"z" * 100)) for i in range(5)]
    opened = _open(keys, _single(packets), max_out=3)
    assert [r["msg"] for r in opened.records] == [0, 1, 2]


# -- 3: declines ----------------------------------------------------------------------------


def _declined(keys: Keys, packet: bytes, **kw: Any) -> int:
    opened = _open(keys, _single([packet]), **kw)
    assert len(opened.records) == 1 and opened.records[0]["count"] == 1
    return opened.records[0]["status"]


def test_valid_control_packet_is_stream() -> None:
    """The control for the declines below: the same packet, unmodified, is opened."""
    keys = _keys("aes128")
    packet = _aioquic_packet(keys, 5, _stream_frame(2, 0, b"q" * 500))
    assert _declined(keys, packet, largest_pn=4) == lib.QF_STREAM


@pytest.mark.parametrize("where", [9 + 2 + 3, -TAG - 1, -1])
def test_a_flipped_bit_is_slow(where: int) -> None:
    keys = _keys("aes128")
    packet = bytearray(_aioquic_packet(keys, 5, _stream_frame(2, 0, b"q" * 500)))
    packet[where] ^= 0x10
    assert _declined(keys, bytes(packet), largest_pn=4) == lib.QF_SLOW


def test_another_key_phase_is_slow() -> None:
    keys = _keys("aes128", key_phase=1)
    packet = _aioquic_packet(keys, 5, _stream_frame(2, 0, b"q" * 500), key_phase=1)
    assert _declined(keys, packet, largest_pn=4, key_phase=0) == lib.QF_SLOW
    assert _declined(keys, packet, largest_pn=4, key_phase=1) == lib.QF_STREAM


@pytest.mark.parametrize(
    "payload",
    [
        _ack_frame(3) + bytes(40),
        _stream_frame(2, 0, b"q" * 100) + _ack_frame(3),
        _ack_frame(3) + _stream_frame(2, 0, b"q" * 100),
        _stream_frame(2, 0, b"q" * 100) + _stream_frame(2, 100, b"r" * 100),
        _stream_frame(2, 0, b"q" * 100) + b"\x01",  # PING after it
        _stream_frame(2, 0, b"q" * 100) + bytes(20) + b"\x55",  # non-zero after padding
        _stream_frame(2, 0, b"q" * 100, fin=True),
        _stream_frame(2, 0, b"q" * 100, fin=True, length=False),
        _stream_frame(2, 0, b"", length=True) + bytes(30),  # empty STREAM frame
        bytes([0x01]) + bytes(40),  # PING, PADDING
        bytes(60),  # PADDING only
    ],
    ids=[
        "ack",
        "stream-ack",
        "ack-stream",
        "two-streams",
        "stream-ping",
        "trailing-byte",
        "fin",
        "fin-no-len",
        "empty",
        "ping",
        "padding",
    ],
)
def test_other_frames_are_slow(payload: bytes) -> None:
    keys = _keys("aes256")
    assert _declined(keys, _aioquic_packet(keys, 9, payload), largest_pn=8) == lib.QF_SLOW


def test_stream_frame_without_length_runs_to_the_packet_end() -> None:
    keys = _keys("aes128")
    packet = _aioquic_packet(keys, 9, _stream_frame(2, 70, b"k" * 300, length=False))
    opened = _open(keys, _single([packet]), largest_pn=8)
    assert [(r["status"], r["offset"], r["length"]) for r in opened.records] == [
        (lib.QF_STREAM, 70, 300)
    ]
    assert _data_of(opened, opened.records[0]) == b"k" * 300


def test_reserved_bits_are_slow() -> None:
    keys = _keys("aes128")
    packet = _aioquic_packet(keys, 9, _stream_frame(2, 0, b"q" * 100), first_bits=0x08)
    assert _declined(keys, packet, largest_pn=8) == lib.QF_SLOW


@pytest.mark.parametrize("largest", [9, 10, 5000])
def test_an_old_packet_number_is_slow(largest: int) -> None:
    keys = _keys("aes128")
    packet = _aioquic_packet(keys, 9, _stream_frame(2, 0, b"q" * 100))
    assert _declined(keys, packet, largest_pn=largest) == lib.QF_SLOW


def test_a_repeated_packet_number_in_one_batch_is_slow() -> None:
    keys = _keys("aes128")
    first = _aioquic_packet(keys, 9, _stream_frame(2, 0, b"q" * 100))
    again = _aioquic_packet(keys, 9, _stream_frame(2, 100, b"r" * 100))
    older = _aioquic_packet(keys, 8, _stream_frame(2, 200, b"s" * 100))
    opened = _open(keys, _single([first, again, older]), largest_pn=7)
    assert [r["status"] for r in opened.records] == [lib.QF_STREAM, lib.QF_SLOW, lib.QF_SLOW]


def test_long_headers_and_other_connections_are_routed_elsewhere() -> None:
    keys = _keys("aes128")
    long_header = bytes([0xC3]) + (1).to_bytes(4, "big") + bytes([8]) + DCID + os.urandom(1180)
    other = _aioquic_packet(keys, 9, _stream_frame(2, 0, b"q" * 100), dcid=OTHER_DCID)
    assert _declined(keys, long_header) == lib.QF_OTHER_CID
    assert _declined(keys, other) == lib.QF_OTHER_CID


def test_truncated_datagrams_do_not_crash() -> None:
    keys = _keys("aes128")
    packet = _aioquic_packet(keys, 9, _stream_frame(2, 0, b"q" * 100))
    for n in range(1, 40):
        status = _declined(keys, packet[:n], largest_pn=8)
        assert status in (lib.QF_SLOW, lib.QF_OTHER_CID)
        if n < 9:
            assert status == lib.QF_OTHER_CID  # too short to hold the connection id
    # and a truncated datagram inside a GRO message with valid ones around it
    good = [_aioquic_packet(keys, 20 + i, _stream_frame(2, 100 * i, b"w" * 100)) for i in range(3)]
    opened = _open(keys, _single([good[0], packet[:15], good[1], good[2]]), largest_pn=19)
    assert [r["status"] for r in opened.records] == [lib.QF_STREAM, lib.QF_SLOW, lib.QF_STREAM]
    assert opened.records[2]["count"] == 2


# -- 4: robustness --------------------------------------------------------------------------


def _expected_datagrams(messages: list[tuple[bytes, int]]) -> list[tuple[int, int, bytes]]:
    found = []
    for m, (data, seg) in enumerate(messages):
        step = seg or len(data)
        for index, k in enumerate(range(0, len(data), step)):
            found.append((m, index, data[k : k + step]))
    return found


def test_random_datagrams_never_crash_and_runs_cover_each_once() -> None:
    rng = random.Random(20261130)
    keys = _keys("aes128", seed=3)
    # a pool of authentic packets (their data is known) to mix with garbage
    truth: dict[tuple[int, int], bytes] = {}
    pool = []
    offsets = {2: 0, 6: 0}
    for pn in range(200):
        sid = rng.choice((2, 6))
        data = rng.randbytes(rng.choice((1, 50, 900, 1300)))
        truth[(sid, offsets[sid])] = data
        pool.append(_aioquic_packet(keys, pn, _stream_frame(sid, offsets[sid], data)))
        offsets[sid] += len(data)
    for _trial in range(400):
        datagrams = []
        cursor = start = rng.randrange(len(pool))
        for _ in range(rng.randrange(1, 40)):
            kind = rng.random()
            packet = rng.choice(pool)
            if kind < 0.5:  # the next authentic packet: runs form
                datagrams.append(pool[cursor % len(pool)])
                cursor += 1
            elif kind < 0.65:
                datagrams.append(packet[: rng.randrange(1, len(packet) + 1)])
            elif kind < 0.8:
                mangled = bytearray(packet)
                mangled[rng.randrange(len(mangled))] ^= 1 << rng.randrange(8)
                datagrams.append(bytes(mangled))
            elif kind < 0.9:
                datagrams.append(rng.randbytes(rng.randrange(1, 1500)))
            else:
                datagrams.append(bytes([0x40]) + DCID + rng.randbytes(rng.randrange(0, 100)))
        # random grouping into GRO messages with random segment sizes
        messages: list[tuple[bytes, int]] = []
        i = 0
        while i < len(datagrams):
            if rng.random() < 0.5:
                messages.append((datagrams[i], 0))
                i += 1
                continue
            n = rng.randrange(1, 8)
            group = b"".join(datagrams[i : i + n])
            sizes = {len(d) for d in datagrams[i : i + n]}
            odd = rng.choice((0, 1, 7, 100, 1200, 65535))
            seg = max(sizes) if rng.random() < 0.8 else odd
            messages.append((group, seg))
            i += n
        largest = rng.choice((-1, 0, 50, 150, 1000, start - 1, start - 1, start - 1))
        max_out = rng.choice((1, 5) + (256,) * 4)
        opened = _open(
            keys, messages, largest_pn=largest, key_phase=rng.choice((0, 1)), max_out=max_out
        )
        expected = _expected_datagrams(messages)
        covered: list[tuple[int, int, bytes]] = []
        last_pn = largest
        for record in opened.records:
            assert record["status"] in STATUSES
            start = [(m, k) for m, k, _ in expected].index((record["msg"], record["index"]))
            assert start == len(covered), "records skip or repeat datagrams"
            covered.extend(expected[start : start + record["count"]])
            assert record["count"] >= 1
            if record["status"] != lib.QF_STREAM:
                assert record["count"] == 1
                continue
            assert record["pn"] > last_pn
            last_pn = record["pn"] + record["count"] - 1
            # authentic data: it must be what aioquic sealed, stitched in order
            got = _data_of(opened, record)
            want, offset = b"", record["offset"]
            while len(want) < len(got):
                piece = truth[(record["stream_id"], offset)]
                want += piece
                offset += len(piece)
            assert got == want
        if len(opened.records) < max_out:
            assert len(covered) == len(expected)


# -- 5: qf_recv -----------------------------------------------------------------------------

UDP_GRO = int(getattr(socket, "UDP_GRO", 104))
UDP_SEGMENT = int(getattr(socket, "UDP_SEGMENT", 103))


def _udp_pair(family: int, host: str) -> tuple[socket.socket, socket.socket]:
    receiver = socket.socket(family, socket.SOCK_DGRAM)
    sender = socket.socket(family, socket.SOCK_DGRAM)
    receiver.bind((host, 0))
    sender.bind((host, 0))
    receiver.setblocking(False)
    try:
        receiver.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    except OSError:
        receiver.close()
        sender.close()
        pytest.skip("UDP_GRO is not supported here")
    return receiver, sender


def _recv_all(receiver: socket.socket) -> list[dict[str, Any]]:
    slot, max_msgs = 65536, 8
    buf = bytearray(slot * max_msgs)
    msgs = ffi.new("qf_msg[]", max_msgs)
    got: list[dict[str, Any]] = []
    for _ in range(200):
        n = lib.qf_recv(receiver.fileno(), ffi.from_buffer(buf), slot, max_msgs, msgs)
        if n == -errno.EAGAIN and sum(len(m["data"]) for m in got) >= 3000:
            break
        if n == -errno.EAGAIN:
            continue
        assert n > 0
        for i in range(n):
            m = msgs[i]
            assert m.at == i * slot
            got.append(
                {
                    "data": bytes(buf[m.at : m.at + m.len]),
                    "seg": int(m.seg),
                    "port": int(m.port),
                    "family": int(m.family),
                    "addr": bytes(ffi.buffer(m.addr, 16)),
                }
            )
    return got


@pytest.mark.parametrize("gso", [True, False], ids=["gso", "sendto"])
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_qf_recv_reads_gro_datagrams_and_their_source(gso: bool, family: str) -> None:
    fam, host = (socket.AF_INET, "127.0.0.1") if family == "ipv4" else (socket.AF_INET6, "::1")
    try:
        receiver, sender = _udp_pair(fam, host)
    except OSError:
        pytest.skip(f"no {family} loopback")
    try:
        datagrams = [bytes([i + 1]) * 1000 for i in range(3)]
        target = receiver.getsockname()[:2]
        if gso:
            try:
                sender.sendmsg(
                    datagrams,
                    [(socket.SOL_UDP, UDP_SEGMENT, (1000).to_bytes(2, "little"))],
                    0,
                    target,
                )
            except OSError:
                pytest.skip("UDP GSO is not supported here")
        else:
            for data in datagrams:
                sender.sendto(data, target)
        got = _recv_all(receiver)
        split = []
        for message in got:
            step = message["seg"] or len(message["data"])
            assert message["seg"] == 0 or message["seg"] < len(message["data"])
            split += [message["data"][k : k + step] for k in range(0, len(message["data"]), step)]
            assert message["port"] == sender.getsockname()[1]
            if fam == socket.AF_INET:
                assert message["family"] == 4
                assert message["addr"][:4] == socket.inet_pton(socket.AF_INET, host)
            else:
                assert message["family"] == 6
                assert message["addr"] == socket.inet_pton(socket.AF_INET6, host)
        assert split == datagrams
        buf = bytearray(65536)
        msgs = ffi.new("qf_msg[]", 1)
        assert lib.qf_recv(receiver.fileno(), ffi.from_buffer(buf), 65536, 1, msgs) == -errno.EAGAIN
    finally:
        receiver.close()
        sender.close()


def test_qf_recv_on_a_closed_descriptor_is_a_negative_errno() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = sock.fileno()
    sock.close()
    buf = bytearray(65536)
    msgs = ffi.new("qf_msg[]", 1)
    assert lib.qf_recv(fd, ffi.from_buffer(buf), 65536, 1, msgs) == -errno.EBADF


# -- qf_hp_mask -------------------------------------------------------------------------------


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_hp_mask_is_aioquics_header_protection_mask(suite: str) -> None:
    """The mask of `qf_hp_mask` is what aioquic's HeaderProtection applies: on a
    short header with a zero 4-byte packet number, the protected header bytes are the
    mask (first byte: its low 5 bits)."""
    keys = _keys(suite, seed=9)
    rng = random.Random(9)
    assert keys.context.hp is not None
    mask = ffi.new("uint8_t[16]")
    for _ in range(50):
        header = bytes([0x43]) + DCID + bytes(4)
        payload = rng.randbytes(40)
        theirs = keys.context.hp.apply(header, payload)
        sample = payload[0:16]  # 4 bytes after the packet number's start
        assert lib.qf_hp_mask(keys.c, sample, mask) == 0
        ours = bytes(mask)
        assert theirs[0] ^ header[0] == ours[0] & 0x1F
        assert theirs[9:13] == ours[1:5]


def test_qf_recv_takes_at_most_max_msgs_per_call() -> None:
    receiver, sender = _udp_pair(socket.AF_INET, "127.0.0.1")
    try:
        target = receiver.getsockname()[:2]
        sent = [bytes([i]) * (100 + i) for i in range(10)]  # sizes differ: no coalescing
        for data in sent:
            sender.sendto(data, target)
        slot = 2048
        buf = bytearray(slot * 4)
        msgs = ffi.new("qf_msg[]", 4)
        got: list[bytes] = []
        counts = []
        for _ in range(100):
            n = lib.qf_recv(receiver.fileno(), ffi.from_buffer(buf), slot, 4, msgs)
            if n == -errno.EAGAIN:
                if len(got) == len(sent):
                    break
                continue
            assert 0 < n <= 4
            counts.append(n)
            got += [bytes(buf[msgs[i].at : msgs[i].at + msgs[i].len]) for i in range(n)]
            assert all(msgs[i].seg == 0 for i in range(n))
        assert got == sent
        assert max(counts) == 4
    finally:
        receiver.close()
        sender.close()
