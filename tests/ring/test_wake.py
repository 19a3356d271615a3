"""Wake channels: eventfd doorbell and JSON-line hints, including across a fork."""

from __future__ import annotations

import os
import time

import pytest

from swactor.ring import Doorbell, JsonLineWake, MalformedWake
from swactor.ring.wake import READABLE_EVENT, WRITABLE_EVENT


def test_doorbell_counts_coalesce_into_one_wake() -> None:
    bell = Doorbell.create()
    assert bell.wait(timeout=0) is False
    for _ in range(5):
        bell.notify(3)
    assert bell.wait(timeout=0) is True
    assert bell.wait(timeout=0.01) is False  # the read reset the counter
    bell.close()


def test_nonblocking_doorbell_drain() -> None:
    bell = Doorbell.create(nonblocking=True)
    assert bell.drain() == 0
    bell.notify()
    bell.notify()
    assert bell.drain() == 2
    assert bell.wait() is False  # would block: reported as no wake
    bell.close()


def test_doorbell_wakes_another_process() -> None:
    bell = Doorbell.create()
    pid = os.fork()
    if pid == 0:  # child: ring after a short delay
        time.sleep(0.05)
        bell.notify(1)
        os._exit(0)
    t0 = time.monotonic()
    assert bell.wait(timeout=10) is True
    assert time.monotonic() - t0 < 10
    assert os.waitpid(pid, 0)[1] == 0
    bell.close()


def test_jsonline_hints_carry_only_the_ring_id() -> None:
    wake = JsonLineWake.create(READABLE_EVENT)
    wake.notify(7)
    wake.notify(8)
    raw = os.read(wake.read_fd, 4096)
    lines = raw.decode().splitlines()
    assert lines == [
        '{"event": "RingReadable", "ring_id": 7}',
        '{"event": "RingReadable", "ring_id": 8}',
    ]
    os.write(wake.write_fd, raw)
    assert wake.wait(timeout=1) is True  # both lines served by one wait
    assert wake.wait(timeout=0) is False
    wake.close()


def test_jsonline_partial_line_waits_for_the_rest() -> None:
    wake = JsonLineWake.create(WRITABLE_EVENT)
    os.write(wake.write_fd, b'{"event": "RingWritable", ')
    assert wake.wait(timeout=0.01) is False
    os.write(wake.write_fd, b'"ring_id": 1}\n')
    assert wake.wait(timeout=1) is True
    wake.close()


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b'{"event": "RingWritable", "ring_id": 1}\n', b'{"event": "RingReadable"}\n'],
)
def test_jsonline_rejects_malformed_hints(line: bytes) -> None:
    wake = JsonLineWake.create(READABLE_EVENT)
    os.write(wake.write_fd, line)
    with pytest.raises(MalformedWake):
        wake.wait(timeout=1)
    wake.close()
