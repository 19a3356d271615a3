"""``ServeSession``: the serving session, an :class:`~swactor.serve.engine.Engine` over a
sequence of fail-stop runs (binding of ``fsm/serve_session.yaml``).

Theory of operation. The HTTP front talks to one engine for the server's whole life; a
run does not live that long: spec §36 makes every run fail-stop. The session is the
engine the front holds. It forwards each sequence to the current run (a
:class:`RunEngine`: an engine over one warm run, with a ``failed`` event, its ``fault``
in words and ``stop()``), and when that run faults it tears it down and provisions a
new one through ``starter``, the command's coroutine that re-plans on the pool's live
nodes each time it is called. Which of these happens when is the ``serve_session``
table's decision; this module is its binding: a ledger (the current run, the
provisioning task, the held sequences, the attempts of this recovery, the restarts) and
one method per effect, hosted by :class:`~swactor.fsm.host.MachineHost` (every effect
returns at once; slow work, provisioning and stopping, runs in a task that feeds the
table its outcome).

Sequences. ``submit`` gives each sequence a session id (a run's own ids restart with
each run) and feeds ``Submitted``: the table forwards it to the run (Serving), holds it
(while a run is being provisioned or recovered: the front admits at most ``slots``
sequences at once, so at most that many wait here), or refuses it (stopping). A held
sequence is forwarded when a run becomes ready, in arrival order, or ended with
``Finished(ERROR, reason)`` when the session stops or fails. A forwarded sequence's
events are the run's, relayed as they come: a run that faults ends them with its
fault (the RunEngine guarantees it), so no stream hangs across a recovery. ``cancel``
is synchronous: a held sequence ends ``CANCELLED`` at once, a forwarded one is
cancelled on the run that has it.

Migration. A stream keeps the tokens it relayed. When its run ends it with an error
and that run has faulted (``failed`` is set), the stream does not pass the error on: it
reports the loss (``SequenceLost``) and waits to be placed again. The table decides
(guards ``context_full``, ``migrations_exhausted``): HoldLost keeps it ahead of the
sequences that arrived later, and ForwardHeld submits it to the next run as prompt +
streamed tokens with ``max_tokens`` reduced by the streamed count (``sequence_migrated``),
so its next tokens follow the last one the client got; every held sequence is
submitted in one ``submit_all``, so the run writes their prompts as prompt batches (one
object per edge for all of them; each stage prefills each prompt as alone, bit for bit,
so each continues exactly); FailLost ends it with the fault
and why it did not move (``sequence_lost``). A second ``Started`` from the new run is
not relayed.

Warm spares. With a ``warmer`` (``swactor.serve.spares``), each run that becomes ready
has its stage roles preloaded on the pool's idle spares (WarmSpares, in a task that
feeds SparesWarmed; CancelWarming stops waiting when the run faults or the session
stops; ``node_joined()``, a node joining the pool while a run serves, warms again).
The warmer and the command's starter share what is warm where: the next plan
puts a warm spare in the lost stage's place (the table's doc). ``report_recovered``
adds the starter's placement words (``placement`` on the new run, when it has them) to
serve_recovery_completed.

Preparing during teardown. With a ``preparer`` (the command's starter split in two:
plan, then greet and provision), PrepareRun starts preparing the next run as soon as a
run faults, beside its teardown (the table's doc), and StartRun provisions what it
prepared instead of calling ``starter``; DiscardPrepared releases it when the session
stops first.

Faulted nodes. The command keeps the nodes its runs' faults named, which its plans
avoid (``swactor.serve.pipeline.NodeHolds.faulted``); ``node_joined()`` feeds
NodeJoined, and ForgetFault (a node that left the pool and joined it again) hands the
node to ``forget_fault``, the command's way to drop it from that set.

Lifetime. ``start()`` begins provisioning the first run (the table's initial state is
Provisioning) and returns the session's health once it serves or has ended; the engine
properties (``model_id``, ``context_length``, ``slots``, ``tokenizer``) are the first
run's and stay the session's. ``request_stop()`` (a signal handler may call it) feeds
OperatorStop; ``wait()`` returns the final health once the session is Stopped or
Failed. ``health()`` maps the table's state onto the front's
:class:`~swactor.serve.engine.HealthState`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Protocol

from swactor.events.emitter import Emitter
from swactor.events.schema import (
    SequenceLost,
    SequenceMigrated,
    ServeFailed,
    ServeRecoveryCompleted,
    ServeRecoveryStarted,
    ServeStarted,
    ServeStopped,
)
from swactor.fsm.generated import serve_session as ss
from swactor.fsm.host import MachineHost
from swactor.serve.engine import (
    Engine,
    Finished,
    FinishReason,
    Health,
    HealthState,
    SamplingParams,
    SequenceEvent,
    SequenceStream,
    Started,
    TextCodec,
    Tokens,
)
from swactor.wire import NodeId, RunId

log = logging.getLogger("swactor.serve.session")

DEFAULT_RESTART_LIMIT = 3
DEFAULT_RETRY_DELAY_S = 2.0

HEALTH: dict[ss.State, HealthState] = {
    ss.State.Provisioning: HealthState.PROVISIONING,
    ss.State.Serving: HealthState.SERVING,
    ss.State.Recovering: HealthState.RECOVERING,
    ss.State.Reprovisioning: HealthState.RECOVERING,
    ss.State.RetryWait: HealthState.RECOVERING,
    ss.State.Stopping: HealthState.STOPPING,
    ss.State.Stopped: HealthState.STOPPED,
    ss.State.Failed: HealthState.FAILED,
}
"""What ``GET /health`` says in each state of the table."""


class RunEngine(Engine, Protocol):
    """An engine over one warm run (``swactor.serve.pipeline.RunEngine`` fits it)."""

    @property
    def failed(self) -> asyncio.Event:
        """Set once the run faulted; its in-flight streams have then ended with the fault."""
        ...

    @property
    def fault(self) -> str | None:
        """The run's fault in words (None while it has none)."""
        ...

    async def stop(self) -> object:
        """Stop the run and tear it down (idempotent); in-flight streams end with an error."""
        ...

    def submit_all(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]
                   ) -> Sequence[SequenceStream]:
        """Submit several sequences together (their prompts travel as prompt batches)."""
        ...


