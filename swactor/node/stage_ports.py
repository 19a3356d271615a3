"""What the StageController needs from its node (`StagePorts`) and the extra mail it takes.

Theory of operation. The controller (`stage_controller.py`) decides; the ports act. A
`StagePorts` object carries out each kind of effect of the stage_controller machine on
the node: configure the worker role, start weight work, establish the inbound (Rx) and
outbound (Tx) edge ends, grant the worker its standing step authorisation and revoke it
(GrantSteps / RevokeSteps to GpuWorkerCtl), stop both edges, reset the role, answer the
orchestrator (`report`), and record lifecycle events (`emit`). The node composition plugs
the real actors in here; unit tests plug in memory fakes.

Port methods return once the action is *started* (a command queued, a task begun);
outcomes come back as mail to the controller:

=====================  ==================================================================
port                   what comes back (mail to the controller)
=====================  ==================================================================
configure_role         `wire.RoleConfigured` / `wire.RoleFailed` (from GpuWorkerCtl)
load_weights           `WeightsFetched` (optional progress), then `WeightsReady` /
                       `WeightsFailed` (machine events)
establish_inbound/     `EdgeReady(edge_id, ring_id)` or `EdgeFault` per edge
establish_outbound
grant_steps            per granted step one `wire.StepCompleted` (with its `StepRecord`) or
                       `wire.StepFailed`
revoke_steps           nothing (a step already started still reports)
stop_edges             one `EdgeStopped(edge_id, clean)` per edge of the stage, whatever
                       phase the edge is in (a never-established edge stops clean)
reset_role, report,    nothing
emit
=====================  ==================================================================

`configure_role` and `load_weights` start at the same time (the table issues both on
entering Preparing). For a role whose configuration reads the weights (the
`llama_stage` worker role), the node's `configure_role` waits for the local artifact
that its `load_weights` produces before sending ConfigureRole; so `WeightsReady` means
the artifact range is local and validated, `RoleConfigured` that the worker bound it.

A port that cannot act raises `RunFaultError` with the §36 run-level reason; the
controller turns it into the machine event that port's outcome would have been
(WeightsFailed, RoleFailed, EdgeFault, StepFailed, EdgeStopped(clean false)), so a
refused command never leaves the stage waiting; a failed revocation is only logged (the
stage is already faulted or stopping).

`emit(event, mono_ns)` records a lifecycle event; `mono_ns` (this host's
`time.monotonic_ns()`) is when it happened when that was not now (a granted step's
events carry the worker's times), None for now.

`report` is awaited inline by the controller, so it must only queue the message (the
control channel sends it); the setup ports run as tasks and may take long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from swactor.events.schema import LifecycleEvent
from swactor.fsm.generated import orchestrator_run as orun
from swactor.wire import (
    Component,
    EdgeId,
    GrantSteps,
    NodeId,
    ProvisionStage,
    RoleId,
    RunFaultReason,
    RunId,
    StageFootprint,
    StageIndex,
    WorkerGeneration,
)

StageReport: TypeAlias = orun.StageReady | orun.StageFault | orun.StageStopped
"""What a stage tells the orchestrator: the orchestrator_run machine's own events."""


class StagePorts(Protocol):
    """The effects of one stage, carried out by the node's actors (module doc)."""

    def worker_generation(self) -> WorkerGeneration:
        """The generation of the node's worker process now (for lifecycle events)."""
        ...

    async def configure_role(self, provision: ProvisionStage) -> None:
        """Configure the stage's worker role (ConfigureRole with its layer range)."""
        ...

    async def load_weights(self, provision: ProvisionStage) -> None:
        """Fetch or locate the GGUF range and validate it against the provision."""
        ...

    async def establish_inbound(self, provision: ProvisionStage) -> None:
        """Provision the receive end of the inbound edge (ProvisionRx to the establisher)."""
        ...

    async def establish_outbound(self, provision: ProvisionStage) -> None:
        """Provision the send end of the outbound edge (ProvisionTx to the establisher)."""
        ...

    async def grant_steps(self, command: GrantSteps) -> None:
        """Send the stage's standing step grant to GpuWorkerCtl."""
        ...

    async def revoke_steps(self, role_id: RoleId) -> None:
        """Send RevokeSteps for the stage's role to GpuWorkerCtl."""
        ...

    async def stop_edges(self, inbound: EdgeId, outbound: EdgeId) -> None:
        """Send StopEdge to both edge actors (edge teardown, spec §38)."""
        ...

    async def reset_role(self, role_id: RoleId) -> None:
        """Drop the role's per-run state in the worker (KV cache, weights: local policy)."""
        ...

    async def report(self, orchestrator: NodeId, run_id: RunId, message: StageReport,
                     footprint: StageFootprint | None = None) -> None:
        """Queue one message for the orchestrator node's run `run_id`; a StageReady
        carries the worker's measured `footprint` (extension) when it reported one."""
        ...

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> None:
        """Record one lifecycle event (spec §40) that happened at `mono_ns` (None: now)."""
        ...

    def emit_all(self, events: Sequence[tuple[LifecycleEvent, int | None]]) -> None:
        """Record several lifecycle events (event, `mono_ns`) in order, written together
        (a step's four events: one write of the events file per token)."""
        ...


# -- mail the controller takes besides the machine's events --------------------------------


@dataclass(frozen=True, slots=True)
class WeightsFetched:
    """Progress from `load_weights`: the artifact range is on this node (weights_downloaded)."""

    bytes_fetched: int = 0


# -- what one controller did ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageFaultRecord:
    """The first fault of the stage: reason and the component that detected it."""

    reason: RunFaultReason
    component: Component


@dataclass(slots=True)
class StageOutcome:
    """The record of one controller's life; final once `stopped` is True."""

    run_id: RunId | None = None
    stage_index: StageIndex | None = None
    provisioned: bool = False
    stopped: bool = False
    clean: bool | None = None
    fault: StageFaultRecord | None = None
    steps_completed: int = 0
    rejected_provisions: list[str] = field(default_factory=list)
    """Why each refused ProvisionStage was refused (one line each, no payload)."""
    rejected_events: list[str] = field(default_factory=list)
    """Events the machine refused in its state ("State: Event"), logged, never acted on."""
