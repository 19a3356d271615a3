"""A Ready edge pair whose QUIC connection dies: both ends fail with StreamFault and
their teardowns still release every lease (real QUIC, rings, arenas, establishers)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from swactor.actors import ActorRef, Runtime
from swactor.edges import EdgeReleases, StopEdge
from swactor.faults import Faults
from swactor.fsm.generated import edge_record as er
from swactor.fsm.generated import edge_teardown as et
from swactor.wire import (
    Component,
    EdgeId,
    QuiescenceProofKind,
    RingId,
    RingReadable,
    RunFaultReason,
    StreamFaultReason,
)
from tests.edges.rig import EdgeNode, node_pair, rx, teardown_feed, tx

EDGE = EdgeId(11)
PAYLOAD = (b"SECRETPAYLOAD-" * 8)[:100]


async def lose_connection(runtime: Runtime) -> tuple[EdgeNode, EdgeNode, list[ActorRef[Any]]]:
    """A Ready pair with a live stream whose sender's endpoint then closes."""
    a, b = await node_pair(runtime)
    rx_actor = await b.provision(rx(EDGE, a.identity.node_id))
    tx_actor = await a.provision(tx(EDGE, b.identity.node_id))
    ring_a = await a.owner.wait("ready", EDGE)
    await b.owner.wait("ready", EDGE)
    # First bytes open the stream, so the receiver has a live pump to lose.
    n, must_wake = a.local.ring(EDGE).write_from(PAYLOAD)
    assert n == 100 and must_wake
    a.driver.tell(RingReadable(RingId(ring_a)))
    await b.wait_state(EDGE, er.State.Ready)
    await a.endpoint.close()  # the sender's node goes away
    return a, b, [tx_actor, rx_actor]


async def test_connection_loss_fails_both_ends_and_releases_their_leases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fed = teardown_feed(monkeypatch)
    async with Runtime("edges") as runtime:
        a, b, actors = await lose_connection(runtime)
        try:
            for node in (a, b):
                reason, component = await node.owner.wait("failed", EDGE)
                assert (reason, component) == (RunFaultReason.StreamFault, Component.Driver)
                await node.wait_state(EDGE, er.State.Failed)
                assert await node.live_leases() == []
                releases = await node.establisher.ask(EdgeReleases(), 5.0)
                assert [kind for _, kind in releases] == [
                    QuiescenceProofKind.PumpStoppedAndRingQuiesced]
            # both teardowns (one per node) began with the driver's fault (§38)
            assert [type(events[0]) for events in fed.values()] == [et.StreamFault] * 2, fed
            assert {int(machine.edge_id) for machine in fed} == {int(EDGE)}
            for node, actor in zip((a, b), actors, strict=True):
                actor.tell(StopEdge(EDGE))
                assert await node.owner.wait("stopped", EDGE) is True
        finally:
            await a.close()
            await b.close()


async def test_each_nodes_log_names_the_faulted_edge_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An operator reading a node's log (WARNING, the nodes' default level) sees which
    edge faulted, the reason and its detail, on both ends, and no payload byte."""
    caplog.set_level(logging.WARNING)
    async with Runtime("edges") as runtime:
        a, b, _ = await lose_connection(runtime)
        try:
            for node in (a, b):
                await node.wait_state(EDGE, er.State.Failed)
        finally:
            await a.close()
            await b.close()
    faults = [record.getMessage() for record in caplog.records
              if record.levelno == logging.WARNING and record.name == "swactor.transport.pump"]
    reasons = {reason.value for reason in StreamFaultReason}
    lines = [line for line in faults if line.startswith(f"edge {int(EDGE)}: stream fault ")]
    assert len(lines) >= 2, faults  # the sender's pump and the receiver's
    for line in lines:
        reason, _, detail = line.removeprefix(f"edge {int(EDGE)}: stream fault ").partition(": ")
        assert reason in reasons and detail.strip(), line
    assert "SECRETPAYLOAD" not in caplog.text


async def test_connection_loss_leaves_no_view_into_the_senders_arena() -> None:
    """`a.close()` unmaps the arena: ArenaBusyError if a pump task still views it."""
    async with Runtime("edges") as runtime:
        a, b, _ = await lose_connection(runtime)
        try:
            await a.wait_state(EDGE, er.State.Failed)
        finally:
            await b.close()
            await a.close()


async def test_handshake_failure_is_an_edge_establishment_failure() -> None:
    """A send pump whose QUIC handshake fails (StreamFault HandshakeFailed) fails its
    edge with the §36 edge establishment reason, not StreamFault, and leaks no lease."""

    class ConnectFails(Faults):
        def connect_fails(self, edge: int) -> bool:
            return edge == int(EDGE)

    async with Runtime("edges") as runtime:
        a, b = await node_pair(runtime, faults=ConnectFails())
        try:
            await b.provision(rx(EDGE, a.identity.node_id))
            await a.provision(tx(EDGE, b.identity.node_id))
            reason, component = await a.owner.wait("failed", EDGE)
            assert reason is RunFaultReason.EdgeEstablishmentFailed
            # the edge record's table chose the reason; the actor reports it as it came
            assert component is Component.EdgeEstablisher
            await a.wait_state(EDGE, er.State.Failed)
            assert await a.live_leases() == []
        finally:
            await a.close()
            await b.close()
