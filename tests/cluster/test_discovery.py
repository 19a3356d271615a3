"""SWIM pool discovery (fast): real `MembershipNode`s on loopback find each other through a
seed; `Pool.watch` turns a chosen node's death (not mere suspicion) into MembershipLost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import pool_readiness as pr
from swactor.membership import (
    BootHealth,
    MemberChanged,
    MemberMeta,
    MembershipNode,
    MemberState,
    SwimConfig,
)
from swactor.orchestrator.discovery import DiscoveryError, discover_pool
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId, RunId

pytestmark = pytest.mark.timeout(120)


class Recorder:
    def __init__(self) -> None:
        self.told: list[Any] = []
        self.run_id = RunId(5)

    def tell(self, message: Any) -> None:
        self.told.append(message)


def member(identity: NodeIdentity, port: int, seeds: list[tuple[str, int]], health: BootHealth,
           ) -> MembershipNode:
    meta = MemberMeta("127.0.0.1", 0, quic_host="127.0.0.1", quic_port=port,
                      boot_health=health)
    node = MembershipNode(identity, SwimConfig(), meta, seeds=seeds, bind=("127.0.0.1", 0))
    node.start()
    return node


async def scenario() -> None:
    seed_identity = NodeIdentity.generate()
    seed = member(seed_identity, 7001, [], BootHealth.Available)
    others = [member(NodeIdentity.generate(), 7002 + i, [seed.address], health)
              for i, health in enumerate((BootHealth.Available, BootHealth.Booting))]
    try:
        pool = await discover_pool(NodeIdentity.generate(), ("127.0.0.1", 0), (seed.address,),
                                   2, timeout_s=60, settle_s=0.3)
        try:
            ids = sorted([int(seed.node_id), int(others[0].node_id)])
            assert [int(m.node_id) for m in pool.members] == ids  # the Booting one is not used
            assert {m.port for m in pool.members} == {7001, 7002}

            recorder = Recorder()
            watcher = asyncio.create_task(pool.watch(recorder))  # type: ignore[arg-type]
            chosen = pool.members[0].node_id
            for state in (MemberState.Suspect, MemberState.Dead, MemberState.Dead):
                pool.events.put_nowait(MemberChanged(chosen, state, 3, None, 0.0))
            pool.events.put_nowait(MemberChanged(NodeId(12345), MemberState.Dead, 1, None, 0.0))
            await asyncio.sleep(0.1)
            watcher.cancel()
            assert recorder.told == [orun.MembershipLost(chosen)]  # the suspicion was no loss
            assert pool.readiness.state is pr.State.Lost
        finally:
            await pool.stop()

        with pytest.raises(DiscoveryError, match="of 3 nodes"):
            await discover_pool(NodeIdentity.generate(), ("127.0.0.1", 0), (seed.address,), 3,
                                timeout_s=2, settle_s=0.3)
    finally:
        for node in (seed, *others):
            await asyncio.to_thread(node.stop, True)


def test_discovery_finds_available_nodes_and_watches_them() -> None:
    asyncio.run(scenario())
