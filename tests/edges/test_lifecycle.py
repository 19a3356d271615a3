"""EdgeEstablisher records on one node: lease rejection, arena pressure, StopEdge in every
state, and a grant that crosses its cancellation.

Real: the memfd arena and ArenaManager, the DriverActor on a loopback QUIC endpoint,
the establisher and its edge actors. Played by the test: the rings' far end
(`HoldingInstaller`, a LocalRingInstaller that can hold its answers, so the record can
be caught in WaitingForWorkerRing or mid-teardown) and, for WaitingForDriver, a
consumer address that never answers the QUIC handshake.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest

from swactor.actors import ActorRef, Runtime
from swactor.edges import LocalRingInstaller, StopEdge
from swactor.fsm.generated import edge_record as er
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    Component,
    EdgeId,
    InstallRing,
    PortId,
    RingFault,
    RingFaultReason,
    RingId,
    RunFaultReason,
    UninstallReason,
)
from tests.edges.rig import PRODUCER, RING, EdgeNode, OpenGate, rx, tx

LEASE_BYTES = 4096 + RING  # header page + data (ArenaManager lease geometry)


class HoldingInstaller(LocalRingInstaller):
    """A local far end that can hold its answers until `let_go()`."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.holding = False
        self.installs: list[int] = []
        self.held: list[Callable[[], None]] = []

    def install(self, command: InstallRing, establisher: ActorRef[Any],
                edge_actor: ActorRef[Any]) -> None:
        self.installs.append(int(command.edge_id))
        def act() -> None:
            LocalRingInstaller.install(self, command, establisher, edge_actor)

        self._run(act)

    def uninstall(self, ring_id: RingId, reason: UninstallReason,
                  establisher: ActorRef[Any]) -> None:
        def act() -> None:
            LocalRingInstaller.uninstall(self, ring_id, reason, establisher)

        self._run(act)

    def _run(self, act: Callable[[], None]) -> None:
        if self.holding:
            self.held.append(act)
        else:
            act()

    def let_go(self) -> None:
        self.holding = False
        held, self.held = self.held, []
        for act in held:
            act()


async def one_node(runtime: Runtime, ceiling: int, lease_timeout_s: float = 10.0
                   ) -> EdgeNode:
    identity = NodeIdentity.generate()
    node = EdgeNode(runtime, "n", ceiling, identity, lease_timeout_s=lease_timeout_s)
    node.installer = HoldingInstaller(node.arena)
    await node.start(TransportConfig(), ())
    return node


def holder(node: EdgeNode) -> HoldingInstaller:
    assert isinstance(node.installer, HoldingInstaller)
    return node.installer


async def test_lease_never_fits_fails_the_edge() -> None:
    async with Runtime("edges") as runtime:
        node = await one_node(runtime, 1 << 20)
        try:
            actor = await node.provision(rx(1, PRODUCER, capacity=4 << 20))
            reason, component = await node.owner.wait("failed", 1)
            assert (reason, component) == (RunFaultReason.RingRequestOversized,
                                           Component.ArenaManager)
            assert await node.state(1) is er.State.Failed
            actor.tell(StopEdge(EdgeId(1)))
            assert await node.owner.wait("stopped", 1) is True
            assert await node.state(1) is er.State.Stopped
            assert holder(node).installs == [] and await node.live_leases() == []
        finally:
            await node.close()


async def test_arena_pressure_waits_then_is_served_after_a_release() -> None:
    async with Runtime("edges") as runtime:
        node = await one_node(runtime, 2 * LEASE_BYTES - 4096)
        try:
            first = await node.provision(rx(1, PRODUCER))
            await node.owner.wait("ready", 1)
            await node.provision(rx(2, PRODUCER))
            await asyncio.sleep(0.1)
            assert await node.state(2) is er.State.WaitingForLease
            assert len(await node.live_leases()) == 1

            first.tell(StopEdge(EdgeId(1)))
            assert await node.owner.wait("stopped", 1) is True
            ring = await node.owner.wait("ready", 2)
            assert [int(lease.ring_id) for lease in await node.live_leases()] == [ring]
            assert node.owner.of("failed", 2) == []
        finally:
            await node.close()


