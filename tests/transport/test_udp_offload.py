"""`UdpSocket`: GSO runs on send, GRO splitting on receive, plain fallbacks.

Real kernel sockets on loopback: what arrives is compared datagram by datagram with what
was sent (lengths and bytes), and the number of send system calls is counted through the
socket's own counter and through a recording wrapper around `sendmsg`/`sendto`.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

import pytest

from swactor.transport import udp
from swactor.transport.udp import GSO_MAX_SEGMENTS, DatagramRun, UdpSocket


def _bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return sock


def _receive_all(rx: UdpSocket, expected: int) -> list[bytes]:
    """Receive until `expected` datagrams arrived or nothing came for 2 s."""
    rx.sock.settimeout(2.0)
    got: list[bytes] = []
    while len(got) < expected:
        batch = rx.receive()
        if batch is None:
            break
        got.extend(batch[0])
    return got


class _Recording:
    """Wraps a socket and records which send call carried how many bytes."""

    def __init__(self, sock: socket.socket, fail_gso: int | None = None) -> None:
        self._sock = sock
        self.calls: list[tuple[str, int]] = []
        self._fail_gso = fail_gso

    def sendmsg(self, buffers: list[bytes], ancillary: Any, flags: int, addr: Any) -> int:
        if self._fail_gso is not None:
            raise OSError(self._fail_gso, os.strerror(self._fail_gso))
        self.calls.append(("sendmsg", sum(len(b) for b in buffers)))
        return self._sock.sendmsg(buffers, ancillary, flags, addr)

    def sendto(self, data: bytes, addr: Any) -> int:
        self.calls.append(("sendto", len(data)))
        return self._sock.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _payloads(sizes: list[int]) -> list[bytes]:
    return [os.urandom(size) for size in sizes]


@pytest.fixture
def pair() -> Any:
    rx_sock, tx_sock = _bound(), _bound()
    yield UdpSocket(rx_sock), tx_sock
    rx_sock.close()
    tx_sock.close()


def test_equal_datagrams_go_as_one_gso_run_and_arrive_unchanged(pair: Any) -> None:
    rx, tx_sock = pair
    recording = _Recording(tx_sock)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr = rx.sock.getsockname()
    sent = _payloads([1452] * 20 + [700])
    tx.send([(data, addr) for data in sent])
    assert recording.calls == [("sendmsg", 1452 * 20 + 700)]  # one system call
    assert _receive_all(rx, len(sent)) == sent


def test_runs_break_at_size_changes_address_changes_and_limits(pair: Any) -> None:
    rx, tx_sock = pair
    other = UdpSocket(_bound())
    recording = _Recording(tx_sock)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr, other_addr = rx.sock.getsockname(), other.sock.getsockname()
    # a shorter datagram ends a run; a longer one starts a new run; 16383-byte runs hold
    # at most 3 (one IP packet); a change of address starts a new run.
    first = _payloads([1200, 1200, 800, 1300, 1300])
    big = _payloads([16383] * 4)
    elsewhere = _payloads([1200, 1200])
    datagrams = [(d, addr) for d in first + big] + [(d, other_addr) for d in elsewhere]
    tx.send(datagrams)
    assert recording.calls == [
        ("sendmsg", 3200),
        ("sendmsg", 2600),
        ("sendmsg", 3 * 16383),
        ("sendto", 16383),
        ("sendmsg", 2400),
    ]
    assert _receive_all(rx, 9) == first + big
    assert _receive_all(other, 2) == elsewhere
    other.close()


def test_a_run_never_exceeds_the_segment_limit(pair: Any) -> None:
    rx, tx_sock = pair
    recording = _Recording(tx_sock)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr = rx.sock.getsockname()
    sent = _payloads([600] * (GSO_MAX_SEGMENTS + 5))
    tx.send([(d, addr) for d in sent])
    assert recording.calls == [("sendmsg", 600 * GSO_MAX_SEGMENTS), ("sendmsg", 600 * 5)]
    assert _receive_all(rx, len(sent)) == sent


@pytest.mark.parametrize("code", [errno.EIO, errno.EINVAL])
def test_refused_gso_falls_back_to_one_sendto_each_for_good(pair: Any, code: int) -> None:
    rx, tx_sock = pair
    recording = _Recording(tx_sock, fail_gso=code)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr = rx.sock.getsockname()
    sent = _payloads([1452] * 3)
    tx.send([(d, addr) for d in sent])
    assert not tx.gso
    assert recording.calls == [("sendto", 1452)] * 3
    assert _receive_all(rx, 3) == sent


def test_without_gro_each_receive_returns_one_datagram(pair: Any) -> None:
    _, tx_sock = pair
    plain = UdpSocket(_bound(), offload=False)
    assert not plain.gro and not plain.gso
    addr = plain.sock.getsockname()
    sent = _payloads([1452] * 4)
    UdpSocket(tx_sock).send([(d, addr) for d in sent])
    got = []
    plain.sock.settimeout(2.0)
    for _ in range(4):
        batch = plain.receive()
        assert batch is not None and len(batch[0]) == 1
        got.extend(batch[0])
    assert got == sent
    plain.close()


def test_gro_hands_a_gso_run_over_in_one_receive_when_the_kernel_coalesces(pair: Any) -> None:
    rx, tx_sock = pair
    assert rx.gro  # Linux >= 5.0
    addr = rx.sock.getsockname()
    sent = _payloads([1452] * 10 + [99])
    UdpSocket(tx_sock).send([(d, addr) for d in sent])
    rx.sock.settimeout(2.0)
    batch = rx.receive()
    assert batch is not None
    datagrams, source = batch
    assert source == tx_sock.getsockname()
    # loopback delivers a GSO run to a GRO socket whole: all 11 datagrams in one call,
    # cut back at the segment size
    assert datagrams == sent


def test_nothing_waiting_is_none() -> None:
    sock = _bound()
    sock.setblocking(False)
    assert UdpSocket(sock).receive() is None
    sock.close()


def _run(sizes: list[int]) -> tuple[DatagramRun, list[bytes]]:
    """A DatagramRun as the bulk path seals it: back to back, all but the last equal."""
    datagrams = _payloads(sizes)
    view = memoryview(bytearray(b"".join(datagrams)))
    return DatagramRun(view, sizes[0], len(sizes)), datagrams


def test_a_datagram_run_is_cut_into_whole_segment_gso_sends() -> None:
    run, _ = _run([16383] * 9 + [500])
    assert run.gso_messages() == [(0, 3 * 16383), (3 * 16383, 3 * 16383),
                                  (6 * 16383, 3 * 16383), (9 * 16383, 500)]
    small, _ = _run([600] * (GSO_MAX_SEGMENTS + 1))
    assert [n for _, n in small.gso_messages()] == [600 * GSO_MAX_SEGMENTS, 600]


def test_datagram_runs_arrive_as_the_datagrams_they_hold(pair: Any) -> None:
    rx, tx_sock = pair
    tx = UdpSocket(tx_sock)
    addr = rx.sock.getsockname()
    first, sent_first = _run([16383] * 7 + [1000])
    second, sent_second = _run([1452] * 50 + [99])
    tx.send([(first, addr), (second, addr)])  # one sendmmsg (native helper)
    assert _receive_all(rx, 59) == sent_first + sent_second


def test_datagram_runs_without_the_native_helper_go_one_sendmsg_per_gso_send(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rx, tx_sock = pair
    monkeypatch.setattr(udp, "_qf", None)
    recording = _Recording(tx_sock)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr = rx.sock.getsockname()
    run, sent = _run([16383] * 4 + [10])
    tx.send([(run, addr)])
    assert recording.calls == [("sendmsg", 3 * 16383), ("sendmsg", 16383 + 10)]
    assert _receive_all(rx, 5) == sent


def test_native_gso_refused_falls_back_to_one_sendto_each(
    pair: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rx, tx_sock = pair

    class Refusing:
        def qf_send(self, *args: Any) -> int:
            return -errno.EIO

    monkeypatch.setattr(udp, "_qf", Refusing())
    recording = _Recording(tx_sock)
    tx = UdpSocket(recording)  # type: ignore[arg-type]
    addr = rx.sock.getsockname()
    run, sent = _run([1452] * 5 + [200])
    tx.send([(run, addr)])
    assert not tx.gso
    assert recording.calls == [("sendto", 1452)] * 5 + [("sendto", 200)]
    assert _receive_all(rx, 6) == sent
