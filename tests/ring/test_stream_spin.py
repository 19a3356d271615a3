"""`stream.wait_*` with `spin_s > 0`: bytes or space that turn up while the waiter
re-polls are taken without a sleep (no wake hint is ever sent here), and no empty view
is left behind (the arena still unmaps)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from swactor.ring import Ring, stream
from swactor.ring.rig import RingRig
from swactor.ring.wake import WakeTimeout

CAPACITY = 4096


def later(action: Callable[[], object], delay_s: float = 0.02) -> threading.Thread:
    """Run `action` on another thread after `delay_s`, without any wake hint."""

    def run() -> None:
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def commit_bytes(producer: Ring, data: bytes) -> None:
    span = producer.writable_span(len(data))
    span[:] = data
    span.release()
    producer.advance_commit(len(data))


def test_a_spinning_consumer_takes_bytes_committed_while_it_polls() -> None:
    rig = RingRig(CAPACITY)
    producer = Ring.open(rig.arena, rig.layout)
    try:
        stats = stream.WaitStats()
        thread = later(lambda: commit_bytes(producer, b"abc"))
        span = stream.wait_readable(rig.ring, rig.readable, timeout=5, stats=stats, spin_s=10)
        thread.join()
        assert bytes(span) == b"abc" and stats.sleeps == 0
        span.release()
    finally:
        producer.close()
        rig.close()


def test_without_spinning_the_same_consumer_sleeps_on_its_wake() -> None:
    rig = RingRig(CAPACITY)
    producer = Ring.open(rig.arena, rig.layout)
    try:
        stats = stream.WaitStats()
        thread = later(lambda: commit_bytes(producer, b"abc"))
        with pytest.raises(WakeTimeout):
            stream.wait_readable(rig.ring, rig.readable, timeout=0.3, stats=stats, spin_s=0)
        thread.join()
        assert stats.sleeps == 1
    finally:
        producer.close()
        rig.close()


def test_a_spinning_producer_takes_space_freed_while_it_polls() -> None:
    rig = RingRig(CAPACITY)
    consumer = Ring.open(rig.arena, rig.layout)
    try:
        commit_bytes(rig.ring, b"x" * CAPACITY)  # full
        stats = stream.WaitStats()
        thread = later(lambda: consumer.advance_consume(64))
        span = stream.wait_writable(rig.ring, rig.writable, timeout=5, stats=stats, spin_s=10)
        thread.join()
        assert len(span) == 64 and stats.sleeps == 0
        span.release()
    finally:
        consumer.close()
        rig.close()
