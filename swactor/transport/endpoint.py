"""One QUIC endpoint per node: a UDP socket, its connections, identity checks, keep-alives.

Theory of operation
-------------------
`QuicEndpoint` owns one non-blocking UDP socket (4 MiB kernel buffers) and every QUIC
connection of the node, in both directions: it accepts connections (server role) and
opens them (client role) from the same socket. When the event loop reports the socket
readable, the endpoint drains up to 64 datagrams, routes each by destination connection
id (an Initial packet with an unknown id creates a server-side `SwactorConnection`), and
only then lets each touched connection process its events and transmit once: one ACK and
one credit update per batch instead of per datagram (measured: 13x at 1452 bytes). A
receive of one datagram (a token object) transmits once the loop has run what that
datagram set off (`QuicLink.transmit_when_idle`): its ACK leaves after the token's work
and, when that work wrote to the same link, in the same datagram; on a link that answers
later (a stage node's, after its worker's step) the ACK waits for that answer, within a
bound the peer allows for (`SwactorConnection.hold_ack`).

Each connection is wrapped in a `QuicLink`, which does what aioquic's asyncio protocol
does (transmit, timer, event loop) plus identity: when the TLS handshake completes, the
link derives the peer's node id from its certificate and compares it with the expected id
(client side) or the endpoint's allow-list (server side). The 64-bit id alone is not
proof of a key: where the endpoint pins that id's full public key (`pinned`, node id ->
raw 32-byte Ed25519 key, from the pool file a node or orchestrator was started with), the
certificate's raw key must equal the pinned one, in both directions, or the peer is
refused ("presented a key that does not match its pinned key"); an id with no pin is
checked by id only (no pool file: only with `--open-pool`, or a caller that opened
the pool on purpose, `SessionOptions.open_pool`). A peer that fails is refused:
the connection is closed with `PEER_REJECTED_CODE` and a reason naming the rejected id,
the endpoint's `on_refused` callback receives a `PeerRefused` event, and no stream byte
of that connection ever reaches a handler (stream events are dispatched only once a link
is verified). There are no session tickets, so no 0-RTT data can precede the check.

Server-side admission. An Initial with an unknown connection id costs a server a key
share and a certificate signature, so no such connection is built for an unproven
source: an Initial without a token is answered with a Retry (`retry.py`, RFC 9000
§8.1) and builds nothing; one whose token this endpoint did not issue to that address
(or issued more than `handshake_timeout` ago) is dropped. Every Initial is validated,
not only under load: links are few and long-lived (cached, reused across runs), so the
extra round trip is paid once per link, and there is no load threshold for an attacker
to steer. A validated Initial is still refused while `max_half_open` links (or
`max_half_open_per_host` from its host) are in their handshake; a server link not
verified within `handshake_timeout` is closed and forgotten. `admission` counts each
outcome and `refused` keeps only the latest `REFUSALS_KEPT` identity refusals, so a
flood costs bounded memory and, per datagram, one header parse and one HMAC.

Verified links are cached by (peer node id, ALPN), whichever side opened them, the newest
winning (`admit`); a link counts as closed from the moment its connection starts closing
or draining (the peer's CONNECTION_CLOSE arrived), not three probe timeouts later when
aioquic reports it terminated, so the cache never hands out a link that carries nothing
(a past orchestrator session's, say). Every verified open link is pinged every
`keepalive_interval` so that a stalled edge (no bytes moving for longer than the idle
timeout while a consumer is slow) does not lose its connection. Stream events of a
verified link go to the `LinkHandler` registered for its ALPN (the driver for edges, the
control channel for control messages).

Outgoing datagrams go straight to the socket unless the endpoint was given an `outbound`
path (a port, `udp.OutboundPath`): then each batch passes through it first, one entry
per UDP datagram, and only what it returns is sent (tests model a lossy path with it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from aioquic.buffer import Buffer  # type: ignore[attr-defined]
from aioquic.quic import events
from aioquic.quic.packet import QuicHeader, QuicPacketType, encode_quic_retry, pull_quic_header

from swactor import heap
from swactor.transport import bulk
from swactor.transport.config import ALPNS, TransportConfig
from swactor.transport.errors import (
    ConnectionLostError,
    IdentityError,
    PeerRejectedError,
    TransportError,
)
from swactor.transport.flow import SwactorConnection
from swactor.transport.identity import (
    NodeIdentity,
    node_id_from_certificate,
    raw_public_key_from_certificate,
)
from swactor.transport.retry import RSCID_LENGTH, RetryTokenError, RetryTokens
from swactor.transport.udp import Datagram, DatagramRun, OutboundPath, UdpSocket

Address = tuple[str, int]
PEER_REJECTED_CODE = 0x5A01
STOPPED_CODE = 0x5A02  # a graceful stop: a receiver's or a send edge's teardown (no fault)
ABORTED_CODE = 0x5A03  # an abortive reset or STOP_SENDING: the peer counts a fault
_CID_LENGTH = 8
_MIN_INITIAL = 1200
_BATCH = 64  # datagrams per receive batch (one event pass, one ACK, one transmit)
IDLE_TURNS = 8
"""Event-loop turns a lone datagram's transmit waits at most for the loop to go idle
(`QuicLink.transmit_when_idle`): its ACK goes microseconds, not milliseconds, late."""


def _loop_busy(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether other callbacks are ready to run on `loop` (asyncio's private `_ready`
    queue of the selector loops; a loop without one counts as idle)."""
    return bool(getattr(loop, "_ready", None))
