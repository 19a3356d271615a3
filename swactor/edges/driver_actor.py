"""`DriverActor`: the node's edge `Driver` (spec §24) behind a mailbox.

Theory of operation
-------------------
`swactor.transport.Driver` is callback-driven: methods in, `emit` / `wake` callbacks
out, all on the event loop. Node actors talk to it by mail through this actor:

- `EstablishSend`, `EstablishRecv`, `StopEdge` (transport messages) -> `driver.handle`;
  an establish the driver refuses (edge already established) is reported as
  `StreamFault(edge_id, PumpFailed)` plus `PumpStopped(edge_id, None)`, so the
  requester's machine ends instead of waiting;
- `ExpectRecv(edges)` -> `driver.expect_recv`: streams for these edges, from their
  producers, are held (not refused) until their EstablishRecv comes;
- the worker's wake hints (`wire.RingReadable` / `wire.RingWritable`, routed here by
  GpuWorkerCtl) and the local token endpoint's -> `driver.ring_readable` /
  `ring_writable`; a worker `RingFault` needs nothing here (the ring's shared state
  word already wakes the pump with RingFaulted);
- `RouteDriverEvents(ref)` -> where the driver's events go from now on (the
  EdgeEstablisher subscribes when it starts; events emitted before are kept and
  delivered on subscription).

Driver events (`DriverEdgeReady`, `StreamClosed`, `StreamFault`, `PumpStopped`) go to
the subscriber; wake hints for the far end of a ring go to the `wake` callback given at
construction (a `WakeFanout` over the ring installers). The driver is the real QUIC
`Driver` unless a `make_driver(endpoint, arena, emit, wake)` factory is given (a node's
`Transport.driver`, e.g. the in-process test layer's `MemoryNetwork`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from swactor.actors import Actor, ActorRef, Context
from swactor.ring.ring import ArenaLike
from swactor.transport.driver import Driver
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.errors import TransportError
from swactor.transport.messages import (
    DriverEvent,
    EstablishRecv,
    EstablishSend,
    PumpStopped,
    StopEdge,
    StreamFault,
    WakeHint,
)
from swactor.wire import EdgeId, RingFault, RingReadable, RingWritable, StreamFaultReason

log = logging.getLogger("swactor.edges.driver")


@dataclass(frozen=True, slots=True)
class ExpectRecv:
    """The active plan's inbound edges as (edge id, producer node id): their streams,
    from those nodes only, wait for EstablishRecv."""

    edges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class RouteDriverEvents:
    """Send the driver's events to `target` from now on."""

    target: ActorRef[Any]


DriverMail = (
    EstablishSend | EstablishRecv | StopEdge | ExpectRecv | RouteDriverEvents
    | RingReadable | RingWritable | RingFault
)


class DriverActor(Actor[DriverMail]):
    """Owns the node's `Driver` (module docstring)."""

    def __init__(
        self, endpoint: QuicEndpoint, arena: ArenaLike, wake: Callable[[WakeHint], None],
        make_driver: Callable[[Any, Any, Callable[[Any], None], Callable[[Any], None]], Any]
        | None = None,
    ) -> None:
        self._target: ActorRef[Any] | None = None
        self._early: list[DriverEvent] = []
        self.driver: Any = (Driver(endpoint, arena, emit=self._emit, wake=wake)
                            if make_driver is None
                            else make_driver(endpoint, arena, self._emit, wake))

    def _emit(self, event: DriverEvent) -> None:
        if self._target is None:
            self._early.append(event)
        else:
            self._target.tell(event)

    def expect(self, edges: Iterable[tuple[int, int]]) -> None:
        self.driver.expect_recv(edges)

    async def receive(self, ctx: Context[DriverMail], message: DriverMail) -> None:
        match message:
            case EstablishSend() | EstablishRecv() | StopEdge():
                try:
                    self.driver.handle(message)
                except TransportError as exc:
                    log.warning("driver refused %s: %s", type(message).__name__, exc)
                    self._emit(StreamFault(EdgeId(message.edge_id),
                                           StreamFaultReason.PumpFailed))
                    self._emit(PumpStopped(message.edge_id, None))
            case ExpectRecv(edges):
                self.driver.expect_recv(edges)
            case RouteDriverEvents(target):
                self._target = target
                early, self._early = self._early, []
                for event in early:
                    target.tell(event)
            case RingReadable(ring_id=ring_id):
                self.driver.ring_readable(int(ring_id))
            case RingWritable(ring_id=ring_id):
                self.driver.ring_writable(int(ring_id))
            case RingFault():
                pass

    async def stopped(self, ctx: Context[DriverMail]) -> None:
        await self.driver.close()
