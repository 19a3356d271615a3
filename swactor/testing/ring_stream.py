"""Blocking producer/consumer steps over a `Ring` with the pending-bit wake protocol.

Theory of operation
-------------------
These helpers are the one place that encodes the waiter's side of spec §21, so that
every blocking user (the worker's ingress parser and egress producer, tests, benches)
gets it right:

    waiter:  span = try();  if empty: clear pending bit; span = try() again;
             if still empty: check state (Faulted -> raise, Closed -> EOF); sleep on wake
    waker:   publish cursor; if mark_pending() (bit was clear): notify(ring_id)

Clearing before the second try is what makes coalescing safe: a publish that happens
after the clear finds the bit clear and sends a hint; a publish before it is seen by
the second try (both are acq_rel on the same wake word).

The consumer loads the state *before* its second try: a producer commits its last bytes
before it closes, so "Closed, then still empty" really means end of stream.

A blocked side also gives up when the ring turns Faulted: whoever faults a ring (the
peer, or the node watching the peer process, see `swactor.testing.ring_liveness`) notifies both
directions afterwards, so the sleeper wakes and sees it.  `timeout` bounds each sleep:
`WakeTimeout` then means a wake was lost or the peer died unreported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from swactor.ring.errors import RingClosedError, RingFaulted
from swactor.ring.ring import Ring, RingState
from swactor.ring.wake import Wake, WakeTimeout
from swactor.wire import RingFaultReason

#: How long a waiter re-polls the cursors before it sleeps on its wake channel (seconds).
#: 0 by default: on a shared, loaded machine (our 2-core CI) spinning steals the peer's
#: core and measured slower (20 us: -10..30 %, 100 us: -50 %); with dedicated cores a
#: few tens of microseconds save a sleep/wake pair per transition.
DEFAULT_SPIN_S = 0.0


@dataclass
class WaitStats:
    """Counts of how often a side actually slept on its wake channel."""

    sleeps: int = 0


def _poll(
    span_of: Callable[[int | None], memoryview], max_len: int | None, spin_s: float
) -> memoryview | None:
    """A non-empty span from `span_of`, asked once and then again for up to `spin_s`
    seconds; None if every answer was empty.  Empty views are released here: they must
    not outlive this frame (they pin the arena)."""
    span = span_of(max_len)
    if span:
        return span
    span.release()
    if spin_s > 0:
        end = time.perf_counter() + spin_s
        while time.perf_counter() < end:
            span = span_of(max_len)
            if span:
                return span
            span.release()
    return None


def _raise_faulted(ring: Ring) -> None:
    raise RingFaulted(ring.fault_reason or RingFaultReason.RingStateInvalid, ring.ring_id)


def wait_writable(
    ring: Ring,
    writable: Wake,
    max_len: int | None = None,
    timeout: float | None = None,
    stats: WaitStats | None = None,
    spin_s: float = DEFAULT_SPIN_S,
) -> memoryview:
    """Producer: a non-empty writable span, sleeping on `writable` while the ring is full."""
    while True:
        ready = _poll(ring.writable_span, max_len, spin_s)
        if ready is not None:
            return ready
        ring.clear_writable_pending()
        span = ring.writable_span(max_len)
        if span:
            return span
        span.release()
        state = ring.state
        if state is RingState.Faulted:
            _raise_faulted(ring)
        if state is RingState.Closed:
            raise RingClosedError("producer already closed the ring", ring.ring_id)
        if stats is not None:
            stats.sleeps += 1
        if not writable.wait(timeout):
            raise WakeTimeout(f"ring {ring.ring_id}: no RingWritable within {timeout} s")


def wait_readable(
    ring: Ring,
    readable: Wake,
    max_len: int | None = None,
    timeout: float | None = None,
    stats: WaitStats | None = None,
    spin_s: float = DEFAULT_SPIN_S,
) -> memoryview:
    """Consumer: a non-empty readable span, or an empty one at end of stream (the
    producer closed and everything was consumed)."""
    while True:
        ready = _poll(ring.readable_span, max_len, spin_s)
        if ready is not None:
            return ready
        ring.clear_readable_pending()
        state = ring.state
        span = ring.readable_span(max_len)
        if span or state is RingState.Closed:
            return span
        span.release()
        if state is RingState.Faulted:
            _raise_faulted(ring)
        if stats is not None:
            stats.sleeps += 1
        if not readable.wait(timeout):
            raise WakeTimeout(f"ring {ring.ring_id}: no RingReadable within {timeout} s")


def commit(ring: Ring, n: int, readable: Wake) -> None:
    """Producer: publish `n` bytes and send RingReadable unless one is still pending."""
    if ring.commit_and_mark(n):
        readable.notify(ring.ring_id)


def consume(ring: Ring, n: int, writable: Wake) -> None:
    """Consumer: release `n` bytes and send RingWritable unless one is still pending."""
    if ring.consume_and_mark(n):
        writable.notify(ring.ring_id)


def write_all(
    ring: Ring,
    data: memoryview | bytes | bytearray,
    readable: Wake,
    writable: Wake,
    timeout: float | None = None,
) -> None:
    """Producer: copy all of `data` into the ring (the copy runs in C, across the wrap),
    blocking while the ring is full."""
    src = memoryview(data).cast("B")
    pos = 0
    while pos < len(src):
        n, wake = ring.write_from(src[pos:])
        if wake:
            readable.notify(ring.ring_id)
        if n:
            pos += n
            continue
        wait_writable(ring, writable, 1, timeout).release()


def read_some(
    ring: Ring,
    dst: bytearray | memoryview,
    readable: Wake,
    writable: Wake,
    timeout: float | None = None,
) -> int:
    """Consumer: copy up to len(dst) bytes out of the ring (in C, across the wrap),
    blocking while it is empty; 0 means end of stream."""
    while True:
        n, wake = ring.read_into(dst)
        if wake:
            writable.notify(ring.ring_id)
        if n:
            return n
        span = wait_readable(ring, readable, 1, timeout)
        if not span:
            return 0
        span.release()


def close(ring: Ring, readable: Wake) -> None:
    """Producer EOF: close the ring and wake the consumer so it sees the end."""
    ring.close_producer()
    if ring.mark_readable_pending():
        readable.notify(ring.ring_id)
