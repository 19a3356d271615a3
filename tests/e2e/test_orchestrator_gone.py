"""An orchestrator that goes away mid-run without teardown (its session cancelled, its
endpoint closed) leaves no stage behind: each node stops the run itself when the
orchestrator's control connection closes, releases its rings, and serves the next run
(tiny GGUF, two in-process nodes, real QUIC and workers)."""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from swactor.events.emitter import Emitter
from swactor.events.names import EventName
from swactor.events.schema import Emitted
from swactor.events.sinks import MemorySink
from swactor.membership.admission import pool_of
from swactor.model.gguf_range import open_reader
from swactor.model.llama_role import StageRole
from swactor.node.node import NodeConfig, StageNode
from swactor.orchestrator.session import PoolMember, SessionOptions, run_session
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId, RunOutcome, TeardownOutcome
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.trace_check import assert_tables_allow

pytestmark = pytest.mark.timeout(300)

TINY = TinyConfig(blocks=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=11)
PROMPT = (5, 6, 7)
MAX_SEQ = 16


class FirstToken:
    def __init__(self) -> None:
        self.seen = asyncio.Event()

    def write(self, emitted: Emitted) -> None:
        if emitted.event.NAME is EventName.token_received:
            self.seen.set()

    def close(self) -> None:
        return None


async def scenario(gguf: Path) -> None:
    orchestrator = NodeIdentity.generate()
    sink = MemorySink()
    identities = [NodeIdentity.generate() for _ in range(2)]
    pool = pool_of(orchestrator, identities)  # both ends pin every full key
    nodes = [StageNode(NodeConfig(identity=identities[i], admission=pool,
                                  orchestrator=NodeId(orchestrator.node_id),
                                  arena_ceiling=16 << 20, models_dir=gguf.parent),
                       Emitter(f"node-{i}", [sink])) for i in range(2)]
    try:
        addresses = await asyncio.gather(*(node.start() for node in nodes))
        members = tuple(PoolMember(node.node_id, host, port)
                        for node, (host, port) in zip(nodes, addresses, strict=True))
        options = SessionOptions(identity=orchestrator, nodes=members, model=gguf,
                                 admission=pool,
                                 prompt_token_ids=PROMPT, decode=False, max_seq_len=MAX_SEQ,
                                 max_tokens=MAX_SEQ - len(PROMPT), run_id=31)
        first = FirstToken()
        session = asyncio.create_task(run_session(
            options, Emitter("orchestrator", [first, sink]), io.StringIO(), io.StringIO()))
        await asyncio.wait_for(first.seen.wait(), 120)
        session.cancel()
        with pytest.raises(asyncio.CancelledError):
            await session
        for node in nodes:
            outcome = await asyncio.wait_for(node.finished.get(), 60)
            assert outcome.run_id == 31 and outcome.stopped
            await asyncio.sleep(0.2)
            assert node.status()["active_run"] is None and node.status()["live_leases"] == []

        role = StageRole(open_reader(gguf).load_stage(0, TINY.blocks, is_first=True,
                                                      is_last=True), max_seq_len=MAX_SEQ)
        expected, ids = [], list(PROMPT)
        for step in range(4):
            expected.append(int(role.step(step, np.array(ids, dtype=np.int32))[0]))
            ids = [expected[-1]]
        report = await run_session(replace(options, run_id=32, max_tokens=4),
                                   Emitter("orchestrator", [sink]), io.StringIO(),
                                   io.StringIO())
        assert report.result.outcome is RunOutcome.Completed
        assert report.result.teardown is TeardownOutcome.Clean
        assert report.result.generated_token_ids == expected
    finally:
        for node in nodes:
            await node.stop()
    # run 31's orchestrator was cancelled mid-run: its own log stops there (incomplete),
    # while each node ended its stage; run 32 is whole
    gone = [e for e in sink.events if e.proc == "orchestrator" and e.value("run_id") == 31]
    assert_tables_allow(gone, complete=False)
    assert_tables_allow([e for e in sink.events if e not in gone])


def test_nodes_stop_a_run_whose_orchestrator_went_away(tmp_path: Path) -> None:
    asyncio.run(scenario(write_tiny_gguf(tmp_path / "tiny.gguf", TINY)))
