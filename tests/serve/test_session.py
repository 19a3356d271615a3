"""ServeSession, the serve_session table's binding, against a FAKE RunEngine.

A component-level test: ``FakeRun`` stands in for one warm run (``swactor.serve.pipeline``'s
RunEngine) and ``Starter`` for the command's re-planning provisioner, each scripted by the
test, so every path of the table (hold, forward, fault, recovery, restart limit, operator
stop at each point) is driven deterministically. The end-to-end tests with real nodes are
``tests/serve/test_e2e_*.py``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field

import pytest

from swactor.events.emitter import Emitter
from swactor.events.names import EventName
from swactor.events.sinks import MemorySink
from swactor.fsm.generated import serve_session as ss
from swactor.serve.engine import (
    Finished,
    FinishReason,
    Health,
    HealthState,
    SamplingParams,
    SequenceEvent,
    Started,
    TextCodec,
    Tokens,
)
from swactor.serve.session import HEALTH, PreparedRun, RunEngine, ServeSession
from swactor.wire import NodeId

from .fake_engine import FakeCodec

PARAMS = SamplingParams(max_tokens=4)


def in_loop(test: Callable[[], Coroutine[object, object, None]]) -> Callable[[], None]:
    """Run an async test body in a fresh event loop."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(test())

    return run


class FakeRunStream:
    def __init__(self, sequence_id: int) -> None:
        self._id = sequence_id
        self.queue: asyncio.Queue[SequenceEvent] = asyncio.Queue()
        self.ended = False

    @property
    def sequence_id(self) -> int:
        return self._id

    def put(self, event: SequenceEvent) -> None:
        if not self.ended:
            self.ended = isinstance(event, Finished)
            self.queue.put_nowait(event)

    def __aiter__(self) -> AsyncIterator[SequenceEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SequenceEvent]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, Finished):
                return


@dataclass
class FakeRun:
    """One warm run: the test plays its tokens, faults it, and sees what it was asked."""

    name: str
    run_id: int = 7
    submitted: list[tuple[tuple[int, ...], FakeRunStream]] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    together: list[int] = field(default_factory=list)
    """How many sequences each `submit_all` carried."""
    stopped: int = 0
    _failed: asyncio.Event = field(default_factory=asyncio.Event)
    _fault: str | None = None
    _codec: FakeCodec = field(default_factory=FakeCodec)

    model_id = "fake-model"
    context_length = 64
    slots = 2

    @property
    def tokenizer(self) -> TextCodec:
        return self._codec

    def health(self) -> Health:
        return Health(HealthState.SERVING)

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> FakeRunStream:
        stream = FakeRunStream(len(self.submitted) + 100)
        self.submitted.append((tuple(prompt), stream))
        self.params.append(params)
        return stream

    def submit_all(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]
                   ) -> list[FakeRunStream]:
        self.together.append(len(requests))
        return [self.submit(prompt, params) for prompt, params in requests]

    def cancel(self, sequence_id: int) -> None:
        self.cancelled.append(sequence_id)
        for _, stream in self.submitted:
            if stream.sequence_id == sequence_id:
                stream.put(Finished(FinishReason.CANCELLED))

    @property
    def failed(self) -> asyncio.Event:
        return self._failed

    @property
    def fault(self) -> str | None:
        return self._fault

    def fail(self, reason: str) -> None:
        """Fail-stop, as the RunEngine does it: in-flight streams end with the fault."""
        self._fault = reason
        for _, stream in self.submitted:
            stream.put(Finished(FinishReason.ERROR, reason))
        self._failed.set()

    async def stop(self) -> None:
        self.stopped += 1
        for _, stream in self.submitted:
            stream.put(Finished(FinishReason.ERROR, "the run was stopped"))


class Starter:
    """The command's provisioner: each call takes the next scripted outcome; a Future
    outcome keeps the call waiting until the test resolves it."""

    def __init__(self, *outcomes: FakeRun | Exception | asyncio.Future[FakeRun]) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.cancelled = 0

    async def __call__(self) -> RunEngine:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, asyncio.Future):
            try:
                return await outcome
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return outcome


