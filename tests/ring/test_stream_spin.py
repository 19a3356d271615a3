"""`stream.wait_*` with `spin_s > 0`: bytes or space that turn up while the waiter
re-polls are taken without a sleep (no wake hint is ever sent here), and no empty view
is left behind (the arena still unmaps)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from swactor.ring import Ring
from swactor.ring.wake import WakeTimeout
from swactor.testing import ring_stream as stream
from swactor.testing.ring_rig import RingRig

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


@pytest.fixture
def rig() -> Iterator[RingRig]:
    made = RingRig(CAPACITY)
    yield made
    made.close()  # ArenaBusyError if a view into the arena is still alive


@pytest.fixture
def peer(rig: RingRig) -> Iterator[Ring]:
    """The other side's handle on the same ring (closed before the rig)."""
    handle = Ring.open(rig.arena, rig.layout)
    yield handle
    handle.close()


def test_a_spinning_consumer_takes_bytes_committed_while_it_polls(
    rig: RingRig, peer: Ring
) -> None:
    stats = stream.WaitStats()
    thread = later(lambda: commit_bytes(peer, b"abc"))
    span = stream.wait_readable(rig.ring, rig.readable, timeout=5, stats=stats, spin_s=10)
    thread.join()
    assert bytes(span) == b"abc" and stats.sleeps == 0
    span.release()


def test_without_spinning_the_same_consumer_sleeps_on_its_wake(rig: RingRig, peer: Ring) -> None:
    stats = stream.WaitStats()
    thread = later(lambda: commit_bytes(peer, b"abc"))
    with pytest.raises(WakeTimeout):
        stream.wait_readable(rig.ring, rig.readable, timeout=0.3, stats=stats, spin_s=0)
    thread.join()
    assert stats.sleeps == 1


def test_a_spinning_producer_takes_space_freed_while_it_polls(rig: RingRig, peer: Ring) -> None:
    commit_bytes(rig.ring, b"x" * CAPACITY)  # full
    stats = stream.WaitStats()
    thread = later(lambda: peer.advance_consume(64))
    span = stream.wait_writable(rig.ring, rig.writable, timeout=5, stats=stats, spin_s=10)
    thread.join()
    assert len(span) == 64 and stats.sleeps == 0
    span.release()