RunStarter = Callable[[], Awaitable[RunEngine]]
"""Plans a run on the pool's live nodes and provisions it; raises naming why it could not."""


class PreparedRun(Protocol):
    """A run planned, no node told of it yet (``RunPreparer``)."""

    async def open(self) -> RunEngine:
        """Greet its nodes and provision it; the run once it serves (raises naming why
        not; releases what it made either way)."""
        ...

    async def close(self) -> None:
        """Release it unopened."""
        ...


RunPreparer = Callable[[], Awaitable[PreparedRun]]
"""A starter's first half: plans a run on the pool's live nodes, telling them nothing yet;
raises naming why it could not. The session calls it while a faulted run tears down."""

SpareWarmer = Callable[[RunEngine], Awaitable[tuple[int, int]]]
"""Preloads `run`'s stage roles on the pool's idle spare nodes; (ready, wanted) roles.
Never raises for a spare that failed (it names it in its own event)."""


def _words(error: BaseException) -> str:
    """An exception as a reason a client may read: its message, else its class."""
    text = str(error).strip()
    return text if text else error.__class__.__name__


def _run_id(engine: object) -> RunId | None:
    value = getattr(engine, "run_id", None)
    return RunId(value) if isinstance(value, int) else None


class _SessionStream:
    """One sequence as the front sees it: held, then forwarded to a run or ended here;
    lost with a faulted run, held and forwarded again as a continuation (module doc)."""

    def __init__(self, sequence_id: int, prompt: tuple[int, ...], params: SamplingParams,
                 done: Callable[[int], None], lost: Callable[[int, str], None]) -> None:
        self._id = sequence_id
        self.prompt = prompt
        self.params = params
        self.run: RunEngine | None = None
        self.streamed: list[int] = []
        """Token ids relayed to the front so far (on every run)."""
        self.migrations = 0
        self.lost_from: RunEngine | None = None
        """The faulted run that lost the sequence, until it is placed again."""
        self.fault = ""
        """That run's fault, in words."""
        self._inner: SequenceStream | None = None
        self._end: Finished | None = None
        self._started = False
        self._placed = asyncio.Event()
        self._done = done
        self._lost = lost

    @property
    def sequence_id(self) -> int:
        return self._id

    @property
    def placed(self) -> bool:
        return self._placed.is_set()

    def request(self) -> tuple[tuple[int, ...], SamplingParams]:
        """What to submit: the prompt, or for a continuation the prompt + the streamed
        tokens with the rest of max_tokens and the sampling step they reached."""
        if not self.streamed:
            return self.prompt, self.params
        return self.prompt + tuple(self.streamed), replace(
            self.params, max_tokens=self.params.max_tokens - len(self.streamed),
            first_step=self.params.first_step + len(self.streamed))

    def forward(self, run: RunEngine, inner: SequenceStream) -> None:
        """Placed on `run`, which runs it as `inner` (`run.submit(*self.request())`)."""
        if self.placed:
            return
        self.run = run
        self._inner = inner
        if self.lost_from is not None:
            self.migrations += 1
            self.lost_from = None
        self._placed.set()

    def end(self, finished: Finished) -> None:
        if not self.placed:
            self._end = finished
            self._placed.set()

    def cancel(self) -> None:
        if self.run is not None and self._inner is not None:
            self.run.cancel(self._inner.sequence_id)
        else:
            self.end(Finished(FinishReason.CANCELLED))

    def _lose(self, run: RunEngine, reason: str) -> None:
        """The faulted `run` ended the sequence: unplace it and let the session decide."""
        self.run, self._inner, self.lost_from, self.fault = None, None, run, reason
        self._placed.clear()
        self._lost(self._id, reason)

    def __aiter__(self) -> AsyncIterator[SequenceEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SequenceEvent]:
        # The session forgets the sequence once its Finished is read. A reader that stops
        # early (the front's handler cancelled: its client went away) must not make it
        # forget: the front then calls cancel(), which has to reach the run, or the
        # sequence would keep its KV slot until it ends by itself.
        while True:
            await self._placed.wait()
            if self._inner is None:
                assert self._end is not None
                self._done(self._id)
                yield self._end
                return
            run = self.run
            async for event in self._inner:
                if isinstance(event, Tokens):
                    self.streamed.extend(event.ids)
                elif isinstance(event, Started):
                    if self._started:
                        continue
                    self._started = True
                elif (event.reason is FinishReason.ERROR and run is not None
                      and run.failed.is_set()):
                    self._lose(run, event.detail)
                    break
                if isinstance(event, Finished):
                    self._done(self._id)
                yield event
                if isinstance(event, Finished):
                    return
            else:
                self._done(self._id)
                yield Finished(FinishReason.ERROR, "the run ended the sequence without a reason")
                return


