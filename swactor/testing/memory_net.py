"""`MemoryNetwork`: the network replaced by in-memory peers, for in-process tests only.

Theory of operation. The in-process test layer runs the whole pipeline in one process
with the network replaced by in-memory peers (the one place a fake transport is
allowed). A `StageNode` and an orchestrator session build their transport through a
`swactor.transport.factory.Transport` factory; `MemoryNetwork` is one whose stand-ins have
the surface of the real QUIC endpoint, edge driver and control channel and talk through
this object:

- `MemoryEndpoint`: a node id, an allow-list, pinned keys and an address book like the
  real one (a peer is reached only if each side admits the other: its id allowed and,
  where pinned, its full public key equal to the pin);
  `start` registers the node (a made-up port), `close` unregisters it and tells every
  peer's control channel that the link closed (`on_lost`).
- `MemoryControl`: `request(peer, message)` round-trips the message through its JSON
  form (`to_json` / `from_json` against the registry), applies the receiver's
  `ControlAuthority` (a refusal raises `ControlRejectedError`, its RejectCode as
  `reason`), and awaits the receiver's handler; an unknown or not-admitted peer raises
  `ConnectionLostError`.
- `MemoryDriver`: per edge, the send side pumps bytes from its own egress ring (its
  arena) straight into the receiver's ingress ring for the same edge id (the receiver's
  arena), byte-blind, only as far as the ingress ring has room: the rings' own space is
  the only backpressure, as with QUIC flow control. Events and wake hints are those of
  the real driver (`DriverEdgeReady`, `PumpStopped`, `RingReadable`, `RingWritable`);
  a pump blocked on an empty or full ring waits for a hint or a short poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swactor.arena import Arena
from swactor.ring import Ring
from swactor.transport import ControlAuthority, ControlChannel
from swactor.transport.config import TransportConfig
from swactor.transport.control import ControlRejectedError, RejectCode, _Reject
from swactor.transport.errors import ConnectionLostError, ControlError
from swactor.transport.factory import Handler
from swactor.transport.identity import NodeIdentity, raw_public_key_from_certificate
from swactor.transport.messages import (
    DriverEdgeReady,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
)
from swactor.wire import EdgeId, RingId, RingReadable, RingWritable
from swactor.wire.codec import WireStruct

POLL_S = 0.02
CHUNK = 1 << 16


class MemoryEndpoint:
    def __init__(self, network: MemoryNetwork, identity: NodeIdentity,
                 allowed: Iterable[int], pinned: Mapping[int, bytes] | None = None) -> None:
        self.network = network
        self.node_id = identity.node_id
        self.public_key = raw_public_key_from_certificate(identity.certificate)
        self.allowed: set[int] = set(allowed)
        self.pinned: dict[int, bytes] = dict(pinned or {})
        self.address_book: dict[int, tuple[str, int]] = {}
        self.address: tuple[str, int] = ("memory", 0)
        self.control: MemoryControl | None = None
        self.driver: MemoryDriver | None = None

    async def start(self, host: str = "memory", port: int = 0) -> tuple[str, int]:
        self.address = (host, next(self.network.ports))
        self.network.endpoints[self.node_id] = self
        return self.address

    def set_allowed(self, allowed: Iterable[int]) -> list[int]:
        new = set(allowed)
        dropped = sorted(self.allowed - new)
        self.allowed = new
        for node_id in dropped:
            self.address_book.pop(node_id, None)
        return dropped

    def pin_keys(self, pinned: Mapping[int, bytes]) -> None:
        self.pinned = dict(pinned)

    def admits(self, peer: MemoryEndpoint) -> bool:
        """The real endpoint's handshake check: id allowed, full key equal to any pin."""
        return (peer.node_id in self.allowed
                and self.pinned.get(peer.node_id, peer.public_key) == peer.public_key)

    async def close(self) -> None:
        if self.network.endpoints.get(self.node_id) is self:
            del self.network.endpoints[self.node_id]
        for peer in list(self.network.endpoints.values()):
            if peer.control is not None and peer.control.on_lost is not None:
                peer.control.on_lost(self.node_id)


class MemoryControl:
    on_lost: Callable[[int], None] | None = None

    def __init__(self, endpoint: MemoryEndpoint, registry: Iterable[type[WireStruct]],
                 handler: Handler, authority: ControlAuthority) -> None:
        self.endpoint = endpoint
        self.registry = {tp.__name__: tp for tp in registry}
        self.handler = handler
        self.authority = authority
        endpoint.control = self

    async def request(self, peer_node_id: int, message: WireStruct, timeout: float = 10.0
                      ) -> WireStruct | None:
        name = type(message).__name__
        if name not in self.registry:
            raise ControlError(f"{name} is not a registered control message type")
        peer = self.endpoint.network.endpoints.get(peer_node_id)
        me = self.endpoint.node_id
        if peer is None or peer.control is None or not peer.admits(self.endpoint) \
                or not self.endpoint.admits(peer):
            raise ConnectionLostError(f"no link to node {peer_node_id:#018x}")
        control = peer.control
        received = control.registry[name].from_json(message.to_json())
        try:
            control.authority.check(me, received)
        except _Reject as refusal:  # the channel's own refusal: its code and words
            raise ControlRejectedError(refusal.reason, refusal.detail) from None
        except Exception as refusal:
            raise ControlRejectedError(RejectCode.BadMessage, str(refusal)) from None
        try:
            reply = await asyncio.wait_for(control.handler(me, received), timeout)
        except TimeoutError:
            raise
        except Exception as error:
            raise ControlRejectedError(RejectCode.HandlerFailed, str(error)) from None
        return reply


