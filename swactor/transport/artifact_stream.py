"""Artifact streams: a pool member serves byte ranges of a file it offers, on ALPN
`swactor/artifact/1` (an extension of spec §15: weights reach nodes that lack the file).

Theory of operation
-------------------
The link is the endpoint's ordinary QUIC connection: mutual TLS with Ed25519 node
certificates, so only peers on the endpoint's allow-list (the pool) ever reach the
handler, and a client knows it talks to the node id it asked for. There is no other
listening port.

Each request is one bidirectional stream. The client writes one fixed 50-byte request
and FIN:

    b"SWAF" | version u8 (1) | kind u8 (1 manifest, 2 range) | file sha256 (32 bytes)
           | offset u64 | length u32                                  (big-endian)

and the server answers a 5-byte head, `status u8 | length u32`, then `length` bytes and
FIN. Status 0 (`OK`) carries the manifest (kind 1; offset and length must be 0) or
exactly the requested range (kind 2; 1 to `MAX_RANGE` bytes inside the file). Any other
status (`UNKNOWN_FILE`, `BAD_RANGE`, `BAD_REQUEST`) carries a short server text.

Bounds, both ways. The server keeps at most `REQUEST.size` bytes per inbound stream
(more is answered `BAD_REQUEST` at once) and serves only digests it `offer`ed; a range
is checked against the file's size before it is read. The client accepts an answer of
at most the head plus the length it asked for (a manifest: `MAX_MANIFEST`); anything
longer, a wrong length or a stream that ends early is an `ArtifactError`. Payload bytes
never go into a log or an exception. `served_bytes` and `served_requests` count what the
server sent; `fetched_bytes` what the client received (tests and benches read them).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import struct
from dataclasses import dataclass, field
from typing import Protocol

from swactor import faults
from swactor.transport.config import ARTIFACT_ALPN
from swactor.transport.endpoint import QuicEndpoint, QuicLink
from swactor.transport.errors import ConnectionLostError, TransportError

MAGIC = b"SWAF"
VERSION = 1
REQUEST = struct.Struct(">4sBB32sQI")
HEAD = struct.Struct(">BI")
MAX_RANGE = 4 << 20
"""The most bytes one range request may ask for."""
MAX_MANIFEST = (1 << 20) + 64
"""The most bytes a manifest answer may hold (`model.fetch` keeps manifests below it)."""
MAX_REASON = 200


class Kind(enum.IntEnum):
    MANIFEST = 1
    RANGE = 2


class Status(enum.IntEnum):
    OK = 0
    UNKNOWN_FILE = 1
    BAD_RANGE = 2
    BAD_REQUEST = 3


class ArtifactError(TransportError):
    """A fetch failed: the peer refused, the answer broke the protocol, or the link went."""


class Offered(Protocol):
    """A file a server offers: its sha256, size, manifest bytes and `read` of a range."""

    sha256: str
    size: int

    def manifest(self) -> bytes: ...

    def read(self, offset: int, length: int) -> bytes: ...


@dataclass
class _Pending:
    limit: int
    buffer: bytearray = field(default_factory=bytearray)
    answer: asyncio.Future[bytes] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


def encode_request(kind: Kind, sha256: str, offset: int = 0, length: int = 0) -> bytes:
    return REQUEST.pack(MAGIC, VERSION, int(kind), bytes.fromhex(sha256), offset, length)


class ArtifactChannel:
    """Serves offered files and fetches from peers on `swactor/artifact/1` (module doc)."""

    def __init__(self, endpoint: QuicEndpoint) -> None:
        self.endpoint = endpoint
        self.offers: dict[bytes, Offered] = {}
        self.served_bytes = 0
        self.served_requests = 0
        self.refused_requests = 0
        self.fetched_bytes = 0
        self._inbound: dict[tuple[QuicLink, int], bytearray] = {}
        self._pending: dict[tuple[QuicLink, int], _Pending] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        endpoint.register_handler(ARTIFACT_ALPN, self)

    def offer(self, item: Offered) -> None:
        """Serve `item` to pool peers that name its sha256."""
        self.offers[bytes.fromhex(item.sha256)] = item

    # -- client ---------------------------------------------------------------------

    async def fetch_manifest(self, peer: int, sha256: str, timeout: float = 60.0) -> bytes:
        return await self._request(peer, encode_request(Kind.MANIFEST, sha256), MAX_MANIFEST,
                                   exact=False, timeout=timeout, what=f"manifest of {sha256}")

    async def fetch_range(self, peer: int, sha256: str, offset: int, length: int,
                          timeout: float = 120.0) -> bytes:
        if not 0 < length <= MAX_RANGE or offset < 0:
            raise ArtifactError(f"range of {length} bytes at {offset}: outside 1..{MAX_RANGE}")
        return await self._request(peer, encode_request(Kind.RANGE, sha256, offset, length),
                                   length, exact=True, timeout=timeout,
                                   what=f"bytes [{offset}, {offset + length}) of {sha256}")

    async def _request(self, peer: int, request: bytes, limit: int, *, exact: bool,
                       timeout: float, what: str) -> bytes:
        try:
            link = await self.endpoint.connect(peer, ARTIFACT_ALPN)
            stream_id = link.open_bidi_stream()
        except (TransportError, OSError) as exc:
            raise ArtifactError(f"{what} from node {peer:#018x}: {exc}") from None
        key = (link, stream_id)
        pending = self._pending[key] = _Pending(limit)
        try:
            link.send(stream_id, request, end=True)
            answer = await asyncio.wait_for(pending.answer, timeout)
        except TimeoutError:
            link.reset_stream(stream_id)
            raise ArtifactError(
                f"{what} from node {peer:#018x}: no answer within {timeout} s") from None
        except (TransportError, OSError) as exc:
            raise ArtifactError(f"{what} from node {peer:#018x}: {exc}") from None
        finally:
            self._pending.pop(key, None)
        status, length = HEAD.unpack_from(answer)
        body = answer[HEAD.size:]
        if status != Status.OK:
            text = body[:MAX_REASON].decode("utf-8", "replace")
            name = Status(status).name if status in Status._value2member_map_ else str(status)
            raise ArtifactError(f"{what}: node {peer:#018x} answered {name}: {text}")
        if len(body) != length or (exact and length != limit):
            raise ArtifactError(f"{what}: node {peer:#018x} sent {len(body)} bytes "
                                f"(head says {length}, asked for {limit})")
        self.fetched_bytes += length
        return body

    # -- LinkHandler ----------------------------------------------------------------

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None:
        key = (link, stream_id)
        link.consume(stream_id, len(data))
        pending = self._pending.get(key)
        if pending is not None:
            self._answer_data(link, stream_id, pending, data, end)
            return
        we_are_client = link.expected_peer is not None
        if (stream_id & 1) == (0 if we_are_client else 1):
            return  # our own stream whose request already ended: drop the late answer
        buffer = self._inbound.setdefault(key, bytearray())
        buffer += data
        if len(buffer) > REQUEST.size:
            del self._inbound[key]
            self._refuse(link, stream_id, Status.BAD_REQUEST, "request too long")
        elif end:
            del self._inbound[key]
            task = asyncio.get_running_loop().create_task(
                self._serve(link, stream_id, bytes(buffer)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _answer_data(self, link: QuicLink, stream_id: int, pending: _Pending, data: bytes,
                     end: bool) -> None:
        if pending.answer.done():
            return
        pending.buffer += data
        if len(pending.buffer) >= HEAD.size:
            status, length = HEAD.unpack_from(pending.buffer)
            bound = MAX_REASON if status != Status.OK else pending.limit
            if length > bound or len(pending.buffer) > HEAD.size + length:
                pending.answer.set_exception(ArtifactError(
                    f"answer of {length} bytes exceeds what was asked ({bound})"))
                link.stop_stream(stream_id)
                return
        if end:
            if len(pending.buffer) < HEAD.size:
                pending.answer.set_exception(ArtifactError("answer ended before its head"))
            else:
                pending.answer.set_result(bytes(pending.buffer))

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        link.quic.settle_stream(stream_id)
        self._inbound.pop((link, stream_id), None)
        pending = self._pending.get((link, stream_id))
        if pending is not None and not pending.answer.done():
            pending.answer.set_exception(
                ConnectionLostError(f"peer reset the artifact stream, code {error_code:#x}"))

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        """The peer stopped reading: aioquic already reset our sending side."""

    def link_closed(self, link: QuicLink, reason: str) -> None:
        for key in [key for key in self._inbound if key[0] is link]:
            del self._inbound[key]
        for key, pending in list(self._pending.items()):
            if key[0] is link and not pending.answer.done():
                pending.answer.set_exception(
                    ConnectionLostError(f"artifact connection lost: {reason}"))

    # -- server ---------------------------------------------------------------------

    async def _serve(self, link: QuicLink, stream_id: int, request: bytes) -> None:
        if len(request) != REQUEST.size:
            self._refuse(link, stream_id, Status.BAD_REQUEST, "request of the wrong size")
            return
        magic, version, kind, digest, offset, length = REQUEST.unpack(request)
        if magic != MAGIC or version != VERSION or kind not in (Kind.MANIFEST, Kind.RANGE):
            self._refuse(link, stream_id, Status.BAD_REQUEST, "not an artifact request")
            return
        item = self.offers.get(digest)
        if item is None:
            self._refuse(link, stream_id, Status.UNKNOWN_FILE, "no such file offered here")
            return
        try:
            if kind == Kind.MANIFEST:
                if offset or length:
                    self._refuse(link, stream_id, Status.BAD_REQUEST,
                                 "a manifest request has no range")
                    return
                body = item.manifest()
            else:
                if not 0 < length <= MAX_RANGE or offset + length > item.size:
                    self._refuse(link, stream_id, Status.BAD_RANGE,
                                 f"range must be 1..{MAX_RANGE} bytes inside {item.size}")
                    return
                body = await asyncio.to_thread(item.read, offset, length)
                if faults.hit("artifact.range"):  # SWACTOR_FAULT_INJECT: a tampered range
                    middle = length // 2
                    body = body[:middle] + bytes([body[middle] ^ 0x01]) + body[middle + 1:]
        except OSError as exc:
            self._refuse(link, stream_id, Status.BAD_RANGE, f"read failed: {exc.strerror}")
            return
        if link.closed:
            return
        try:
            link.send(stream_id, HEAD.pack(Status.OK, len(body)) + body, end=True)
        except (ConnectionLostError, RuntimeError, ValueError):
            return  # the requester reset the stream or the link is gone
        self.served_requests += 1
        self.served_bytes += len(body)

    def _refuse(self, link: QuicLink, stream_id: int, status: Status, reason: str) -> None:
        self.refused_requests += 1
        if link.closed:
            return
        text = reason.encode()[:MAX_REASON]
        with contextlib.suppress(ConnectionLostError, RuntimeError, ValueError):
            link.send(stream_id, HEAD.pack(status, len(text)) + text, end=True)


class FileOffer:
    """A local file served by range (`pread`); `manifest` is computed by `model.fetch`."""

    def __init__(self, path: str | os.PathLike[str], sha256: str, manifest: bytes) -> None:
        self.path = os.fspath(path)
        self.sha256 = sha256
        self._manifest = manifest
        self._fd = os.open(self.path, os.O_RDONLY)
        self.size = os.fstat(self._fd).st_size

    def manifest(self) -> bytes:
        return self._manifest

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) != length:
            raise OSError(0, "file shorter than offered")
        return data

    def close(self) -> None:
        os.close(self._fd)