class _LoopTimers:
    """The table's timers on the running event loop: a fired timer feeds its event."""

    def __init__(self, feed: Callable[[ss.Event], None]) -> None:
        self._feed = feed
        self._handles: dict[str, asyncio.TimerHandle] = {}

    def start(self, name: str, seconds: float, message: ss.Event) -> None:
        self.cancel(name)
        self._handles[name] = asyncio.get_running_loop().call_later(
            seconds, self._fire, name, message)

    def cancel(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, name: str, message: ss.Event) -> None:
        self._handles.pop(name, None)
        self._feed(message)


class ServeSession(ss.ServeSessionEffects[None]):
    """The serving session (module doc): an Engine over a sequence of fail-stop runs."""

    def __init__(
        self,
        starter: RunStarter,
        *,
        node_id: int,
        emitter: Emitter | None = None,
        restart_limit: int = DEFAULT_RESTART_LIMIT,
        retry_delay_s: float = DEFAULT_RETRY_DELAY_S,
        notify: Callable[[str], None] | None = None,
        warmer: SpareWarmer | None = None,
        preparer: RunPreparer | None = None,
        forget_fault: Callable[[NodeId], None] | None = None,
    ) -> None:
        if restart_limit < 1:
            raise ValueError(f"restart_limit must be >= 1, got {restart_limit}")
        if retry_delay_s < 0:
            raise ValueError(f"retry_delay_s must be >= 0, got {retry_delay_s}")
        self._starter = starter
        self._preparer = preparer
        self._prepared: asyncio.Task[PreparedRun] | None = None
        """The next run being prepared beside a teardown (PrepareRun), until StartRun
        takes it or DiscardPrepared drops it."""
        self._warmer = warmer
        self._forget_fault = forget_fault
        self._warmings: set[asyncio.Task[None]] = set()
        self._node_id = NodeId(node_id)
        self._emitter = emitter
        self._notify = notify or (lambda text: log.info("%s", text))
        self._machine = ss.ServeSessionMachine(
            self, restart_limit=restart_limit, retry_delay_s=retry_delay_s)
        self._host = MachineHost(self._machine, ss.bind(self), timers=_LoopTimers(self._feed),
                                 timer_events=ss.TIMER_EVENTS)
        # the ledger
        self._run: RunEngine | None = None
        self._first: RunEngine | None = None
        self._provisioning: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._streams: dict[int, _SessionStream] = {}
        self._held: deque[int] = deque()
        self._ids = itertools.count(1)
        self._attempts = 0
        self._restarts = 0
        self._detail = ""
        self._changed = asyncio.Event()

    # ----------------------------------------------------------------- lifetime

    @property
    def state(self) -> ss.State:
        return self._machine.state

    async def start(self) -> Health:
        """Provision the first run; the health once it serves, or once the session ended
        (Failed with the reason, or Stopped by ``request_stop``)."""
        if self._provisioning is None and self._first is None:
            self._provisioning = self._spawn(self._provision())
        while self.state in (ss.State.Provisioning, ss.State.Stopping):
            await self._wait_change()
        return self.health()

    def node_joined(self, node: NodeId) -> None:
        """`node` joined the pool's usable nodes (the command's LiveNodes): added, or back
        after it left them."""
        if not self._terminal():
            self._feed(ss.NodeJoined(node_id=int(node)))

    def request_stop(self) -> None:
        """The operator stops the session (Ctrl-C, SIGTERM); idempotent."""
        if not self._terminal():
            self._host.feed(ss.OperatorStop())

    async def wait(self) -> Health:
        """The final health, once the session is Stopped or Failed."""
        while not self._terminal():
            await self._wait_change()
        for task in list(self._tasks):
            await asyncio.gather(task, return_exceptions=True)
        return self.health()

    async def stop(self) -> Health:
        """``request_stop()`` then ``wait()``."""
        self.request_stop()
        return await self.wait()

    def _terminal(self) -> bool:
        return self.state in (ss.State.Stopped, ss.State.Failed)

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _feed(self, event: ss.Event) -> None:
        self._host.feed(event)
        self._changed.set()

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------ Engine protocol

    def _warm(self) -> RunEngine:
        if self._first is None:
            raise RuntimeError("the serving session has no run yet (await start() first)")
        return self._first

    @property
    def model_id(self) -> str:
        return self._warm().model_id

    @property
    def context_length(self) -> int:
        return self._warm().context_length

    @property
    def slots(self) -> int:
        return self._warm().slots

    @property
    def tokenizer(self) -> TextCodec:
        return self._warm().tokenizer

    @property
    def restarts(self) -> int:
        return self._restarts

    def health(self) -> Health:
        state = HEALTH[self.state]
        detail = "" if state is HealthState.SERVING else self._detail
        return Health(state, detail, self._restarts)

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> SequenceStream:
        sequence_id = next(self._ids)
        stream = _SessionStream(sequence_id, tuple(prompt), params, self._forget,
                                self._sequence_lost)
        self._streams[sequence_id] = stream
        run = self._run
        if run is not None and run.failed.is_set():
            # the run faulted and its watcher has not run yet: it takes nothing more
            self._feed(ss.RunFaulted(reason=run.fault or "the run faulted"))
        self._feed(ss.Submitted(sequence_id=sequence_id))
        if not stream.placed and sequence_id not in self._held:  # Stopped or Failed
            stream.end(Finished(FinishReason.ERROR, self._detail or "the server is stopped"))
        return stream

    def cancel(self, sequence_id: int) -> None:
        stream = self._streams.pop(sequence_id, None)
        if stream is None:
            return
        if sequence_id in self._held:
            self._held.remove(sequence_id)
        stream.cancel()

    def _forget(self, sequence_id: int) -> None:
        self._streams.pop(sequence_id, None)

    def _sequence_lost(self, sequence_id: int, reason: str) -> None:
        """A stream's faulted run ended it (module doc: Migration)."""
        stream = self._streams.get(sequence_id)
        if stream is None:
            return
        run = self._run
        if run is not None and run is stream.lost_from:
            # the run faulted and its watcher has not run yet: the fault comes first
            self._feed(ss.RunFaulted(reason=run.fault or reason))
        self._feed(ss.SequenceLost(sequence_id=sequence_id, reason=reason))
        if not stream.placed and sequence_id not in self._held:  # Stopped or Failed
            self._end_lost(stream, reason, self._detail or "the server stopped")

    # ------------------------------------------------------------------ guards

    def attempts_left(self, event: ss.ProvisionFailed) -> bool:
        return self._attempts < self._machine.restart_limit

    def context_full(self, event: ss.SequenceLost) -> bool:
        stream = self._streams.get(event.sequence_id)
        return stream is not None and (
            len(stream.prompt) + len(stream.streamed) >= self.context_length)

    def migrations_exhausted(self, event: ss.SequenceLost) -> bool:
        stream = self._streams.get(event.sequence_id)
        return stream is not None and stream.migrations >= self._machine.restart_limit

    # ----------------------------------------------------------- effect methods

    def start_run(self) -> None:
        self._attempts += 1
        self._provisioning = self._spawn(self._provision())

    def prepare_run(self) -> None:
        if self._preparer is not None:
            self._discard(self._prepared)
            self._prepared = asyncio.get_running_loop().create_task(
                self._prepare(self._preparer))

    def discard_prepared(self) -> None:
        task, self._prepared = self._prepared, None
        self._discard(task)

    def _discard(self, task: asyncio.Task[PreparedRun] | None) -> None:
        if task is not None:
            self._spawn(self._close_prepared(task))

    def cancel_provision(self) -> None:
        task = self._provisioning
        self._spawn(self._cancel_provision(task))

    def stop_run(self) -> None:
        run, self._run = self._run, None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self._spawn(self._stop(run))

    def forward_sequence(self, sequence_id: int) -> None:
        self._forward([sequence_id])

    def _forward(self, sequence_ids: list[int]) -> None:
        """Submit the sequences to the current run together (their prompts travel as
        prompt batches: one object per edge for all of them)."""
        run = self._run
        streams = [stream for stream in (self._streams.get(i) for i in sequence_ids)
                   if stream is not None and not stream.placed]
        if run is None or not streams:
            return
        inners = run.submit_all([stream.request() for stream in streams])
        for stream, inner in zip(streams, inners, strict=True):
            lost_from = stream.lost_from
            stream.forward(run, inner)
            if lost_from is not None:
                self._notify(f"sequence {stream.sequence_id} continues on the new run after "
                             f"{len(stream.streamed)} streamed tokens")
                self._emit(SequenceMigrated(
                    node_id=self._node_id, run_id=_run_id(run),
                    detail={"sequence_id": stream.sequence_id, "from_run": _run_id(lost_from),
                            "prompt_tokens": len(stream.prompt),
                            "streamed_tokens": len(stream.streamed),
                            "migrations": stream.migrations}))

    def warm_spares(self) -> None:
        run = self._run
        if self._warmer is not None and run is not None:
            # a second warming (a spare joined) skips the roles warm or under way already
            task = self._spawn(self._preload_spares(self._warmer, run))
            self._warmings.add(task)
            task.add_done_callback(self._warmings.discard)

    def forget_fault(self, node_id: int) -> None:
        if self._forget_fault is not None:
            self._forget_fault(NodeId(node_id))

    def cancel_warming(self) -> None:
        for task in list(self._warmings):
            task.cancel()

    def report_spares_warmed(self, ready: int, wanted: int) -> None:
        self._notify(f"{ready} of {wanted} stage role(s) preloaded on spare node(s)")

    def hold_sequence(self, sequence_id: int) -> None:
        self._held.append(sequence_id)

    def refuse_sequence(self, sequence_id: int, reason: str) -> None:
        stream = self._streams.get(sequence_id)
        if stream is not None:
            stream.end(Finished(FinishReason.ERROR, reason))

    def hold_lost(self, sequence_id: int) -> None:
        # ahead of later arrivals: session ids follow arrival order
        self._held = deque(sorted((*self._held, sequence_id)))

    def fail_lost(self, sequence_id: int, reason: str, why: str) -> None:
        stream = self._streams.get(sequence_id)
        if stream is not None:
            self._end_lost(stream, reason, why)

    def _end_lost(self, stream: _SessionStream, reason: str, why: str) -> None:
        why = why.replace("restart_limit", str(self._machine.restart_limit))
        self._emit(SequenceLost(
            node_id=self._node_id, run_id=_run_id(stream.lost_from),
            detail={"sequence_id": stream.sequence_id, "reason": reason, "why": why,
                    "streamed_tokens": len(stream.streamed)}))
        stream.end(Finished(FinishReason.ERROR, f"{reason}; not migrated: {why}"))

    def forward_held(self) -> None:
        held = list(self._held)
        self._held.clear()
        self._forward(held)

    def end_held(self, reason: str) -> None:
        while self._held:
            sequence_id = self._held.popleft()
            stream = self._streams.get(sequence_id)
            if stream is not None and stream.lost_from is not None:  # a lost one says so
                self._end_lost(stream, stream.fault, reason)
            else:
                self.refuse_sequence(sequence_id, reason)

    def report_serving(self) -> None:
        self._detail = ""
        self._emit(ServeStarted(node_id=self._node_id, run_id=_run_id(self._run),
                                detail={"slots": self.slots}))

    def report_recovery_started(self, reason: str) -> None:
        self._attempts = 0
        self._detail = f"provisioning a new run after a fault ({reason})"
        self._notify(f"fault ({reason}); provisioning a new run on the live nodes")
        self._emit(ServeRecoveryStarted(node_id=self._node_id, run_id=_run_id(self._run),
                                        detail={"reason": reason}))

    def report_attempt_failed(self, reason: str) -> None:
        self._detail = (f"provisioning attempt {self._attempts} of "
                        f"{self._machine.restart_limit} failed ({reason}); retrying")
        self._notify(self._detail)

    def report_recovered(self) -> None:
        self._restarts += 1
        self._attempts = 0
        self._detail = ""
        placement = getattr(self._run, "placement", None)
        words = placement if isinstance(placement, str) else ""
        self._notify(f"serving again (restart {self._restarts})"
                     + (f": {words}" if words else ""))
        self._emit(ServeRecoveryCompleted(node_id=self._node_id, run_id=_run_id(self._run),
                                          detail={"restarts": self._restarts}
                                          | ({"placement": words} if words else {})))

    def report_stopped(self) -> None:
        self._detail = "the server stopped"
        self._emit(ServeStopped(node_id=self._node_id, detail={"restarts": self._restarts}))

    def report_failed(self, reason: str) -> None:
        self._detail = reason
        self._notify(f"giving up: {reason}")
        self._emit(ServeFailed(node_id=self._node_id,
                               detail={"reason": reason, "restarts": self._restarts}))

    # ------------------------------------------------------------- slow work

    async def _provision(self) -> None:
        prepared, self._prepared = self._prepared, None
        try:
            run = await (self._starter() if prepared is None else self._open(prepared))
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._feed(ss.ProvisionFailed(reason=_words(error)))
            return
        self._run = run
        if self._first is None:
            self._first = run
        self._watcher = self._spawn(self._watch(run))
        self._feed(ss.RunReady())

    async def _prepare(self, preparer: RunPreparer) -> PreparedRun:
        return await preparer()

    async def _open(self, task: asyncio.Task[PreparedRun]) -> RunEngine:
        """Provision the run PrepareRun made (its preparation's error is this attempt's)."""
        try:
            prepared = await asyncio.shield(task)
        except asyncio.CancelledError:  # stop preparing, or release what it made
            await self._close_prepared(task)
            raise
        return await prepared.open()

    async def _close_prepared(self, task: asyncio.Task[PreparedRun]) -> None:
        """Stop preparing, or release what the preparation made."""
        task.cancel()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        if not isinstance(outcome, BaseException):
            try:
                await outcome.close()
            except Exception:
                log.exception("serve session: releasing a prepared run failed")

    async def _preload_spares(self, warmer: SpareWarmer, run: RunEngine) -> None:
        try:
            ready, wanted = await warmer(run)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("serve session: warming the spares failed")
            return
        if run is self._run and wanted:
            self._feed(ss.SparesWarmed(ready=ready, wanted=wanted))

    async def _watch(self, run: RunEngine) -> None:
        await run.failed.wait()
        if run is self._run:
            self._feed(ss.RunFaulted(reason=run.fault or "the run faulted"))

    async def _cancel_provision(self, task: asyncio.Task[None] | None) -> None:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        run, self._run = self._run, None  # a provisioning that finished regardless
        if self._watcher is not None:
            self._watcher.cancel()
        if run is not None:
            await self._stop_quietly(run)
        self._feed(ss.RunStopped())

    async def _stop(self, run: RunEngine | None) -> None:
        if run is not None:
            await self._stop_quietly(run)
        self._feed(ss.RunStopped())

    async def _stop_quietly(self, run: RunEngine) -> None:
        try:
            await run.stop()
        except Exception:
            log.exception("serve session: stopping the run failed")

    def _emit(self, event: ServeStarted | ServeRecoveryStarted | ServeRecoveryCompleted
              | ServeStopped | ServeFailed | SequenceMigrated | SequenceLost) -> None:
        if self._emitter is not None:
            self._emitter.emit(event)
