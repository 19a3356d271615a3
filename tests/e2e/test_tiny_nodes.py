"""Two `StageNode`s and an orchestrator session in one process, on a tiny GGUF (fast).

Real: QUIC endpoints with node identities, the control channel, edge drivers, memfd
arenas and rings, one `python -m swactor.worker` per node with the llama_stage role.
The model is a random 2-block GGUF the test writes (no tokenizer: token ids only). Two
runs must both give the tokens of the model package's StageRole over the whole model,
end Completed with a clean teardown and leave each node idle without ring leases. A
node refuses StopRun from a pool peer that is not its orchestrator (Unauthorized), and
a node outside the pool gets no connection at all. Ctrl-C (SIGINT) after the first
token of a third run is an operator stop with a clean teardown.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
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
from swactor.transport import ControlAuthority, ControlChannel, QuicEndpoint
from swactor.transport.config import TransportConfig
from swactor.transport.control import ControlRejectedError, RejectCode
from swactor.transport.errors import ConnectionLostError
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import REGISTRY, StopRunMessage
from swactor.wire import NodeId, RunId, RunOutcome, StageIndex, TeardownOutcome
from tests.model.tiny_gguf import TinyConfig, write_tiny_gguf
from tests.trace_check import assert_tables_allow

pytestmark = pytest.mark.timeout(300)

TINY = TinyConfig(blocks=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=64, context=32,
                  seed=5)
PROMPT = (3, 17, 42, 9)
TOKENS = 4
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
                                 prompt_token_ids=PROMPT, decode=False, max_tokens=TOKENS,
                                 max_seq_len=MAX_SEQ)
        expected = reference(gguf)
        for run in (7, 8):
            report = await run_session(replace(options, run_id=run),
                                       Emitter("orchestrator", [sink]), io.StringIO(),
                                       io.StringIO())
            result = report.result
            assert result.outcome is RunOutcome.Completed, report.summary_lines()
            assert result.teardown is TeardownOutcome.Clean, report.summary_lines()
            assert report.token_leases_left == 0, "the token arena kept a ring leased"
            assert result.generated_token_ids == expected
            assert report.layer_ranges == [(0, 1), (1, 2)]
            for node in nodes:
                await asyncio.wait_for(node.finished.get(), 30)
                await asyncio.sleep(0.2)
                status = node.status()
                assert status["active_run"] is None and status["live_leases"] == []
        assert [node.status()["runs_served"] for node in nodes] == [[7, 8], [7, 8]]

        # Ctrl-C after the first token: an operator stop, still a clean teardown
        interrupt = InterruptOnFirstToken()
        report = await run_session(replace(options, run_id=9, max_tokens=MAX_SEQ - len(PROMPT)),
                                   Emitter("orchestrator", [sink, interrupt]), io.StringIO(),
                                   io.StringIO())
        assert interrupt.sent
        assert report.result.outcome is RunOutcome.OperatorStopped, report.summary_lines()
        assert report.result.teardown is TeardownOutcome.Clean
        assert report.token_leases_left == 0
        assert 1 <= len(report.result.generated_token_ids) < MAX_SEQ - len(PROMPT)
        for node in nodes:
            await asyncio.wait_for(node.finished.get(), 30)
            await asyncio.sleep(0.2)
            assert node.status()["active_run"] is None and node.status()["live_leases"] == []

        # a pool peer is admitted by the endpoint but may not stop another node's stage
        peer_channel = nodes[1].control
        assert peer_channel is not None
        with pytest.raises(ControlRejectedError) as refused:
            await peer_channel.request(int(nodes[0].node_id),
                                       StopRunMessage(RunId(8), StageIndex(0)), timeout=10)
        assert refused.value.reason is RejectCode.Unauthorized
        # a node outside the pool does not even get a connection
        stranger = QuicEndpoint(NodeIdentity.generate(), TransportConfig(),
                                allowed={int(nodes[0].node_id)})
        await stranger.start()
        stranger.address_book[int(nodes[0].node_id)] = addresses[0]
        channel = ControlChannel(stranger, REGISTRY, _no_handler, ControlAuthority())
        with pytest.raises(ConnectionLostError):
            await channel.request(int(nodes[0].node_id),
                                  StopRunMessage(RunId(8), StageIndex(0)), timeout=10)
        await stranger.close()
    finally:
        for node in nodes:
            await node.stop()
    names = [e.name.value for e in sink.events]
    assert names.count("stage_ready") == 6 and names.count("run_torn_down") == 3
    for run in (7, 8, 9):  # the orchestrator's own token edges report like a stage's edges
        mine = [e for e in sink.events if e.proc == "orchestrator" and e.value("run_id") == run]
        started = {e.value("edge_id") for e in mine
                   if e.name is EventName.edge_provision_started}
        ready = {e.value("edge_id") for e in mine if e.name is EventName.edge_ready}
        assert len(started) == 2 and ready == started, (run, started, ready)
    assert names.count("run_completed") == 2  # an operator stop is neither completed nor faulted
    assert_tables_allow(sink.events)


class InterruptOnFirstToken:
    """An event sink that sends this process SIGINT (Ctrl-C) at the first token_received."""

    def __init__(self) -> None:
        self.sent = False

    def write(self, emitted: Emitted) -> None:
        if not self.sent and emitted.event.NAME is EventName.token_received:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def close(self) -> None:
        return None


async def _no_handler(peer: int, message: object) -> None:
    return None


def test_two_runs_on_two_in_process_nodes(tmp_path: Path) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", TINY)
    asyncio.run(scenario(gguf))
