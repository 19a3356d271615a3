"""PoolReady (spec §9) bound to the generated pool_readiness machine."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

import swactor.fsm.generated.pool_readiness as pr
from swactor.events import Emitter, MemorySink
from swactor.membership.config import MEMBERLIST_LAN
from swactor.membership.messages import (
    BootHealth,
    MemberChanged,
    MemberMeta,
    MembershipEvent,
    MemberState,
)
from swactor.membership.pool import (
    MembershipLost,
    PoolReadiness,
    PoolReadyReached,
    ReadinessLost,
    wait_pool_ready,
)
from swactor.membership.udp import MembershipNode, asyncio_events
from swactor.testing.swim_sim import Simulation, sim_node_id
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId, RunId

WINDOW = 2.0
NODES = [NodeId(11), NodeId(12), NodeId(13)]
ORCH = NodeId(1)


def _meta(health: BootHealth = BootHealth.Available, port: int = 7000) -> MemberMeta:
    return MemberMeta("10.0.0.1", 5000, "10.0.0.1", port, health, "cuda", 1 << 30)


def _alive(node: NodeId, at: float, incarnation: int = 0,
           meta: MemberMeta | None = None) -> MemberChanged:
    return MemberChanged(node, MemberState.Alive, incarnation, meta or _meta(), at)


def _state(pool: PoolReadiness) -> pr.State:
    return pool.state  # read afresh (mypy narrows a repeated `pool.state`)


def _pool() -> tuple[PoolReadiness, MemorySink]:
    sink = MemorySink()
    return PoolReadiness(NODES, WINDOW, observer=ORCH, emitter=Emitter("orch", [sink])), sink


def test_pool_ready_only_after_the_window_and_once() -> None:
    pool, sink = _pool()
    for i, node in enumerate(NODES):
        pool.observe(_alive(node, float(i)), float(i))
        pool.tick(float(i))
    assert pool.state is pr.State.Converging  # complete at t=2
    pool.tick(2.0 + WINDOW - 0.01)
    assert not pool.ready and pool.take_outcomes() == []
    assert sink.names() == []
    pool.tick(2.0 + WINDOW)
    assert pool.ready
    assert pool.take_outcomes() == [PoolReadyReached(2.0 + WINDOW)]
    assert sink.names() == ["pool_ready"]
    assert sink.events[0].event.node_id == ORCH
    pool.tick(100.0)
    assert pool.take_outcomes() == []


def test_flapping_restarts_the_window() -> None:
    pool, _ = _pool()
    for node in NODES:
        pool.observe(_alive(node, 0.0), 0.0)
    pool.tick(1.5)
    pool.observe(MemberChanged(NODES[1], MemberState.Suspect, 0, _meta(), 1.5), 1.5)
    assert pool.state is pr.State.Waiting
    pool.observe(_alive(NODES[1], 1.6, incarnation=1), 1.6)  # refuted: complete again
    pool.tick(0.0 + WINDOW)  # the first window would have ended here
    assert not pool.ready
    pool.observe(_alive(NODES[2], 3.0, incarnation=1), 3.0)  # any change restarts it
    pool.tick(1.6 + WINDOW)
    assert not pool.ready
    pool.tick(3.0 + WINDOW - 0.01)
    assert not pool.ready
    pool.tick(3.0 + WINDOW)
    assert pool.ready


@pytest.mark.parametrize(
    "meta",
    [_meta(BootHealth.Booting), _meta(BootHealth.Unavailable), _meta(port=0),
     MemberMeta("10.0.0.1", 5000, "", 7000, BootHealth.Available)],
    ids=["booting", "unavailable", "no-port", "no-host"],
)
def test_incomplete_candidate_blocks_readiness(meta: MemberMeta) -> None:
    pool, _ = _pool()
    pool.observe(_alive(NODES[0], 0.0, meta=meta), 0.0)
    for node in NODES[1:]:
        pool.observe(_alive(node, 0.0), 0.0)
    pool.tick(100.0)
    assert pool.state is pr.State.Waiting


def test_node_available_report_completes_a_booting_candidate() -> None:
    pool, _ = _pool()
    pool.observe(_alive(NODES[0], 0.0, meta=_meta(BootHealth.Booting)), 0.0)
    for node in NODES[1:]:
        pool.observe(_alive(node, 0.0), 0.0)
    assert pool.state is pr.State.Waiting
    pool.node_available(NODES[0], 1.0)
    pool.tick(1.0 + WINDOW)
    assert pool.ready


def test_loss_before_commit_waits_after_commit_faults() -> None:
    pool, _ = _pool()
    for node in NODES:
        pool.observe(_alive(node, 0.0), 0.0)
    pool.tick(WINDOW)
    pool.take_outcomes()
    pool.observe(MemberChanged(NODES[0], MemberState.Dead, 0, _meta(), 3.0), 3.0)
    assert pool.take_outcomes() == [ReadinessLost(3.0)]
    assert pool.state is pr.State.Waiting
    pool.observe(_alive(NODES[0], 4.0, incarnation=1), 4.0)
    pool.tick(4.0 + WINDOW)
    assert pool.take_outcomes() == [PoolReadyReached(4.0 + WINDOW)]
    pool.plan_committed(RunId(7), 7.0)
    pool.observe(MemberChanged(NODES[2], MemberState.Suspect, 0, _meta(), 8.0), 8.0)
    assert pool.take_outcomes() == [], "a suspicion alone is not a loss"
    assert _state(pool) is pr.State.Committed
    pool.observe(_alive(NODES[2], 8.5, incarnation=1), 8.5)  # refuted
    pool.observe(MemberChanged(NODES[2], MemberState.Dead, 1, _meta(), 9.0), 9.0)
    assert pool.take_outcomes() == [MembershipLost(NODES[2], 9.0)]
    assert _state(pool) is pr.State.Lost


def test_after_commit_a_left_or_unavailable_candidate_is_lost() -> None:
    for change in (MemberChanged(NODES[1], MemberState.Left, 0, _meta(), 5.0),
                   MemberChanged(NODES[1], MemberState.Alive, 0,
                                 _meta(BootHealth.Unavailable), 5.0)):
        pool, _ = _pool()
        for node in NODES:
            pool.observe(_alive(node, 0.0), 0.0)
        pool.tick(WINDOW)
        pool.plan_committed(RunId(7), 4.0)
        pool.take_outcomes()
        pool.observe(change, 5.0)
        assert pool.take_outcomes() == [MembershipLost(NODES[1], 5.0)], change


def test_events_about_non_candidates_change_nothing() -> None:
    pool, _ = _pool()
    for node in NODES:
        pool.observe(_alive(node, 0.0), 0.0)
    pool.observe(_alive(NodeId(99), 1.0), 1.0)
    pool.observe(MemberChanged(NodeId(99), MemberState.Dead, 0, None, 1.5), 1.5)
    pool.tick(WINDOW)
    assert pool.ready


def test_wait_pool_ready_over_real_udp_members() -> None:
    config = MEMBERLIST_LAN.scaled(0.1)
    window = 0.5

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[MembershipEvent] = asyncio.Queue()
        orchestrator = MembershipNode(NodeIdentity.generate(), config,
                                      MemberMeta("127.0.0.1", 0, role="orchestrator"),
                                      on_event=asyncio_events(loop, queue),
                                      rng=random.Random(1))
        nodes = [
            MembershipNode(NodeIdentity.generate(), config,
                           MemberMeta("127.0.0.1", 0, "127.0.0.1", 7100 + i,
                                      BootHealth.Booting, "cpu", 1 << 30),
                           seeds=[orchestrator.address], rng=random.Random(i))
            for i in range(3)
        ]
        readiness = PoolReadiness([n.node_id for n in nodes], window,
                                  observer=orchestrator.node_id, emitter=Emitter("t", []))
        orchestrator.start()
        for node in nodes:
            node.start()
        try:
            await asyncio.sleep(0.5)
            # still booting: not ready however long we wait for the window
            with pytest.raises(TimeoutError, match="incomplete"):
                await wait_pool_ready(queue, readiness, 1.0)
            available_at = time.monotonic()
            for node in nodes:
                node.update_meta(MemberMeta("", 0, node.meta.quic_host, node.meta.quic_port,
                                            BootHealth.Available, "cpu", 1 << 30))
            reached = await wait_pool_ready(queue, readiness, 10.0)
            return reached.at - available_at
        finally:
            for node in [*nodes, orchestrator]:
                node.stop()

    elapsed = asyncio.run(scenario())
    assert elapsed >= window


def test_pool_ready_waits_out_a_flapping_member_in_a_simulated_pool() -> None:
    window = 5.0
    sim = Simulation(6, seed=41, available=True)
    observer = sim.members[0].core
    candidates = [sim_node_id(i) for i in range(1, 6)]
    pool = PoolReadiness(candidates, window, observer=observer.node_id,
                         emitter=Emitter("t", []))
    for node, view in observer.view().items():  # the bootstrapped view, as events
        pool.observe(MemberChanged(node, view.state, view.incarnation, view.meta, 0.0), 0.0)
    seen = 0
    sim.pause(3, 2.5)  # member 3 stalls: suspected, then it refutes
    ready_at = None
    while sim.now < 30.0 and ready_at is None:
        sim.run_until(sim.now + 0.05)
        for at, index, event in sim.events[seen:]:
            if index == 0:
                pool.observe(event, at)
        seen = len(sim.events)
        pool.tick(sim.now)
        for outcome in pool.take_outcomes():
            if isinstance(outcome, PoolReadyReached):
                ready_at = outcome.at
    changes = [at for at, index, e in sim.events
               if index == 0 and isinstance(e, MemberChanged) and e.node_id == sim_node_id(3)]
    assert len(changes) >= 2, "member 3 was never suspected and refuted: no flapping"
    assert ready_at is not None
    assert ready_at >= max(changes) + window
    assert ready_at <= max(changes) + window + 0.1
