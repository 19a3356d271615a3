"""wait_for_event: past and future events, matching, timeouts, other processes' files."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from swactor.events import (
    Emitter,
    EventName,
    EventTimeout,
    JsonlFollower,
    MemorySink,
    ObjectLoaded,
    RunFaulted,
    wait_for_event,
)
from swactor.wire import Component, RingFaultReason, RunFaultReason

from .samples import sample


def test_finds_an_event_emitted_before_the_wait_and_one_emitted_later() -> None:
    async def body() -> None:
        sink = MemorySink()
        emitter = Emitter("node", [sink])
        emitter.emit(sample(ObjectLoaded, sequence=0))
        hit = await wait_for_event(sink, 1.0, event="object_loaded", sequence=0)
        assert hit.event.sequence == 0

        async def later() -> None:
            await asyncio.sleep(0.05)
            emitter.emit(sample(ObjectLoaded, sequence=1))
            emitter.emit(sample(ObjectLoaded, sequence=2))

        task = asyncio.ensure_future(later())
        hit = await wait_for_event(sink, 2.0, event=EventName.object_loaded, sequence=2)
        assert hit.event.sequence == 2
        await task

    asyncio.run(body())


def test_since_skips_earlier_events_and_where_filters_further() -> None:
    async def body() -> None:
        sink = MemorySink()
        emitter = Emitter("node", [sink])
        emitter.emit(sample(ObjectLoaded, sequence=5))
        cursor = sink.cursor()
        emitter.emit(sample(ObjectLoaded, sequence=6))
        emitter.emit(sample(ObjectLoaded, sequence=7))
        hit = await wait_for_event(sink, 1.0, since=cursor, event="object_loaded")
        assert hit.event.sequence == 6
        hit = await wait_for_event(sink, 1.0, where=lambda e: e.value("sequence") > 6)
        assert hit.event.sequence == 7

    asyncio.run(body())


def test_enum_fields_match_by_value() -> None:
    async def body() -> None:
        sink = MemorySink()
        Emitter("node", [sink]).emit(sample(
            RunFaulted, reason=RunFaultReason.RingFault, component=Component.RecvPump,
            cause=RingFaultReason.HeaderMalformed,
        ))
        hit = await wait_for_event(
            sink, 1.0, reason=RunFaultReason.RingFault, component="recv_pump",
            cause=RingFaultReason.HeaderMalformed,
        )
        assert hit.name is EventName.run_faulted
        with pytest.raises(EventTimeout):
            await wait_for_event(sink, 0.05, reason=RunFaultReason.StepFailed)

    asyncio.run(body())


def test_timeout_names_what_was_wanted_and_what_was_seen() -> None:
    async def body() -> None:
        sink = MemorySink()
        Emitter("node", [sink]).emit(sample(ObjectLoaded))
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(EventTimeout) as timed_out:
            await wait_for_event(sink, 0.1, event="run_completed", run_id=101)
        assert 0.09 <= loop.time() - began < 1.0
        assert "run_completed" in str(timed_out.value)
        assert timed_out.value.recent == ["object_loaded"]
        assert isinstance(timed_out.value, TimeoutError)

    asyncio.run(body())


def test_a_field_no_event_has_is_a_type_error_not_a_timeout() -> None:
    async def body() -> None:
        with pytest.raises(TypeError, match="rn_id"):
            await wait_for_event(MemorySink(), 5.0, rn_id=1)

    asyncio.run(body())


WRITER = """
import sys, time
from swactor.events import Emitter, JsonlSink, ObjectLoaded
from swactor.wire import (
    EdgeId, NodeId, ObjectId, RingId, RunId, Sequence, StageIndex, WorkerGeneration,
)
sink = JsonlSink(sys.argv[1], max_bytes=2000, keep=50)
emitter = Emitter("worker", [sink])
for n in range(40):
    emitter.emit(ObjectLoaded(node_id=NodeId(1), run_id=RunId(2), stage_index=StageIndex(0),
                              edge_id=EdgeId(3), ring_id=RingId(4), object_id=ObjectId(n),
                              sequence=Sequence(n), worker_generation=WorkerGeneration(1)))
    time.sleep(0.005)
"""


def test_follower_sees_another_process_events_across_rotations(tmp_path: Path) -> None:
    path = tmp_path / "worker.jsonl"

    async def body() -> None:
        follower = JsonlFollower(path, poll_s=0.01)
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", textwrap.dedent(WRITER), str(path)
        )
        try:
            hit = await wait_for_event(follower, 10.0, event="object_loaded", sequence=39)
            assert await writer.wait() == 0
            assert hit.proc == "worker" and hit.pid == writer.pid
            assert [e.event.sequence for e in follower.events] == list(range(40))
        finally:
            await writer.wait()
            follower.close()

    asyncio.run(body())
    assert len(list(tmp_path.iterdir())) > 3  # it really rotated several times