def session(starter: Starter, **kwargs: object) -> tuple[ServeSession, MemorySink]:
    sink = MemorySink()
    options: dict[str, object] = {"restart_limit": 2, "retry_delay_s": 0.0, **kwargs}
    return ServeSession(starter, node_id=5, emitter=Emitter("orchestrator", [sink]),
                        **options), sink  # type: ignore[arg-type]


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Yield to the loop until `predicate()` holds (bounded, so a broken path fails)."""
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def collect(stream: AsyncIterable[SequenceEvent]) -> list[SequenceEvent]:
    events: list[SequenceEvent] = []
    async with asyncio.timeout(5):
        async for event in stream:
            events.append(event)
    return events


async def collect_into(stream: AsyncIterable[SequenceEvent],
                       events: list[SequenceEvent]) -> None:
    async with asyncio.timeout(5):
        async for event in stream:
            events.append(event)


def names(sink: MemorySink) -> list[str]:
    return [e.name.value for e in sink.events]


@in_loop
async def test_serves_through_the_first_run_and_relays_its_events() -> None:
    run = FakeRun("a")
    serve, sink = session(Starter(run))
    health = await serve.start()
    assert health == Health(HealthState.SERVING, "", 0)
    assert (serve.model_id, serve.context_length, serve.slots) == ("fake-model", 64, 2)
    stream = serve.submit([1, 2, 3], PARAMS)
    assert run.submitted[0][0] == (1, 2, 3)
    inner = run.submitted[0][1]
    inner.put(Tokens((9,)))
    inner.put(Finished(FinishReason.LENGTH))
    assert await collect(stream) == [Tokens((9,)), Finished(FinishReason.LENGTH)]
    assert names(sink) == [EventName.serve_started.value]
    assert sink.events[0].event.run_id == 7
    await serve.stop()


@in_loop
async def test_a_fault_migrates_in_flight_streams_then_a_new_run_serves_held_requests() -> None:
    first, second = FakeRun("a"), FakeRun("b", run_id=8)
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    serve, sink = session(Starter(first, provisioning))
    await serve.start()
    in_flight = serve.submit([1], PARAMS)
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(in_flight, events))
    first.submitted[0][1].put(Tokens((9,)))
    first.fail("worker crashed (stage 1)")
    await until(lambda: serve.state is ss.State.Reprovisioning, "the faulted run stopped")
    assert events == [Tokens((9,))]  # the fault is not passed on: the sequence is held
    assert first.stopped == 1
    health = serve.health()
    assert health.state is HealthState.RECOVERING and "worker crashed" in health.detail
    held = [serve.submit([n], PARAMS) for n in (2, 3)]
    assert second.submitted == []
    provisioning.set_result(second)
    await until(lambda: serve.state is ss.State.Serving, "serving again")
    # the migrated continuation first, then the held ones in arrival order
    assert [prompt for prompt, _ in second.submitted] == [(1, 9), (2,), (3,)]
    assert second.together == [3], "one submission: one prompt batch"
    assert [p.max_tokens for p in second.params] == [PARAMS.max_tokens - 1, 4, 4]
    assert serve.health() == Health(HealthState.SERVING, "", 1)
    for _, inner in second.submitted:
        inner.put(Finished(FinishReason.STOP))
    for stream in held:
        assert await collect(stream) == [Finished(FinishReason.STOP)]
    await reader
    assert events == [Tokens((9,)), Finished(FinishReason.STOP)]
    assert names(sink) == ["serve_started", "serve_recovery_started",
                           "serve_recovery_completed", "sequence_migrated"]
    assert sink.events[1].event.detail["reason"] == "worker crashed (stage 1)"
    assert sink.events[2].event.run_id == 8
    migrated = sink.events[3].event
    assert migrated.run_id == 8 and migrated.detail == {
        "sequence_id": in_flight.sequence_id, "from_run": 7, "prompt_tokens": 1,
        "streamed_tokens": 1, "migrations": 1}
    await serve.stop()


@in_loop
async def test_a_submit_after_the_fault_but_before_its_watcher_ran_is_held() -> None:
    first, second = FakeRun("a"), FakeRun("b")
    serve, _ = session(Starter(first, second))
    await serve.start()
    first.fail("stream fault")
    stream = serve.submit([4], PARAMS)  # the watcher task has not run yet
    assert first.submitted == []
    await until(lambda: serve.state is ss.State.Serving and serve.restarts == 1, "recovered")
    assert [prompt for prompt, _ in second.submitted] == [(4,)]
    second.submitted[0][1].put(Finished(FinishReason.STOP))
    assert await collect(stream) == [Finished(FinishReason.STOP)]
    await serve.stop()


@in_loop
async def test_cancel_frees_a_held_sequence_at_once_and_a_forwarded_one_on_its_run() -> None:
    first = FakeRun("a")
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    serve, _ = session(Starter(first, provisioning))
    await serve.start()
    forwarded = serve.submit([1], PARAMS)
    serve.cancel(forwarded.sequence_id)
    assert first.cancelled == [first.submitted[0][1].sequence_id]
    assert await collect(forwarded) == [Finished(FinishReason.CANCELLED)]
    first.fail("boom")
    await until(lambda: serve.state is ss.State.Reprovisioning, "reprovisioning")
    held = serve.submit([2], PARAMS)
    serve.cancel(held.sequence_id)
    serve.cancel(held.sequence_id)  # idempotent
    serve.cancel(12345)  # unknown
    assert await collect(held) == [Finished(FinishReason.CANCELLED)]
    second = FakeRun("b")
    provisioning.set_result(second)
    await until(lambda: serve.state is ss.State.Serving, "serving again")
    assert second.submitted == []  # the cancelled sequence was not forwarded
    await serve.stop()


@in_loop
async def test_a_reader_that_stops_early_still_cancels_on_the_run() -> None:
    """The front's handler is cancelled mid-stream (its client left), then it calls
    cancel(): the run must hear of it, or the sequence keeps its KV slot."""
    run = FakeRun("a")
    serve, _ = session(Starter(run))
    await serve.start()
    stream = serve.submit([1], PARAMS)
    inner = run.submitted[0][1]
    inner.put(Tokens((5,)))
    first = asyncio.Event()

    async def read() -> None:
        async for _ in stream:
            first.set()

    reader = asyncio.create_task(read())
    await first.wait()
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    serve.cancel(stream.sequence_id)
    assert run.cancelled == [inner.sequence_id]
    await serve.stop()


@in_loop
async def test_the_first_provisioning_failing_fails_the_session_with_its_reason() -> None:
    starter = Starter(RuntimeError("plan: 2 nodes but the model has 1 block"))
    serve, sink = session(starter)
    health = await serve.start()
    assert health.state is HealthState.FAILED
    assert health.detail == "plan: 2 nodes but the model has 1 block"
    assert starter.calls == 1  # no retry at start
    late = serve.submit([1], PARAMS)
    assert await collect(late) == [Finished(FinishReason.ERROR, health.detail)]
    assert names(sink) == ["serve_failed"]
    assert (await serve.wait()).state is HealthState.FAILED


@in_loop
async def test_a_recovery_gives_up_after_the_restart_limit() -> None:
    first = FakeRun("a")
    starter = Starter(first, OSError("node 1 did not answer"), OSError("node 1 did not answer"),
                      FakeRun("never"))
    serve, sink = session(starter, restart_limit=2)
    await serve.start()
    first.fail("membership lost")
    held = serve.submit([3], PARAMS)
    health = await serve.wait()
    assert starter.calls == 3  # the first run, then restart_limit attempts
    assert health.state is HealthState.FAILED
    assert health.detail == "node 1 did not answer" and health.restarts == 0
    assert await collect(held) == [Finished(FinishReason.ERROR, "node 1 did not answer")]
    assert names(sink) == ["serve_started", "serve_recovery_started", "serve_failed"]


@in_loop
async def test_a_failed_attempt_is_retried_after_the_delay() -> None:
    first, second = FakeRun("a"), FakeRun("b")
    starter = Starter(first, OSError("node 2 is gone"), second)
    serve, _ = session(starter, restart_limit=3, retry_delay_s=0.05)
    await serve.start()
    first.fail("membership lost")
    await until(lambda: serve.state is ss.State.RetryWait, "waiting to retry")
    health = serve.health()
    assert health.state is HealthState.RECOVERING
    assert "attempt 1 of 3 failed (node 2 is gone)" in health.detail
    async with asyncio.timeout(5):
        while serve.state is not ss.State.Serving:
            await asyncio.sleep(0.01)
    assert starter.calls == 3 and serve.restarts == 1
    await serve.stop()


@pytest.mark.parametrize("state", list(ss.State), ids=lambda state: state.name)
def test_health_names_each_state_of_the_table(state: ss.State) -> None:
    """/health reports the table's state by its own name, except the three states of a
    recovery, which a client sees as one (Recovering)."""
    recovery = {ss.State.Recovering, ss.State.Reprovisioning, ss.State.RetryWait}
    expected = "Recovering" if state in recovery else state.name
    assert HEALTH[state].value == expected


@in_loop
async def test_operator_stop_while_serving_stops_the_run_and_refuses_new_work() -> None:
    run = FakeRun("a")
    serve, sink = session(Starter(run))
    await serve.start()
    in_flight = serve.submit([1], PARAMS)
    serve.request_stop()
    assert serve.health().state is HealthState.STOPPING
    refused = serve.submit([2], PARAMS)
    assert await collect(refused) == [Finished(FinishReason.ERROR, "the server is stopping")]
    health = await serve.wait()
    assert run.stopped == 1
    assert await collect(in_flight) == [Finished(FinishReason.ERROR, "the run was stopped")]
    assert health.state is HealthState.STOPPED and serve.state is ss.State.Stopped
    late = serve.submit([3], PARAMS)
    assert (await collect(late))[-1].reason is FinishReason.ERROR  # type: ignore[union-attr]
    assert names(sink)[-1] == "serve_stopped"
    serve.request_stop()  # idempotent


@in_loop
async def test_operator_stop_while_provisioning_cancels_it() -> None:
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    starter = Starter(provisioning)
    serve, _ = session(starter)
    starting = asyncio.create_task(serve.start())
    await until(lambda: starter.calls == 1, "provisioning started")
    held = serve.submit([1], PARAMS)
    serve.request_stop()
    health = await starting
    assert serve.state is ss.State.Stopped and health.state is HealthState.STOPPED
    assert starter.cancelled == 1
    assert await collect(held) == [Finished(FinishReason.ERROR, "the server is stopping")]


@in_loop
async def test_operator_stop_while_waiting_to_retry_stops_at_once() -> None:
    first = FakeRun("a")
    starter = Starter(first, OSError("no nodes"))
    serve, _ = session(starter, retry_delay_s=60.0)
    await serve.start()
    first.fail("boom")
    await until(lambda: serve.state is ss.State.RetryWait, "waiting to retry")
    held = serve.submit([1], PARAMS)
    health = await serve.stop()
    assert serve.state is ss.State.Stopped and health.state is HealthState.STOPPED
    assert starter.calls == 2  # the 60 s timer was cancelled, no third attempt
    assert await collect(held) == [Finished(FinishReason.ERROR, "the server is stopping")]


@in_loop
async def test_operator_stop_during_the_faulted_runs_teardown_lets_it_finish() -> None:
    gate = asyncio.Event()

    class SlowStop(FakeRun):
        async def stop(self) -> None:
            await gate.wait()
            await super().stop()

    first = SlowStop("a")
    starter = Starter(first, FakeRun("never"))
    serve, _ = session(starter)
    await serve.start()
    first.fail("boom")
    await until(lambda: serve.state is ss.State.Recovering, "recovering")
    serve.request_stop()
    assert serve.health().state is HealthState.STOPPING
    gate.set()
    await serve.wait()
    assert serve.state is ss.State.Stopped and first.stopped == 1
    assert starter.calls == 1  # no new run was provisioned


def test_restart_limit_and_retry_delay_are_checked() -> None:
    with pytest.raises(ValueError, match="restart_limit"):
        ServeSession(Starter(), node_id=1, restart_limit=0)
    with pytest.raises(ValueError, match="retry_delay_s"):
        ServeSession(Starter(), node_id=1, retry_delay_s=-1.0)


@in_loop
async def test_a_migrated_stream_relays_every_token_once_and_one_started() -> None:
    first, second = FakeRun("a"), FakeRun("b", run_id=8)
    serve, _ = session(Starter(first, second))
    await serve.start()
    stream = serve.submit([1, 2], SamplingParams(max_tokens=5))
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(stream, events))
    inner = first.submitted[0][1]
    for event in (Started(), Tokens((10,)), Tokens((11,))):
        inner.put(event)
    await until(lambda: len(events) == 3, "tokens relayed")
    first.fail("stream reset on edge 2")
    await until(lambda: len(second.submitted) == 1, "continued on the new run")
    assert second.submitted[0][0] == (1, 2, 10, 11)
    assert second.params[0] == SamplingParams(max_tokens=3, first_step=2)
    again = second.submitted[0][1]
    for event in (Started(), Tokens((12,)), Tokens((13,)), Finished(FinishReason.STOP)):
        again.put(event)
    await reader
    assert events == [Started(), Tokens((10,)), Tokens((11,)), Tokens((12,)), Tokens((13,)),
                      Finished(FinishReason.STOP)]
    await serve.stop()


@in_loop
async def test_a_lost_sequence_that_fills_the_context_ends_naming_why() -> None:
    first, second = FakeRun("a"), FakeRun("b")
    serve, sink = session(Starter(first, second))
    await serve.start()
    prompt = list(range(1, FakeRun.context_length))  # one position left
    stream = serve.submit(prompt, SamplingParams(max_tokens=1))
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(stream, events))
    first.submitted[0][1].put(Tokens((7,)))
    first.fail("node 3 lost")
    await reader
    assert events == [Tokens((7,)), Finished(
        FinishReason.ERROR, "node 3 lost; not migrated: its prompt and the tokens already "
        "streamed fill the context")]
    await until(lambda: serve.state is ss.State.Serving and serve.restarts == 1, "recovered")
    assert second.submitted == []
    lost = [e.event for e in sink.events if e.name is EventName.sequence_lost]
    assert len(lost) == 1 and lost[0].detail["streamed_tokens"] == 1
    assert lost[0].run_id == 7
    await serve.stop()


@in_loop
async def test_a_sequence_migrated_restart_limit_times_ends_on_the_next_fault() -> None:
    runs = [FakeRun(name, run_id=10 + n) for n, name in enumerate("abc")]
    serve, _ = session(Starter(*runs), restart_limit=2)
    await serve.start()
    stream = serve.submit([1], SamplingParams(max_tokens=9))
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(stream, events))
    for n, run in enumerate(runs):
        await until(lambda run=run: len(run.submitted) == 1, f"placed on run {run.name}")
        assert run.submitted[0][0] == (1, *range(20, 20 + n))
        run.submitted[0][1].put(Tokens((20 + n,)))
        run.fail(f"fault {n}")
    await reader
    assert events[-1] == Finished(
        FinishReason.ERROR, "fault 2; not migrated: it was already migrated 2 times")
    assert events[:-1] == [Tokens((20,)), Tokens((21,)), Tokens((22,))]
    await serve.stop()


@in_loop
async def test_a_sequence_lost_while_the_session_stops_ends_with_the_stop() -> None:
    first = FakeRun("a")
    serve, _ = session(Starter(first, FakeRun("b")))
    await serve.start()
    stream = serve.submit([1], PARAMS)
    serve.request_stop()
    first.fail("node 2 lost")  # its streams end before the stop reached them
    events = await collect(stream)
    assert events == [Finished(FinishReason.ERROR,
                               "node 2 lost; not migrated: the server is stopping")]
    assert (await serve.wait()).state is HealthState.STOPPED


@in_loop
async def test_a_lost_sequence_waits_out_failed_attempts_or_ends_with_the_last() -> None:
    first, third = FakeRun("a"), FakeRun("c", run_id=9)
    starter = Starter(first, OSError("node 2 is gone"), third)
    serve, _ = session(starter, restart_limit=2)
    await serve.start()
    kept = serve.submit([1], PARAMS)
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(kept, events))
    first.submitted[0][1].put(Tokens((5,)))
    first.fail("membership lost")  # the first attempt fails, the second serves
    await until(lambda: len(third.submitted) == 1, "continued after a failed attempt")
    assert third.submitted[0][0] == (1, 5)
    third.submitted[0][1].put(Finished(FinishReason.LENGTH))
    await reader
    assert events == [Tokens((5,)), Finished(FinishReason.LENGTH)]

    lost = serve.submit([2], PARAMS)
    events = []
    reader = asyncio.create_task(collect_into(lost, events))
    third.submitted[1][1].put(Tokens((6,)))
    starter.outcomes = [OSError("node 3 is gone"), OSError("node 3 is gone")]
    third.fail("membership lost again")  # no attempt serves: the session gives up
    await reader
    assert events == [Tokens((6,)), Finished(
        FinishReason.ERROR, "membership lost again; not migrated: node 3 is gone")]
    assert (await serve.wait()).state is HealthState.FAILED


class Warmer:
    """The spare warmer: records each run it was asked to warm; each call waits for the
    test's (ready, wanted) answer."""

    def __init__(self) -> None:
        self.runs: list[RunEngine] = []
        self.answers: list[asyncio.Future[tuple[int, int]]] = []
        self.cancelled = 0

    async def __call__(self, run: RunEngine) -> tuple[int, int]:
        self.runs.append(run)
        answer: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        try:
            return await answer
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


