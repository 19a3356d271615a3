"""Cross-process streaming through a real memfd ring between two peer processes.

Each test runs a producer and a consumer as separate `python -m swactor.testing.ring_peer`
processes that inherit the arena and wake fds.  The producer hashes the pattern it
wrote, the consumer hashes what it read from the ring: a byte read before it was
written, or overwritten before it was read, changes the consumer's digest (stale bytes
from an earlier lap differ from the pattern, whose period is not a multiple of the
ring).  The expected digest is also computed here, independently of both peers.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from swactor.ring import DEFAULT_VERSION, VERSION_COMPACT
from swactor.testing.ring_peer import EXIT_TIMEOUT, PATTERN_PERIOD, pattern_source
from swactor.testing.ring_rig import RingRig, run_pair

MiB = 1 << 20


def expected_digest(total: int, seed: int) -> str:
    src = pattern_source(seed, 0)[:PATTERN_PERIOD]
    h = hashlib.blake2b()
    pos = 0
    while pos < total:
        n = min(PATTERN_PERIOD, total - pos)
        h.update(src[:n])
        pos += n
    return h.hexdigest()


def stream(
    total: int,
    capacity: int,
    wake: str = "eventfd",
    seed: int = 11,
    version: int = DEFAULT_VERSION,
    api: str = "spans",
) -> None:
    rig = RingRig(capacity, wake=wake, version=version)
    try:
        spans = f"random:{2 * capacity}"  # requests of 1 B .. 2x capacity, log-uniform
        common = ["--spans", spans, "--seed", str(seed), "--timeout", "30", "--api", api]
        prod, cons, prc, crc = run_pair(
            rig, ["--total", str(total), *common], common, timeout=300
        )
        assert (prc, crc) == (0, 0), (prod, cons)
        assert prod["bytes"] == cons["bytes"] == total
        assert cons["digest"] == prod["digest"] == expected_digest(total, seed)
        assert rig.ring.commit == rig.ring.consume == total
        laps = total // capacity
        assert laps >= 64
        # random requests really produced many spans on both sides
        assert prod["spans"] > laps and cons["spans"] > laps
    finally:
        rig.close()


def test_stream_64mib_through_1mib_compact_header_ring() -> None:
    stream(64 * MiB, 1 * MiB, version=VERSION_COMPACT)


def test_stream_64mib_with_the_copying_calls() -> None:
    stream(64 * MiB, 256 * 1024, seed=9, api="copy")


def test_stream_jsonline_wakes_16mib_through_64kib_ring() -> None:
    stream(16 * MiB, 64 * 1024, wake="jsonline", seed=5)


def test_stream_1gib_through_1mib_ring() -> None:
    stream(1 << 30, 1 * MiB, seed=3)


def handoffs(seed: int, timeout: float, consumer_flags: list[str]) -> tuple[Any, Any, int, int]:
    rig = RingRig(256)
    try:
        sched = ["--seed", str(seed), "--sleep-prob", "0.01", "--sleep-max-us", "300"]
        sched += ["--timeout", str(timeout), "--spans", "fixed:16"]
        return run_pair(
            rig,
            ["--total", str(HANDOFFS * 16), *sched],
            [*sched, *consumer_flags],
            timeout=600,
        )
    finally:
        rig.close()


HANDOFFS = 100_000


@pytest.mark.parametrize("seed", [1, 2])
def test_no_lost_wakeup_over_100k_handoffs(seed: int) -> None:
    """A seeded schedule of sleeps on both sides over 100k 16-byte hand-offs through a
    256-byte ring: empty->readable and full->writable transitions happen constantly and
    are woken only through coalesced hints.  A lost wake-up makes a side time out."""
    prod, cons, prc, crc = handoffs(seed, 20.0, [])
    assert EXIT_TIMEOUT not in (prc, crc), (prod, cons)
    assert (prc, crc) == (0, 0), (prod, cons)
    assert cons["spans"] == HANDOFFS and cons["digest"] == prod["digest"]
    # both sides really slept on their wake channel, many times
    assert prod["sleeps"] > 100 and cons["sleeps"] > 100, (prod, cons)


def test_lost_wakeup_harness_catches_a_waiter_that_never_clears() -> None:
    """The same harness with a consumer that waits wrongly (never clears its pending
    bit) must report a lost wake-up: proof that the test above can fail."""
    _prod, cons, _prc, crc = handoffs(1, 1.0, ["--mutant-no-clear"])
    assert crc == EXIT_TIMEOUT, (cons, crc)
    assert "lost a wake-up" in cons["error"]
