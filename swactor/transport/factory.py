"""How a node or an orchestrator builds its transport: endpoint, edge driver, control.

Theory of operation. `StageNode` and the orchestrator session never construct the QUIC
pieces directly: they ask a `Transport` factory. `QuicTransport` (the default) builds the
real `QuicEndpoint`, edge `Driver` and `ControlChannel` (or a subclass of it the node
asks for). The in-process test layer passes `swactor.testing.memory_net.MemoryNetwork`
instead, whose stand-ins have the same surface.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from swactor.arena import Arena
from swactor.faults import NO_FAULTS, Faults
from swactor.transport import ControlAuthority, ControlChannel, Driver, QuicEndpoint
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire.codec import WireStruct

Handler = Callable[[int, WireStruct], Awaitable[WireStruct | None]]


class Transport(Protocol):
    """How a node or an orchestrator builds its endpoint, edge driver and control channel."""

    def endpoint(self, identity: NodeIdentity, config: TransportConfig,
                 allowed: Iterable[int], pinned: Mapping[int, bytes] | None = None
                 ) -> Any:
        """The endpoint; `pinned` (node id -> raw public key) are the full keys those
        ids must present (`QuicEndpoint.pinned`; None: ids only)."""
        ...

    def driver(self, endpoint: Any, arena: Arena, emit: Callable[[object], None],
               wake: Callable[[object], None]) -> Any: ...

    def control(self, endpoint: Any, registry: Iterable[type[WireStruct]], handler: Handler,
                authority: ControlAuthority, cls: type[ControlChannel] = ControlChannel
                ) -> Any: ...


class QuicTransport:
    """The real transport: aioquic endpoint, edge `Driver`, `ControlChannel`; its drivers'
    send pumps consult `faults` (`swactor.faults`; default: none)."""

    def __init__(self, faults: Faults = NO_FAULTS) -> None:
        self.faults = faults

    def endpoint(self, identity: NodeIdentity, config: TransportConfig,
                 allowed: Iterable[int], pinned: Mapping[int, bytes] | None = None
                 ) -> QuicEndpoint:
        return QuicEndpoint(identity, config, allowed=allowed, pinned=pinned)

    def driver(self, endpoint: Any, arena: Arena, emit: Callable[[object], None],
               wake: Callable[[object], None]) -> Driver:
        return Driver(endpoint, arena, emit=emit, wake=wake, faults=self.faults)

    def control(self, endpoint: Any, registry: Iterable[type[WireStruct]], handler: Handler,
                authority: ControlAuthority, cls: type[ControlChannel] = ControlChannel
                ) -> ControlChannel:
        return cls(endpoint, registry, handler, authority)