@in_loop
async def test_each_ready_run_has_its_spares_warmed_and_the_outcome_reported() -> None:
    first, second = FakeRun("a"), FakeRun("b", run_id=8)
    second.placement = "stage 1 on spare 0x9, preloaded"  # type: ignore[attr-defined]
    warmer = Warmer()
    notes: list[str] = []
    serve, sink = session(Starter(first, second), warmer=warmer, notify=notes.append)
    await serve.start()
    await until(lambda: warmer.runs == [first], "the first run's spares warmed")
    warmer.answers[0].set_result((3, 3))
    await until(lambda: any("3 of 3 stage role(s)" in n for n in notes), "reported")
    first.fail("MembershipLost")
    await until(lambda: serve.state is ss.State.Serving and serve.restarts == 1, "recovered")
    await until(lambda: warmer.runs == [first, second], "the new run's spares warmed")
    recovered = next(e.event for e in sink.events
                     if e.name is EventName.serve_recovery_completed)
    assert recovered.detail == {"restarts": 1, "placement": "stage 1 on spare 0x9, preloaded"}
    async with asyncio.timeout(5):
        await serve.stop()
    assert warmer.cancelled == 1  # the stop cancelled the second warming


@in_loop
async def test_a_fault_cancels_the_warming_and_a_stale_result_is_ignored() -> None:
    first = FakeRun("a")
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    warmer = Warmer()
    notes: list[str] = []
    serve, _ = session(Starter(first, provisioning), warmer=warmer, notify=notes.append)
    await serve.start()
    await until(lambda: len(warmer.answers) == 1, "warming began")
    first.fail("MembershipLost")
    await until(lambda: warmer.cancelled == 1, "the fault cancelled the warming")
    await until(lambda: serve.state is ss.State.Reprovisioning, "reprovisioning")
    serve._feed(ss.SparesWarmed(ready=1, wanted=1))  # a late answer: ignored here
    assert serve.state is ss.State.Reprovisioning
    assert not any("stage role(s) preloaded" in n for n in notes)
    async with asyncio.timeout(5):
        await serve.stop()


