"""kill -9 of a ring peer mid-stream: the surviving side learns it through the
worker-control path (a pidfd watch on the peer process faults the ring and wakes the
survivor), and raises RingFaulted(WorkerProcessExited) instead of hanging."""

from __future__ import annotations

import signal
import time

import pytest

from swactor.ring import Ring, RingFaulted, RingState, WakeTimeout
from swactor.testing import ring_stream as stream
from swactor.testing.ring_liveness import PeerWatch
from swactor.testing.ring_rig import RingRig
from swactor.wire import RingFaultReason

MiB = 1 << 20


def wait_until(cond: object, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def test_producer_sees_killed_consumer_through_peer_watch() -> None:
    rig = RingRig(1 * MiB)
    consumer = rig.spawn("consumer", "--spans", "random:65536", barrier=False)
    watcher_ring = Ring.open(rig.arena, rig.layout)
    watch = PeerWatch(consumer.pid, [watcher_ring], [rig.writable, rig.readable]).start()
    chunk = bytes(range(256)) * 256  # 64 KiB
    written = 0
    killed = False

    def write_until_fault() -> None:
        nonlocal written, killed
        while True:
            stream.write_all(rig.ring, chunk, rig.readable, rig.writable, timeout=20)
            written += len(chunk)
            if not killed and rig.ring.consume >= 8 * MiB:
                consumer.send_signal(signal.SIGKILL)  # mid-stream
                killed = True

    try:
        with pytest.raises(RingFaulted) as info:
            write_until_fault()
        assert killed
        assert info.value.reason is RingFaultReason.WorkerProcessExited
        assert rig.ring.state is RingState.Faulted
        assert consumer.wait(timeout=10) == -signal.SIGKILL
        assert watch.exited.is_set()
        # it stopped because the ring was full and the peer was gone, not earlier
        assert rig.ring.commit - rig.ring.consume == rig.capacity
    finally:
        watch.stop()
        watcher_ring.close()
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        rig.close()


def test_consumer_sees_killed_producer_through_peer_watch() -> None:
    rig = RingRig(64 * 1024)
    producer = rig.spawn("producer", "--total", str(1 << 40), barrier=False)
    watcher_ring = Ring.open(rig.arena, rig.layout)
    watch = PeerWatch(producer.pid, [watcher_ring], [rig.writable, rig.readable]).start()
    got = 0

    def read_until_fault() -> None:
        nonlocal got
        while True:
            span = stream.wait_readable(rig.ring, rig.readable, timeout=20)
            n = len(span)
            span.release()
            stream.consume(rig.ring, n, rig.writable)
            got += n
            if got >= 4 * MiB and producer.poll() is None:
                producer.send_signal(signal.SIGKILL)

    try:
        with pytest.raises(RingFaulted) as info:
            read_until_fault()
        assert info.value.reason is RingFaultReason.WorkerProcessExited
        assert got >= 4 * MiB
        assert producer.wait(timeout=10) == -signal.SIGKILL
    finally:
        watch.stop()
        watcher_ring.close()
        if producer.poll() is None:
            producer.kill()
            producer.wait()
        rig.close()


def test_without_a_watch_the_survivor_only_times_out() -> None:
    """Control: shared memory alone does not reveal the death (the watch is needed)."""
    rig = RingRig(64 * 1024)
    consumer = rig.spawn("consumer", barrier=False)
    try:
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(timeout=10)
        with pytest.raises(WakeTimeout):
            stream.write_all(rig.ring, bytes(128 * 1024), rig.readable, rig.writable, timeout=0.3)
        assert rig.ring.state is RingState.Open
    finally:
        rig.close()
