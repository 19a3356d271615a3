"""`node.ring_oversize` through the EdgeEstablisher: three in-process `StageNode`s on a
`MemoryNetwork`, every node's edge ports asking for a ring larger than its arena. The
ArenaManager rejects the lease (LeaseNeverFits), the edge_record table maps it to
RingRequestOversized, the run faults with that reason, the teardown is clean and no node
keeps a lease or an active run."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from swactor.events.emitter import Emitter
from swactor.events.sinks import MemorySink
from swactor.membership.admission import pool_of
from swactor.node.node import NodeConfig, StageNode
from swactor.orchestrator.session import PoolMember, SessionOptions, run_session
from swactor.testing.memory_net import MemoryNetwork
from swactor.transport.identity import NodeIdentity
from swactor.wire import Component, NodeId, RunFaultReason, RunOutcome, TeardownOutcome
from tests.e2e.test_memory_network import MAX_SEQ, PROMPT, TINY, TOKENS
from tests.model.tiny_gguf import write_tiny_gguf
from tests.trace_check import assert_tables_allow

pytestmark = pytest.mark.timeout(300)


async def scenario(gguf: Path) -> None:
    network = MemoryNetwork()
    orchestrator = NodeIdentity.generate()
    sink = MemorySink()
    identities = [NodeIdentity.generate() for _ in range(3)]
    pool = pool_of(orchestrator, identities)  # both ends pin every full key
    nodes = [StageNode(NodeConfig(identity=identities[i], admission=pool,
                                  orchestrator=NodeId(orchestrator.node_id),
                                  arena_ceiling=16 << 20, models_dir=gguf.parent,
                                  network=network),
                       Emitter(f"node-{i}", [sink])) for i in range(3)]
    try:
        addresses = await asyncio.gather(*(node.start() for node in nodes))
        members = tuple(PoolMember(node.node_id, host, port)
                        for node, (host, port) in zip(nodes, addresses, strict=True))
        options = SessionOptions(identity=orchestrator, nodes=members, model=gguf,
                                 admission=pool,
                                 prompt_token_ids=PROMPT, decode=False, max_tokens=TOKENS,
                                 max_seq_len=MAX_SEQ, network=network, run_id=7)
        report = await run_session(options, Emitter("orchestrator", [sink]), io.StringIO(),
                                   io.StringIO())
        result = report.result
        assert result.outcome is RunOutcome.Faulted, report.summary_lines()
        assert result.teardown is TeardownOutcome.Clean, report.summary_lines()
        assert result.fault is not None
        assert (result.fault.reason, result.fault.component) == (
            RunFaultReason.RingRequestOversized, Component.ArenaManager)
        for node in nodes:
            await asyncio.wait_for(node.finished.get(), 30)
            status = node.status()
            assert status["active_run"] is None and status["live_leases"] == []
    finally:
        for node in nodes:
            await node.stop()
    assert_tables_allow(sink.events)


def test_oversized_ring_faults_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"faults": [{"point": "node.ring_oversize"}]}))
    monkeypatch.setenv("SWACTOR_FAULT_INJECT", str(faults))
    # each in-process node's start() records its id in os.environ (faults.bind_node):
    # registered here, monkeypatch undoes that too (a stale SWACTOR_FAULT_NODE would
    # otherwise outlive this test and reach every process later tests start)
    monkeypatch.setenv("SWACTOR_FAULT_NODE", "")
    asyncio.run(scenario(write_tiny_gguf(tmp_path / "tiny.gguf", TINY)))