@in_loop
async def test_without_a_warmer_no_spare_is_warmed_and_nothing_reported() -> None:
    run = FakeRun("a")
    notes: list[str] = []
    serve, sink = session(Starter(run), notify=notes.append)
    await serve.start()
    await asyncio.sleep(0)
    assert names(sink) == ["serve_started"]
    assert not any("preloaded" in n for n in notes)
    async with asyncio.timeout(5):
        await serve.stop()


@dataclass
class SlowStopRun(FakeRun):
    """A run whose teardown lasts until the test ends it (`end_stop`)."""

    _stop_done: asyncio.Event = field(default_factory=asyncio.Event)

    async def stop(self) -> None:
        await super().stop()
        await self._stop_done.wait()

    def end_stop(self) -> None:
        self._stop_done.set()


class FakePrepared:
    def __init__(self, run: FakeRun, preparer: Preparer) -> None:
        self.run = run
        self.preparer = preparer

    async def open(self) -> RunEngine:
        self.preparer.opened.append(self.run.name)
        return self.run

    async def close(self) -> None:
        self.preparer.closed.append(self.run.name)


class Preparer:
    """The command's preparer (plan and greet): each call takes the next outcome."""

    def __init__(self, *outcomes: FakeRun | Exception) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.opened: list[str] = []
        self.closed: list[str] = []

    async def __call__(self) -> PreparedRun:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return FakePrepared(outcome, self)


