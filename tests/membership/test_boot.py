"""Node boot (spec §8) bound to node_boot, with the real SWIM join step."""

from __future__ import annotations

import queue
import random
import time

import swactor.fsm.generated.node_boot as nb
from swactor.events import Emitter, MemorySink, NodeFaulted
from swactor.membership.boot import NodeBoot, SwimJoin
from swactor.membership.config import MEMBERLIST_LAN
from swactor.membership.messages import BootHealth, MemberMeta
from swactor.membership.udp import MembershipNode
from swactor.transport.identity import NodeIdentity
from swactor.wire import (
    ArenaFailure,
    Component,
    NodeId,
    RunFaultReason,
    RunId,
    StageIndex,
    WorkerGeneration,
)

CONFIG = MEMBERLIST_LAN.scaled(0.1)


class Steps:
    """Records which boot steps ran; the test answers them with milestone events."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def construct_arena(self, ceiling: int) -> None:
        self.calls.append(f"arena:{ceiling}")

    def start_worker(self) -> None:
        self.calls.append("worker")

    def start_transport(self) -> None:
        self.calls.append("transport")

    def join_membership(self) -> None:
        self.calls.append("join")

    def admit_provisioning(self, run: RunId, stage: StageIndex) -> None:
        self.calls.append(f"admit:{run}")

    def reject_provisioning(self, run: RunId, stage: StageIndex, reason: RunFaultReason,
                            component: Component) -> None:
        self.calls.append(f"reject:{run}:{reason.value}:{component.value}")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _node(seeds: list[tuple[str, int]], health: BootHealth = BootHealth.Booting
          ) -> MembershipNode:
    meta = MemberMeta("127.0.0.1", 0, "127.0.0.1", 7300, health, "cpu", 1 << 30)
    return MembershipNode(NodeIdentity.generate(), CONFIG, meta, seeds=seeds,
                          rng=random.Random(3))


def _last_fault(sink: MemorySink) -> NodeFaulted:
    event = sink.events[-1].event
    assert isinstance(event, NodeFaulted)
    return event


def _pump(boot: NodeBoot, inbox: queue.Queue[nb.Event], timeout: float = 5.0) -> None:
    boot.handle(inbox.get(timeout=timeout))


def test_boot_reaches_node_available_and_the_pool_sees_it() -> None:
    sink = MemorySink()
    seed = _node([], BootHealth.Available)
    seed.start()
    inbox: queue.Queue[nb.Event] = queue.Queue()
    member = _node([seed.address])
    join = SwimJoin(member, inbox.put, join_timeout_s=5.0)
    steps = Steps()
    boot = NodeBoot(member.node_id, 1 << 20, steps, health=join, emitter=Emitter("n", [sink]))
    try:
        boot.handle(nb.NodeProcessStarted())
        boot.handle(nb.ArenaReady())
        boot.handle(nb.WorkerReady(worker_generation=WorkerGeneration(1)))
        boot.handle(nb.TransportReady())
        assert steps.calls == ["arena:1048576", "worker", "transport", "join"]
        join.start()
        _pump(boot, inbox)  # MembershipJoinStarted
        assert boot.state is nb.State.MembershipJoining
        # not yet available:
        boot.handle(nb.ProvisionRequested(run_id=RunId(4), stage_index=StageIndex(0)))
        _pump(boot, inbox)  # MembershipJoined
        assert boot.available
        boot.handle(nb.ProvisionRequested(run_id=RunId(5), stage_index=StageIndex(0)))
        assert steps.calls[-2:] == ["reject:4:ProvisioningRejected:node_boot", "admit:5"]
        assert sink.names() == ["node_started", "node_available"]
        # the seed (standing in for the orchestrator) sees the published boot health
        def health_seen() -> bool:
            view = seed.view().get(member.node_id)
            return view is not None and view.meta.boot_health is BootHealth.Available

        deadline = time.monotonic() + 5.0
        while not health_seen():
            assert time.monotonic() < deadline, "boot health never reached the seed"
            time.sleep(0.05)
    finally:
        join.stop()
        seed.stop()


def test_worker_failure_before_worker_ready_makes_node_unavailable_without_joining() -> None:
    sink = MemorySink()
    steps = Steps()
    boot = NodeBoot(NodeId(9), 1 << 20, steps, emitter=Emitter("n", [sink]))
    boot.handle(nb.NodeProcessStarted())
    boot.handle(nb.ArenaReady())
    boot.handle(nb.WorkerFailed())
    assert boot.state is nb.State.Unavailable
    assert "join" not in steps.calls
    boot.handle(nb.ProvisionRequested(run_id=RunId(1), stage_index=StageIndex(0)))
    assert steps.calls[-1] == "reject:1:ProvisioningRejected:node_boot"
    faulted = _last_fault(sink)
    assert sink.names() == ["node_started", "node_faulted"]
    assert (faulted.reason, faulted.component) == (RunFaultReason.WorkerFatal, Component.WorkerCtl)


def test_arena_failure_makes_node_unavailable() -> None:
    sink = MemorySink()
    steps = Steps()
    boot = NodeBoot(NodeId(9), 1 << 20, steps, emitter=Emitter("n", [sink]))
    boot.handle(nb.NodeProcessStarted())
    boot.handle(nb.ArenaFailed(reason=next(iter(ArenaFailure))))
    assert boot.state is nb.State.Unavailable
    assert steps.calls == ["arena:1048576"]
    assert _last_fault(sink).reason is RunFaultReason.ArenaBootFailed


def test_unanswered_join_fails_the_boot() -> None:
    sink = MemorySink()
    inbox: queue.Queue[nb.Event] = queue.Queue()
    member = _node([("127.0.0.1", 9)])  # nobody answers on the discard port
    join = SwimJoin(member, inbox.put, join_timeout_s=0.5)
    steps = Steps()
    boot = NodeBoot(member.node_id, 1 << 20, steps, health=join, emitter=Emitter("n", [sink]))
    try:
        for event in (nb.NodeProcessStarted(), nb.ArenaReady(),
                      nb.WorkerReady(worker_generation=WorkerGeneration(1)), nb.TransportReady()):
            boot.handle(event)
        join.start()
        _pump(boot, inbox)
        _pump(boot, inbox)
        assert boot.state is nb.State.Unavailable
        faulted = _last_fault(sink)
        assert (faulted.reason, faulted.component) == (RunFaultReason.NodeUnavailable,
                                                       Component.Membership)
        assert inbox.empty()
    finally:
        join.stop()
