"""`UdpSocket`: the endpoint's UDP socket, with Linux segmentation offload both ways.

Theory of operation
-------------------
aioquic hands the endpoint one Python `bytes` per QUIC datagram, and the plain way to
move them is one `sendto` / `recvfrom` system call each. On loopback a datagram's system
call (copy, socket accounting, waking the peer) costs more than aioquic's own work for a
16 KiB packet, so the endpoint batches both directions:

* Send (UDP GSO, `UDP_SEGMENT`): consecutive datagrams to the same address with the same
  length (the last one of a run may be shorter) are handed to the kernel in one `sendmsg`
  (one iovec each) with the segment size as a control message; the kernel (or
  the NIC) cuts it back into the same datagrams on the wire. A run holds at most
  `GSO_MAX_SEGMENTS` datagrams and `GSO_MAX_BYTES` bytes (one IP packet's limit).
* Receive (UDP GRO, `UDP_GRO`): the kernel may hand over several datagrams of one flow
  as one buffer plus their segment size (a control message); `receive` cuts it back into
  the original datagrams. On loopback a GSO batch reaches a GRO socket whole, so one
  system call moves up to ~64 KiB each way.

Wire format and QUIC semantics are unchanged: the peer sees ordinary datagrams, with or
without offload on its side. Where the kernel refuses GSO (no `UDP_SEGMENT`, or `EIO`
from a device without checksum offload) the socket falls back to one `sendto` per
datagram for good; where `UDP_GRO` is unknown it receives one datagram per call.

Send errors never raise: a full socket buffer or an unreachable peer loses the datagrams,
which QUIC's loss recovery re-sends (the same contract as a plain `sendto`).
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

try:
    from swactor.transport._quicfast_cffi import ffi as _ffi  # type: ignore[import-not-found]
    from swactor.transport._quicfast_cffi import lib as _qf
except ImportError:  # pragma: no cover - the package build compiles it
    _ffi = _qf = None

Address = tuple[str, int]
Buffer = bytes | memoryview
Datagram = tuple["Buffer | DatagramRun", Address]
OutboundPath = Callable[[list[Datagram]], Sequence[Datagram]]
"""A port between an endpoint and its socket: given one entry per outgoing UDP
datagram, it returns those to send (a test models a lossy path with one)."""

UDP_SEGMENT = int(getattr(socket, "UDP_SEGMENT", 103))
UDP_GRO = int(getattr(socket, "UDP_GRO", 104))
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65000  # below 65507 (IPv4) and 65527 (IPv6) UDP payload limits
RECV_BUFFER = 65536
RECV_MESSAGES = 16  # GRO receives per recvmmsg (native helper)
SEND_MESSAGES = 64  # GSO sends per sendmmsg (native helper; its QF_MAX_MSGS)
_CMSG_SPACE = socket.CMSG_SPACE(4)
_SEGMENT_SIZE = struct.Struct("=H")
_GRO_SIZE = struct.Struct("=i")
# errno values that mean "this socket/device cannot do GSO": fall back to sendto.
_NO_GSO = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
_NO_GSO_NEG = frozenset(-code for code in _NO_GSO)  # as the native helper returns them


class DatagramRun:
    """Datagrams built back to back in one buffer, each `segment` bytes but the last
    (shorter or equal). The bulk path seals into these; the socket cuts a run into GSO
    sends (`gso_messages`: as many whole segments as one send may carry), each one
    iovec, so no per-datagram objects exist. `len()` is the total byte count (what
    aioquic adds to a path's bytes_sent)."""

    __slots__ = ("count", "segment", "view")

    def __init__(self, view: memoryview, segment: int, count: int) -> None:
        self.view = view
        self.segment = segment
        self.count = count

    def __len__(self) -> int:
        return len(self.view)

    def gso_messages(self) -> list[tuple[int, int]]:
        """(offset, length) of each GSO send the run needs: whole segments, at most
        `GSO_MAX_SEGMENTS` and `GSO_MAX_BYTES` each."""
        step = max(1, min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // self.segment)) * self.segment
        total = len(self.view)
        return [(k, min(step, total - k)) for k in range(0, total, step)]

    def datagrams(self) -> list[memoryview]:
        """The run cut back into one view per datagram."""
        view, step = self.view, self.segment
        return [view[k : k + step] for k in range(0, len(view), step)]


class UdpSocket:
    """A bound, non-blocking UDP socket that sends and receives datagrams in batches."""

    def __init__(self, sock: socket.socket, offload: bool = True) -> None:
        self.sock = sock
        self.gso = offload and hasattr(sock, "sendmsg")
        self.gro = False
        if offload:
            try:
                sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                self.gro = False
        self._native: tuple[memoryview, Any, Any] | None = None
        self._sources: dict[tuple[bytes, int], Address] = {}
        self._packed_addrs: dict[Address, tuple[int, bytes]] = {}
        if self.gro and _qf is not None:
            buf = bytearray(RECV_BUFFER * RECV_MESSAGES)
            msgs = _ffi.new("qf_msg[]", RECV_MESSAGES)
            self._native = (memoryview(buf), msgs, _ffi.from_buffer(buf))

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    # -- send -----------------------------------------------------------------------

    def send(self, datagrams: Sequence[Datagram]) -> None:
        """Send `datagrams` in order, as few system calls as GSO allows (a
        `DatagramRun` is one GSO send, or one send per datagram without GSO)."""
        count = len(datagrams)
        i = 0
        while i < count:
            data, addr = datagrams[i]
            if type(data) is DatagramRun:
                runs = [data]
                j = i + 1
                while j < count:
                    nxt, nxt_addr = datagrams[j]
                    if type(nxt) is not DatagramRun or nxt_addr != addr:
                        break
                    runs.append(nxt)
                    j += 1
                self._send_datagram_runs(runs, addr)
                i = j
                continue
            size = len(data)
            j = i + 1
            if self.gso:
                limit = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // size) if size else 1
                while j < count and j - i < limit:
                    nxt, nxt_addr = datagrams[j]
                    if nxt_addr != addr or len(nxt) > size:
                        break
                    j += 1
                    if len(nxt) < size:
                        break  # a shorter datagram may only end a run
            if j - i == 1:
                self._sendto(cast(Buffer, data), addr)
            else:
                self._send_run([cast(Buffer, d) for d, _ in datagrams[i:j]], size, addr)
            i = j

    def _send_datagram_runs(self, runs: list[DatagramRun], addr: Address) -> None:
        """Runs to one address: one `sendmmsg` of GSO sends (native helper), else one
        `sendmsg` per run, or one `sendto` per datagram without GSO."""
        if self.gso and _qf is not None:
            try:
                family, packed = self._packed(addr)
            except (OSError, ValueError):
                return  # not a numeric address (the endpoint resolves names first): lost
            messages: list[tuple[Any, int, int, int]] = []  # (buffer, offset, length, seg)
            for run in runs:
                base = _ffi.from_buffer(run.view)
                messages.extend((base, k, n, run.segment) for k, n in run.gso_messages())
            for k in range(0, len(messages), SEND_MESSAGES):
                batch = messages[k : k + SEND_MESSAGES]
                bufs = _ffi.new("uint8_t *[]", [base + at for base, at, _, _ in batch])
                lens = _ffi.new("uint32_t[]", [n for _, _, n, _ in batch])
                segs = _ffi.new("uint16_t[]", [seg for _, _, _, seg in batch])
                sent = _qf.qf_send(
                    self.sock.fileno(), family, packed, addr[1], bufs, lens, segs, len(batch)
                )
                if sent in _NO_GSO_NEG:  # the kernel or device refuses GSO: for good
                    self.gso = False
                    for base, at, n, seg in messages[k:]:
                        view = memoryview(_ffi.buffer(base + at, n))
                        for d in range(0, n, seg):
                            self._sendto(view[d : d + seg], addr)
                    return
            return  # other errors (full buffer, unreachable): lost, QUIC recovers
        for run in runs:
            if run.count > 1 and self.gso:
                for at, n in run.gso_messages():
                    self._send_run([run.view[at : at + n]], run.segment, addr)
            else:
                for data in run.datagrams():
                    self._sendto(data, addr)

    def _packed(self, addr: Address) -> tuple[int, bytes]:
        found = self._packed_addrs.get(addr)
        if found is None:
            host = addr[0]
            if ":" in host:
                found = (6, socket.inet_pton(socket.AF_INET6, host))
            else:
                found = (4, socket.inet_pton(socket.AF_INET, host))
            if len(self._packed_addrs) > 1024:
                self._packed_addrs.clear()
            self._packed_addrs[addr] = found
        return found

    def _send_run(self, run: list[Buffer], size: int, addr: Address) -> None:
        try:
            self.sock.sendmsg(
                run,  # one iovec per datagram: the kernel gathers them, no join copy
                [(socket.SOL_UDP, UDP_SEGMENT, _SEGMENT_SIZE.pack(size))],
                0,
                addr,
            )
        except (BlockingIOError, InterruptedError):
            pass  # socket buffer full: lost datagrams, which QUIC recovers
        except OSError as exc:
            if exc.errno not in _NO_GSO:
                return  # e.g. unreachable peer; the connection's timers deal with it
            self.gso = False
            for data in run:
                view = memoryview(data)
                for k in range(0, len(view), size):  # one iovec may hold a whole run
                    self._sendto(view[k : k + size], addr)

    def _sendto(self, data: Buffer, addr: Address) -> None:
        # once per datagram: a bare try costs nothing here, contextlib.suppress a call
        try:  # noqa: SIM105
            self.sock.sendto(data, addr)
        except OSError:
            pass  # buffer full or unreachable: a lost datagram, which QUIC recovers

    # -- receive --------------------------------------------------------------------

    def receive(self) -> tuple[list[bytes], Address] | None:
        """The datagrams of one receive call and their sender; None when nothing is
        waiting (or the socket reported an error, which a UDP endpoint ignores)."""
        raw = self.receive_raw()
        if raw is None:
            return None
        data, segment, source = raw
        if not segment or segment >= len(data):
            return [data], source
        return [data[k : k + segment] for k in range(0, len(data), segment)], source

    def receive_messages(self) -> tuple[memoryview, Any, int] | None:
        """Up to `RECV_MESSAGES` GRO receives in one `recvmmsg` (native helper): the
        reused receive buffer, the `qf_msg` records (offset, length, segment size,
        source) and their count. None when nothing is waiting, on a socket error, or
        where this socket has no GRO or the native helper is missing (use `receive`)."""
        if self._native is None:
            return None
        buf, msgs, cbuf = self._native
        count = int(_qf.qf_recv(self.sock.fileno(), cbuf, RECV_BUFFER, RECV_MESSAGES, msgs))
        if count <= 0:
            return None
        return buf, msgs, count

    def source(self, message: Any) -> Address:
        """The (host, port) a `qf_msg` came from (cached: one peer sends most)."""
        raw = bytes(_ffi.buffer(message.addr, 16 if message.family == 6 else 4))
        key = (raw, int(message.port))
        found = self._sources.get(key)
        if found is None:
            family = socket.AF_INET6 if message.family == 6 else socket.AF_INET
            found = (socket.inet_ntop(family, raw), int(message.port))
            if len(self._sources) > 1024:
                self._sources.clear()
            self._sources[key] = found
        return found

    def receive_raw(self) -> tuple[bytes, int, Address] | None:
        """One receive call as it came: the buffer, its GRO segment size (0: one
        datagram) and the sender; None when nothing is waiting or on a socket error."""
        sock = self.sock
        try:
            if not self.gro:
                data, addr = sock.recvfrom(RECV_BUFFER)
                return data, 0, (str(addr[0]), int(addr[1]))
            data, ancillary, _, addr = sock.recvmsg(RECV_BUFFER, _CMSG_SPACE)
        except OSError:  # BlockingIOError (nothing waiting), ICMP errors, ...
            return None
        segment = _gro_segment_size(ancillary)
        if segment >= len(data):
            segment = 0
        return data, segment, (str(addr[0]), int(addr[1]))


def _gro_segment_size(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, payload in ancillary:
        if level == socket.SOL_UDP and kind == UDP_GRO and len(payload) >= _GRO_SIZE.size:
            size: int = _GRO_SIZE.unpack_from(payload)[0]
            return size
    return 0