@in_loop
async def test_the_next_run_is_prepared_while_the_faulted_run_tears_down() -> None:
    first, second = SlowStopRun("a"), FakeRun("b", run_id=8)
    starter, preparer = Starter(first), Preparer(second)
    serve, sink = session(starter, preparer=preparer)
    await serve.start()
    stream = serve.submit([1, 2], PARAMS)
    await until(lambda: len(first.submitted) == 1, "forwarded")
    first.submitted[0][1].put(Tokens((5,)))
    events: list[SequenceEvent] = []
    reader = asyncio.create_task(collect_into(stream, events))
    await until(lambda: len(events) == 1, "a token relayed")
    first.fail("MembershipLost")
    await until(lambda: preparer.calls == 1, "the next run prepared")
    for _ in range(20):
        await asyncio.sleep(0)
    # the faulted run is still tearing down: the prepared run is not provisioned yet
    assert serve.state is ss.State.Recovering and first.stopped == 1
    assert preparer.opened == [] and starter.calls == 1
    first.end_stop()
    await until(lambda: serve.state is ss.State.Serving, "serving again")
    assert preparer.opened == ["b"] and starter.calls == 1  # the prepared run, not a new one
    assert second.submitted == [((1, 2, 5), second.submitted[0][1])]  # migrated onto it
    second.submitted[0][1].put(Finished(FinishReason.LENGTH))
    await reader
    assert "serve_recovery_completed" in names(sink)
    async with asyncio.timeout(5):
        await serve.stop()
    assert preparer.closed == []


