"""The stage-run messages that travel on the control channel besides `ProvisionStage`.

Theory of operation. The orchestrator sends a node `AddressBook` (the run's peers),
`ProvisionStage` (a wire type of its own) and `StopRunMessage`; the node answers each
stage milestone with one report request back to the orchestrator: `StageReadyReport`,
`StageFaultReport`, `StageStoppedReport`. Outside runs, `PreloadStage` (answered
`StagePreloaded`) warms a spare node's role (extension beyond the spec, see its doc).
They are `WireStruct`s, so the control channel checks every field strictly on arrival,
and the reports carry the run id, so its authority check refuses reports for a run the
orchestrator is not running. `report_message` / `report_event` convert between these
and the orchestrator_run machine's own event classes.

`REGISTRY` lists all of them: nodes and orchestrators build their channels with it
(a requester needs the type in its registry too); `ORCHESTRATOR_ONLY` names the ones a
node accepts only from the orchestrator it trusts.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.fsm.generated import orchestrator_run as orun
from swactor.wire import (
    Component,
    NodeId,
    ProvisionStage,
    RoleId,
    RunFaultReason,
    RunId,
    StageFootprint,
    StageIndex,
)
from swactor.wire.codec import WireStruct


@dataclass(frozen=True, slots=True)
class PeerAddress(WireStruct):
    """One node's QUIC address (host, UDP port)."""

    node_id: NodeId
    host: str
    port: int

    def _validate(self) -> None:
        self._check_range("port", 1, 65535)
        if not self.host:
            self._fail("host", "is empty")


@dataclass(frozen=True, slots=True)
class AddressBook(WireStruct):
    """Orchestrator -> node, before provisioning: the run's nodes and where they listen.

    The node admits these peers to its QUIC endpoint and records their addresses, so a
    Tx edge can reach its consumer (the next stage, or the orchestrator's token-out)."""

    peers: tuple[PeerAddress, ...]


@dataclass(frozen=True, slots=True)
class StopRunMessage(WireStruct):
    """Orchestrator -> node: stop stage `stage_index` of run `run_id` (spec §38)."""

    run_id: RunId
    stage_index: StageIndex


@dataclass(frozen=True, slots=True)
class StageReadyReport(WireStruct):
    """Node -> orchestrator: the stage passed its setup barrier (spec §14). `footprint`
    (extension): what the stage's worker holds at ready, as measured there; None when
    its role holds no model."""

    run_id: RunId
    stage_index: StageIndex
    footprint: StageFootprint | None = None


@dataclass(frozen=True, slots=True)
class StageFaultReport(WireStruct):
    """Node -> orchestrator: the stage faulted; reason and detecting component (§36)."""

    run_id: RunId
    stage_index: StageIndex
    reason: RunFaultReason
    component: Component


@dataclass(frozen=True, slots=True)
class StageStoppedReport(WireStruct):
    """Node -> orchestrator: the stage finished its teardown (spec §38)."""

    run_id: RunId
    stage_index: StageIndex
    clean: bool


@dataclass(frozen=True, slots=True)
class PreloadStage(WireStruct):
    """Orchestrator -> idle node (extension beyond spec §12 for warm spares): configure
    the worker role of `provision`'s stage now, outside any run, so that a later run
    that provisions this node with the same stage finds the role loaded and its kernels
    built (the worker re-arms a role it holds for the same stage of the same file). Only
    the provision's stage facts are used (source, layer range, role, model facts); its
    run id and edges are not: nothing is opened, no run is started. Answered with
    `StagePreloaded` once the worker configured the role or refused it."""

    provision: ProvisionStage


@dataclass(frozen=True, slots=True)
class StagePreloaded(WireStruct):
    """Node -> orchestrator, the answer to `PreloadStage`: `ok` with the role's measured
    `footprint`, or not ok with `detail` in words (node busy with a run, weights or role
    failed)."""

    role_id: RoleId
    ok: bool
    detail: str = ""
    footprint: StageFootprint | None = None


Report = StageReadyReport | StageFaultReport | StageStoppedReport
StageEvent = orun.StageReady | orun.StageFault | orun.StageStopped

REGISTRY: tuple[type[WireStruct], ...] = (
    AddressBook, ProvisionStage, StopRunMessage,
    StageReadyReport, StageFaultReport, StageStoppedReport,
    PreloadStage, StagePreloaded,
)
ORCHESTRATOR_ONLY = frozenset({"AddressBook", "ProvisionStage", "StopRunMessage",
                               "PreloadStage"})


def report_message(run_id: RunId, event: StageEvent,
                   footprint: StageFootprint | None = None) -> Report:
    """The wire report for one orchestrator_run stage event (a StageReady's with the
    stage's `footprint`)."""
    match event:
        case orun.StageReady():
            return StageReadyReport(run_id, event.stage_index, footprint)
        case orun.StageFault():
            return StageFaultReport(run_id, event.stage_index, event.reason, event.component)
        case orun.StageStopped():
            return StageStoppedReport(run_id, event.stage_index, event.clean)
    raise TypeError(f"not a stage report: {type(event).__name__}")


def report_event(message: WireStruct) -> StageEvent | None:
    """The orchestrator_run event a wire report stands for (None: not a report)."""
    match message:
        case StageReadyReport():
            return orun.StageReady(message.stage_index)
        case StageFaultReport():
            return orun.StageFault(message.stage_index, message.reason, message.component)
        case StageStoppedReport():
            return orun.StageStopped(message.stage_index, message.clean)
    return None
