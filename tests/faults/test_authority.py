"""Authority (spec §4, §39) against real `swactor node` processes on loopback.

- A pool peer (a node the orchestrator introduced through AddressBook, speaking with its
  own key) may not provision or stop a stage on another node: both are refused
  `Unauthorized`, and the node still answers its orchestrator afterwards.
- A node outside the allow-list gets no connection at all (the TLS handshake fails).
- A node key readable by group or others is refused at start (exit 2, one line naming
  the key), before anything binds.

Covered elsewhere, referenced by the README table: edge data for an edge that is not in
the active plan is refused with StreamRefused(UnknownEdge) (tests/transport/test_edges.py),
a control message naming an unknown edge is refused UnknownEdge
(tests/transport/test_control.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swactor.cluster.launcher import LocalCluster
from swactor.testing.examples import example
from swactor.transport import ControlAuthority, ControlChannel, QuicEndpoint
from swactor.transport.config import TransportConfig
from swactor.transport.control import ControlRejectedError, RejectCode
from swactor.transport.errors import ConnectionLostError
from swactor.transport.identity import NodeIdentity
from swactor.transport.run_control import REGISTRY, AddressBook, PeerAddress, StopRunMessage
from swactor.wire import NodeId, ProvisionStage, RunId, StageIndex
from swactor.wire.codec import WireStruct

pytestmark = pytest.mark.timeout(300)


async def _no_handler(peer: int, message: WireStruct) -> WireStruct | None:
    return None


class Speaker:
    """A control channel in this process under some identity."""

    def __init__(self, identity: NodeIdentity, targets: dict[int, tuple[str, int]]) -> None:
        self.endpoint = QuicEndpoint(identity, TransportConfig(), allowed=set(targets))
        self.targets = targets
        self.channel: ControlChannel | None = None

    async def __aenter__(self) -> ControlChannel:
        await self.endpoint.start("127.0.0.1", 0)
        self.endpoint.address_book.update(self.targets)
        self.channel = ControlChannel(self.endpoint, REGISTRY, _no_handler, ControlAuthority())
        return self.channel

    async def __aexit__(self, *exc: object) -> None:
        await self.endpoint.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(2, tmp_path_factory.mktemp("authority") / "keys",
                           arena_ceiling="16MiB")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(cluster.start())
        cluster.loop = loop  # type: ignore[attr-defined]
        yield cluster
    finally:
        codes = loop.run_until_complete(cluster.stop())
        loop.close()
    assert codes == [0, 0]


async def _peer_is_refused(cluster: LocalCluster) -> None:
    first, second = (node.member for node in cluster.nodes)
    assert first is not None and second is not None
    target = {int(second.node_id): (second.host, second.port)}
    # the orchestrator introduces the first node to the second one
    book = AddressBook((PeerAddress(first.node_id, first.host, first.port),
                        PeerAddress(second.node_id, second.host, second.port)))
    async with Speaker(cluster.orchestrator, target) as orchestrator:
        await orchestrator.request(int(second.node_id), book, timeout=20)
    peer_key = NodeIdentity.load_or_create(cluster.keys_dir / "node-0.key")
    assert NodeId(peer_key.node_id) == first.node_id
    async with Speaker(peer_key, target) as peer:
        for message in (example(ProvisionStage), StopRunMessage(RunId(7), StageIndex(1))):
            with pytest.raises(ControlRejectedError) as refused:
                await peer.request(int(second.node_id), message, timeout=20)
            assert refused.value.reason is RejectCode.Unauthorized, refused.value
    # the node still serves its orchestrator
    async with Speaker(cluster.orchestrator, target) as orchestrator:
        await orchestrator.request(int(second.node_id), book, timeout=20)


def test_a_pool_peer_cannot_provision_or_stop_a_stage(cluster: LocalCluster) -> None:
    cluster.loop.run_until_complete(_peer_is_refused(cluster))  # type: ignore[attr-defined]


async def _stranger(cluster: LocalCluster) -> None:
    node = cluster.nodes[0].member
    assert node is not None
    async with Speaker(NodeIdentity.generate(),
                       {int(node.node_id): (node.host, node.port)}) as stranger:
        with pytest.raises(ConnectionLostError):
            await stranger.request(int(node.node_id), StopRunMessage(RunId(7), StageIndex(0)),
                                   timeout=20)


def test_a_node_outside_the_allow_list_gets_no_connection(cluster: LocalCluster) -> None:
    cluster.loop.run_until_complete(_stranger(cluster))  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_group_or_world_readable_node_key_is_refused(tmp_path: Path, mode: int) -> None:
    key = tmp_path / "node.key"
    NodeIdentity.load_or_create(key)
    os.chmod(key, mode)
    done = subprocess.run([sys.executable, "-m", "swactor.cli", "node", "--key", str(key),
                           "--trust-orchestrator", "1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert str(key) in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""