@in_loop
async def test_a_failed_preparation_is_a_failed_attempt_and_the_retry_starts_afresh() -> None:
    first, third = FakeRun("a"), FakeRun("c", run_id=9)
    starter, preparer = Starter(first, third), Preparer(OSError("node 2 did not answer"))
    serve, _ = session(starter, preparer=preparer, restart_limit=2)
    await serve.start()
    first.fail("MembershipLost")
    await until(lambda: serve.state is ss.State.Serving and starter.calls == 2,
                "serving on the retry's run")
    assert preparer.calls == 1 and preparer.opened == []
    assert serve.health().restarts == 1
    async with asyncio.timeout(5):
        await serve.stop()


@in_loop
async def test_a_stop_while_tearing_down_releases_the_prepared_run_unopened() -> None:
    first = SlowStopRun("a")
    preparer = Preparer(FakeRun("b", run_id=8))
    serve, _ = session(Starter(first), preparer=preparer)
    await serve.start()
    first.fail("MembershipLost")
    await until(lambda: preparer.calls == 1, "the next run prepared")
    serve.request_stop()
    first.end_stop()
    async with asyncio.timeout(5):
        health = await serve.wait()
    assert health.state is HealthState.STOPPED
    assert preparer.opened == [] and preparer.closed == ["b"]