REFUSALS_KEPT = 256
"""How many of the latest `PeerRefused` records `QuicEndpoint.refused` keeps (the
counts of every kind of refusal are in `QuicEndpoint.admission`)."""


@dataclass(frozen=True, slots=True)
class PeerRefused:
    """A peer failed identity verification (`peer_node_id` None: it sent no certificate)."""

    peer_node_id: int | None
    reason: str
    inbound: bool


class LinkHandler(Protocol):
    """Receives the stream events of verified links of one ALPN."""

    def stream_data(self, link: QuicLink, stream_id: int, data: bytes, end: bool) -> None: ...

    def stream_reset(self, link: QuicLink, stream_id: int, error_code: int) -> None: ...

    def stream_stopped(self, link: QuicLink, stream_id: int, error_code: int) -> None:
        """The peer sent STOP_SENDING for a stream we send on (aioquic has already reset
        our sending side with the same code)."""
        ...

    def link_closed(self, link: QuicLink, reason: str) -> None: ...


class QuicLink:
    """One QUIC connection: transmit, timers, identity check, dispatch of stream events."""

    def __init__(
        self,
        endpoint: QuicEndpoint,
        quic: SwactorConnection,
        addr: Address,
        expected_peer: int | None,
    ) -> None:
        self.endpoint = endpoint
        self.quic = quic
        self.addr = addr
        self.expected_peer = expected_peer
        self.peer_node_id: int | None = None
        self.peer_public_key: bytes | None = None
        """The raw Ed25519 key the verified peer's certificate carries."""
        self.alpn: str | None = None
        self.closed = False
        self.close_reason = ""
        self.verified: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set whenever a datagram was processed (ACKs may have drained send buffers) or
        # the link closed; send-pumps waiting for buffer room wait on it.
        self.progress = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._transmit_handle: asyncio.Handle | None = None
        self._idle_handle: asyncio.Handle | None = None
        self._idle_turns = 0
        self.deadline: asyncio.TimerHandle | None = None
        """Server side: drops the link if its handshake is not verified in time."""

    # -- I/O ------------------------------------------------------------------------

    def receive(self, data: bytes, addr: Address) -> None:
        """Feed one datagram to aioquic (the endpoint calls `after_receive` per batch)."""
        self.quic.receive_datagram(data, addr, now=self._loop.time())

    def receive_bulk(
        self, buf: memoryview, msgs: object, count: int, addr: Address
    ) -> list[memoryview] | None:
        """Feed received messages through the native path (None: not taken)."""
        return self.quic.receive_bulk(buf, msgs, count, addr, now=self._loop.time())

    def after_receive(self, lone: bool = False) -> None:
        """After a receive batch: hand on its events, then transmit (its ACK). A `lone`
        datagram's transmit waits until the loop has nothing else ready
        (`transmit_when_idle`), and its ACK may wait longer for data to ride with
        (`SwactorConnection.hold_ack`); a batch's goes at once."""
        ended = self._process_events()
        if lone:
            self.quic.hold_ack(self._loop.time(), ended)
            self.transmit_when_idle()
        else:
            self.transmit()
        self.progress.set()

    def transmit_when_idle(self) -> None:
        """Transmit once the event loop has no other callback ready, or after
        `IDLE_TURNS` turns, whichever comes first; a transmit before then takes it over.

        What a lone datagram sets off (a recv pump ringing a worker's doorbell, an
        orchestrator reading a token and injecting the next) runs first, so the ACK
        leaves after the token's work, not ahead of it, and rides in the same datagram
        when that work writes to this link (`SwactorConnection._ack_due`)."""
        if self._transmit_handle is None and self._idle_handle is None:
            self._idle_turns = IDLE_TURNS
            self._idle_handle = self._loop.call_soon(self._idle_transmit)

    def _idle_transmit(self) -> None:
        self._idle_handle = None
        if self._transmit_handle is not None:
            return  # a transmit is already coming
        if self._idle_turns > 0 and _loop_busy(self._loop):
            self._idle_turns -= 1
            self._idle_handle = self._loop.call_soon(self._idle_transmit)
            return
        self.transmit()

    def transmit(self) -> None:
        """Send every datagram aioquic has ready and re-arm the timer."""
        self._transmit_handle = None
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        datagrams = self.quic.transmissions(now=self._loop.time())
        if datagrams:
            self.endpoint.send_datagrams(datagrams)
        timer_at = self.quic.get_timer()
        if self._timer is not None and self._timer_at != timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None and timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)
        self._timer_at = timer_at

    def transmit_soon(self) -> None:
        """Coalesce several writes or credit updates into one transmit."""
        if self._transmit_handle is None:
            self._transmit_handle = self._loop.call_soon(self.transmit)

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = None

    def _handle_timer(self) -> None:
        now = max(self._timer_at or 0.0, self._loop.time())
        self._timer = None
        self._timer_at = None
        self.quic.handle_timer(now=now)
        self._process_events()
        self.transmit()

    # -- stream helpers used by pumps and the control channel -----------------------

    def open_uni_stream(self) -> int:
        self._require_open()
        stream_id: int = self.quic.get_next_available_stream_id(is_unidirectional=True)
        return stream_id

    def open_bidi_stream(self) -> int:
        self._require_open()
        stream_id: int = self.quic.get_next_available_stream_id(is_unidirectional=False)
        return stream_id

    def send(self, stream_id: int, data: bytes | memoryview, end: bool = False) -> None:
        self._require_open()
        # aioquic appends `data` to a bytearray, so any buffer works (typed as bytes).
        self.quic.send_stream_data(stream_id, cast(bytes, data), end_stream=end)
        self.transmit_soon()

    def consume(self, stream_id: int, nbytes: int) -> None:
        """Credit the peer for `nbytes` taken from `stream_id`; when a credit update is
        due, transmit promptly (an idle connection would otherwise never send it)."""
        if self.quic.consume(stream_id, nbytes) and not self.closed:
            self.transmit_soon()

    def stop_stream(self, stream_id: int, error_code: int = ABORTED_CODE) -> None:
        if self.closed:
            return
        try:
            self.quic.stop_stream(stream_id, error_code)
        except ValueError:
            return
        self.transmit_soon()

    def reset_stream(self, stream_id: int, error_code: int = ABORTED_CODE) -> None:
        if self.closed:
            return
        try:
            self.quic.reset_stream(stream_id, error_code)
        except ValueError:
            return
        self.transmit_soon()

    def ping(self) -> None:
        if not self.closed:
            self.quic.send_ping(0)
            self.transmit()

    def close(self, reason: str, error_code: int = 0) -> None:
        """Close the connection (application close) and notify the handler once."""
        if not self.closed:
            self.quic.close(error_code=error_code, reason_phrase=reason[:200])
            self.transmit()
            self._mark_closed(reason)

    def _require_open(self) -> None:
        if self.closed:
            raise ConnectionLostError(f"connection to {self.addr} closed: {self.close_reason}")

    # -- events ---------------------------------------------------------------------

    def _process_events(self) -> bool:
        """Hand aioquic's events on; True if a stream ended or was reset among them."""
        quic = self.quic
        ended = False
        event = quic.next_event()
        while event is not None:
            if isinstance(event, events.StreamDataReceived):
                ended = ended or event.end_stream
                if self.peer_node_id is not None and not self.closed:
                    handler = self.endpoint.handler_for(self.alpn)
                    if handler is not None:
                        handler.stream_data(self, event.stream_id, event.data, event.end_stream)
            elif isinstance(event, events.StreamReset):
                ended = True
                if self.peer_node_id is not None and not self.closed:
                    handler = self.endpoint.handler_for(self.alpn)
                    if handler is not None:
                        handler.stream_reset(self, event.stream_id, event.error_code)
            elif isinstance(event, events.StopSendingReceived):
                if self.peer_node_id is not None and not self.closed:
                    handler = self.endpoint.handler_for(self.alpn)
                    if handler is not None:
                        handler.stream_stopped(self, event.stream_id, event.error_code)
            elif isinstance(event, events.ConnectionIdIssued):
                self.endpoint.route(event.connection_id, self)
            elif isinstance(event, events.ConnectionIdRetired):
                self.endpoint.unroute(event.connection_id)
            elif isinstance(event, events.HandshakeCompleted):
                self._verify_peer(event.alpn_protocol)
            elif isinstance(event, events.ConnectionTerminated):
                reason = event.reason_phrase or f"error code {event.error_code:#x}"
                self._mark_closed(reason)
                self.endpoint.forget(self)
            event = quic.next_event()
        if not self.closed:
            closing = quic.closing_reason()
            if closing is not None:  # closed now, not when aioquic's draining period ends
                self._mark_closed(closing)
        return ended

    def _verify_peer(self, alpn: str | None) -> None:
        inbound = self.expected_peer is None
        cert = self.quic.peer_certificate()
        if cert is None:
            self._refuse(None, "peer presented no certificate", inbound)
            return
        try:
            node_id = node_id_from_certificate(cert)
            raw_key = raw_public_key_from_certificate(cert)
        except IdentityError as exc:
            self._refuse(None, str(exc), inbound)
            return
        pinned = self.endpoint.pinned.get(node_id)
        if alpn not in ALPNS:
            self._refuse(node_id, f"unsupported ALPN {alpn!r}", inbound)
        elif inbound and not self.endpoint.is_allowed(node_id):
            self._refuse(node_id, f"node {node_id:#018x} is not in the allow-list", inbound)
        elif not inbound and node_id != self.expected_peer:
            self._refuse(
                node_id,
                f"server is node {node_id:#018x}, expected {self.expected_peer:#018x}",
                inbound,
            )
        elif pinned is not None and raw_key != pinned:
            self._refuse(
                node_id,
                f"node {node_id:#018x} presented a key that does not match its pinned key",
                inbound,
            )
        else:
            self.peer_node_id = node_id
            self.peer_public_key = raw_key
            self.alpn = alpn
            self.endpoint.handshake_over(self)
            self.endpoint.admit(self)
            if not self.verified.done():
                self.verified.set_result(None)

    def _refuse(self, node_id: int | None, reason: str, inbound: bool) -> None:
        self.endpoint.report_refused(PeerRefused(node_id, reason, inbound))
        if not self.verified.done():
            self.verified.set_exception(PeerRejectedError(node_id, reason))
            if self.expected_peer is None:
                self.verified.exception()  # inbound: nobody awaits it
        self.close(f"peer rejected: {reason}", PEER_REJECTED_CODE)

    def _mark_closed(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.endpoint.handshake_over(self)
        self.close_reason = reason
        self.progress.set()
        if not self.verified.done():
            self.verified.set_exception(ConnectionLostError(f"handshake failed: {reason}"))
            # Nobody may await it (inbound link); mark the exception retrieved.
            self.verified.exception()
        if self.peer_node_id is not None:
            handler = self.endpoint.handler_for(self.alpn)
            if handler is not None:
                handler.link_closed(self, reason)


class QuicEndpoint:
    """The node's single QUIC endpoint (see the module docstring)."""

    def __init__(
        self,
        identity: NodeIdentity,
        config: TransportConfig,
        allowed: Iterable[int] = (),
        on_refused: Callable[[PeerRefused], None] | None = None,
        pinned: Mapping[int, bytes] | None = None,
        outbound: OutboundPath | None = None,
    ) -> None:
        self.identity = identity
        self._outbound = outbound
        self.config = config
        self.allowed: set[int] = set(allowed)
        self.pinned: dict[int, bytes] = {}
        """Node id -> the raw 32-byte public key that id must present (module doc)."""
        self.address_book: dict[int, Address] = {}
        self.refused: deque[PeerRefused] = deque(maxlen=REFUSALS_KEPT)
        """The latest identity refusals (`REFUSALS_KEPT`)."""
        self.admission: Counter[str] = Counter()
        """Counts of what happened to unknown Initials and handshakes: `retry_sent`,
        `bad_token`, `half_open_full`, `host_full`, `accepted`, `handshake_expired`,
        `peer_refused`."""
        self._half_open: dict[QuicLink, str] = {}
        self._half_open_hosts: Counter[str] = Counter()
        self._retry = RetryTokens(lifetime=config.handshake_timeout)
        self._on_refused = on_refused
        self._handlers: dict[str, LinkHandler] = {}
        self._routes: dict[bytes, QuicLink] = {}
        self._cache: dict[tuple[int, str], QuicLink] = {}
        # (peer, alpn) -> the address being dialled and the handshake's outcome.
        self._connecting: dict[tuple[int, str], tuple[Address, asyncio.Future[QuicLink]]] = {}
        self._links: set[QuicLink] = set()
        self.pin_keys(pinned or {})
        self._sock: UdpSocket | None = None
        self._server_config = config.quic_configuration(identity, is_client=False)
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> int:
        return self.identity.node_id

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Address:
        """Bind the UDP socket and start keep-alives; returns the bound address."""
        heap.keep_free_pages()  # the packet path's buffers stay resident (heap.py)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, self.config.socket_buffer)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise TransportError(f"cannot bind UDP {host}:{port}: {exc.strerror}") from exc
        self._sock = UdpSocket(sock, offload=self.config.udp_offload)
        loop.add_reader(sock.fileno(), self._read_ready)
        self._keepalive = asyncio.create_task(self._keepalive_loop())
        return self.address

    @property
    def address(self) -> Address:
        """The bound (host, port)."""
        if self._sock is None:
            raise TransportError("endpoint is not started")
        host, port = self._sock.sock.getsockname()[:2]
        return (str(host), int(port))

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        for link in list(self._links):
            link.close("endpoint closing")
        await asyncio.sleep(0)
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def register_handler(self, alpn: str, handler: LinkHandler) -> None:
        self._handlers[alpn] = handler

    def handler_for(self, alpn: str | None) -> LinkHandler | None:
        return self._handlers.get(alpn) if alpn is not None else None

    def is_allowed(self, node_id: int) -> bool:
        return node_id in self.allowed

    def set_allowed(self, allowed: Iterable[int]) -> list[int]:
        """Replace the allow-list: a peer no longer on it loses its address and every
        verified link (closed with `PEER_REJECTED_CODE`), and is refused if it comes
        back. Returns the ids dropped."""
        new = set(allowed)
        dropped = sorted(self.allowed - new)
        self.allowed = new
        for node_id in dropped:
            self.address_book.pop(node_id, None)
        for link in list(self._links):
            peer = link.peer_node_id
            if peer is not None and peer not in new and not link.closed:
                link.close(f"node {peer:#018x} left the allow-list", PEER_REJECTED_CODE)
        return dropped

    def pin_keys(self, pinned: Mapping[int, bytes]) -> None:
        """Replace the pinned keys (node id -> raw 32-byte Ed25519 public key): every later
        handshake with a pinned id must present that key; a verified link whose key does
        not match its new pin is closed with `PEER_REJECTED_CODE`."""
        new: dict[int, bytes] = {}
        for node_id, key in pinned.items():
            if len(key) != 32:
                raise ValueError(f"pinned key of node {node_id:#018x} is {len(key)} bytes, "
                                 "not a raw 32-byte Ed25519 key")
            new[int(node_id)] = bytes(key)
        self.pinned = new
        for link in list(self._links):
            peer = link.peer_node_id
            if peer is None or link.closed:
                continue
            pin = new.get(peer)
            if pin is not None and link.peer_public_key != pin:
                link.close(f"node {peer:#018x} no longer matches its pinned key",
                           PEER_REJECTED_CODE)

    def report_refused(self, refusal: PeerRefused) -> None:
        self.admission["peer_refused"] += 1
        self.refused.append(refusal)
        if self._on_refused is not None:
            self._on_refused(refusal)

    # -- outbound -------------------------------------------------------------------

    async def connect(self, peer_node_id: int, alpn: str, addr: Address | None = None) -> QuicLink:
        """A verified link to `peer_node_id` on `alpn`, from the cache or newly opened.

        A caller joins a handshake already under way to the same peer only when it is
        aimed at the address known now: a peer that restarted on another port (a new
        orchestrator session with the same key) is dialled afresh instead of waiting for
        the dead address's handshake to time out."""
        key = (peer_node_id, alpn)
        cached = self._cache.get(key)
        if cached is not None and not cached.closed:
            return cached
        target = addr or self.address_book.get(peer_node_id)
        if target is None:
            pending = self._connecting.get(key)
            if pending is not None:  # dialled at an address given by its first caller
                return await asyncio.shield(pending[1])
            raise TransportError(f"no address known for node {peer_node_id:#018x}")
        target = await self.resolve(target)
        pending = self._connecting.get(key)
        if pending is not None and pending[0] == target:
            return await asyncio.shield(pending[1])
        future: asyncio.Future[QuicLink] = asyncio.get_running_loop().create_future()
        self._connecting[key] = (target, future)
        try:
            link = await self._open(peer_node_id, alpn, target)
            future.set_result(link)
            return link
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            if self._connecting.get(key, (None, None))[1] is future:
                del self._connecting[key]

    async def resolve(self, addr: Address) -> Address:
        """`addr` with its host as an IPv4 address (the socket is IPv4): a host name is
        resolved once here, so that the send path and path validation only ever see
        numeric addresses; `TransportError` names an address that cannot be used."""
        host, port = addr
        if not isinstance(port, int) or not 0 < port < 65536:
            raise TransportError(f"peer address {host}:{port}: bad port")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if isinstance(ip, ipaddress.IPv4Address):
            return (str(ip), port)
        if ip is not None:
            raise TransportError(f"peer address {host}:{port}: the endpoint is IPv4 only")
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
            )
        except (OSError, UnicodeError) as exc:
            raise TransportError(
                f"peer address {host}:{port} does not resolve to IPv4: {exc}"
            ) from None
        if not found:
            raise TransportError(f"peer address {host}:{port} does not resolve to IPv4")
        return (str(found[0][4][0]), port)

    async def _open(self, peer_node_id: int, alpn: str, addr: Address) -> QuicLink:
        config = self.config.quic_configuration(self.identity, is_client=True)
        config.alpn_protocols = [alpn]
        config.server_name = f"swactor-{peer_node_id:016x}"
        quic = SwactorConnection(
            configuration=config,
            stream_window=self.config.stream_window,
            connection_window=self.config.connection_window,
            pacing=self.config.pacing,
            native_path=self.config.native_path,
            key_update_packets=self.config.key_update_packets,
            ack_hold=self.config.ack_hold,
        )
        link = QuicLink(self, quic, addr, expected_peer=peer_node_id)
        self._links.add(link)
        self.route(quic.host_cid, link)
        quic.connect(addr, now=asyncio.get_running_loop().time())
        link.transmit()
        try:
            await asyncio.wait_for(asyncio.shield(link.verified), self.config.handshake_timeout)
        except TimeoutError:
            link.close("handshake timed out")
            raise ConnectionLostError(
                f"handshake with node {peer_node_id:#018x} at {addr} timed out"
            ) from None
        return link

    # -- routing and cache ------------------------------------------------------------

    def route(self, cid: bytes, link: QuicLink) -> None:
        self._routes[cid] = link

    def unroute(self, cid: bytes) -> None:
        self._routes.pop(cid, None)

    def admit(self, link: QuicLink) -> None:
        """Cache a newly verified link: the newest one to a peer on an ALPN wins.

        A peer that opens a new link has a reason to (an orchestrator's next session
        comes from a new endpoint with the same identity): its previous link may still
        look open here, and close a moment later, so a request sent on it would be lost.
        An older link stays usable for the streams it carries and is still pinged."""
        assert link.peer_node_id is not None and link.alpn is not None
        self._cache[(link.peer_node_id, link.alpn)] = link

    def forget(self, link: QuicLink) -> None:
        self.handshake_over(link)
        self._links.discard(link)
        for cid in [cid for cid, routed in self._routes.items() if routed is link]:
            del self._routes[cid]
        for key in [key for key, cached in self._cache.items() if cached is link]:
            del self._cache[key]

    def cached(self, peer_node_id: int, alpn: str) -> QuicLink | None:
        return self._cache.get((peer_node_id, alpn))

    def shared_link(self, current: QuicLink) -> QuicLink:
        """The link both ends of `current` pick to carry a new stream: among the open,
        verified links between the same two endpoints on the same ALPN, one dialled by
        the end with the smaller node id, if any; else `current`.

        Two nodes that dial each other at once (a 1-stage run: the orchestrator's
        token-in edge to the node, the node's token-out edge back) get two links; a
        stream on each means one link per direction, each with ACK-only datagrams.
        With both streams on one link, each direction's data carries the ACK of the
        other's (`QuicLink.transmit_when_idle`). A send edge asks this when it opens its
        stream, by which time both links of such a pair exist."""
        peer, alpn = current.peer_node_id, current.alpn
        if peer is None or alpn is None:
            return current
        dialler = min(self.node_id, peer)
        chosen = current
        for link in self._links:
            if (link.peer_node_id == peer and link.alpn == alpn and link.addr == current.addr
                    and not link.closed
                    and (self.node_id if link.quic._is_client else peer) == dialler):
                if link is current or link is self._cache.get((peer, alpn)):
                    return link
                chosen = link
        return chosen

    def send_datagrams(self, datagrams: Sequence[Datagram]) -> None:
        """Send datagrams in order (GSO batches where possible); a full buffer or an
        unreachable peer loses them, which QUIC recovers. An `outbound` path sees them
        first, one entry per UDP datagram (runs cut apart), and passes on what it keeps."""
        if self._sock is None:
            return
        if self._outbound is not None:
            single: list[Datagram] = []
            for data, addr in datagrams:
                if type(data) is DatagramRun:
                    single.extend((view, addr) for view in data.datagrams())
                else:
                    single.append((data, addr))
            datagrams = self._outbound(single)
        self._sock.send(datagrams)

    def sendto(self, data: bytes, addr: Address) -> None:
        self.send_datagrams([(data, addr)])

    # -- inbound --------------------------------------------------------------------

    def _read_ready(self) -> None:
        """Drain up to `_BATCH` datagrams (GRO may bring many per system call), then let
        each touched link react once: one event pass and one transmit (with one ACK, see
        `flow.py`) per batch instead of per datagram.

        With GRO and the native helper, one `recvmmsg` brings up to 16 GRO buffers;
        consecutive ones from one source are offered together to each link in its
        steady state whose 1-RTT packets they hold, one link after another
        (`_receive_natively`, `SwactorConnection.receive_bulk`: opened in C). Whatever
        no link takes, and everything else, is routed here one datagram at a time."""
        sock = self._sock
        if sock is None:
            return
        touched: dict[QuicLink, None] = {}
        received = 0
        while received < _BATCH:
            batch = sock.receive_messages()
            if batch is None:
                if not self._read_plain(sock, touched):
                    break
                received += 1
                continue
            buf, msgs, count = batch
            i = 0
            while i < count:
                first = msgs[i]
                addr = sock.source(first)
                j = i + 1
                while j < count and sock.source(msgs[j]) == addr:
                    j += 1
                link = None
                at = first.at
                if first.len > _CID_LENGTH and not buf[at] & 0x80:
                    link = self._routes.get(bytes(buf[at + 1 : at + 1 + _CID_LENGTH]))
                group = self._receive_natively(link, buf, msgs + i, j - i, addr, touched)
                for datagram in group:
                    routed = self._route(bytes(datagram), addr)
                    if routed is not None:
                        touched[routed] = None
                i = j
            # datagrams in this receive (an empty UDP datagram counts as one, and none of
            # the step computations below may be 0)
            received += sum(-(-msgs[m].len // (msgs[m].seg or msgs[m].len or 1)) or 1
                            for m in range(count))
        lone = received <= 1
        for link in touched:
            link.after_receive(lone)

    def _receive_natively(
        self, link: QuicLink | None, buf: memoryview, msgs: object, count: int,
        addr: Address, touched: dict[QuicLink, None],
    ) -> Sequence[memoryview]:
        """Let each link with short-header packets among these `count` messages from one
        source take its own through the native path, one link after another, starting
        with `link` (the first datagram's, if it is a short-header packet of a known
        connection); returns the datagrams no link took, in arrival order, for `_route`.

        Two links to one peer (an edge each way, each dialled by its sender) share the
        peer's address, so one receive holds both interleaved: one link's data and the
        other's ACKs. The first datagram's link is offered the messages as received (in
        the steady state of one edge it takes everything); each further link is offered
        what is left, as records over the same buffer (no copy). A link never gets a
        second turn, so the loop ends after at most one call per link in the receive."""
        tried: set[QuicLink] = set()
        rest: Sequence[memoryview] | None = None
        if link is not None:
            tried.add(link)
            rest = link.receive_bulk(buf, msgs, count, addr)
            if rest is not None:
                touched[link] = None
        if rest is None:
            rest = bulk.datagram_views(buf, msgs, count, (0, 0), -1)
        while rest:
            other = self._next_bulk_link(rest, tried)
            if other is None:
                break
            tried.add(other)
            taken = other.receive_bulk(buf, bulk.message_records(buf, rest), len(rest), addr)
            if taken is not None:
                touched[other] = None
                rest = taken
        return rest

    def _next_bulk_link(
        self, datagrams: Sequence[memoryview], tried: set[QuicLink]
    ) -> QuicLink | None:
        """The link of the first short-header datagram whose link has not had its turn."""
        for datagram in datagrams:
            if len(datagram) > _CID_LENGTH and not datagram[0] & 0x80:
                link = self._routes.get(bytes(datagram[1 : 1 + _CID_LENGTH]))
                if link is not None and link not in tried:
                    return link
        return None

    def _read_plain(self, sock: UdpSocket, touched: dict[QuicLink, None]) -> bool:
        """One plain receive call (no native batch); False when nothing was waiting."""
        got = sock.receive()
        if got is None:
            return False
        datagrams, addr = got
        for data in datagrams:
            link = self._route(data, addr)
            if link is not None:
                touched[link] = None
        return True

    def _route(self, data: bytes, addr: Address) -> QuicLink | None:
        if data and not data[0] & 0x80:
            # Short header (the data path): the destination id follows the first byte.
            known = self._routes.get(data[1 : 1 + _CID_LENGTH])
            if known is not None:
                known.receive(data, addr)
                return known
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=_CID_LENGTH)
        except ValueError:
            return None
        link = self._routes.get(header.destination_cid)
        if link is None:
            if header.packet_type != QuicPacketType.INITIAL or len(data) < _MIN_INITIAL:
                return None
            if header.version not in self._server_config.supported_versions:
                return None
            link = self._accept(header, addr)
            if link is None:
                return None
        link.receive(data, addr)
        return link

    # -- server-side admission (module docstring) --------------------------------------

    def _accept(self, header: QuicHeader, addr: Address) -> QuicLink | None:
        """A new server link for an Initial with an unknown connection id, or None: a
        Retry was sent instead, or the token or a half-open cap refused it."""
        loop = asyncio.get_running_loop()
        if not header.token:
            self._send_retry(header, addr, loop.time())
            return None
        try:
            proof = self._retry.check(addr, header.token, loop.time())
        except RetryTokenError:
            self.admission["bad_token"] += 1
            return None
        if proof.retry_source_cid != header.destination_cid:
            self.admission["bad_token"] += 1
            return None
        host = addr[0]
        if len(self._half_open) >= self.config.max_half_open:
            self.admission["half_open_full"] += 1
            return None
        if self._half_open_hosts[host] >= self.config.max_half_open_per_host:
            self.admission["host_full"] += 1
            return None
        quic = SwactorConnection(
            configuration=self._server_config,
            original_destination_connection_id=proof.original_destination_cid,
            retry_source_connection_id=proof.retry_source_cid,
            stream_window=self.config.stream_window,
            connection_window=self.config.connection_window,
            pacing=self.config.pacing,
            native_path=self.config.native_path,
            key_update_packets=self.config.key_update_packets,
            ack_hold=self.config.ack_hold,
        )
        link = QuicLink(self, quic, addr, expected_peer=None)
        self._links.add(link)
        self._half_open[link] = host
        self._half_open_hosts[host] += 1
        link.deadline = loop.call_later(
            self.config.handshake_timeout, self._handshake_expired, link
        )
        self.admission["accepted"] += 1
        self.route(header.destination_cid, link)
        self.route(quic.host_cid, link)
        return link

    def _send_retry(self, header: QuicHeader, addr: Address, now: float) -> None:
        if header.version is None or not 8 <= len(header.destination_cid) <= 20:
            return  # RFC 9000 §7.2: a client's first destination id has 8..20 bytes
        retry_cid = os.urandom(RSCID_LENGTH)
        token = self._retry.issue(addr, header.destination_cid, retry_cid, now)
        packet = encode_quic_retry(
            version=header.version,
            source_cid=retry_cid,
            destination_cid=header.source_cid,
            original_destination_cid=header.destination_cid,
            retry_token=token,
        )
        self.admission["retry_sent"] += 1
        self.sendto(packet, addr)

    def _handshake_expired(self, link: QuicLink) -> None:
        link.deadline = None
        if link in self._half_open:
            self.admission["handshake_expired"] += 1
            link.close("handshake timed out")
            link.cancel_timer()
            self.forget(link)

    def handshake_over(self, link: QuicLink) -> None:
        """`link` left its handshake (verified, refused or closed): free its slot."""
        host = self._half_open.pop(link, None)
        if host is not None:
            self._half_open_hosts[host] -= 1
            if self._half_open_hosts[host] <= 0:
                del self._half_open_hosts[host]
        if link.deadline is not None:
            link.deadline.cancel()
            link.deadline = None

    def status(self) -> dict[str, object]:
        """Connection counts for a leak check: `links`, every connection the endpoint
        still tracks; `closing`, those of them already closed (no stream moves) whose
        closing or draining period has not ended yet, so they are forgotten within three
        probe timeouts; `half_open`, server-side handshakes; `verified`, cached verified
        links; `peers`, how many open verified links go to each peer (16 hex digits);
        and the admission counters.

        A peer's session that ended a moment ago may still show here as open (its
        CONNECTION_CLOSE not read yet) or closing: a leak check waits for it to go."""
        peers: Counter[str] = Counter()
        for link in self._links:
            if link.peer_node_id is not None and not link.closed:
                peers[f"{link.peer_node_id:016x}"] += 1
        return {
            "links": len(self._links),
            "closing": sum(1 for link in self._links if link.closed),
            "half_open": len(self._half_open),
            "verified": len(self._cache),
            "peers": dict(sorted(peers.items())),
            "admission": dict(self.admission),
        }

    @property
    def half_open(self) -> int:
        """Server-side links in their handshake now."""
        return len(self._half_open)

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.keepalive_interval)
            for link in list(self._links):
                if link.peer_node_id is not None and not link.closed:
                    link.ping()

