"""The orchestrator's run actor: the generated orchestrator_run machine bound to `RunPorts`.

Theory of operation. `OrchestratorRun` is an actor (`swactor.actors`) that owns one
`OrchestratorRunMachine` (spec §13, §36, §38) and nothing else stateful but
bookkeeping. Mail is the machine's events (StageReady, EndpointReady, StageFault,
EndpointFault, MembershipLost, OperatorStop, StageStopped, EndpointsStopped, the timer
events, SettleTimerFired included) plus `TokenOutput`, which the token-out endpoint
sends for each output object: the binding keeps its token id and feeds the machine
`ObjectLoaded` for it, since the machine never sees payload. For every message the binding

1. updates its bookkeeping (who is ready, who stopped and how cleanly, the pending
   output token), so that the guards it answers for the machine are plain reads:
   `all_ready` (every stage and both token endpoints ready), `output_out_of_order`
   (not the token-out edge, or not the awaited step), `run_policy_stops` (the token is
   a stop id while `stop_on_eos`, or `max_tokens` are generated, or feeding the token
   back would need a position past `max_seq_len - 1`), `teardown_pending` / `teardown_failed` (every
   provisioned stage and the endpoints stopped / any of them unclean), `symptomatic_fault`
   (the fault's reason is StreamFault), `prefill_may_wait` (the awaited output is a
   prompt's and, counting this StepTimeout, fewer than `RunTimeouts.prefill_s` passed:
   ExtendPrefillWait counts the timeouts it outlasted, and a new awaited output starts
   the count again);
2. feeds the event to its `AsyncMachineHost` (`swactor.fsm.host`), which runs the
   machine's timers on `ctx.timers` and awaits the binding's method for each effect,
   in order (the class implements `OrchestratorRunEffects`): ProvisionStages as a
   parallel fan-out (one task per stage, each
   `ports.provision_stage(node, provision_stage(plan, i, facts))`);
   CreateTokenEndpoints / StopTokenEndpoints / SendStopRun as tasks too, so the actor
   never blocks on the network and its timers stay live (a stage's StopRun is sent only
   after its ProvisionStage was answered, so the two can never reach the node
   reversed); InjectPrompt writes step 0 (the prompt ids), InjectNextInput writes step
   k + 1 (the token of step k), in mailbox order; AcceptOutput appends the token and
   releases the object; the Record* effects fill `RunResult` (each fault effect carries
   the stage, edge or node its event named); HoldFault keeps the fault aside,
   CommitHeldFault makes it the run's fault, DemoteHeldFault the first late fault.

A port that raises `RunFaultError` (or anything else) is turned into the event the machine
understands: a StageFault for that stage (provisioning; the stage still counts as
provisioned, so teardown still sends it StopRun, and a node that cannot be reached
then makes the teardown Faulted rather than silently skipped; a node that answered
with a refusal, ProvisioningRejected, holds nothing of the run, so its StopRun is not
sent and the stage counts as stopped clean), an EndpointFault for a
token edge, a StageStopped(clean=False) for a stage that cannot be sent StopRun, an
EndpointsStopped(clean=False) for endpoints that cannot be stopped. Such an event is
posted to the actor's own mailbox, never fed re-entrantly. A stage whose node the run
was told is lost (MembershipLost: SWIM declared it dead or unavailable) counts as
stopped, not clean, as soon as its StopRun is sent: a killed node or a cut-off host
never answers, and waiting for its control connection's idle timeout would hold the
teardown (and a serving session's recovery) for 30 s. The StopRun still goes, so a
node declared dead by mistake stops its stage.

Events the machine refuses in its state (its table's `unhandled: raise`, e.g. a
duplicate StageReady after the barrier) come from peers, so they are logged and listed
in `RunResult.rejected_events`, never allowed to crash the run.

Lifecycle events (spec §40) go through `ports.emit`, in this order for a clean run:
run_planned, stage_provision_started (per stage), readiness_barrier_passed,
prompt_injected, token_received (per token), run_completed | run_faulted (with the
first fault's reason and component; an operator stop emits neither), stop_run_sent
(per provisioned stage), run_torn_down (outcome and teardown outcome).

Attribution (spec §36 "records the first run-level failure reason", §40 the component
that saw it) is the table's: a first StreamFault sends the machine to Settling, whose
timer (`RunTimeouts.fault_settle_s`, the context field `fault_settle_s`) gives a root
cause reported over another connection the time to arrive and take over the reason
(fsm/orchestrator_run.yaml, doc). The binding only answers `symptomatic_fault`, runs the
timer like any other and records the held fault where the effects say.

Serving runs (`start_run(..., serving=Serving(slots))`; the table's ServingIdle /
ServingBusy, an extension beyond spec §13). `SubmitSequence` carries a sequence's
request and sink: the binding keeps a `LiveSequence` (swactor/orchestrator/serving.py,
the sequence table's binding) and feeds the machine `SequenceSubmitted`; `RunHandle.cancel`
feeds `SequenceCancelled`. The ledger adds the free KV slots (a heap: the lowest is
bound first), the live sequences by id, and one queue of objects in flight, (edge step,
sequence id, header flags), which a single-prompt run uses too (its one object, flags
0). Guards: `serving_ready` (a serving run, all ready), `slot_free`, `last_in_flight`,
and `output_out_of_order` also compares the output's flags with those injected for the
oldest step. `TokenOutput.flags` tells how to read an output: a tagged CANDIDATES
object must hold `2 * CANDIDATES_K` u32s and its token is sampled by its sequence
(`LiveSequence.pick`), any other object one id (else an EndpointFault,
ObjectHeaderMalformed). Effects: BindSlot / RejectSequence / CancelSequence /
FailSequences feed the sequence's machine SlotBound / Refused / Cancel / RunFaulted
(with the recorded fault in words, `describe_fault`); a sequence's next input is
written tagged `SequenceTag(slot, position, candidates)`; AcceptSequenceOutput pops
the oldest object in flight and feeds its sequence TokenAccepted (dropped if it ended).
A sequence's own effects feed the run `InputReady`, which the host queues behind the
current event. OpenServing and FailSequences call `Serving.on_serving` / `on_ended`.

Batched decode (the table's BatchDue): a decode InputReady (guard `decode_input`: the
sequence's next input is at a position > 0) only queues the sequence (QueueInput).
AcceptSequenceOutput feeds the host `BatchDue` after routing, so it is handled after
the InputReady its sequences raised; `batch_ready` (rows queued, fewer than
`Serving.max_in_flight` objects in flight, default the plan's stages plus one, and
`swactor.orchestrator.spread.next_batch_rows` gives the next object rows: the decoding
rows spread evenly over as many decode objects as the stages that compute at once,
or they gather with the rows in flight) lets InjectBatch write that many queued rows,
at most `min(Serving.max_batch, slots, max_seq_len // 2)`, as one object
(`swactor.wire.tags`: flags BATCH, the tag table, then one id per row; one row alone
is a plain tagged object), remember its rows' sequences and table, and feed BatchDue
again while rows remain queued, so one turn writes every object the spread wants. A
batch output (the table repeated, then each row's answer: one id, or candidates where
the row's tag asked) must repeat the injected table (else output_out_of_order:
SequenceViolation) and hold whole answers (else an EndpointFault,
ObjectHeaderMalformed); each row's token is picked by its sequence and routed to it. A
sequence that ends leaves the queue.

Prompts submitted together (the table's PromptsDue): a prompt's InputReady only queues
its sequence (QueuePrompt), and the binding feeds PromptsDue after each submission:
after a `SubmitSequence` (one prompt: written at once, as a plain tagged object), or
after every sequence of a `SubmitSequences` (`RunHandle.submit_all`: a serving session
forwarding the streams it migrated or held). InjectPrompts writes the queued prompts
in submission order as prompt batches (`swactor.wire.tags`: flags BATCH | PROMPTS, a table of one
tag per prompt whose position field is its row count, then the prompts' ids), each at
most `MAX_PROMPTS` prompts and, with its table, the `max_seq_len` rows the token-in and
activation edges hold; a prompt alone is a plain tagged object. The output repeats the
table, then each prompt's answer: it is read and routed as a batch's rows.

Mixed steps (`Serving.mixed`, `--mixed-steps on`; the table's prompt_rides, mix_ready,
prompt_stranded): a lone queued prompt is held while a decode object is in flight, and
the next BatchDue that may send rows sends InjectMixed: the prompt and the spread's
share of the queued rows as one object (`swactor.wire.tags`: flags BATCH | MIXED, the
prompt's tag with its row count, the rows' tags, then the prompt's ids and the rows').
In flight it counts as a prompt (the prefill wait) and as its rows (the spread); its
output is read and routed as a batch's, the prompt's sequence first. With no decode
object left in flight a held prompt goes alone.

When the machine reaches Done the result future resolves and the actor stops itself.
`start_run(runtime, plan, ports, ...)` spawns the actor, feeds PlanAvailable and returns
a `RunHandle` (`await handle.result()`, `handle.stop()` for an operator stop).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from swactor.actors import Actor, Context, Runtime
from swactor.actors.ref import ActorRef
from swactor.events.schema import (
    LifecycleEvent,
    PromptInjected,
    ReadinessBarrierPassed,
    RunCompleted,
    RunFaulted,
    RunPlanned,
    RunTornDown,
    Scalar,
    StageProvisionStarted,
    StopRunSent,
    TokenReceived,
)
from swactor.fsm.generated import orchestrator_run as orun
from swactor.fsm.generated import sequence as sq
from swactor.fsm.host import AsyncMachineHost
from swactor.fsm.runtime import ProtocolError
from swactor.orchestrator.planner import stage_runtime_facts
from swactor.orchestrator.ports import (
    RunFault,
    RunPorts,
    RunResult,
    StopCause,
)
from swactor.orchestrator.serving import LiveSequence, SequenceRequest, SequenceSink
from swactor.orchestrator.spread import next_batch_rows
from swactor.wire import (
    Component,
    EdgeId,
    EdgeKind,
    NodeId,
    ObjectId,
    PromptKind,
    RunFaultError,
    RunFaultReason,
    RunId,
    RunOutcome,
    RunPlan,
    Sequence,
    StageIndex,
    TeardownOutcome,
    provision_rx,
    provision_stage,
    provision_tx,
)
from swactor.wire.tags import (
    CANDIDATES_K,
    MAX_PROMPTS,
    MAX_SLOTS,
    TAG_WIDTH,
    SequenceTag,
    TagError,
    answer_words,
    batch_flags,
    mixed_count,
    mixed_flags,
    prompt_count,
    prompt_flags,
    read_table,
    table_bytes,
    table_entries,
)

log = logging.getLogger("swactor.orchestrator.run")

DEFAULT_READINESS_TIMEOUT_S = 600.0
DEFAULT_STEP_TIMEOUT_S = 120.0
DEFAULT_TEARDOWN_TIMEOUT_S = 30.0
DEFAULT_PREFILL_TIMEOUT_S = 600.0
"""A prompt of a length no stage has computed yet first builds its prefill kernels:
measured on SmolLM2 Q4_1, one stage on 2 CPU cores, a first prompt of 1536 tokens
takes 79 s and one of 2048 112 s, about `DEFAULT_STEP_TIMEOUT_S`. Ten minutes leaves a
slower CPU or a larger model room, and a hung stage is still found."""
DEFAULT_FAULT_SETTLE_S = 0.25
"""A stage's own fault report and its peer's StreamFault take one control hop each (the
peer's after the reset crossed the edge): measured on loopback under load, a worker kill
reaches run_faulted in under 0.1 s, so a quarter of a second leaves the root cause a
margin while a stream reset is still known in well under a second."""


@dataclass(frozen=True, slots=True)
class TokenOutput:
    """The token-out endpoint loaded output object `object_id` of step `sequence`.

    `token_ids` are the u32 ids it holds (one per step for a sampling last stage); they
    are vocabulary indices the run policy needs, not tensor payload.
    """

    edge_id: EdgeId
    object_id: ObjectId
    sequence: Sequence
    token_ids: tuple[int, ...]
    flags: int = 0
    """The output object's header flags: its sequence tag on a serving run, else 0."""


@dataclass(frozen=True, slots=True)
class SubmitSequence:
    """Run `request` as serving sequence `sequence_id`; its results go to `sink`."""

    sequence_id: int
    request: SequenceRequest
    sink: SequenceSink


@dataclass(frozen=True, slots=True)
class SubmitSequences:
    """Run several sequences submitted together: their prompts travel as prompt
    batches (PromptsDue comes after the last of them)."""

    sequences: tuple[SubmitSequence, ...]


@dataclass(frozen=True, slots=True)
class Serving:
    """What makes a run a serving run: its KV slots, and whom to tell it is serving."""

    slots: int
    on_serving: Callable[[], None] = lambda: None
    """Called once the readiness barrier passed (OpenServing)."""
    on_ended: Callable[[str | None], None] = lambda fault: None
    """Called once every live sequence ended (FailSequences): the run's fault in words,
    or None for an operator stop."""
    on_fault: Callable[[RunFault], None] = lambda fault: None
    """Called with the run's fault just before `on_ended` (FailSequences), when it has one."""
    max_in_flight: int | None = None
    """Objects in flight before queued decode rows wait for the next batch (BatchDue);
    None: the plan's stages plus one (each stage, and the orchestrator's own hop from
    accepting an output to writing the next input, holds one), or with `max_batch` 1
    the slots (every sequence's step in flight)."""
    max_batch: int | None = None
    """Decode rows per batch object (None: the slots). 1 turns batching off: every
    decode row is its own object, written at once, as many in flight as sequences."""
    mixed: bool = False
    """Mixed steps: a lone prompt submitted while a decode object is in flight waits for
    that object's rows and goes with them as one object (fsm/orchestrator_run.yaml,
    guard prompt_rides); False: every prompt goes at once, alone."""

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"a serving run needs at least one slot, got {self.slots}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")


