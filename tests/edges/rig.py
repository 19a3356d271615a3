"""One node's edge machinery, wired for tests: real arena, ArenaManager, Driver, QUIC.

`EdgeNode` builds, inside a running `Runtime`: a memfd arena with its `ArenaManager`
(behind `ArenaActor`), a `QuicEndpoint` on loopback with a `DriverActor`, a ring
installer (local by default; a GpuWorkerCtl one when given), and the `EdgeEstablisher`.
`RecordingOwner` is an `EdgeOwner` that keeps every report and lets a test wait for one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from swactor.actors import Actor, ActorRef, Context, Runtime
from swactor.arena import ArenaManager, LiveLease
from swactor.edges import (
    ArenaActor,
    ArenaLiveLeases,
    DriverActor,
    EdgeEstablisher,
    EdgeProvisioned,
    EdgeStates,
    EstablisherConfig,
    LocalRingInstaller,
    ProvisionEdge,
    RingInstaller,
    WakeFanout,
)
from swactor.events.schema import LifecycleEvent
from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import edge_record as er
from swactor.testing.worker_rig import float_spec
from swactor.transport import Driver
from swactor.transport.config import TransportConfig
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    Component,
    EdgeId,
    HostPinning,
    NodeId,
    PortId,
    ProvisionRx,
    ProvisionTx,
    RingDirection,
    RingId,
    RingSpec,
    RunFaultReason,
    RunId,
    WakeCoalescing,
)

RING = 1 << 16


def ring_spec(direction: RingDirection, capacity: int = RING) -> RingSpec:
    return RingSpec(capacity, 64, direction, HostPinning.Pageable, WakeCoalescing.PendingBit)


def tx(edge: int, rx_node: int, capacity: int = RING) -> ProvisionTx:
    return ProvisionTx(EdgeId(edge), NodeId(rx_node), float_spec(),
                       ring_spec(RingDirection.Egress, capacity))


PRODUCER = 0x5EED
"""A producer node id for receive edges whose stream never comes (single-node tests)."""


def rx(edge: int, tx_node: int, capacity: int = RING) -> ProvisionRx:
    return ProvisionRx(EdgeId(edge), NodeId(tx_node), float_spec(),
                       ring_spec(RingDirection.Ingress, capacity))


@dataclass
class RecordingOwner:
    """An EdgeOwner that records (kind, edge_id, detail) tuples."""

    reports: list[tuple[str, int, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _add(self, kind: str, edge: int, detail: Any) -> None:
        self.reports.append((kind, edge, detail))
        self.changed.set()

    def edge_ready(self, edge_id: EdgeId, ring_id: RingId) -> None:
        self._add("ready", int(edge_id), int(ring_id))

    def edge_failed(self, edge_id: EdgeId, reason: RunFaultReason, component: Component
                    ) -> None:
        self._add("failed", int(edge_id), (reason, component))

    def edge_stopped(self, edge_id: EdgeId, clean: bool) -> None:
        self._add("stopped", int(edge_id), clean)

    def of(self, kind: str, edge: int) -> list[Any]:
        return [d for k, e, d in self.reports if k == kind and e == edge]

    async def wait(self, kind: str, edge: int, timeout: float = 10.0) -> Any:
        async with asyncio.timeout(timeout):
            while True:
                found = self.of(kind, edge)
                if found:
                    return found[0]
                self.changed.clear()
                await self.changed.wait()


@dataclass(frozen=True, slots=True)
class OpenGate:
    """Tell a `Gate` to forward what it holds and everything after."""


class Gate(Actor[Any]):
    """Forwards mail to `target`, holding it while closed (orders crossings in tests)."""

    def __init__(self, target: ActorRef[Any]) -> None:
        self.target = target
        self.held: list[Any] | None = []

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        if isinstance(message, OpenGate):
            held, self.held = self.held or [], None
            for item in held:
                self.target.tell(item)
        elif self.held is not None:
            self.held.append(message)
        else:
            self.target.tell(message)


class EdgeNode:
    """A node's arena, driver and establisher (module docstring)."""

    def __init__(self, runtime: Runtime, name: str, ceiling: int,
                 identity: NodeIdentity, installer: RingInstaller | None = None,
                 lease_timeout_s: float = 10.0,
                 faults: Faults = NO_FAULTS) -> None:
        self.runtime, self.name, self.identity = runtime, name, identity
        self.faults = faults
        self.manager = ArenaManager(ceiling)
        self.manager.construct()
        assert self.manager.arena is not None
        self.arena = self.manager.arena
        self.minter = self.manager.take_minter()
        self.installer: RingInstaller = installer or LocalRingInstaller(self.arena)
        self.lease_timeout_s = lease_timeout_s
        self.owner = RecordingOwner()
        self.events: list[LifecycleEvent] = []

    async def start(self, config: TransportConfig, allowed: tuple[int, ...],
                    gate_arena: bool = False) -> None:
        """Start the actors; `gate_arena` puts a closed `Gate` before the ArenaActor."""
        self.endpoint = QuicEndpoint(self.identity, config, allowed=allowed)
        await self.endpoint.start("127.0.0.1")
        rt, name = self.runtime, self.name
        self.arena_ref = rt.spawn(lambda: ArenaActor(self.manager), f"{name}-arena")
        self.driver_actor = DriverActor(
            self.endpoint, self.arena, WakeFanout(self.installer),
            lambda endpoint, arena, emit, wake: Driver(endpoint, arena, emit, wake, self.faults),
        )
        self.driver = rt.spawn(lambda: self.driver_actor, f"{name}-driver")
        self.arena_front: ActorRef[Any] = (rt.spawn(lambda: Gate(self.arena_ref), f"{name}-gate")
                            if gate_arena else self.arena_ref)
        cfg = EstablisherConfig(NodeId(self.identity.node_id), self.arena_front, self.driver,
                                self.installer, self.minter, lease_timeout_s=self.lease_timeout_s,
                                teardown_step_timeout_s=5.0, emit=self.events.append)
        self.establisher = rt.spawn(lambda: EdgeEstablisher(cfg), f"{name}-establisher")

    @property
    def local(self) -> LocalRingInstaller:
        assert isinstance(self.installer, LocalRingInstaller)
        return self.installer

    async def provision(self, provision: ProvisionTx | ProvisionRx, port: int = 1,
                        run_id: int | None = None) -> ActorRef[Any]:
        run = None if run_id is None else RunId(run_id)
        answer = await self.establisher.ask(
            ProvisionEdge(provision, PortId(port), self.owner, run), 5.0)
        assert isinstance(answer, EdgeProvisioned), answer
        return answer.edge_actor

    async def live_leases(self) -> list[LiveLease]:
        leases: list[LiveLease] = await self.arena_ref.ask(ArenaLiveLeases(), 5.0)
        return leases

    async def state(self, edge: int) -> er.State:
        states: dict[int, er.State] = await self.establisher.ask(EdgeStates(), 5.0)
        return states[edge]

    async def wait_state(self, edge: int, state: er.State, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while await self.state(edge) is not state:
                await asyncio.sleep(0.01)

    async def wait_sent(self, edge: int, timeout: float = 10.0) -> None:
        """Wait until the send pump of `edge` finished (its stream ended with FIN)."""
        async with asyncio.timeout(timeout):
            while not self.driver_actor.driver.send_edges[edge].finished:
                await asyncio.sleep(0.01)

    async def close(self, unmap: bool = True) -> None:
        """Stop the driver and the endpoint, then unmap the arena: `Arena.close` raises
        ArenaBusyError if any ring handle (driver, installer) still views it."""
        await self.driver.stop_and_join()
        await self.endpoint.close()
        if isinstance(self.installer, LocalRingInstaller):
            self.installer.close()
        if unmap:
            self.arena.close()


async def node_pair(runtime: Runtime, ceiling: int = 8 << 20, faults: Faults = NO_FAULTS
                    ) -> tuple[EdgeNode, EdgeNode]:
    """Sender `a` and receiver `b` on loopback QUIC, each allowing the other; `a`'s send
    pumps consult `faults`."""
    ida, idb = NodeIdentity.generate(), NodeIdentity.generate()
    a = EdgeNode(runtime, "a", ceiling, ida, faults=faults)
    b = EdgeNode(runtime, "b", ceiling, idb)
    config = TransportConfig()
    await a.start(config, (idb.node_id,))
    await b.start(config, (ida.node_id,))
    a.endpoint.address_book[idb.node_id] = b.endpoint.address
    return a, b


def teardown_feed(monkeypatch: Any) -> dict[Any, list[Any]]:
    """Every event each `edge_teardown` machine is fed, in order, keyed by the machine
    (its `edge_id` says whose), in the order the machines were first fed."""
    from swactor.fsm.generated import edge_teardown as et

    fed: dict[Any, list[Any]] = {}
    handle = et.EdgeTeardownMachine.handle

    def recording(machine: et.EdgeTeardownMachine, event: et.Event) -> list[et.Effect]:
        fed.setdefault(machine, []).append(event)
        return handle(machine, event)

    monkeypatch.setattr(et.EdgeTeardownMachine, "handle", recording)
    return fed

