"""The orchestrator's token-ring waits are woken by the driver's hints, never by a poll.

A real ring in a memfd arena; the test plays the driver's side: it commits bytes with
the ring's own pending-bit call and, when that call says a hint is due, sets the wake
event, exactly as `LocalRingInstaller.wake` does for the driver's hint. The safety net's
check runs once an hour in the first tests, so a reader that lost a hint would hang
there (the test's timeout fails it); the last tests drop a hint on purpose and the
check, run often, recovers it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Iterator

import pytest

from swactor.orchestrator.real_ports import write_record
from swactor.orchestrator.wake_watch import WakeWatch
from tests.orchestrator.token_ring import TokenRing

pytestmark = pytest.mark.timeout(30)
NEVER = 3600.0
WAIT_S = 10.0


@pytest.fixture
def ring() -> Iterator[TokenRing]:
    rig = TokenRing()
    yield rig
    rig.close()


def record(sequence: int) -> bytes:
    return TokenRing.record(sequence, struct.pack("<I", 100 + sequence))


def produce(ring: TokenRing, data: bytes, wake: asyncio.Event, *, hint: bool = True) -> bool:
    """Commit `data` as the driver's recv pump does; True if a hint was due."""
    written, due = ring.producer.write_from(data)
    assert written == len(data)
    if due and hint:
        wake.set()
    return due


async def loaded(ring: TokenRing, count: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while len(ring.loaded) < count:
            await asyncio.sleep(0)


async def _test_each_token_wakes_the_reader_by_its_hint_alone(ring: TokenRing) -> None:
    wake, watch = asyncio.Event(), WakeWatch(NEVER)
    reader = asyncio.get_running_loop().create_task(ring.reader.consume(wake, watch))
    try:
        for step in range(6):
            data = record(step)
            produce(ring, data[:17], wake)  # a record in two commits, a turn apart
            await asyncio.sleep(0)
            produce(ring, data[17:], wake)
            await loaded(ring, step + 1)
        assert [ids for _, _, ids in ring.loaded] == [(100 + k,) for k in range(6)]
        assert watch.lost == 0 and ring.failed == []
    finally:
        reader.cancel()
        watch.close()


async def _test_records_committed_together_take_one_hint(ring: TokenRing) -> None:
    wake, watch = asyncio.Event(), WakeWatch(NEVER)
    reader = asyncio.get_running_loop().create_task(ring.reader.consume(wake, watch))
    try:
        await asyncio.sleep(0)
        assert produce(ring, record(0), wake)
        assert not produce(ring, record(1), wake), "the pending bit coalesces the second"
        await loaded(ring, 2)
        assert produce(ring, record(2), wake), "the reader cleared the bit before reading"
        await loaded(ring, 3)
        assert watch.lost == 0
    finally:
        reader.cancel()
        watch.close()


async def _test_a_lost_hint_is_found_by_the_check_and_the_ring_goes_on(
        ring: TokenRing, caplog: pytest.LogCaptureFixture) -> None:
    wake, watch = asyncio.Event(), WakeWatch(0.01)
    reader = asyncio.get_running_loop().create_task(ring.reader.consume(wake, watch))
    try:
        await asyncio.sleep(0)
        with caplog.at_level(logging.WARNING, "swactor.orchestrator.wake_watch"):
            assert produce(ring, record(0), wake, hint=False)  # the hint is lost
            assert not produce(ring, record(1), wake), "a stuck bit: no hint would come"
            await loaded(ring, 2)
        assert watch.lost == 1
        assert "no wake hint came" in caplog.text
        assert produce(ring, record(2), wake), "the read cleared the stuck bit"
        await loaded(ring, 3)
        assert watch.lost == 1
    finally:
        reader.cancel()
        watch.close()


async def _test_a_full_token_in_ring_waits_for_its_writable_hint() -> None:
    rig = TokenRing(capacity=64)  # token-in: this process produces, the driver consumes
    wake, watch = asyncio.Event(), WakeWatch(NEVER)
    payload = bytes(range(200))
    told: list[int] = []
    writer = asyncio.get_running_loop().create_task(
        write_record(rig.producer, payload, wake, watch, lambda: told.append(1)))
    try:
        got, buffer = bytearray(), bytearray(24)
        async with asyncio.timeout(WAIT_S):
            while len(got) < len(payload):
                await asyncio.sleep(0)
                n, due = rig.consumer.read_into(buffer)  # the driver's send pump
                got += buffer[:n]
                if due:
                    wake.set()  # its RingWritable hint
            await writer
        assert bytes(got) == payload and len(told) > 1 and watch.lost == 0
    finally:
        writer.cancel()
        watch.close()
        rig.close()


def test_each_token_wakes_the_reader_by_its_hint_alone(ring: TokenRing) -> None:
    asyncio.run(_test_each_token_wakes_the_reader_by_its_hint_alone(ring))


def test_records_committed_together_take_one_hint(ring: TokenRing) -> None:
    asyncio.run(_test_records_committed_together_take_one_hint(ring))


def test_a_lost_hint_is_found_by_the_check_and_the_ring_goes_on(
        ring: TokenRing, caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(_test_a_lost_hint_is_found_by_the_check_and_the_ring_goes_on(ring, caplog))


def test_a_full_token_in_ring_waits_for_its_writable_hint() -> None:
    asyncio.run(_test_a_full_token_in_ring_waits_for_its_writable_hint())
