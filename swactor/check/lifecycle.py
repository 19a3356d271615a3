"""Which table transition each lifecycle event stands for: the data `swactor check` replays.

Theory of operation
-------------------
A binding emits a lifecycle event (spec §40) at one of three kinds of place, and each
`Anchor` below names its place in one generated table (`swactor.fsm.generated.*.MODEL`):

- `on_effect`: while carrying out that effect of a row (ProvisionStages emits
  stage_provision_started, one per stage). `where` narrows it to the rows whose `with:`
  sets a field to a value (RecordRunOutcome emits run_completed only for Completed).
- `on_event`: just before the binding feeds the machine that event (run_planned comes
  with PlanAvailable); the table must then have a row
  for it in the current state, ignore it there, or be in a terminal state.
- `in_states`: at any time while the machine is in one of those states, with no
  transition of its own (an asynchronous report: stop_run_sent from the tasks SendStopRun
  started).

`count` says how often a place emits it: exactly once, at most once (a send that may fail
first), once or more, or any number of times (once per stage).

A row's emissions, in order, are its event's `on_event` anchors (in this table's order)
and then each effect's `on_effect` anchors; a row with none is silent and may happen
unseen between two events. An `Role` is what one process does for one run (or for
itself): which machines it hosts and the identities that tell their instances apart.
Events no anchor names are listed in `UNCHECKED` with the reason.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from swactor.events.names import EventName
from swactor.fsm.model import Literal

_E = EventName


class Count(enum.Enum):
    """How many times one place emits its event: (least, most; None: no bound)."""

    One = (1, 1)
    AtMostOne = (0, 1)
    Some = (1, None)
    Any = (0, None)

    @property
    def least(self) -> int:
        least: int = self.value[0]
        return least

    @property
    def most(self) -> int | None:
        most: int | None = self.value[1]
        return most


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where in `machine`'s table the binding emits `event` (module doc)."""

    event: EventName
    machine: str
    on_effect: str | None = None
    where: tuple[str, Literal] | None = None
    """(field, value) the row's `with:` must set on `on_effect`."""
    on_event: tuple[str, ...] = ()
    in_states: tuple[str, ...] = ()
    count: Count = Count.One


@dataclass(frozen=True, slots=True)
class Role:
    """What one process does per run (or once per process, `per_run` False)."""

    name: str
    machines: tuple[str, ...]
    per_run: bool = True


KEYS: dict[str, tuple[str, ...]] = {
    "orchestrator_run": ("run_id",),
    "stage_controller": ("run_id", "stage_index"),
    "edge_record": ("run_id", "edge_id"),
    "node_boot": ("node_id",),
}
"""The identities that name one instance of each replayed machine in one process."""

ROLES: tuple[Role, ...] = (
    Role("orchestrator", ("orchestrator_run", "edge_record")),
    Role("stage", ("stage_controller", "edge_record")),
    Role("node", ("node_boot",), per_run=False),
)
"""Tried in order; a process's events for one run take the first role that anchors all."""

ANCHORS: tuple[Anchor, ...] = (
    # the orchestrator's run (swactor.orchestrator.run)
    Anchor(_E.run_planned, "orchestrator_run", on_event=("PlanAvailable",)),
    Anchor(_E.stage_provision_started, "orchestrator_run", on_effect="ProvisionStages",
           count=Count.Some),
    Anchor(_E.readiness_barrier_passed, "orchestrator_run", on_effect="InjectPrompt"),
    Anchor(_E.prompt_injected, "orchestrator_run", on_effect="InjectPrompt",
           count=Count.AtMostOne),
    Anchor(_E.token_received, "orchestrator_run", on_effect="AcceptOutput"),
    # a serving run (extension beyond spec §40): token_received per accepted output,
    # then what became of the output's sequences (a batch's or prompt batch's output
    # carries several: each may get its first token or finish)
    Anchor(_E.readiness_barrier_passed, "orchestrator_run", on_effect="OpenServing"),
    Anchor(_E.sequence_started, "orchestrator_run", on_effect="BindSlot"),
    Anchor(_E.token_received, "orchestrator_run", on_effect="AcceptSequenceOutput"),
    Anchor(_E.sequence_first_token, "orchestrator_run", on_effect="AcceptSequenceOutput",
           count=Count.Any),
    Anchor(_E.sequence_finished, "orchestrator_run", on_effect="AcceptSequenceOutput",
           count=Count.Any),
    Anchor(_E.sequence_finished, "orchestrator_run", on_effect="CancelSequence",
           count=Count.AtMostOne),
    Anchor(_E.sequence_failed, "orchestrator_run", on_effect="RejectSequence"),
    Anchor(_E.sequence_failed, "orchestrator_run", on_effect="FailSequences",
           count=Count.Any),
    Anchor(_E.run_completed, "orchestrator_run", on_effect="RecordRunOutcome",
           where=("outcome", "Completed")),
    Anchor(_E.run_faulted, "orchestrator_run", on_effect="RecordFaultReason"),
    Anchor(_E.run_faulted, "orchestrator_run", on_effect="CommitHeldFault"),
    Anchor(_E.stop_run_sent, "orchestrator_run", in_states=("TearingDown",), count=Count.Any),
    Anchor(_E.run_torn_down, "orchestrator_run", on_effect="RecordTeardownOutcome"),
    # one edge end's establishment, on a stage node or the orchestrator (swactor.edges)
    Anchor(_E.edge_provision_started, "edge_record", on_event=("ProvisionTx", "ProvisionRx")),
    Anchor(_E.edge_ready, "edge_record", on_effect="NotifyEdgeReady"),
    # a stage (swactor.node.stage_controller)
    Anchor(_E.weights_download_started, "stage_controller", on_effect="StartWeightLoad"),
    Anchor(_E.weights_downloaded, "stage_controller", in_states=("Preparing",),
           count=Count.Any),
    Anchor(_E.weights_loaded, "stage_controller", in_states=("Preparing",), count=Count.Any),
    Anchor(_E.stage_ready, "stage_controller", on_effect="ReportStageReady"),
    # a granted step's four events, emitted together from its StepCompleted
    Anchor(_E.object_loaded, "stage_controller", on_effect="RecordStep"),
    Anchor(_E.execute_step_started, "stage_controller", on_effect="RecordStep"),
    Anchor(_E.object_produced, "stage_controller", on_effect="RecordStep"),
    Anchor(_E.step_completed, "stage_controller", on_effect="RecordStep"),
    Anchor(_E.stage_stopped, "stage_controller", on_effect="ReportStageStopped"),
    # a node's boot (swactor.membership.boot)
    Anchor(_E.node_started, "node_boot", on_effect="ReportNodeStarted"),
    Anchor(_E.node_available, "node_boot", on_effect="ReportNodeAvailable"),
    Anchor(_E.node_faulted, "node_boot", on_effect="ReportNodeUnavailable"),
)

UNCHECKED: dict[EventName, str] = {
    _E.pool_ready: "names no run, and one orchestrator process may wait for many pools "
                   "(one pool_readiness machine per session)",
    **dict.fromkeys(
        (_E.serve_started, _E.serve_recovery_started, _E.serve_recovery_completed,
         _E.serve_stopped, _E.serve_failed, _E.sequence_migrated, _E.sequence_lost,
         _E.spare_preloaded, _E.spare_preload_failed),
        "a serving session's events (serve_session, an extension beyond spec §40) frame "
        "many runs; each run's own events are checked"),
}
"""Lifecycle events no table position is claimed for, and why."""