@dataclass(frozen=True, slots=True)
class InFlight:
    """An object injected and not yet answered: its edge step, sequence and flags; a
    batch object's row sequences and tag table (the words its output must repeat)."""

    step: int
    sequence_id: int | None
    flags: int
    rows: tuple[int, ...] = ()
    table: tuple[int, ...] = ()

    @property
    def prompt(self) -> bool:
        """Whether its output is a prompt's: a prompt batch, a mixed step, a tagged
        prompt (position 0), or a single-prompt run's step 0."""
        if prompt_count(self.flags) is not None or mixed_count(self.flags) is not None:
            return True
        if self.rows or table_entries(self.flags) is not None:
            return False
        tag = SequenceTag.unpack(self.flags)
        return self.step == 0 if tag is None else tag.position == 0

    @property
    def decode_rows(self) -> int:
        """Decode rows it carries: a batch's rows, a mixed step's rows beside its prompt,
        1 for one decode row, 0 for a prompt or a prompt batch (or a single-prompt run's
        untagged step)."""
        if prompt_count(self.flags) is not None:
            return 0
        if mixed_count(self.flags) is not None:
            return len(self.rows) - 1
        if self.rows:
            return len(self.rows)
        tag = SequenceTag.unpack(self.flags) if table_entries(self.flags) is None else None
        return int(tag is not None and tag.position > 0)