@dataclass
class _Edge:
    edge_id: int
    ring_id: int
    ring: Ring
    wake: asyncio.Event
    task: asyncio.Task[None] | None = None
    stopped: bool = False


class MemoryDriver:
    def __init__(self, endpoint: MemoryEndpoint, arena: Arena, emit: Callable[[object], None],
                 wake: Callable[[object], None]) -> None:
        self.endpoint = endpoint
        self.arena = arena
        self._emit = emit
        self._wake = wake
        self.recv: dict[int, _Edge] = {}
        self.send: dict[int, _Edge] = {}
        self._arrived: dict[int, asyncio.Event] = {}
        endpoint.driver = self

    def expect_recv(self, edges: Iterable[tuple[int, int]]) -> None:
        return None

    def handle(self, message: object) -> None:
        match message:
            case EstablishRecv():
                ring = Ring.open(self.arena, message.ring_layout)
                self.recv[message.edge_id] = _Edge(message.edge_id, message.ring_id, ring,
                                                   asyncio.Event())
                self._arrival(message.edge_id).set()
                self._emit(DriverEdgeReady(EdgeId(message.edge_id)))
            case EstablishSend():
                ring = Ring.open(self.arena, message.ring_layout)
                edge = _Edge(message.edge_id, message.ring_id, ring, asyncio.Event())
                self.send[message.edge_id] = edge
                edge.task = asyncio.get_running_loop().create_task(
                    self._pump(edge, message.rx_node_id))
                self._emit(DriverEdgeReady(EdgeId(message.edge_id)))
            case StopEdge():
                self.stop_edge(message.edge_id)

    def _arrival(self, edge_id: int) -> asyncio.Event:
        return self._arrived.setdefault(edge_id, asyncio.Event())

    def stop_edge(self, edge_id: int) -> None:
        edge = self.send.get(edge_id) or self.recv.get(edge_id)
        if edge is None or edge.stopped:
            if edge is None:
                self._emit(PumpStopped(edge_id, None))
            return
        edge.stopped = True
        if edge.task is not None:
            edge.task.cancel()
        edge.ring.close()
        self._emit(PumpStopped(edge_id, edge.ring_id))

    async def wait_stopped(self, edge_id: int) -> None:
        edge = self.send.get(edge_id)
        if edge is not None and edge.task is not None:
            await asyncio.gather(edge.task, return_exceptions=True)

    async def close(self) -> None:
        for edge_id in [*self.send, *self.recv]:
            self.stop_edge(edge_id)
        for edge_id in list(self.send):
            await self.wait_stopped(edge_id)

    def ring_readable(self, ring_id: int) -> None:
        for edge in self.send.values():
            if edge.ring_id == ring_id:
                edge.wake.set()

    def ring_writable(self, ring_id: int) -> None:
        for edge in self.recv.values():
            if edge.ring_id == ring_id:
                edge.wake.set()

    async def _pump(self, edge: _Edge, rx_node_id: int) -> None:
        """Egress ring (here) -> ingress ring (the receiver's), as far as it has room."""
        network = self.endpoint.network
        peer = network.endpoints.get(rx_node_id)
        if peer is None or peer.driver is None:
            return
        receiver = peer.driver
        await receiver._arrival(edge.edge_id).wait()
        target = receiver.recv[edge.edge_id]
        buffer = bytearray(CHUNK)
        pending = memoryview(b"")
        while not edge.stopped and not target.stopped:
            if not pending:
                edge.ring.clear_readable_pending()
                count, _ = edge.ring.read_into(buffer)
                if count:
                    pending = memoryview(bytes(buffer[:count]))
                    self._wake(RingWritable(RingId(edge.ring_id)))
            if pending:
                target.ring.clear_writable_pending()
                written, _ = target.ring.write_from(pending)
                if written:
                    pending = pending[written:]
                    receiver._wake(RingReadable(RingId(target.ring_id)))
                    continue
                waiter = target.wake
            else:
                waiter = edge.wake
            waiter.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), POLL_S)


class MemoryNetwork:
    """The in-memory stand-in for QUIC between the peers of one test (module doc)."""

    def __init__(self) -> None:
        self.endpoints: dict[int, MemoryEndpoint] = {}
        self.ports = itertools.count(1)

    def endpoint(self, identity: NodeIdentity, config: TransportConfig,
                 allowed: Iterable[int], pinned: Mapping[int, bytes] | None = None
                 ) -> MemoryEndpoint:
        return MemoryEndpoint(self, identity, allowed, pinned)

    def driver(self, endpoint: Any, arena: Arena, emit: Callable[[object], None],
               wake: Callable[[object], None]) -> MemoryDriver:
        assert isinstance(endpoint, MemoryEndpoint)
        return MemoryDriver(endpoint, arena, emit, wake)

    def control(self, endpoint: Any, registry: Iterable[type[WireStruct]], handler: Handler,
                authority: ControlAuthority, cls: type[ControlChannel] = ControlChannel
                ) -> MemoryControl:
        assert isinstance(endpoint, MemoryEndpoint)
        return MemoryControl(endpoint, registry, handler, authority)
