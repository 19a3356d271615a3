"""Node boot (spec §8) bound to the generated `node_boot` machine, and its SWIM join step.

Theory of operation
-------------------
`NodeBoot` feeds milestone events (`NodeProcessStarted`, `ArenaReady`, `WorkerReady`,
`TransportReady`, `MembershipJoinStarted`, `MembershipJoined`, or a failure) into the
machine and carries out the effects: each effect that starts the next boot step calls
the matching method of a `BootSteps` object (the node composition: ArenaManager,
GpuWorkerCtl, Driver, membership), which answers later with the next milestone event.
The lifecycle events `node_started`, `node_available` and `node_faulted` (with its §37
reason and detecting component) are emitted here. Provisioning admission is the
table's too: the node feeds every ProvisionStage as `ProvisionRequested`, and the row
answers `AdmitProvisioning` (the steps hand the held message to the StageHost) or
`RejectProvisioning` with the reason and component the row names.

The membership step is `SwimJoin`: it starts a `MembershipNode`, reports
`MembershipJoinStarted`, turns the first `Joined` into `MembershipJoined` and a join
that is not answered within `join_timeout_s` into `MembershipJoinFailed`. When the node
becomes available or unavailable, `NodeBoot` publishes that boot health in the node's
SWIM metadata (a new incarnation, gossiped), which is how the orchestrator's
`PoolReadiness` learns NodeAvailable and never counts a node that failed to boot. A node
whose arena or worker failed never starts membership at all, so it never appears in the
pool and no edge is provisioned to it (§8).

`NodeBoot.handle` is not thread-safe: call it from one thread (the node's event loop).
`SwimJoin` reports through a `deliver` callable, which must hand the event over to that
thread (e.g. `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import swactor.fsm.generated.node_boot as nb
from swactor.events import Emitter, NodeAvailable, NodeFaulted, NodeStarted, default_emitter
from swactor.fsm.host import MachineHost
from swactor.membership.messages import BootHealth, Joined, MembershipEvent
from swactor.membership.udp import MembershipNode
from swactor.wire import Component, NodeId, RunFaultReason, RunId, StageIndex


class BootSteps(Protocol):
    """The node's components, as node boot starts them (each answers with an event)."""

    def construct_arena(self, ceiling: int) -> None: ...

    def start_worker(self) -> None: ...

    def start_transport(self) -> None: ...

    def join_membership(self) -> None: ...

    def admit_provisioning(self, run: RunId, stage: StageIndex) -> None: ...

    def reject_provisioning(self, run: RunId, stage: StageIndex, reason: RunFaultReason,
                            component: Component) -> None: ...

    def shutdown(self) -> None: ...


class HealthPublisher(Protocol):
    """Where boot health is published (the SWIM metadata, via `SwimJoin`)."""

    def publish_health(self, health: BootHealth) -> None: ...


class NodeBoot(nb.NodeBootEffects[None]):
    """The `node_boot` binding (see the module docstring): one method per effect."""

    def __init__(self, node_id: NodeId, ceiling: int, steps: BootSteps, *,
                 health: HealthPublisher | None = None, emitter: Emitter | None = None) -> None:
        self.node_id = node_id
        self._steps = steps
        self._health = health
        self._emitter = emitter
        self._machine = nb.NodeBootMachine(_NoGuards(), node_id=node_id, ceiling=ceiling)
        self._host = MachineHost(self._machine, nb.bind(self))

    @property
    def state(self) -> nb.State:
        return self._machine.state

    @property
    def available(self) -> bool:
        return self._machine.state is nb.State.NodeAvailable

    def handle(self, event: nb.Event) -> None:
        """Feed one milestone (or provisioning request, or shutdown) and act on it."""
        self._host.feed(event)

    # -- effects (NodeBootEffects) ------------------------------------------------------

    @property
    def _emit(self) -> Emitter:
        return self._emitter or default_emitter()

    def report_node_started(self, node_id: NodeId) -> None:
        self._emit.emit(NodeStarted(node_id=node_id))

    def construct_arena(self, ceiling: int) -> None:
        self._steps.construct_arena(ceiling)

    def start_worker(self) -> None:
        self._steps.start_worker()

    def start_transport(self, node_id: NodeId) -> None:
        self._steps.start_transport()

    def join_membership(self, node_id: NodeId) -> None:
        self._steps.join_membership()

    def report_node_available(self, node_id: NodeId) -> None:
        self._emit.emit(NodeAvailable(node_id=node_id))
        if self._health is not None:
            self._health.publish_health(BootHealth.Available)

    def report_node_unavailable(self, node_id: NodeId, reason: RunFaultReason,
                                component: Component) -> None:
        self._emit.emit(NodeFaulted(node_id=node_id, reason=reason, component=component))
        if self._health is not None:
            self._health.publish_health(BootHealth.Unavailable)

    def admit_provisioning(self, run_id: RunId, stage_index: StageIndex) -> None:
        self._steps.admit_provisioning(run_id, stage_index)

    def reject_provisioning(self, run_id: RunId, stage_index: StageIndex,
                            reason: RunFaultReason, component: Component) -> None:
        self._steps.reject_provisioning(run_id, stage_index, reason, component)

    def shutdown_node(self) -> None:
        self._steps.shutdown()


class _NoGuards:
    """node_boot declares no guards."""


class SwimJoin:
    """The membership boot step: start the SWIM node, report joined or failed."""

    def __init__(self, node: MembershipNode, deliver: Callable[[nb.Event], None],
                 join_timeout_s: float) -> None:
        self.node = node
        self._deliver = deliver
        self._timeout_s = join_timeout_s
        self._lock = threading.Lock()
        self._settled = False
        self._timer: threading.Timer | None = None
        node.add_listener(self._on_event)

    def start(self) -> None:
        """Start the SWIM participant; the join outcome arrives through `deliver`."""
        self._deliver(nb.MembershipJoinStarted())
        self._timer = threading.Timer(self._timeout_s, self._timed_out)
        self._timer.daemon = True
        self._timer.start()
        self.node.start()

    def publish_health(self, health: BootHealth) -> None:
        self.node.update_meta(replace(self.node.meta, boot_health=health))

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.node.stop()

    def _settle(self, event: nb.Event) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        if self._timer is not None:
            self._timer.cancel()
        self._deliver(event)

    def _on_event(self, event: MembershipEvent) -> None:
        if isinstance(event, Joined):
            self._settle(nb.MembershipJoined())

    def _timed_out(self) -> None:
        self._settle(nb.MembershipJoinFailed())