@in_loop
async def test_a_node_joining_while_serving_is_warmed_and_ignored_while_recovering() -> None:
    first = FakeRun("a")
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    warmer = Warmer()
    serve, _ = session(Starter(first, provisioning), warmer=warmer)
    serve.node_joined(NodeId(9))  # while the first run provisions: its RunReady warms anyway
    await serve.start()
    await until(lambda: len(warmer.runs) == 1, "the ready run warmed")
    serve.node_joined(NodeId(9))
    await until(lambda: warmer.runs == [first, first], "the joined spare warmed")
    assert warmer.cancelled == 0  # the first warming goes on beside the second
    first.fail("MembershipLost")
    await until(lambda: serve.state is ss.State.Reprovisioning, "reprovisioning")
    assert warmer.cancelled == 2  # the fault cancelled both
    serve.node_joined(NodeId(9))
    await asyncio.sleep(0)
    assert len(warmer.runs) == 2
    async with asyncio.timeout(5):
        await serve.stop()


@in_loop
async def test_a_node_that_rejoins_is_forgotten_in_every_state_a_plan_follows() -> None:
    first = SlowStopRun("a")
    provisioning: asyncio.Future[FakeRun] = asyncio.get_running_loop().create_future()
    forgotten: list[int] = []
    serve, _ = session(Starter(first, provisioning), retry_delay_s=60.0,
                       forget_fault=lambda node: forgotten.append(int(node)))
    serve.node_joined(NodeId(1))  # Provisioning: no run has faulted yet
    await serve.start()
    serve.node_joined(NodeId(2))  # Serving
    first.fail("MembershipLost")
    await until(lambda: serve.state is ss.State.Recovering, "recovering")
    serve.node_joined(NodeId(3))  # Recovering: the next plan is still to come
    first.end_stop()
    await until(lambda: serve.state is ss.State.Reprovisioning, "reprovisioning")
    serve.node_joined(NodeId(4))
    provisioning.set_exception(OSError("node 4 did not answer"))
    await until(lambda: serve.state is ss.State.RetryWait, "waiting to retry")
    serve.node_joined(NodeId(5))
    assert forgotten == [2, 3, 4, 5]
    async with asyncio.timeout(5):
        await serve.stop()
    serve.node_joined(NodeId(6))  # Stopped: nothing
    assert forgotten == [2, 3, 4, 5]


