"""StageNode boot through the node_boot machine: each boot failure names its step, emits
node_faulted with the table's reason and component, and leaves nothing running; a
provisioning request before NodeAvailable is refused by the table's row."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import pytest

from swactor.events.emitter import Emitter
from swactor.events.schema import NodeFaulted
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import node_boot as nb
from swactor.membership.admission import pool_of
from swactor.node.node import NodeBootError, NodeConfig, StageNode
from swactor.testing.examples import example
from swactor.transport import ControlAuthority, ControlChannel, QuicEndpoint
from swactor.transport.config import TransportConfig
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import REGISTRY, StageFaultReport
from swactor.wire import Component, NodeId, ProvisionStage, RunFaultReason, RunId
from swactor.wire.codec import WireStruct
from tests.trace_check import assert_tables_allow

pytestmark = pytest.mark.timeout(180)


async def boot(config: NodeConfig) -> tuple[str, list[str], StageNode, MemorySink]:
    sink = MemorySink()
    node = StageNode(config, Emitter("node-test", [sink]))
    with pytest.raises(NodeBootError) as failed:
        await node.start()
    await node.stop()
    return str(failed.value), [e.name.value for e in sink.events], node, sink


def fault_of(sink: MemorySink) -> NodeFaulted:
    faults = [e.event for e in sink.events if isinstance(e.event, NodeFaulted)]
    assert len(faults) == 1
    return faults[0]


def test_an_arena_that_cannot_be_created_fails_the_boot(tmp_path: Path) -> None:
    config = NodeConfig(identity=NodeIdentity.generate(), orchestrator=NodeId(1),
                        arena_ceiling=1 << 62, models_dir=tmp_path, open_pool=True)
    message, names, node, sink = asyncio.run(boot(config))
    assert message.startswith(f"arena of {1 << 62} bytes")
    assert names == ["node_started", "node_faulted"]
    fault = fault_of(sink)
    assert (fault.reason, fault.component) == (RunFaultReason.ArenaBootFailed,
                                               Component.ArenaManager)
    assert_tables_allow(sink.events)
    assert node.boot is not None and node.boot.state is nb.State.Stopped


def test_a_transport_that_cannot_bind_fails_the_boot(tmp_path: Path) -> None:
    config = NodeConfig(identity=NodeIdentity.generate(), orchestrator=NodeId(1),
                        bind_host="203.0.113.7", arena_ceiling=8 << 20, models_dir=tmp_path,
                        open_pool=True)
    message, names, node, sink = asyncio.run(boot(config))
    assert message.startswith("transport: cannot bind UDP 203.0.113.7")
    assert names == ["node_started", "node_faulted"]
    fault = fault_of(sink)
    assert (fault.reason, fault.component) == (RunFaultReason.NodeUnavailable, Component.Driver)
    assert_tables_allow(sink.events)
    assert node.status()["worker_pid"] is not None
    assert not node._worker_alive()  # the worker that did start was shut down


async def _provision_while_joining(tmp_path: Path) -> tuple[StageNode, list[WireStruct]]:
    """A real node whose SWIM join goes unanswered (its seed is a silent socket) sits in
    MembershipJoining with QUIC up; its orchestrator provisions it then."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    orchestrator, identity = NodeIdentity.generate(), NodeIdentity.generate()
    config = NodeConfig(identity=identity, admission=pool_of(orchestrator, [identity]),
                        orchestrator=NodeId(orchestrator.node_id), arena_ceiling=8 << 20,
                        models_dir=tmp_path, swim_bind=("127.0.0.1", 0),
                        seeds=(silent.getsockname(),))
    node = StageNode(config, Emitter("node-test", [MemorySink()]))
    booting = asyncio.create_task(node.start())
    reports: list[WireStruct] = []
    got = asyncio.Event()

    async def handler(peer: int, message: WireStruct) -> WireStruct | None:
        reports.append(message)
        got.set()
        return None

    try:
        async with asyncio.timeout(150):
            while node.boot is None or node.boot.state is not nb.State.MembershipJoining:
                assert not booting.done()
                await asyncio.sleep(0.05)
            assert node.endpoint is not None
            endpoint = QuicEndpoint(orchestrator, TransportConfig(),
                                    allowed={int(node.node_id)})
            await endpoint.start("127.0.0.1", 0)
            try:
                endpoint.address_book[int(node.node_id)] = node.endpoint.address
                control = ControlChannel(endpoint, REGISTRY, handler, ControlAuthority(
                    orchestrator_id=orchestrator.node_id, active_run_id=77))
                provision = dataclasses.replace(example(ProvisionStage), run_id=RunId(77))
                await control.request(int(node.node_id), provision, timeout=20)
                await got.wait()
                assert node.boot.state is nb.State.MembershipJoining  # still not available
            finally:
                await endpoint.close()
    finally:
        booting.cancel()
        await asyncio.gather(booting, return_exceptions=True)
        await node.stop()
        silent.close()
    return node, reports


def test_provisioning_before_node_available_is_rejected_by_the_table(tmp_path: Path) -> None:
    """node_boot's `* ProvisionRequested -> RejectProvisioning` row answers, with the
    reason and component the row names; nothing reaches the StageHost."""
    node, reports = asyncio.run(_provision_while_joining(tmp_path))
    stage = example(ProvisionStage).stage_index
    assert reports == [StageFaultReport(RunId(77), stage,
                                        RunFaultReason.ProvisioningRejected,
                                        Component.NodeBoot)]
    assert node.boot_refusals == 1
    assert node.host_state.active_run is None and not node.host_state.history
