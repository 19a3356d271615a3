"""RunEngine's Engine contract over a serving run driven through fake ports.

The run actor, its tables and the engine's streams are real; the ports (control
channel, token rings) are tests/orchestrator/fake_ports.py, and the stages' reports and
outputs are played into the run as in tests/orchestrator/test_serving.py. The real
pipeline is tests/e2e/test_run_engine_e2e.py.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable

import pytest

from swactor.actors import Runtime
from swactor.events.emitter import Emitter
from swactor.fsm.generated import orchestrator_run as orun
from swactor.orchestrator.ports import RunResult
from swactor.orchestrator.session import PoolMember, SessionError
from swactor.serve.engine import (
    Finished,
    FinishReason,
    HealthState,
    SamplingParams,
    SequenceEvent,
    Started,
    Tokens,
)
from swactor.serve.pipeline import (
    NodeHolds,
    PreparedEngine,
    PreparedRunSpent,
    RunEngine,
    RunPreparation,
    RunStream,
    TeardownPending,
    sampling_policy,
)
from swactor.wire import (
    Component,
    NodeId,
    RunFaultReason,
    RunOutcome,
    StageIndex,
    TeardownOutcome,
)
from tests.orchestrator.fake_ports import FakePorts
from tests.orchestrator.test_run import EOS, SLOW, make_plan, make_ready, stop_all
from tests.orchestrator.test_serving import out, tag
from tests.trace_check import assert_tables_allow

GREEDY = SamplingParams(max_tokens=8)


class _Pool:
    closed = 0

    async def close(self) -> None:
        self.closed += 1


class _Unreachable(_Pool):
    """A pool whose greeting no node answers (it counts the greetings)."""

    greeted = 0

    async def greet(self, emitter: object) -> None:
        self.greeted += 1
        raise SessionError("no node answered the AddressBook")


def prepared(pool: _Pool, nodes: tuple[int, ...] = (), holds: NodeHolds | None = None,
             ) -> PreparedEngine:
    """A run prepared on `nodes` over `pool` (as `RunEngine.prepare` leaves it)."""
    planned = types.SimpleNamespace(plan=make_plan(), stop_token_ids=frozenset({EOS}))
    members = tuple(PoolMember(NodeId(n), "127.0.0.1", 1) for n in nodes)
    options = types.SimpleNamespace(nodes=members, timeouts=SLOW, mixed_steps=False)
    return PreparedEngine(RunPreparation(
        options, planned, pool, None, 2, 1, Emitter("orchestrator", []), None,  # type: ignore[arg-type]
        holds or NodeHolds()), RunEngine)


Body = Callable[[RunEngine, FakePorts], Awaitable[None]]


def engine_test(body: Body, slots: int = 2) -> None:
    ports = FakePorts()

    async def main() -> None:
        runtime = Runtime("orchestrator")
        pool = _Pool()
        engine = RunEngine(make_plan(), slots, None, pool, runtime, ports)  # type: ignore[arg-type]
        options = types.SimpleNamespace(timeouts=SLOW, mixed_steps=False)
        opening = asyncio.create_task(engine._provision(frozenset({EOS}), options, None))  # type: ignore[arg-type]
        await ports.until(lambda: len(ports.of("provision")) == 3)
        assert engine._handle is not None
        make_ready(engine._handle)
        await asyncio.wait_for(opening, 5)
        await body(engine, ports)
        if engine._stop_task is None:
            await stop(engine, ports)
        assert pool.closed == 1

    asyncio.run(asyncio.wait_for(main(), timeout=20))
    assert_tables_allow(ports.sink.events, complete=False)


async def stop(engine: RunEngine, ports: FakePorts) -> RunResult:
    stopping = asyncio.create_task(engine.stop())
    assert engine._handle is not None
    if not engine._handle.future.done():
        await stop_all(engine._handle, ports)
    return await stopping


async def events(stream: RunStream) -> list[SequenceEvent]:
    return [event async for event in stream]


def test_streams_yield_started_tokens_and_one_finished() -> None:
    async def body(engine: RunEngine, ports: FakePorts) -> None:
        assert engine.health().state is HealthState.SERVING
        a = engine.submit([1, 5, 6], SamplingParams(max_tokens=8))
        b = engine.submit([1, 7], SamplingParams(max_tokens=2))
        assert a.sequence_id != b.sequence_id
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle = engine._handle
        assert handle is not None
        handle.tell(out(0, tag(0, 0), 40))
        handle.tell(out(1, tag(1, 0), 50))
        await ports.until(lambda: len(ports.of("inject")) == 4)
        handle.tell(out(2, tag(0, 3), EOS))
        handle.tell(out(3, tag(1, 2), 51))
        got_a, got_b = await asyncio.wait_for(asyncio.gather(events(a), events(b)), 5)
        assert got_a == [Started(), Tokens((40,)), Finished(FinishReason.STOP)]
        assert got_b == [Started(), Tokens((50,)), Tokens((51,)), Finished(FinishReason.LENGTH)]

    engine_test(body)


def test_cancel_ends_the_stream_at_once_and_frees_the_slot() -> None:
    async def body(engine: RunEngine, ports: FakePorts) -> None:
        a = engine.submit([1, 5], GREEDY)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        engine.cancel(a.sequence_id)
        engine.cancel(a.sequence_id)  # idempotent
        engine.cancel(12345)  # unknown: fine
        b = engine.submit([1, 6], SamplingParams(max_tokens=1))  # the one slot
        assert await asyncio.wait_for(events(a), 1) == [Started(), Finished(FinishReason.CANCELLED)]
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle = engine._handle
        assert handle is not None
        handle.tell(out(0, tag(0, 0), 40))  # a's late output: dropped
        handle.tell(out(1, tag(0, 0), 41))
        assert await asyncio.wait_for(events(b), 5) == [
            Started(), Tokens((41,)), Finished(FinishReason.LENGTH)]

    engine_test(body, slots=1)


def test_a_fault_ends_every_stream_naming_it_and_sets_failed() -> None:
    async def body(engine: RunEngine, ports: FakePorts) -> None:
        a = engine.submit([1, 5], GREEDY)
        b = engine.submit([1, 6], GREEDY)
        await ports.until(lambda: len(ports.of("inject")) == 2)
        handle = engine._handle
        assert handle is not None
        handle.tell(out(0, tag(0, 0), 40))
        handle.tell(orun.StageFault(StageIndex(2), RunFaultReason.WorkerCrashed,
                                    Component.WorkerCtl))
        await asyncio.wait_for(engine.failed.wait(), 5)
        assert engine.fault is not None and "WorkerCrashed" in engine.fault
        assert engine.health().state is HealthState.FAILED
        got_a, got_b = await asyncio.wait_for(asyncio.gather(events(a), events(b)), 5)
        assert got_a[:2] == [Started(), Tokens((40,))]
        for got in (got_a, got_b):
            end = got[-1]
            assert isinstance(end, Finished) and end.reason is FinishReason.ERROR
            assert "WorkerCrashed" in end.detail and "stage 2" in end.detail
        late = await asyncio.wait_for(events(engine.submit([1, 7], GREEDY)), 1)
        assert late == [Finished(FinishReason.ERROR, engine.fault)]
        result = await stop(engine, ports)
        assert result.outcome is RunOutcome.Faulted

    engine_test(body)


def test_stop_ends_in_flight_streams_and_is_idempotent() -> None:
    async def body(engine: RunEngine, ports: FakePorts) -> None:
        a = engine.submit([1, 5], GREEDY)
        await ports.until(lambda: len(ports.of("inject")) == 1)
        result = await stop(engine, ports)
        assert (result.outcome, result.teardown) == (RunOutcome.OperatorStopped,
                                                     TeardownOutcome.Clean)
        assert await asyncio.wait_for(events(a), 1) == [
            Started(), Finished(FinishReason.ERROR, "the run was stopped")]
        assert await engine.stop() is result
        assert not engine.failed.is_set() and engine.fault is None
        after = await asyncio.wait_for(events(engine.submit([1, 6], GREEDY)), 1)
        assert len(after) == 1 and isinstance(after[0], Finished)
        assert after[0].reason is FinishReason.ERROR

    engine_test(body)


def test_a_request_the_engine_cannot_run_ends_at_once() -> None:
    async def body(engine: RunEngine, ports: FakePorts) -> None:
        empty = await asyncio.wait_for(events(engine.submit([], GREEDY)), 1)
        assert len(empty) == 1 and isinstance(empty[0], Finished)
        assert empty[0].reason is FinishReason.ERROR and "prompt" in empty[0].detail
        assert ports.of("inject") == []

    engine_test(body)


def test_sampling_params_map_onto_the_runs_policy() -> None:
    greedy = sampling_policy(SamplingParams(max_tokens=4, temperature=0.0, seed=3))
    assert greedy.kind.value == "greedy"
    sampled = sampling_policy(SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=3))
    assert (sampled.kind.value, sampled.temperature, sampled.top_k, sampled.top_p,
            sampled.seed) == ("sample", 0.7, 40, 0.9, 3)


def test_start_cancelled_while_provisioning_tears_down_what_it_made() -> None:
    ports = FakePorts()

    async def main() -> None:
        runtime = Runtime("orchestrator")
        pool = _Pool()
        engine = RunEngine(make_plan(), 2, None, pool, runtime, ports)  # type: ignore[arg-type]
        options = types.SimpleNamespace(timeouts=SLOW, mixed_steps=False)
        opening = asyncio.create_task(engine._provision(frozenset({EOS}), options, None))  # type: ignore[arg-type]
        await ports.until(lambda: len(ports.of("provision")) == 3)
        opening.cancel()  # Ctrl-C before the barrier
        assert engine._handle is not None
        result = await stop_all(engine._handle, ports)  # the stages answer StopRun
        try:
            await opening
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("start() must re-raise its cancellation")
        assert (result.outcome, result.teardown) == (RunOutcome.OperatorStopped,
                                                     TeardownOutcome.Clean)
        assert pool.closed == 1 and len(ports.of("stop_run")) == 3

    asyncio.run(asyncio.wait_for(main(), timeout=20))
    assert_tables_allow(ports.sink.events, complete=False)


def test_a_prepared_run_opens_at_most_once() -> None:
    """`PreparedEngine.open` hands its preparation to `RunEngine.open` once: a second
    open, or one after `close`, is a typed `PreparedRunSpent`, and the pool endpoint is
    released exactly once (here by the open whose greeting failed)."""

    async def main() -> None:
        pool = _Unreachable()
        first = prepared(pool)
        with pytest.raises(SessionError, match="no node answered"):
            await first.open()
        assert pool.closed == 1
        with pytest.raises(PreparedRunSpent):
            await first.open()
        with pytest.raises(PreparedRunSpent):
            await RunEngine.open(first)
        await first.close()
        assert pool.closed == 1

        unopened = _Pool()
        second = prepared(unopened)
        await second.close()
        await second.close()
        assert unopened.closed == 1
        with pytest.raises(PreparedRunSpent):
            await second.open()
        assert unopened.closed == 1

    asyncio.run(asyncio.wait_for(main(), timeout=20))


def test_greeting_the_nodes_of_a_run_still_tearing_down_is_a_typed_error() -> None:
    """A node reports on its newest orchestrator link: a run that greeted the nodes of a
    faulted run before its teardown ended would take their StageStopped. The session's
    runs share `NodeHolds`: such a greeting raises `TeardownPending` naming the run
    and its nodes before any node is told anything, and once the teardown has ended
    the same nodes are greeted."""
    ports = FakePorts()

    async def main() -> None:
        holds = NodeHolds()
        runtime = Runtime("orchestrator")
        engine = RunEngine(make_plan(), 2, None, _Pool(), runtime, ports,  # type: ignore[arg-type]
                           holds=holds)
        options = types.SimpleNamespace(timeouts=SLOW, mixed_steps=False)
        opening = asyncio.create_task(engine._provision(frozenset({EOS}), options, None))  # type: ignore[arg-type]
        await ports.until(lambda: len(ports.of("provision")) == 3)
        assert engine._handle is not None
        make_ready(engine._handle)
        await asyncio.wait_for(opening, 5)
        nodes = tuple(int(node) for node in engine.stage_nodes)
        stopping = asyncio.create_task(engine.stop())  # teardown under way ...
        await ports.until(lambda: len(ports.of("stop_run")) == 3)  # ... no StageStopped yet

        early = _Unreachable()
        with pytest.raises(TeardownPending, match=f"run 5 has not ended on node.*{nodes[1]:016x}"):
            await prepared(early, (nodes[1], 99), holds).open()
        assert (early.greeted, early.closed) == (0, 1)  # refused before greeting, released

        elsewhere = _Unreachable()  # other nodes: nothing to take from the old run
        with pytest.raises(SessionError, match="no node answered"):
            await prepared(elsewhere, (98, 99), holds).open()
        assert elsewhere.greeted == 1

        await stop_all(engine._handle, ports)
        await stopping
        late = _Unreachable()  # torn down: its nodes are free to greet
        with pytest.raises(SessionError, match="no node answered"):
            await prepared(late, nodes, holds).open()
        assert late.greeted == 1

    asyncio.run(asyncio.wait_for(main(), timeout=20))