@in_loop
async def test_a_faulted_node_that_left_and_rejoined_the_pool_is_planned_again() -> None:
    from swactor.membership import BootHealth, MemberChanged, MemberMeta, MemberState
    from swactor.orchestrator.ports import RunFault
    from swactor.orchestrator.session import PoolMember
    from swactor.serve.pipeline import NodeHolds
    from swactor.serve.serve_cmd import LiveNodes
    from swactor.wire.enums import Component, RunFaultReason

    def change(node: int, state: MemberState) -> MemberChanged:
        meta = MemberMeta(swim_host="127.0.0.1", swim_port=7946, quic_host="127.0.0.1",
                          quic_port=7400 + node, boot_health=BootHealth.Available,
                          role="node")
        return MemberChanged(NodeId(node), state, 2, meta, 0.0)

    a, b, c, d = (NodeId(n) for n in (1, 2, 3, 4))
    live = LiveNodes(tuple(PoolMember(n, "127.0.0.1", 7400 + int(n)) for n in (a, b, c, d)),
                     count=3)
    live.previous = (a, b, c)
    holds = NodeHolds()  # serve_pool's wiring: the session forgets in the plans' ledger
    serve, _ = session(Starter(FakeRun("a")), forget_fault=holds.forget)
    live.on_join = serve.node_joined
    await serve.start()
    # b's worker crashed and faulted a run: the next plan gives its stage to idle d
    holds.fault((a, b, c), RunFault(RunFaultReason.WorkerCrashed, Component.Orchestrator,
                                    node_id=b))
    assert [m.node_id for m in live.place({}, holds.faulted)[0]] == [a, d, c]
    live.observe(change(2, MemberState.Alive))  # refuted a suspicion: still the same node
    assert holds.faulted == frozenset({b})
    live.observe(change(2, MemberState.Dead))
    live.observe(change(2, MemberState.Alive))  # restarted: a new process joined the pool
    assert holds.faulted == frozenset()
    assert [m.node_id for m in live.place({}, holds.faulted)[0]] == [a, b, c]
    async with asyncio.timeout(5):
        await serve.stop()
