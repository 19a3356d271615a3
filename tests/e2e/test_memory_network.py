"""In-process end to end with the network replaced by in-memory peers.

Three `StageNode`s and the orchestrator session in one process; `MemoryNetwork` stands
in for QUIC (control requests through their JSON form and the receivers' authority
checks, edge bytes pumped ring to ring); everything else is real: the node_boot machine,
GpuWorkerCtl and one worker process per node with the llama_stage role, memfd arenas,
rings, StageHost/StageController, the orchestrator run machine. Two runs on a random
3-block GGUF equal the model package's single StageRole; both tear down clean and leave
no ring lease; a non-orchestrator peer's StopRun is refused Unauthorized.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from swactor.events.emitter import Emitter
from swactor.events.sinks import MemorySink
from swactor.membership.admission import pool_of
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.node.node import NodeConfig, StageNode
from swactor.orchestrator.session import PoolMember, SessionOptions, run_session
from swactor.testing.memory_net import MemoryNetwork
from swactor.transport.control import ControlRejectedError, RejectCode
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import StopRunMessage
from swactor.wire import NodeId, RunId, RunOutcome, StageIndex, TeardownOutcome
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.trace_check import assert_tables_allow

pytestmark = pytest.mark.timeout(300)

TINY = TinyConfig(blocks=3, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=21)
PROMPT = (2, 30, 41, 8, 13)
TOKENS = 5
MAX_SEQ = 16


def reference(gguf: Path) -> list[int]:
    role = StageRole(open_reader(gguf).load_stage(0, TINY.blocks, is_first=True, is_last=True),
                     max_seq_len=MAX_SEQ)
    tokens: list[int] = []
    ids = list(PROMPT)
    for step in range(TOKENS):
        tokens.append(int(role.step(step, np.array(ids, dtype=np.int32))[0]))
        ids = [tokens[-1]]
    return tokens


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
                                 max_seq_len=MAX_SEQ, network=network)
        expected = reference(gguf)
        for run in (3, 4):
            report = await run_session(replace(options, run_id=run),
                                       Emitter("orchestrator", [sink]), io.StringIO(),
                                       io.StringIO())
            result = report.result
            assert result.outcome is RunOutcome.Completed, report.summary_lines()
            assert result.teardown is TeardownOutcome.Clean, report.summary_lines()
            assert report.token_leases_left == 0, "the token arena kept a ring leased"
            assert result.generated_token_ids == expected
            assert report.layer_ranges == [(0, 1), (1, 2), (2, 3)]
            for node in nodes:
                outcome = await asyncio.wait_for(node.finished.get(), 30)
                assert (outcome.run_id, outcome.clean) == (run, True)
                await asyncio.sleep(0.1)
                assert node.status()["live_leases"] == []
        peer = nodes[1].control
        assert peer is not None
        with pytest.raises(ControlRejectedError) as refused:
            await peer.request(int(nodes[0].node_id), StopRunMessage(RunId(4), StageIndex(0)))
        assert refused.value.reason is RejectCode.Unauthorized
    finally:
        for node in nodes:
            await node.stop()
    names = [e.name.value for e in sink.events]
    assert names.count("stage_ready") == 6 and names.count("run_completed") == 2
    assert_tables_allow(sink.events)


def test_three_nodes_on_in_memory_peers_match_one_stage(tmp_path: Path) -> None:
    asyncio.run(scenario(write_tiny_gguf(tmp_path / "tiny.gguf", TINY)))
