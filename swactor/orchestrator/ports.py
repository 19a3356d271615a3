"""What the run binding needs from the world (`RunPorts`), and what it reports (`RunResult`).

Theory of operation. The run binding (`run.py`) decides; the ports act. A `RunPorts`
object carries out each kind of effect of the orchestrator_run machine: send one
`ProvisionStage` or `StopRun` to a stage node over the control channel, create and stop
the local token endpoints (the token-in producer and token-out consumer rings with their
edges), write one token object to token-in, release a consumed token-out object, and
emit lifecycle events. The transport and control channel plug in here later; unit tests
plug in memory fakes.

Port methods return as soon as the action is started (a message sent, an endpoint
being built): their outcomes come back as messages to the run actor (`StageReady`,
`EndpointReady`, `TokenOutput`, `StageStopped`, `EndpointsStopped`, faults). A port that
cannot act raises `RunFaultError` with the §36 run-level reason; the binding turns it into
the machine's fault event for that stage or endpoint (or, during teardown, into an
unclean stop), so a dead node or a refused send never leaves the run waiting.

`RunResult` is the one record of a run: its single execution outcome (with the first
fault's reason, component and where it came from), its teardown outcome, the faults
that arrived too late to matter, the prompt and generated token ids, why generation
stopped, and timings (monotonic seconds) for time-to-first-token and tokens/s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from swactor.events.schema import LifecycleEvent
from swactor.wire import (
    Component,
    EdgeId,
    NodeId,
    ObjectId,
    ProvisionRx,
    ProvisionStage,
    ProvisionTx,
    RunFaultReason,
    RunId,
    RunOutcome,
    Sequence,
    StageIndex,
    TeardownOutcome,
)


class RunPorts(Protocol):
    """The effects of one run, carried out by the transport / control channel."""

    async def provision_stage(self, node_id: NodeId, message: ProvisionStage) -> None:
        """Send ProvisionStage to the stage's node (StageReady/StageFault come back)."""
        ...

    async def create_token_endpoints(self, token_in: ProvisionTx, token_out: ProvisionRx) -> None:
        """Build the local token-in producer and token-out consumer (EndpointReady x2)."""
        ...

    async def inject(
        self, edge_id: EdgeId, object_id: ObjectId, sequence: Sequence,
        token_ids: tuple[int, ...], flags: int = 0,
    ) -> None:
        """Write one token object (u32 ids) for inference step `sequence` to token-in;
        `flags` is its header's flags word (a serving run's sequence tag, else 0)."""
        ...

    async def release_output(self, edge_id: EdgeId, object_id: ObjectId) -> None:
        """Release a consumed token-out object (its ring space)."""
        ...

    async def send_stop_run(self, node_id: NodeId, run_id: RunId, stage_index: StageIndex) -> None:
        """Send StopRun to a provisioned stage (StageStopped comes back)."""
        ...

    async def stop_token_endpoints(self) -> None:
        """Tear down both token endpoints (EndpointsStopped comes back)."""
        ...

    def emit(self, event: LifecycleEvent) -> None:
        """Record one lifecycle event (spec §40)."""
        ...


class StopCause(enum.Enum):
    """Why a completed run stopped generating."""

    Eos = "eos"  #: the last token is EOS or another end-of-generation id
    MaxTokens = "max_tokens"  #: max_tokens tokens were generated
    ContextFull = "context_full"  #: prompt + generated tokens reached max_seq_len


@dataclass(frozen=True, slots=True)
class RunFault:
    """One fault report: reason, detecting component, and the stage/edge/node it names."""

    reason: RunFaultReason
    component: Component
    stage_index: StageIndex | None = None
    edge_id: EdgeId | None = None
    node_id: NodeId | None = None


@dataclass(slots=True)
class RunTimings:
    """Monotonic seconds (`time.monotonic()`) of the run's milestones; None if not reached."""

    started: float | None = None
    ready: float | None = None
    first_token: float | None = None
    finished: float | None = None
    torn_down: float | None = None

    @property
    def time_to_first_token_s(self) -> float | None:
        """From prompt injection (the readiness barrier) to the first token."""
        if self.ready is None or self.first_token is None:
            return None
        return self.first_token - self.ready

    def tokens_per_second(self, generated: int) -> float | None:
        """Decode rate after the first token (generated - 1 tokens over that time)."""
        if self.first_token is None or self.finished is None or generated < 2:
            return None
        elapsed = self.finished - self.first_token
        return (generated - 1) / elapsed if elapsed > 0 else None


@dataclass(slots=True)
class RunResult:
    """What one run did; filled in by the binding, final once `teardown` is set."""

    run_id: RunId
    prompt_token_ids: tuple[int, ...]
    generated_token_ids: list[int] = field(default_factory=list)
    outcome: RunOutcome | None = None
    fault: RunFault | None = None
    stop_cause: StopCause | None = None
    teardown: TeardownOutcome | None = None
    late_faults: list[RunFault] = field(default_factory=list)
    unstopped_stages: tuple[StageIndex, ...] = ()
    """Stages that had not reported StageStopped when teardown ended."""
    unclean_stages: tuple[StageIndex, ...] = ()
    """Stages that reported StageStopped(clean=False) or could not be sent StopRun."""
    rejected_events: list[str] = field(default_factory=list)
    """Events the machine refused in its state ("State: Event"), logged, never acted on."""
    batched_rows: int = 0
    """A serving run's decode rows that travelled in batch objects of two or more rows
    (InjectBatch; `swactor.wire.tags`), or beside a prompt in a mixed step."""
    mixed_steps: int = 0
    """A serving run's mixed step objects: a prompt and decode rows as one (InjectMixed)."""
    timings: RunTimings = field(default_factory=RunTimings)