RunMessage: TypeAlias = orun.Event | TokenOutput | SubmitSequence | SubmitSequences


@dataclass(frozen=True, slots=True)
class RunTimeouts:
    """The machine's timers and the prefill wait, in seconds."""

    readiness_s: float = DEFAULT_READINESS_TIMEOUT_S
    step_s: float = DEFAULT_STEP_TIMEOUT_S
    teardown_s: float = DEFAULT_TEARDOWN_TIMEOUT_S
    fault_settle_s: float = DEFAULT_FAULT_SETTLE_S
    """How long a first StreamFault waits in Settling for a root-cause fault report."""
    prefill_s: float = DEFAULT_PREFILL_TIMEOUT_S
    """How long a prompt's output may take, in whole `step_s` (the guard prefill_may_wait)."""


class OrchestratorRun(Actor[RunMessage], orun.OrchestratorRunEffects[Awaitable[None]]):
    """One run: the orchestrator_run machine, its guards and its effects (module doc)."""

    def __init__(
        self,
        plan: RunPlan,
        ports: RunPorts,
        prompt_token_ids: tuple[int, ...],
        stop_token_ids: frozenset[int],
        result: asyncio.Future[RunResult],
        timeouts: RunTimeouts = RunTimeouts(),
        serving: Serving | None = None,
    ) -> None:
        if not prompt_token_ids and serving is None:
            raise ValueError("a run needs at least one prompt token id")
        self.plan = plan
        self.ports = ports
        self.stop_token_ids = stop_token_ids
        self.result = RunResult(plan.run_id, tuple(prompt_token_ids))
        self._future = result
        self.machine = orun.OrchestratorRunMachine(
            self,
            readiness_timeout_s=timeouts.readiness_s,
            step_timeout_s=timeouts.step_s,
            teardown_timeout_s=timeouts.teardown_s,
            fault_settle_s=timeouts.fault_settle_s,
            prefill_timeout_s=timeouts.prefill_s,
        )
        self._timeouts = timeouts
        self._prefill_waits = 0
        """Step timeouts the awaited prompt outlasted (ExtendPrefillWait); 0 for a new one."""
        self._node = plan.orchestrator_node
        self._token_in = next(e for e in plan.edges if e.kind is EdgeKind.TokenIn)
        self._token_out = next(e for e in plan.edges if e.kind is EdgeKind.TokenOut)
        self._stage_count = len(plan.stages)
        self._ready_stages: set[int] = set()
        self._ready_endpoints: set[int] = set()
        self._provisioned: set[int] = set()
        self._refused: set[int] = set()
        """Stages whose node refused ProvisionStage: stopped clean without a StopRun."""
        self._provisioning: dict[int, asyncio.Task[None]] = {}
        """Each stage's ProvisionStage task; its StopRun waits for it (_stop_after_provisioned)."""
        self._stopped: set[int] = set()
        self._unclean: set[int] = set()
        self._lost: set[int] = set()
        """Nodes the run was told are lost (MembershipLost): their stops are not awaited."""
        self._endpoints_stopped = False
        self._endpoints_unclean = False
        self._in_flight: deque[InFlight] = deque()
        """Objects injected and not yet answered, in edge step order (the edge is FIFO)."""
        self._next_step = 0
        self._pending_token: int | None = None
        self._pending_flags = 0
        self._pending_table: tuple[int, ...] = ()
        self._pending_rows: tuple[int, ...] = ()
        """A batch output's token per row (table order)."""
        self._serving = serving
        self._free_slots: list[int] = list(range(serving.slots if serving else 0))
        self._sequences: dict[int, LiveSequence] = {}
        self._queued: list[int] = []
        """Sequences whose decode row waits for the next batch object (QueueInput)."""
        self._prompts: list[int] = []
        """Sequences whose prompt waits for the next PromptsDue (QueuePrompt)."""
        slots = serving.slots if serving else 1
        self._max_batch = max(1, min(serving.max_batch or slots if serving else 1, slots,
                                     plan.model.max_seq_len // 2, MAX_SLOTS))
        """Rows per batch object: the slots, and what the token-in and activation edges'
        max_extent (max_seq_len rows) hold with the table."""
        self._max_in_flight = max(1, len(plan.stages) + 1)
        """Objects in flight before queued decode rows wait (`Serving.max_in_flight`)."""
        if serving is not None and serving.max_in_flight is not None:
            self._max_in_flight = serving.max_in_flight
        elif serving is not None and serving.max_batch == 1:
            self._max_in_flight = max(self._max_in_flight, slots)  # batching off
        self._computing = max(1, min(len(plan.stages), self._max_in_flight))
        """Objects computed at once: the stages, at most the cap (`spread`)."""
        self.node_id, self.run_id = plan.orchestrator_node, plan.run_id
        self._candidate_stop: StopCause | None = None
        self._fault_pending = False
        self._held_fault: RunFault | None = None
        """The fault HoldFault set aside while the machine is Settling."""
        self._ctx: Context[RunMessage] | None = None
        self._host = AsyncMachineHost(self.machine, orun.bind(self),
                                      timer_events=orun.TIMER_EVENTS, rejected=self._rejected_event)

    # -- actor -----------------------------------------------------------------------------

    async def started(self, ctx: Context[RunMessage]) -> None:
        self._ctx = ctx
        self._host.timers = ctx.timers

    async def receive(self, ctx: Context[RunMessage], message: RunMessage) -> None:
        """Feed one message to the machine and carry out its effects (module doc)."""
        if self._done():
            return
        if isinstance(message, SubmitSequence | SubmitSequences):
            # each sequence, then PromptsDue: the prompts submitted together go together
            submitted = (message,) if isinstance(message, SubmitSequence) else message.sequences
            for each in submitted:
                await self._feed(ctx, self._submitted(each))
            await self._feed(ctx, orun.PromptsDue())
            return
        if isinstance(message, TokenOutput):
            event: orun.Event | None = self._token_event(message)
            if event is None:
                return
        else:
            event = message
        await self._feed(ctx, event)

    async def _feed(self, ctx: Context[RunMessage], event: orun.Event) -> None:
        if self._done():
            return
        self._note(event)
        await self._host.feed(event)
        self._flush_outcome()
        if self._done():
            self._finish(ctx)

    def _rejected_event(self, event: orun.Event, error: ProtocolError) -> None:
        log.warning("run %s: %s", self.plan.run_id, error)
        self.result.rejected_events.append(f"{error.state}: {error.event}")

    @property
    def _context(self) -> Context[RunMessage]:
        assert self._ctx is not None, "effects run only once the actor started"
        return self._ctx

    def _done(self) -> bool:
        return self.machine.state is orun.State.Done

    async def stopped(self, ctx: Context[RunMessage]) -> None:
        if not self._future.done():
            self._future.set_exception(RuntimeError(f"run {self.plan.run_id}: actor stopped "
                                                    f"in state {self.machine.state.name}"))
            self._future.exception()  # reported to whoever awaits; not logged if nobody does

    # -- bookkeeping ---------------------------------------------------------------------

    def _token_event(self, message: TokenOutput) -> orun.Event | None:
        """ObjectLoaded for a well-formed output (its token kept aside), else a fault:
        a tagged candidates output holds 2 * CANDIDATES_K u32s, a batch its table and
        each row's answer, any other one id."""
        self._pending_token = None
        self._pending_flags = message.flags
        self._pending_table = self._pending_rows = ()
        malformed = orun.EndpointFault(
            message.edge_id, RunFaultReason.ObjectHeaderMalformed, Component.TokenEndpoint)
        try:
            if table_entries(message.flags) is not None:
                return self._batch_event(message) or malformed
            tag = SequenceTag.unpack(message.flags)
        except TagError:
            return malformed
        ids = message.token_ids
        if len(ids) != (2 * CANDIDATES_K if tag is not None and tag.candidates else 1):
            return malformed
        live = self._owner(self._in_flight[0]) if self._in_flight else None
        self._pending_token = live.pick(ids) if live is not None else ids[0]
        return orun.ObjectLoaded(message.edge_id, message.object_id, message.sequence)

    def _batch_event(self, message: TokenOutput) -> orun.Event | None:
        """ObjectLoaded for a batch or prompt batch output whose table and answers are
        whole (each row's token kept aside, sampled by its sequence), else None.
        Whether the table is the one injected is output_out_of_order's to say."""
        ids = message.token_ids
        table = read_table(message.flags, ids, MAX_SLOTS)
        head = _table_words(len(table))
        self._pending_table = ids[:head]
        oldest = self._in_flight[0] if self._in_flight else None
        owners = (oldest.rows if oldest is not None and oldest.table == self._pending_table
                  else (None,) * len(table))
        tokens: list[int] = []
        offset = head
        for tag, owner in zip(table, owners, strict=True):
            answer = ids[offset:offset + answer_words(tag)]
            offset += len(answer)
            if not answer:
                return None
            live = self._sequences.get(owner) if owner is not None else None
            tokens.append(live.pick(answer) if live is not None else answer[0])
        if offset != len(ids):
            return None
        self._pending_rows = tuple(tokens)
        self._pending_token = tokens[0]
        return orun.ObjectLoaded(message.edge_id, message.object_id, message.sequence)

    def _owner(self, in_flight: InFlight) -> LiveSequence | None:
        """The live sequence an object in flight was injected for (None: a spec run's
        step, or a sequence that ended since)."""
        if in_flight.sequence_id is None:
            return None
        return self._sequences.get(in_flight.sequence_id)

    def _submitted(self, message: SubmitSequence) -> orun.Event:
        """Keep the sequence's ledger; the table decides whether it runs."""
        self._sequences[message.sequence_id] = LiveSequence(
            message.sequence_id, message.request, message.sink, self,
            self.stop_token_ids, self.plan.model.max_seq_len)
        return orun.SequenceSubmitted(message.sequence_id)

    def _note(self, event: orun.Event) -> None:
        match event:
            case orun.StageReady(stage_index=index) if index < self._stage_count:
                self._ready_stages.add(index)
            case orun.EndpointReady(edge_id=edge) if edge in self._token_edges:
                self._ready_endpoints.add(edge)
            case orun.StageStopped(stage_index=index, clean=clean):
                if index in self._provisioned:
                    self._stopped.add(index)
                    if not clean:
                        self._unclean.add(index)
            case orun.EndpointsStopped(clean=clean):
                self._endpoints_stopped = True
                self._endpoints_unclean = not clean
            case orun.ObjectLoaded():
                self._candidate_stop = self._stop_cause()
            case _:
                pass

    @property
    def _token_edges(self) -> tuple[EdgeId, EdgeId]:
        return (self._token_in.edge_id, self._token_out.edge_id)

    # -- guards (OrchestratorRunGuards) ------------------------------------------------------

    def all_ready(self, event: orun.StageReady | orun.EndpointReady) -> bool:
        return len(self._ready_stages) == self._stage_count and len(self._ready_endpoints) == 2

    def serving_ready(self, event: orun.StageReady | orun.EndpointReady) -> bool:
        return self._serving is not None and self.all_ready(event)

    def slot_free(self, event: orun.SequenceSubmitted) -> bool:
        return bool(self._free_slots)

    def last_in_flight(self, event: orun.ObjectLoaded) -> bool:
        return len(self._in_flight) == 1

    def prefill_may_wait(self, event: orun.StepTimeout) -> bool:
        if not self._in_flight or not self._in_flight[0].prompt:
            return False
        return (self._prefill_waits + 1) * self._timeouts.step_s < self._timeouts.prefill_s

    def decode_input(self, event: orun.InputReady) -> bool:
        live = self._sequences.get(event.sequence_id)
        return live is not None and live.next_input[1] > 0

    def batch_ready(self, event: orun.BatchDue) -> bool:
        return self._batch_rows() > 0

    def _batch_rows(self) -> int:
        """Queued rows the next batch object takes now (`swactor.orchestrator.spread`)."""
        if not self._queued:
            return 0
        return next_batch_rows(
            len(self._queued), [o.decode_rows for o in self._in_flight],
            len(self._in_flight), max_in_flight=self._max_in_flight,
            max_batch=self._max_batch, computing=self._computing)

    def prompts_ready(self, event: orun.PromptsDue) -> bool:
        return bool(self._prompts)

    def prompt_rides(self, event: orun.PromptsDue) -> bool:
        if self._serving is None or not self._serving.mixed or len(self._prompts) != 1:
            return False
        live = self._sequences.get(self._prompts[0])
        if live is None:
            return False
        # the token-in edge holds max_seq_len ids: the prompt, a full batch's rows and
        # the table (the activation edges' padded table takes at most as many rows)
        rows = len(live.next_input[0]) + 2 * self._max_batch + 1
        return (rows <= self.plan.model.max_seq_len
                and self._decode_in_flight())

    def mix_ready(self, event: orun.BatchDue) -> bool:
        return bool(self._prompts) and self._batch_rows() > 0

    def prompt_stranded(self, event: orun.BatchDue) -> bool:
        return bool(self._prompts) and not self._decode_in_flight()

    def _decode_in_flight(self) -> bool:
        """Whether an object in flight carries decode rows, whose return may take a held
        prompt along (prompt_rides, prompt_stranded)."""
        return any(o.decode_rows > 0 for o in self._in_flight)

    def output_out_of_order(self, event: orun.ObjectLoaded) -> bool:
        oldest = self._in_flight[0] if self._in_flight else None
        return (
            event.edge_id != self._token_out.edge_id
            or oldest is None
            or event.sequence != oldest.step
            or self._pending_flags != oldest.flags
            or self._pending_table != oldest.table
            or self._pending_token is None
        )

    def run_policy_stops(self, event: orun.ObjectLoaded) -> bool:
        return self._candidate_stop is not None

    def _stop_cause(self) -> StopCause | None:
        token = self._pending_token
        generated = len(self.result.generated_token_ids) + 1
        policy = self.plan.runtime.token_output_policy
        if policy.stop_on_eos and token in self.stop_token_ids:
            return StopCause.Eos
        if generated >= self.plan.max_tokens:
            return StopCause.MaxTokens
        # Feeding token g back takes position prompt + g - 1; the last is max_seq_len - 1.
        if len(self.result.prompt_token_ids) + generated > self.plan.model.max_seq_len:
            return StopCause.ContextFull
        return None

    def teardown_pending(self, event: orun.StageStopped | orun.EndpointsStopped) -> bool:
        return not (self._provisioned <= self._stopped and self._endpoints_stopped)

    def teardown_failed(self, event: orun.StageStopped | orun.EndpointsStopped) -> bool:
        return bool(self._unclean) or self._endpoints_unclean

    def symptomatic_fault(self, event: orun.StageFault | orun.EndpointFault) -> bool:
        return event.reason is RunFaultReason.StreamFault

    # -- effects ---------------------------------------------------------------------------

    # One coroutine per effect (the host awaits each in turn); those that only book
    # or spawn a task return at once.

    async def open_serving(self) -> None:
        self.result.timings.ready = time.monotonic()
        self.ports.emit(ReadinessBarrierPassed(node_id=self._node, run_id=self.plan.run_id))
        assert self._serving is not None, "serving_ready guards OpenServing"
        self._serving.on_serving()

    async def bind_slot(self, sequence_id: int) -> None:
        await self._sequences[sequence_id].feed(sq.SlotBound(heapq.heappop(self._free_slots)))

    async def reject_sequence(self, sequence_id: int, detail: str) -> None:
        fault = self.result.fault or self._held_fault
        words = detail if fault is None else f"{detail}: {describe_fault(fault)}"
        await self._sequences[sequence_id].feed(sq.Refused(words))

    async def _inject_input(self, sequence_id: int) -> None:
        """Write one sequence's next input as a plain tagged object."""
        live = self._sequences[sequence_id]
        ids, position = live.next_input
        assert live.slot is not None, "a sequence asks for input only while it holds a slot"
        flags = SequenceTag(live.slot, position, live.request.candidates).pack()
        await self._inject(Sequence(self._next_step), ids, sequence_id, flags)

    async def queue_input(self, sequence_id: int) -> None:
        self._queued.append(sequence_id)

    async def queue_prompt(self, sequence_id: int) -> None:
        self._prompts.append(sequence_id)

    async def inject_prompts(self) -> None:
        queued = [i for i in self._prompts if i in self._sequences]
        self._prompts.clear()
        limit = self.plan.model.max_seq_len  # rows the token-in and activation edges hold
        groups: list[list[int]] = []
        rows = 0
        for sequence_id in queued:
            length = len(self._sequences[sequence_id].next_input[0])
            if (groups and len(groups[-1]) < MAX_PROMPTS
                    and rows + length + len(groups[-1]) + 1 <= limit):
                groups[-1].append(sequence_id)
                rows += length
            else:
                groups.append([sequence_id])
                rows = length
        for group in groups:
            if len(group) == 1:
                await self._inject_input(group[0])
                continue
            tags: list[int] = []
            ids: list[int] = []
            for sequence_id in group:
                live = self._sequences[sequence_id]
                prompt, position = live.next_input
                assert live.slot is not None and position == 0, "a queued prompt holds its slot"
                tags.append(SequenceTag(live.slot, len(prompt), live.request.candidates).pack())
                ids += prompt
            await self._inject(Sequence(self._next_step), (*tags, *ids), None,
                               prompt_flags(len(group)), tuple(group), tuple(tags))

    async def inject_mixed(self) -> None:
        rows = self._take_rows()
        prompt_id = self._prompts.pop(0)
        live = self._sequences[prompt_id]
        prompt, position = live.next_input
        assert live.slot is not None and position == 0, "a held prompt holds its slot"
        entries = [self._row_entry(i) for i in rows]
        tags = [SequenceTag(live.slot, len(prompt), live.request.candidates).pack(),
                *(tag for tag, _ in entries)]
        table = _padded_table(tags)
        self.result.batched_rows += len(rows)
        self.result.mixed_steps += 1
        await self._inject(Sequence(self._next_step),
                           (*table, *prompt, *(token for _, token in entries)), None,
                           mixed_flags(len(tags)), (prompt_id, *rows), table)
        if self._queued:  # another object, while the spread wants one
            await self._host.feed(orun.BatchDue())

    async def inject_batch(self) -> None:
        await self._inject_rows(self._take_rows())
        if self._queued:  # another object, while the spread wants one
            await self._host.feed(orun.BatchDue())

    def _take_rows(self) -> list[int]:
        """The spread's share of the queued rows, the oldest first, off the queue: at
        least one row where the guard that chose the effect saw ``_batch_rows() > 0``,
        and only live sequences' (an ended sequence's row leaves the queue in
        :meth:`forget`)."""
        take = self._batch_rows()
        rows = self._queued[:take]
        del self._queued[:take]
        assert rows and all(i in self._sequences for i in rows), "queued rows are live"
        return rows

    def _row_entry(self, sequence_id: int) -> tuple[int, int]:
        """A queued decode row's tag word and token."""
        live = self._sequences[sequence_id]
        (token,), position = live.next_input
        assert live.slot is not None, "a queued sequence holds its slot"
        return SequenceTag(live.slot, position, live.request.candidates).pack(), token

    async def _inject_rows(self, rows: list[int]) -> None:
        if len(rows) == 1:
            await self._inject_input(rows[0])
            return
        entries = [self._row_entry(i) for i in rows]
        tags = [tag for tag, _ in entries]
        table = _padded_table(tags)
        self.result.batched_rows += len(rows)
        await self._inject(Sequence(self._next_step), (*table, *(t for _, t in entries)),
                           None, batch_flags(len(rows)), tuple(rows), table)

    async def accept_sequence_output(self, object_id: ObjectId, sequence: Sequence) -> None:
        oldest = self._in_flight[0]
        if oldest.rows:
            routes = list(zip(oldest.rows, self._pending_rows, strict=True))
            await self._accept(object_id, sequence)
        else:
            live = self._owner(oldest)
            token = await self._accept(object_id, sequence)
            routes = [] if live is None else [(live.sequence_id, token)]
        for sequence_id, row_token in routes:
            row = self._sequences.get(sequence_id)
            if row is not None:  # None: the sequence ended meanwhile; its output is dropped
                await row.feed(sq.TokenAccepted(row_token))
        await self._host.feed(orun.BatchDue())  # behind the InputReady the routes raised

    async def cancel_sequence(self, sequence_id: int) -> None:
        live = self._sequences.get(sequence_id)
        if live is not None:  # None: ended already, or never submitted
            await live.feed(sq.Cancel())

    async def fail_sequences(self) -> None:
        fault = None if self.result.fault is None else describe_fault(self.result.fault)
        for live in list(self._sequences.values()):
            await live.feed(sq.RunFaulted(fault or "the run was stopped"))
        if self._serving is not None:
            if self.result.fault is not None:
                self._serving.on_fault(self.result.fault)
            self._serving.on_ended(fault)

    # RunSide: what a sequence asks of its run

    def emit(self, event: LifecycleEvent) -> None:
        self.ports.emit(event)

    async def input_ready(self, sequence_id: int) -> None:
        await self._host.feed(orun.InputReady(sequence_id))  # queued behind the current event

    def free_slot(self, slot: int) -> None:
        heapq.heappush(self._free_slots, slot)

    def forget(self, sequence_id: int) -> None:
        self._sequences.pop(sequence_id, None)
        if sequence_id in self._queued:
            self._queued.remove(sequence_id)
        if sequence_id in self._prompts:
            self._prompts.remove(sequence_id)

    async def provision_stages(self, plan: RunPlan) -> None:
        self._provision_all(self._context)

    async def create_token_endpoints(self, plan: RunPlan) -> None:
        self._spawn(self._context, self.ports.create_token_endpoints(
            provision_tx(self._token_in), provision_rx(self._token_out)
        ), self._endpoint_fault_for(self._token_in.edge_id))

    async def inject_prompt(self) -> None:
        self.result.timings.ready = time.monotonic()
        self.ports.emit(ReadinessBarrierPassed(node_id=self._node, run_id=self.plan.run_id))
        await self._inject(Sequence(0), self.result.prompt_token_ids)

    async def accept_output(self, object_id: ObjectId, sequence: Sequence) -> None:
        self.result.generated_token_ids.append(await self._accept(object_id, sequence))

    async def inject_next_input(self, sequence: Sequence) -> None:
        await self._inject(Sequence(sequence + 1), (self.result.generated_token_ids[-1],))

    async def finalize_output(self) -> None:
        self.result.timings.finished = time.monotonic()

    async def extend_prefill_wait(self) -> None:
        self._prefill_waits += 1
        awaited = self._in_flight[0]
        log.warning("run %s: the prompt of step %d has not come back in %g s; waiting up "
                    "to %g s (a prompt of a length the stages have not computed yet "
                    "builds its prefill kernels first)", self.plan.run_id, awaited.step,
                    self._prefill_waits * self._timeouts.step_s, self._timeouts.prefill_s)

    async def record_run_outcome(self, outcome: RunOutcome) -> None:
        self.result.outcome = outcome
        if outcome is RunOutcome.Completed:
            self.result.stop_cause = self._candidate_stop
        self._fault_pending = outcome is RunOutcome.Faulted
        if self.result.timings.finished is None:
            self.result.timings.finished = time.monotonic()
        if outcome is RunOutcome.Completed:
            self.ports.emit(RunCompleted(node_id=self._node, run_id=self.plan.run_id))

    async def record_fault_reason(self, reason: RunFaultReason, component: Component,
                                  stage_index: StageIndex | None, edge_id: EdgeId | None,
                                  node_id: NodeId | None) -> None:
        self.result.fault = self._fault(reason, component, stage_index, edge_id, node_id)
        self._note_lost(reason, node_id)

    def _note_lost(self, reason: RunFaultReason, node_id: NodeId | None) -> None:
        if reason is RunFaultReason.MembershipLost and node_id is not None:
            self._lost.add(int(node_id))

    async def send_stop_run(self) -> None:
        self._flush_outcome()
        self._stop_all(self._context)

    async def stop_token_endpoints(self) -> None:
        self._spawn(self._context, self.ports.stop_token_endpoints(),
                    lambda _error: orun.EndpointsStopped(clean=False))

    async def hold_fault(self, reason: RunFaultReason, component: Component,
                         stage_index: StageIndex | None, edge_id: EdgeId | None,
                         node_id: NodeId | None) -> None:
        self._held_fault = self._fault(reason, component, stage_index, edge_id, node_id)
        log.info("run %s: %s from %s held for its root cause", self.plan.run_id, reason.value,
                 component.value)

    async def commit_held_fault(self) -> None:
        self.result.fault = self._take_held_fault()

    async def demote_held_fault(self) -> None:
        self.result.late_faults.insert(0, self._take_held_fault())

    async def record_late_fault(self, reason: RunFaultReason, component: Component,
                                stage_index: StageIndex | None, edge_id: EdgeId | None,
                                node_id: NodeId | None) -> None:
        self.result.late_faults.append(
            self._fault(reason, component, stage_index, edge_id, node_id))
        self._note_lost(reason, node_id)

    async def record_teardown_outcome(self, teardown: TeardownOutcome) -> None:
        self._record_teardown(teardown)

    def _fault(self, reason: RunFaultReason, component: Component, stage: StageIndex | None,
               edge: EdgeId | None, node: NodeId | None) -> RunFault:
        if node is None and stage is not None and stage < self._stage_count:
            node = self.plan.stages[stage].node_id
        return RunFault(reason, component, stage, edge, node)

    def _take_held_fault(self) -> RunFault:
        held = self._held_fault
        assert held is not None, "the table holds a fault before it commits or demotes one"
        self._held_fault = None
        return held

    def _flush_outcome(self) -> None:
        """Emit run_faulted once its reason is known (RecordFaultReason follows the outcome)."""
        if self._fault_pending and self.result.fault is not None:
            self._fault_pending = False
            fault = self.result.fault
            self.ports.emit(RunFaulted(
                node_id=self._node, run_id=self.plan.run_id, reason=fault.reason,
                component=fault.component, stage_index=fault.stage_index,
                edge_id=fault.edge_id,
            ))

    def _provision_all(self, ctx: Context[RunMessage]) -> None:
        self.result.timings.started = self.result.timings.started or time.monotonic()
        for stage in self.plan.stages:
            index = stage.stage_index
            self.ports.emit(StageProvisionStarted(
                node_id=self._node, run_id=self.plan.run_id, stage_index=index
            ))
            message = provision_stage(self.plan, index, stage_runtime_facts(self.plan, index))
            self._provisioned.add(index)
            self._provisioning[index] = self._spawn(
                ctx, self.ports.provision_stage(stage.node_id, message),
                self._provision_failed(index))

    def _provision_failed(self, index: StageIndex) -> Callable[[BaseException], orun.Event]:
        def event(error: BaseException) -> orun.Event:
            reason = (error.reason if isinstance(error, RunFaultError)
                      else RunFaultReason.ProvisioningRejected)
            if isinstance(error, RunFaultError) and reason is RunFaultReason.ProvisioningRejected:
                self._refused.add(index)  # the node answered no: nothing of the run there
            return orun.StageFault(index, reason, Component.Orchestrator)
        return event

    def _endpoint_fault_for(self, edge: EdgeId) -> Callable[[BaseException], orun.Event]:
        def event(error: BaseException) -> orun.Event:
            reason = error.reason if isinstance(error, RunFaultError) else RunFaultReason.RingFault
            return orun.EndpointFault(edge, reason, Component.TokenEndpoint)
        return event

    def _stop_all(self, ctx: Context[RunMessage]) -> None:
        for index in sorted(self._provisioned):
            stage = self.plan.stages[index]

            def unclean(_error: BaseException, index: StageIndex = stage.stage_index
                        ) -> orun.Event:
                return orun.StageStopped(index, clean=False)

            self._spawn(ctx, self._stop_after_provisioned(stage.node_id, stage.stage_index),
                        unclean)

    async def _stop_after_provisioned(self, node: NodeId, index: StageIndex) -> None:
        """StopRun once the stage's ProvisionStage was answered: sent earlier it could
        reach the node first (refused there as a run it does not serve) and leave the
        late ProvisionStage to lease rings for a run that is over."""
        provisioning = self._provisioning.get(index)
        if provisioning is not None:
            await asyncio.shield(provisioning)  # never raises: failures become events
        if index in self._refused:
            assert self._ctx is not None
            self._ctx.self_ref.tell(orun.StageStopped(index, clean=True))
            return
        self.ports.emit(StopRunSent(node_id=self._node, run_id=self.plan.run_id,
                                    stage_index=index))
        if int(node) in self._lost:  # no answer is coming: do not wait for it (module doc)
            assert self._ctx is not None
            self._ctx.self_ref.tell(orun.StageStopped(index, clean=False))
        await self.ports.send_stop_run(node, self.plan.run_id, index)

    def _spawn(
        self,
        ctx: Context[RunMessage],
        action: Awaitable[None],
        on_error: Callable[[BaseException], orun.Event],
    ) -> asyncio.Task[None]:
        async def run() -> None:
            try:
                await action
            except Exception as error:  # a port failure becomes the machine's event
                log.warning("run %s: port action failed: %s", self.plan.run_id, error)
                ctx.self_ref.tell(on_error(error))

        return ctx.spawn_task(run())

    async def _inject(self, sequence: Sequence, token_ids: tuple[int, ...],
                      sequence_id: int | None = None, flags: int = 0,
                      rows: tuple[int, ...] = (), table: tuple[int, ...] = ()) -> None:
        edge = self._token_in.edge_id
        object_id = ObjectId(sequence + 1)
        self._in_flight.append(InFlight(sequence, sequence_id, flags, rows, table))
        self._next_step = sequence + 1
        try:
            await self.ports.inject(edge, object_id, sequence, token_ids, flags)
        except Exception as error:
            log.warning("run %s: inject step %d failed: %s", self.plan.run_id, sequence, error)
            assert self._ctx is not None
            self._ctx.self_ref.tell(self._endpoint_fault_for(edge)(error))
            return
        if sequence == 0 and self._serving is None:  # a single-prompt run's prompt
            self.ports.emit(PromptInjected(
                node_id=self._node, run_id=self.plan.run_id, edge_id=edge,
                object_id=object_id, sequence=sequence,
            ))

    async def _accept(self, object_id: ObjectId, sequence: Sequence) -> int:
        """Consume the oldest object in flight's output (token_received); its token."""
        token = self._pending_token
        assert token is not None, "output_out_of_order guards a missing token"
        self._pending_token = None
        in_flight = len(self._in_flight)
        oldest = self._in_flight.popleft()
        self._prefill_waits = 0  # the next object in flight is awaited from now
        if self.result.timings.first_token is None:
            self.result.timings.first_token = time.monotonic()
        edge = self._token_out.edge_id
        # A serving run says how its objects travel: the rows this one carried (0: a
        # prompt), the objects in flight with it (scheduling figures, bench serve), and
        # for a mixed step that a prompt rode with its rows.
        detail: dict[str, Scalar] = ({} if self._serving is None else
                                     {"rows": oldest.decode_rows, "in_flight": in_flight})
        if mixed_count(oldest.flags) is not None:
            detail["mixed"] = 1
        self.ports.emit(TokenReceived(
            node_id=self._node, run_id=self.plan.run_id, edge_id=edge, object_id=object_id,
            sequence=sequence, token=token, detail=detail,
        ))
        try:
            await self.ports.release_output(edge, object_id)
        except Exception as error:
            log.warning("run %s: release of step %d failed: %s", self.plan.run_id, sequence,
                        error)
            assert self._ctx is not None
            self._ctx.self_ref.tell(self._endpoint_fault_for(edge)(error))
        return token

    def _record_teardown(self, teardown: TeardownOutcome) -> None:
        result = self.result
        result.teardown = teardown
        result.timings.torn_down = time.monotonic()
        result.unstopped_stages = tuple(
            StageIndex(i) for i in sorted(self._provisioned - self._stopped)
        )
        result.unclean_stages = tuple(StageIndex(i) for i in sorted(self._unclean))
        outcome = result.outcome or RunOutcome.OperatorStopped
        self.ports.emit(RunTornDown(
            node_id=self._node, run_id=self.plan.run_id, outcome=outcome, teardown=teardown,
        ))

    def _finish(self, ctx: Context[RunMessage]) -> None:
        if not self._future.done():
            self._future.set_result(self.result)
        ctx.stop_self()


def describe_fault(fault: RunFault) -> str:
    """A run fault in words a client may read: reason, who saw it, where."""
    where = [f"stage {int(fault.stage_index)}"] if fault.stage_index is not None else []
    if fault.node_id is not None:
        where.append(f"node {int(fault.node_id):016x}")
    return (f"the run faulted: {fault.reason.value} reported by {fault.component.value}"
            + (f" ({', '.join(where)})" if where else ""))


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A started run: its actor and its result."""

    ref: ActorRef[RunMessage]
    future: asyncio.Future[RunResult]
    run_id: RunId

    async def result(self, timeout_s: float | None = None) -> RunResult:
        """The run's result once teardown ended (the terminal Done state)."""
        return await asyncio.wait_for(asyncio.shield(self.future), timeout_s)

    def stop(self) -> None:
        """Operator stop (Ctrl-C): the run ends OperatorStopped and tears down."""
        self.ref.tell(orun.OperatorStop())

    def tell(self, message: RunMessage) -> None:
        """Deliver a port's report (StageReady, TokenOutput, StageStopped, ...)."""
        self.ref.tell(message)

    def submit(self, sequence_id: int, request: SequenceRequest, sink: SequenceSink) -> None:
        """Serving run: run `request` as sequence `sequence_id` (results go to `sink`)."""
        self.ref.tell(SubmitSequence(sequence_id, request, sink))

    def submit_all(self, sequences: tuple[SubmitSequence, ...]) -> None:
        """Serving run: run several sequences submitted together, their prompts as
        prompt batches."""
        self.ref.tell(SubmitSequences(sequences))

    def cancel(self, sequence_id: int) -> None:
        """Serving run: end sequence `sequence_id` now and free its slot."""
        self.ref.tell(orun.SequenceCancelled(sequence_id))


def prompt_ids_of(plan: RunPlan, prompt_token_ids: tuple[int, ...] | None) -> tuple[int, ...]:
    """The prompt ids to inject: given ones, or the plan's own TokenIds prompt."""
    if prompt_token_ids is not None:
        return tuple(prompt_token_ids)
    prompt = plan.runtime.prompt
    if prompt.kind is PromptKind.TokenIds and prompt.token_ids:
        return prompt.token_ids
    raise ValueError("a Text prompt must be tokenized by the caller (prompt_token_ids)")


def start_run(
    runtime: Runtime,
    plan: RunPlan,
    ports: RunPorts,
    *,
    stop_token_ids: frozenset[int] | None = None,
    prompt_token_ids: tuple[int, ...] | None = None,
    timeouts: RunTimeouts = RunTimeouts(),
    name: str | None = None,
    serving: Serving | None = None,
) -> RunHandle:
    """Spawn the run actor for a valid `plan`, emit run_planned and feed PlanAvailable.
    With `serving`, the run serves sequences (`SubmitSequence`) instead of one prompt."""
    future: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
    prompt = () if serving is not None else prompt_ids_of(plan, prompt_token_ids)
    stops = stop_token_ids if stop_token_ids is not None else frozenset({
        plan.model.eos_token_id
    })
    ref = runtime.spawn(
        lambda: OrchestratorRun(plan, ports, prompt, stops, future, timeouts, serving),
        name or f"run-{plan.run_id}",
    )
    ports.emit(RunPlanned(node_id=plan.orchestrator_node, run_id=plan.run_id))
    ref.tell(orun.PlanAvailable(plan))
    return RunHandle(ref, future, plan.run_id)


def _table_words(rows: int) -> int:
    """u32s of a batch's tag table on a token edge, whose rows are one u32: the table
    needs no padding there (`swactor.wire.tags.table_bytes`)."""
    return table_bytes(rows, TAG_WIDTH) // TAG_WIDTH


def _padded_table(tags: list[int]) -> tuple[int, ...]:
    """A batch's or mixed step's tag table as written to the token edge: the tags,
    zero-padded to :func:`_table_words`."""
    return (*tags, *(0,) * (_table_words(len(tags)) - len(tags)))