async def test_arena_pressure_timeout_fails_the_edge_and_cancels_its_lease() -> None:
    async with Runtime("edges") as runtime:
        node = await one_node(runtime, 2 * LEASE_BYTES - 4096, lease_timeout_s=0.2)
        try:
            first = await node.provision(rx(1, PRODUCER))
            await node.owner.wait("ready", 1)
            second = await node.provision(rx(2, PRODUCER))
            reason, _ = await node.owner.wait("failed", 2)
            assert reason is RunFaultReason.ArenaPressureTimeout
            await node.wait_state(2, er.State.Failed)
            assert node.manager.queued_requests() == []
            for edge, actor in ((1, first), (2, second)):
                actor.tell(StopEdge(EdgeId(edge)))
                assert await node.owner.wait("stopped", edge) is True
            assert await node.live_leases() == []
            assert holder(node).installs == [1]
        finally:
            await node.close()


STOP_STATES = ["WaitingForLease", "WaitingForWorkerRing", "WaitingForDriver", "Ready",
               "Failed", "StoppingAfterFault"]


@pytest.mark.parametrize("state", STOP_STATES)
async def test_stop_edge_in_each_state_leaves_no_live_lease(state: str) -> None:
    async with Runtime("edges") as runtime:
        node = await one_node(runtime, 3 * LEASE_BYTES)
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        silent.bind(("127.0.0.1", 0))
        try:
            edge, provision = 5, rx(5, PRODUCER)
            expected_clean = True
            if state == "WaitingForLease":
                await node.provision(rx(9, PRODUCER, capacity=3 * RING))  # takes most of the arena
                await node.owner.wait("ready", 9)
            elif state == "WaitingForWorkerRing":
                holder(node).holding = True
            elif state == "WaitingForDriver":
                peer = NodeIdentity.generate().node_id
                node.endpoint.address_book[peer] = silent.getsockname()
                provision = tx(edge, peer)  # type: ignore[assignment]
            elif state == "Failed":
                provision = rx(edge, PRODUCER, capacity=64 * RING)
            actor = await node.provision(provision)
            if state == "StoppingAfterFault":
                ring = await node.owner.wait("ready", edge)
                holder(node).holding = True
                node.establisher.tell(RingFault(RingId(ring), EdgeId(edge), PortId(1),
                                                RingFaultReason.RingStateInvalid))
            await node.wait_state(edge, er.State[state])

            actor.tell(StopEdge(EdgeId(edge)))
            if state in ("WaitingForWorkerRing", "StoppingAfterFault"):
                await asyncio.sleep(0.05)
                assert await node.state(edge) is er.State.Stopping
                holder(node).let_go()
            assert await node.owner.wait("stopped", edge) is expected_clean
            assert await node.state(edge) is er.State.Stopped
            leases = await node.live_leases()
            assert [int(lease.edge_id) for lease in leases] == (
                [9] if state == "WaitingForLease" else [])
        finally:
            silent.close()
            await node.close()


async def test_grant_crossing_its_cancellation_is_released_unused() -> None:
    async with Runtime("edges") as runtime:
        node = EdgeNode(runtime, "n", 4 * LEASE_BYTES, NodeIdentity.generate())
        node.installer = HoldingInstaller(node.arena)
        await node.start(TransportConfig(), (), gate_arena=True)
        try:
            # LeaseRing and then CancelLease reach the ArenaManager back to back, so it
            # grants the lease before it sees the cancellation.
            actor = await node.provision(rx(3, PRODUCER))
            actor.tell(StopEdge(EdgeId(3)))
            await node.wait_state(3, er.State.CancellingLease)
            node.arena_front.tell(OpenGate())
            assert await node.owner.wait("stopped", 3) is True
            assert await node.state(3) is er.State.Stopped
            assert holder(node).installs == [] and node.owner.of("ready", 3) == []
            assert await node.live_leases() == []
            # Ring ids are never reused: the next lease getting ring 2 proves ring 1 was
            # granted to the cancelled request (and then released unused).
            await node.provision(rx(4, PRODUCER))
            assert await node.owner.wait("ready", 4) == 2
            await actor.join()
        finally:
            await node.close()
