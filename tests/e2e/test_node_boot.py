"""StageNode boot failures through the node_boot machine: each names its step, emits
node_faulted with the table's reason and component, and leaves nothing running."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from swactor.events.emitter import Emitter
from swactor.events.schema import NodeFaulted
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import node_boot as nb
from swactor.node.node import NodeBootError, NodeConfig, StageNode
from swactor.transport.identity import NodeIdentity
from swactor.wire import Component, NodeId, RunFaultReason
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
                        arena_ceiling=1 << 62, models_dir=tmp_path)
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
                        bind_host="203.0.113.7", arena_ceiling=8 << 20, models_dir=tmp_path)
    message, names, node, sink = asyncio.run(boot(config))
    assert message.startswith("transport: cannot bind UDP 203.0.113.7")
    assert names == ["node_started", "node_faulted"]
    fault = fault_of(sink)
    assert (fault.reason, fault.component) == (RunFaultReason.NodeUnavailable, Component.Driver)
    assert_tables_allow(sink.events)
    assert node.status()["worker_pid"] is not None
    assert not node._worker_alive()  # the worker that did start was shut down
