"""``RunEngine``: an :class:`~swactor.serve.engine.Engine` over ONE warm serving run.

Theory of operation. ``RunEngine.start(options, slots=K)`` does what ``swactor run``'s
orchestrator does up to its first token, once: it plans a serving run over
``options.nodes`` (``plan_for(serving=True)``: the token-out edge may carry a sampled
step's candidates), sends the pool its AddressBook, makes the run's token endpoints
(``NetworkRunPorts``) and starts the orchestrator_run actor with ``Serving(K)``. The
run provisions every stage and passes the readiness barrier into ServingIdle
(fsm/orchestrator_run.yaml) instead of injecting a prompt; ``start`` returns then. If
the run ends before it serves (a stage refused, a node did not answer, the readiness
timer), ``start`` waits for its teardown, releases what it made and raises
``SessionError`` naming the fault. ``start`` is two halves: ``RunEngine.prepare``
(plan, pool endpoint: no node is told anything) returns a ``PreparedEngine`` whose
``open()`` (``RunEngine.open``) greets the nodes, provisions the run and waits for the
barrier, at most once per prepared run, so a serving session can plan the next run while
the faulted one is still torn down.

Sequences. ``submit`` gives each sequence an id, makes its stream (a queue of
``SequenceEvent``) and tells the run actor ``SubmitSequence``; from then on the run's
tables decide (fsm/sequence.yaml): a free KV slot is bound (``Started``), the prompt
and then each accepted token are injected as tagged objects, tokens arrive as
``Tokens((id,))``, and the stream ends with exactly one ``Finished`` (stop, length, or
error naming why). ``submit`` never blocks or raises: a request the engine cannot run
(a run that faulted or stopped, a prompt the request type refuses) gets
``Finished(ERROR, detail)`` at once, and one the run cannot take (no free slot) gets it
from the run. ``cancel`` ends the stream ``Finished(CANCELLED)`` at once and tells the
run, whose mailbox handles it before any later ``submit``, so the slot is free for the
next sequence; unknown and finished ids are fine.

Sampling: ``temperature == 0`` is greedy (the last stage's argmax, bit-exact with a
single-prompt run); otherwise the run asks for candidates and samples them with
``sample_token`` (top_k 40, llama.cpp's default; ``top_p``, ``temperature``; seeded by
(``seed``, step)).

Faults. Runs are fail-stop (spec §36): when the run faults its table ends every live
sequence with the fault in words (FailSequences); the engine then records ``fault``
and sets ``failed``, after which new submissions end at once with that error.
``stop()`` (idempotent) is the operator stop: live sequences end with an error, the run
tears down, and the engine releases its endpoints, actor runtime and QUIC endpoint;
it returns the run's ``RunResult`` (teardown Clean when everything was released).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TextIO

from swactor.actors import Runtime
from swactor.events.emitter import Emitter
from swactor.model.sampling import SamplingPolicy
from swactor.orchestrator.ports import RunFault, RunResult
from swactor.orchestrator.real_ports import NetworkRunPorts
from swactor.orchestrator.run import (
    RunHandle,
    Serving,
    SubmitSequence,
    describe_fault,
    start_run,
)
from swactor.orchestrator.serving import SAMPLED_TOP_K, SequenceRequest
from swactor.orchestrator.session import (
    TOKEN_ARENA_BYTES,
    Pool,
    SessionError,
    SessionOptions,
    StageProgress,
    StreamingPorts,
    plan_for,
)
from swactor.serve.engine import (
    Finished,
    FinishReason,
    Health,
    HealthState,
    SamplingParams,
    SequenceEvent,
    Started,
    Tokens,
)
from swactor.transport.run_control import StageReadyReport
from swactor.wire import NodeId, RunFaultError, RunId, RunPlan
from swactor.wire.codec import WireStruct

if TYPE_CHECKING:
    from swactor.model.tokenizer import Tokenizer
    from swactor.orchestrator.planner import PlannedRun

log = logging.getLogger("swactor.serve.pipeline")

DEFAULT_SLOTS = 4
"""KV slots of a serving run (`--slots`): sequences in flight at once."""

Watch = Callable[[RunHandle], Awaitable[None]]
"""Runs beside the run until it ends (membership: it tells the run MembershipLost)."""


class RunStream:
    """One submitted sequence's events (a :class:`~swactor.serve.engine.SequenceStream`)
    and the run's sink for them (a :class:`~swactor.orchestrator.serving.SequenceSink`):
    every event is queued; the first ``Finished`` is the last."""

    def __init__(self, sequence_id: int, on_end: Callable[[int], None]) -> None:
        self._id = sequence_id
        self._queue: asyncio.Queue[SequenceEvent] = asyncio.Queue()
        self._on_end = on_end
        self.ended = False

    @property
    def sequence_id(self) -> int:
        return self._id

    # -- the run's side (SequenceSink) ----------------------------------------------

    def started(self) -> None:
        if not self.ended:
            self._queue.put_nowait(Started())

    def tokens(self, ids: tuple[int, ...]) -> None:
        if not self.ended:
            self._queue.put_nowait(Tokens(ids))

    def finished(self, reason: str, detail: str) -> None:
        if self.ended:
            return
        self.ended = True
        self._queue.put_nowait(Finished(FinishReason(reason), detail))
        self._on_end(self._id)

    # -- the front's side (SequenceStream) --------------------------------------------

    def __aiter__(self) -> AsyncIterator[SequenceEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SequenceEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, Finished):
                return


def sampling_policy(params: SamplingParams) -> SamplingPolicy:
    """The run's policy for `params`: greedy at temperature 0, else sampled from the
    candidates with top_k 40 (llama.cpp's default)."""
    if params.temperature == 0.0:
        return SamplingPolicy.greedy()
    return SamplingPolicy.sample(temperature=params.temperature, top_k=SAMPLED_TOP_K,
                                 top_p=params.top_p, seed=params.seed)


class _ServingPorts(StreamingPorts):
    """`StreamingPorts` that also keep what each stage's ready report says of its role."""

    reused: dict[int, bool] | None = None
    """Per stage index, whether its node served the stage with a role it already held
    (the StageReady footprint's `reused`: kept from its last run, or preloaded)."""

    async def on_request(self, peer: int, message: WireStruct) -> WireStruct | None:
        if isinstance(message, StageReadyReport) and message.footprint is not None:
            if self.reused is None:
                self.reused = {}
            self.reused[int(message.stage_index)] = message.footprint.reused
        return await super().on_request(peer, message)


class TeardownPending(SessionError):
    """Greeting nodes that a run which has not ended yet still holds (`NodeHolds`)."""


class NodeHolds:
    """The stage nodes of each run a serving session provisioned, until the run has
    ended, its teardown included. A node sends its reports on its newest link to the
    orchestrator, and greeting it opens a new one: greeting a node for the next run
    while a faulted run's teardown on it is under way would take that node's
    StageStopped from the run being torn down. The serve_session table orders StartRun
    after RunStopped; `check` makes a greeting in the wrong order a `TeardownPending`
    error naming the run and its nodes, before any node is told anything."""

    def __init__(self) -> None:
        self._held: dict[RunId, frozenset[NodeId]] = {}
        self.faulted: frozenset[NodeId] = frozenset()
        """Nodes a run of the session named in its fault (`faulted_node`): the next plan
        avoids them while another node can take their stage (`spares.place`), until
        they leave the pool and join it again (`forget`)."""

    def fault(self, run_nodes: Sequence[NodeId], fault: RunFault) -> None:
        """Record the node `fault` names (`faulted_node`) in `faulted`."""
        node = faulted_node(run_nodes, fault)
        if node is not None:
            self.faulted |= {node}

    def forget(self, node: NodeId) -> None:
        """`node` left the pool and joined it again (the serve_session table's
        ForgetFault): plans no longer avoid it."""
        self.faulted -= {node}

    def hold(self, run_id: RunId, nodes: Iterable[NodeId],
             ended: asyncio.Future[RunResult]) -> None:
        """`run_id` holds `nodes` until `ended` (the run's result) is done."""
        self._held[run_id] = frozenset(nodes)
        ended.add_done_callback(lambda _: self.release(run_id))

    def release(self, run_id: RunId) -> None:
        """`run_id` holds no node any more (its engine released everything)."""
        self._held.pop(run_id, None)

    def check(self, nodes: Iterable[NodeId]) -> None:
        """Raise `TeardownPending` when a run that has not ended holds one of `nodes`."""
        wanted = frozenset(nodes)
        for run_id, held in self._held.items():
            busy = sorted(int(node) for node in held & wanted)
            if busy:
                names = ", ".join(f"{node:016x}" for node in busy)
                raise TeardownPending(
                    f"run {int(run_id)} has not ended on node(s) {names}: greeting them "
                    "before its teardown ends would take their StageStopped from it (a "
                    "node reports on its newest orchestrator link)")


def faulted_node(run_nodes: Sequence[NodeId], fault: RunFault) -> NodeId | None:
    """The node a run fault names: its node, else the node of its stage (`run_nodes`, in
    stage order); None when it names neither (an edge, the orchestrator)."""
    if fault.node_id is not None:
        return NodeId(fault.node_id)
    if fault.stage_index is not None and 0 <= int(fault.stage_index) < len(run_nodes):
        return run_nodes[int(fault.stage_index)]
    return None


class PreparedRunSpent(SessionError):
    """A prepared run was opened or closed already: it is provisioned at most once."""


@dataclass(frozen=True, slots=True)
class RunPreparation:
    """What `RunEngine.prepare` made: the run's plan, its pool endpoint (open, no node
    greeted yet) and the settings of the engine to be."""

    options: SessionOptions
    planned: PlannedRun
    pool: Pool
    tokenizer: Tokenizer
    slots: int
    batch_rows: int | None
    emitter: Emitter
    progress: TextIO | None
    holds: NodeHolds
    """The session's runs that have not ended, and their nodes (greeted only once free)."""
    objects_in_flight: int | None = None
    """Objects in flight before decode rows wait for the next batch (None: the run's
    default, `Serving.max_in_flight`)."""


class PreparedEngine:
    """A serving run planned and its pool endpoint open, no node told anything yet
    (`RunEngine.prepare`). It owns its `RunPreparation` until `take()` hands it over,
    once: `open()` hands it to `RunEngine.open`, which greets the nodes and provisions
    the run; `close()` releases it unopened. Opening it again raises `PreparedRunSpent`
    (the preparation went with the first `take()`), so one prepared run is never
    provisioned twice."""

    def __init__(self, preparation: RunPreparation, engine: type[RunEngine]) -> None:
        self._preparation: RunPreparation | None = preparation
        self._engine = engine

    def take(self) -> RunPreparation:
        """The preparation, which the caller now owns (it must open or close its pool);
        `PreparedRunSpent` when it was taken or closed already."""
        preparation, self._preparation = self._preparation, None
        if preparation is None:
            raise PreparedRunSpent("this prepared run was opened or closed already")
        return preparation

    async def open(self, watch: Watch | None = None) -> RunEngine:
        """`RunEngine.open(self, watch)`: the engine once its run serves."""
        return await self._engine.open(self, watch)

    async def close(self) -> None:
        """Release the unopened run's pool endpoint (idempotent; nothing once opened)."""
        preparation, self._preparation = self._preparation, None
        if preparation is not None:
            await preparation.pool.close()


class RunEngine:
    """An engine over one warm serving run (module doc)."""

    def __init__(self, plan: RunPlan, slots: int, tokenizer: Tokenizer, pool: Pool,
                 runtime: Runtime, ports: NetworkRunPorts, *,
                 batch_rows: int | None = 1, holds: NodeHolds | None = None,
                 objects_in_flight: int | None = None) -> None:
        self.plan = plan
        self._slots = slots
        self._batch_rows = batch_rows
        """Decode rows per batch object (`--batch-rows`, default 1: every decode step
        its own object; None: the slots)."""
        self._objects_in_flight = objects_in_flight
        """Objects in flight before decode rows wait for the next batch
        (`--objects-in-flight`; None: `Serving.max_in_flight`'s default)."""
        self._holds = holds if holds is not None else NodeHolds()
        self._tokenizer = tokenizer
        self._pool = pool
        self._runtime = runtime
        self._ports = ports
        self._handle: RunHandle | None = None
        self._streams: dict[int, RunStream] = {}
        self._ids = itertools.count(1)
        self._failed = asyncio.Event()
        self._fault: str | None = None
        self._stopping = False
        self._stop_task: asyncio.Task[RunResult] | None = None
        self._watchers: list[asyncio.Future[None]] = []
        self.placement = ""
        """How the command placed this run's stages, in words (set by its starter)."""

    # -- starting ---------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        options: SessionOptions,
        *,
        slots: int = DEFAULT_SLOTS,
        batch_rows: int | None = 1,
        objects_in_flight: int | None = None,
        emitter: Emitter | None = None,
        progress: TextIO | None = None,
        watch: Watch | None = None,
    ) -> RunEngine:
        """Provision a serving run over `options.nodes` and return once it serves
        (module doc); `watch(handle)` runs beside the run (membership: it tells the run
        MembershipLost) until it ends. Decode steps of up to `batch_rows` sequences
        travel as one batch object (1: each its own object; None: `slots`), with at most
        `objects_in_flight` objects in flight (None: `Serving`'s default); the stages
        build the batched kernels of sizes 2..`options.warm_batch_rows` while they load.
        Raises `SessionError` naming why it cannot; cancelled, it tears down what it
        provisioned and re-raises. `prepare` then `open`."""
        prepared = await cls.prepare(options, slots=slots, batch_rows=batch_rows,
                                     objects_in_flight=objects_in_flight,
                                     emitter=emitter, progress=progress)
        return await prepared.open(watch)

    @classmethod
    async def prepare(
        cls,
        options: SessionOptions,
        *,
        slots: int = DEFAULT_SLOTS,
        batch_rows: int | None = None,
        objects_in_flight: int | None = None,
        emitter: Emitter | None = None,
        progress: TextIO | None = None,
        holds: NodeHolds | None = None,
    ) -> PreparedEngine:
        """`start`'s first half: plan the run and open its pool endpoint, telling no
        node anything (the greeting is `open()`'s: it opens this endpoint's links to
        the nodes, and a node still stopping an earlier run sends its StageStopped on
        its newest link to the orchestrator). Raises `SessionError` naming why not. A
        serving session prepares the next run while the faulted one tears down, and
        shares `holds` among its runs so that none greets a node another has not
        released."""
        from swactor.model.tokenizer import Tokenizer

        if not options.nodes:
            raise SessionError("the pool is empty: name at least one node")
        try:
            tokenizer = Tokenizer.from_gguf(options.model)
        except Exception as error:
            raise SessionError(f"tokenizer of {options.model}: {error}") from None
        run_id = RunId(options.run_id if options.run_id is not None
                       else secrets.randbits(62) + 1)
        placeholder = (tokenizer.bos_id or 0,)  # a serving plan's prompt: never injected
        planned, offered = plan_for(replace(options, max_tokens=1, slots=slots), run_id,
                                    placeholder,
                                    with_stop_ids=True, serving=True)
        pool = await Pool.open(options, run_id, offered)
        return PreparedEngine(
            RunPreparation(options, planned, pool, tokenizer, slots, batch_rows,
                           emitter or Emitter("orchestrator", []), progress,
                           holds if holds is not None else NodeHolds(),
                           objects_in_flight), cls)

    @classmethod
    async def open(cls, prepared: PreparedEngine, watch: Watch | None = None) -> RunEngine:
        """`start`'s second half: take `prepared`'s preparation, greet its nodes,
        provision the run and return the engine once it serves (module doc). Raises
        `PreparedRunSpent` when `prepared` was opened or closed already,
        `TeardownPending` when a run that has not ended holds one of its nodes (before
        any greeting), `SessionError` naming why the run cannot serve; it releases
        everything when it raises."""
        preparation = prepared.take()
        try:
            preparation.holds.check(member.node_id for member in preparation.options.nodes)
        except TeardownPending:
            await preparation.pool.close()
            raise
        engine = await cls._greeted(preparation)
        await engine._provision(preparation.planned.stop_token_ids, preparation.options,
                                watch)  # releases everything if it fails
        return engine

    @classmethod
    async def _greeted(cls, prepared: RunPreparation) -> RunEngine:
        """Greet the prepared run's pool and make its runtime and token ports; releases
        the pool (and what it made) if that fails."""
        options, pool, planned = prepared.options, prepared.pool, prepared.planned
        plan, slots, progress = planned.plan, prepared.slots, prepared.progress
        runtime: Runtime | None = None
        ports: _ServingPorts | None = None
        try:
            await pool.greet(prepared.emitter)
            if progress is not None:
                progress.write(f"[swactor] pool ready: {len(options.nodes)} nodes; loading "
                               f"{len(plan.stages)} stages ({slots} slots)\n")
                progress.flush()
            me = NodeId(options.identity.node_id)
            runtime = Runtime(f"orchestrator-{int(me):x}")
            try:
                ports = _ServingPorts(pool.control, runtime, pool.endpoint,
                                      pool.network.driver, prepared.emitter, plan.run_id, me,
                                      TOKEN_ARENA_BYTES)
            except RunFaultError as error:
                raise SessionError(f"token endpoints: {error}") from None
            if progress is not None:
                ports.on_stage = StageProgress(progress, planned.stage_memory, len(plan.stages))
            pool.holder.append(ports)
            engine = cls(plan, slots, prepared.tokenizer, pool, runtime, ports,
                         batch_rows=prepared.batch_rows, holds=prepared.holds,
                         objects_in_flight=prepared.objects_in_flight)
        except BaseException:
            if ports is not None:
                await ports.close()
            if runtime is not None:
                await runtime.shutdown()
            await pool.close()
            raise
        return engine

    async def _provision(self, stop_token_ids: frozenset[int], options: SessionOptions,
                         watch: Watch | None) -> None:
        serving = asyncio.get_running_loop().create_future()

        def opened() -> None:
            if not serving.done():
                serving.set_result(None)

        handle = start_run(self._runtime, self.plan, self._ports,
                           stop_token_ids=stop_token_ids, timeouts=options.timeouts,
                           serving=Serving(self._slots, opened, self._ended,
                                           on_fault=lambda fault: self._holds.fault(
                                               self.stage_nodes, fault),
                                           max_batch=self._batch_rows,
                                           max_in_flight=self._objects_in_flight,
                                           mixed=options.mixed_steps))
        self._handle = self._ports.handle = handle
        self._holds.hold(self.plan.run_id, self.stage_nodes, handle.future)
        if watch is not None:
            self._watchers.append(asyncio.ensure_future(watch(handle)))
        self._watchers.append(asyncio.create_task(self._watch_result(handle)))
        try:
            await asyncio.wait((serving, handle.future), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while provisioning: tear down what was made
            self._stopping = True
            handle.stop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(handle.future),
                                       options.timeouts.teardown_s + 5)
            await self._release()
            raise
        if not serving.done():
            result = await handle.result()
            await self._release()
            fault = describe_fault(result.fault) if result.fault is not None else (
                f"the run ended {result.outcome.value if result.outcome else 'early'}")
            raise SessionError(f"the serving run did not start: {fault}")

    # -- the Engine protocol ----------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.plan.model.model_id

    @property
    def context_length(self) -> int:
        return self.plan.model.max_seq_len

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def stage_nodes(self) -> tuple[NodeId, ...]:
        """The node of each stage, in stage order."""
        return tuple(NodeId(stage.node_id) for stage in self.plan.stages)

    @property
    def reused_stages(self) -> frozenset[int]:
        """Stages whose node held the role already (no weight load, no kernel build)."""
        reused: dict[int, bool] = getattr(self._ports, "reused", None) or {}
        return frozenset(i for i, hit in reused.items() if hit)

    @property
    def run_id(self) -> int:
        return int(self.plan.run_id)

    @property
    def failed(self) -> asyncio.Event:
        """Set once the run faulted: every in-flight stream has then ended with the fault."""
        return self._failed

    @property
    def fault(self) -> str | None:
        """The run's fault in words (None while it has none)."""
        return self._fault

    def health(self) -> Health:
        if self._fault is not None:
            return Health(HealthState.FAILED, self._fault)
        if self._stopping:
            return Health(HealthState.STOPPING, "the run is stopping")
        return Health(HealthState.SERVING, f"{len(self._streams)}/{self._slots} slots busy")

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> RunStream:
        stream, request = self._admit(prompt, params)
        if request is not None:
            assert self._handle is not None, "a request is admitted only while serving"
            self._handle.submit(stream.sequence_id, request, stream)
        return stream

    def submit_all(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]
                   ) -> list[RunStream]:
        """Submit several sequences together, as `submit` each: the run writes their
        prompts as prompt batches (one object per edge; a stage prefills each prompt as
        alone), which a serving session uses for the streams it migrates to this run
        after a fault."""
        streams: list[RunStream] = []
        together: list[SubmitSequence] = []
        for prompt, params in requests:
            stream, request = self._admit(prompt, params)
            streams.append(stream)
            if request is not None:
                together.append(SubmitSequence(stream.sequence_id, request, stream))
        if together:
            assert self._handle is not None, "a request is admitted only while serving"
            self._handle.submit_all(tuple(together))
        return streams

    def _admit(self, prompt: Sequence[int], params: SamplingParams
               ) -> tuple[RunStream, SequenceRequest | None]:
        """A new stream and its request; no request when the stream ended at once (the
        run does not serve, or the request is refused)."""
        stream = RunStream(next(self._ids), self._forget)
        handle = self._handle
        if handle is None or handle.future.done() or self._fault is not None or self._stopping:
            stream.finished("error", self._fault or "the run is not serving")
            return stream, None
        try:
            request = SequenceRequest(tuple(int(t) for t in prompt), params.max_tokens,
                                      sampling_policy(params), params.first_step)
        except (ValueError, TypeError) as error:
            stream.finished("error", f"bad request: {error}")
            return stream, None
        self._streams[stream.sequence_id] = stream
        return stream, request

    def cancel(self, sequence_id: int) -> None:
        stream = self._streams.get(sequence_id)
        if stream is None or self._handle is None:
            return
        stream.finished("cancelled", "")
        self._handle.cancel(sequence_id)

    # -- ending -----------------------------------------------------------------------

    async def stop(self) -> RunResult:
        """Operator stop and clean teardown (idempotent): the run's result."""
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._stop())
        return await asyncio.shield(self._stop_task)

    async def _stop(self) -> RunResult:
        self._stopping = True
        handle = self._handle
        assert handle is not None, "a started engine has its run"
        if not handle.future.done():
            handle.stop()
        try:
            result = await handle.result()
        finally:
            self._end_all("the run was stopped")
            await self._release()
        return result

    async def _release(self) -> None:
        for task in self._watchers:
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*(t for t in self._watchers if t is not asyncio.current_task()),
                             return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._ports.close()
        await self._runtime.shutdown()
        await self._pool.close()
        self._holds.release(self.plan.run_id)  # a run whose actor died without a result

    def _ended(self, fault: str | None) -> None:
        """The run's FailSequences: every live sequence ended (fault None: a stop)."""
        if fault is not None and self._fault is None:
            self._fault = fault
            self._failed.set()

    async def _watch_result(self, handle: RunHandle) -> None:
        """Safety net: however the run ends, no stream outlives it."""
        try:
            result = await handle.result()
            reason = describe_fault(result.fault) if result.fault is not None else None
        except Exception as error:  # the actor stopped without a result
            log.error("serving run %d: %s", int(handle.run_id), error)
            reason = f"the run stopped unexpectedly: {error}"
        self._ended(reason)
        self._end_all(reason or "the run ended")

    def _end_all(self, detail: str) -> None:
        for stream in list(self._streams.values()):
            stream.finished("error", detail)

    def _forget(self, sequence_id: int) -> None:
        self._streams.pop(sequence_id, None)
