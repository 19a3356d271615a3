"""A stand-alone ring endpoint process, for cross-process tests and benchmarks.

Theory of operation
-------------------
`python -m swactor.testing.ring_peer producer|consumer ...` maps the arena named by
`SWACTOR_ARENA_FD` / `SWACTOR_ARENA_BYTES` (inherited with `pass_fds`), opens the ring of
`--layout` (RingLayout JSON) and streams `--total` bytes through it with the blocking
helpers of `swactor.testing.ring_stream`, exactly as a worker would.  The wake channels are
inherited fds too (`--wake eventfd|jsonline`, `--readable`, `--writable`; a jsonline
channel is `read_fd,write_fd`).

The stream content is a deterministic pattern: a seeded random block of PATTERN_PERIOD
bytes repeated (an odd period, so stale ring bytes from an earlier lap differ from the
expected ones).  Span requests are `fixed:N` bytes or `random:MAX` (log-uniform in
1..MAX, seeded).  `--sleep-prob` / `--sleep-max-us` add a seeded schedule of sleeps
between hand-offs.  `--mutant-no-clear` makes this side wait the *wrong* way (it never
clears its pending bit), which must lose a wake-up: tests use it to prove that the
lost-wake-up harness can fail.  The producer hashes what it wrote from the source, the consumer
hashes (or copies, or ignores) what it read from the ring; BLAKE2b digests compare.
`--api spans` moves bytes through zero-copy span views; `--api copy` through the
native copying calls (`Ring.write_from` / `Ring.read_into`).

Start barrier: after set-up the peer prints `ready` and waits for one line on stdin, so
that a parent can time the streaming alone.  It ends with one JSON line: role, bytes,
digest (hex, or null), spans, sleeps, start and end (`time.monotonic()`, comparable
across processes) and the CPU seconds spent streaming.  Exit status 0; 3 when a wait
timed out (a lost wake-up); 4 when the ring faulted (reason in the JSON line).  No
payload byte is ever printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from swactor.arena import Arena
from swactor.ring.errors import RingFaulted
from swactor.ring.ring import Ring, RingState
from swactor.ring.wake import (
    READABLE_EVENT,
    WRITABLE_EVENT,
    Doorbell,
    JsonLineWake,
    Wake,
    WakeTimeout,
)
from swactor.testing import ring_stream as stream
from swactor.wire import RingLayout

PATTERN_PERIOD = (16 << 20) + 4099
EXIT_TIMEOUT = 3
EXIT_FAULTED = 4


def pattern_source(seed: int, max_piece: int) -> memoryview:
    """The pattern block, extended by `max_piece` bytes so any piece is one slice."""
    block = random.Random(seed).randbytes(PATTERN_PERIOD)
    return memoryview(block + block[:max_piece])


def span_sizes(spec: str, seed: int) -> tuple[Callable[[], int], int]:
    """`fixed:N` or `random:MAX` -> (draw function, largest size)."""
    kind, _, value = spec.partition(":")
    size = int(value)
    if size < 1 or kind not in ("fixed", "random"):
        raise ValueError(f"span spec {spec!r}: want fixed:N or random:MAX with N, MAX >= 1")
    if kind == "fixed":
        return (lambda: size), size
    rng = random.Random(seed ^ 0x5EED)
    log_max = math.log(size)
    return (lambda: min(size, max(1, int(math.exp(rng.uniform(0.0, log_max)))))), size


class Sleeper:
    """Seeded schedule of short sleeps between hand-offs."""

    def __init__(self, prob: float, max_us: int, seed: int) -> None:
        self.prob = prob
        self.max_s = max_us / 1e6
        self.rng = random.Random(seed ^ 0xD0D0)

    def maybe(self) -> None:
        if self.prob > 0 and self.rng.random() < self.prob:
            time.sleep(self.rng.uniform(0.0, self.max_s))


def mutant_wait_writable(
    ring: Ring, writable: Wake, max_len: int, timeout: float | None, stats: stream.WaitStats
) -> memoryview:
    """Broken on purpose: never clears the writable pending bit before sleeping."""
    while not (span := ring.writable_span(max_len)):
        stats.sleeps += 1
        if not writable.wait(timeout):
            raise WakeTimeout(f"ring {ring.ring_id}: mutant waiter lost a wake-up")
    return span


def mutant_wait_readable(
    ring: Ring, readable: Wake, max_len: int, timeout: float | None, stats: stream.WaitStats
) -> memoryview:
    """Broken on purpose: never clears the readable pending bit before sleeping."""
    while not (span := ring.readable_span(max_len)):
        if ring.state is RingState.Closed:
            return span
        stats.sleeps += 1
        if not readable.wait(timeout):
            raise WakeTimeout(f"ring {ring.ring_id}: mutant waiter lost a wake-up")
    return span


def open_wake(kind: str, fds: str, event: str) -> Wake:
    if kind == "eventfd":
        return Doorbell(int(fds))
    read_fd, _, write_fd = fds.partition(",")
    return JsonLineWake(int(read_fd), int(write_fd), event)


@dataclass
class Result:
    role: str
    bytes: int = 0
    spans: int = 0
    digest: str | None = None
    sleeps: int = 0
    start: float = 0.0
    end: float = 0.0
    cpu: float = 0.0
    error: str | None = None
    reason: str | None = None


def produce(ring: Ring, args: argparse.Namespace, readable: Wake, writable: Wake) -> Result:
    draw, max_piece = span_sizes(args.spans, args.seed)
    src = pattern_source(args.seed, max_piece)
    sleeper = Sleeper(args.sleep_prob, args.sleep_max_us, args.seed + 1)
    digest = hashlib.blake2b() if args.sink == "hash" else None
    res = Result("producer")
    stats = stream.WaitStats()
    wait = mutant_wait_writable if args.mutant_no_clear else stream.wait_writable
    res.start = time.monotonic()
    cpu0 = time.process_time()
    pos, total, timeout = 0, args.total, args.timeout
    while pos < total:
        want = min(draw(), total - pos)
        base = pos % PATTERN_PERIOD
        piece = src[base : base + want]
        done = want if args.api == "copy" else 0
        if args.api == "copy":
            stream.write_all(ring, piece, readable, writable, timeout)
            res.spans += 1
        while done < want:  # one request may need several spans (wrap, little room)
            span = wait(ring, writable, want - done, timeout, stats)
            n = len(span)
            span[:] = piece[done : done + n]
            span.release()
            stream.commit(ring, n, readable)
            done += n
            res.spans += 1
        if digest is not None:
            digest.update(piece)
        pos += want
        sleeper.maybe()
    stream.close(ring, readable)
    res.end = time.monotonic()
    res.cpu = time.process_time() - cpu0
    res.bytes = pos
    res.sleeps = stats.sleeps
    res.digest = digest.hexdigest() if digest is not None else None
    return res


def consume(ring: Ring, args: argparse.Namespace, readable: Wake, writable: Wake) -> Result:
    draw, max_piece = span_sizes(args.spans, args.seed + 7)
    sleeper = Sleeper(args.sleep_prob, args.sleep_max_us, args.seed + 2)
    digest = hashlib.blake2b() if args.sink == "hash" else None
    dst = bytearray(max(64 << 20, max_piece)) if args.sink == "copy" else None
    dst_view = memoryview(dst) if dst is not None else None
    dst_off = 0
    res = Result("consumer")
    stats = stream.WaitStats()
    wait = mutant_wait_readable if args.mutant_no_clear else stream.wait_readable
    res.start = time.monotonic()
    cpu0 = time.process_time()
    timeout = args.timeout
    scratch = memoryview(bytearray(max_piece))
    while True:
        if args.api == "copy":
            want = draw()
            if dst_view is not None:
                if dst_off + want > len(dst_view):
                    dst_off = 0
                n = stream.read_some(ring, dst_view[dst_off : dst_off + want], readable,
                                     writable, timeout)  # fmt: skip
                dst_off += n
            else:
                n = stream.read_some(ring, scratch[:want], readable, writable, timeout)
                if digest is not None:
                    digest.update(scratch[:n])
            if n == 0:
                break
            res.bytes += n
            res.spans += 1
            sleeper.maybe()
            continue
        span = wait(ring, readable, draw(), timeout, stats)
        n = len(span)
        if n == 0:
            break
        if digest is not None:
            digest.update(span)
        elif dst_view is not None:
            if dst_off + n > len(dst_view):
                dst_off = 0
            dst_view[dst_off : dst_off + n] = span
            dst_off += n
        span.release()
        stream.consume(ring, n, writable)
        res.bytes += n
        res.spans += 1
        sleeper.maybe()
    res.end = time.monotonic()
    res.cpu = time.process_time() - cpu0
    res.sleeps = stats.sleeps
    res.digest = digest.hexdigest() if digest is not None else None
    return res


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m swactor.testing.ring_peer", description=__doc__)
    p.add_argument("role", choices=["producer", "consumer"])
    p.add_argument("--layout", required=True, help="RingLayout as JSON")
    p.add_argument("--wake", choices=["eventfd", "jsonline"], default="eventfd")
    p.add_argument("--readable", required=True, help="RingReadable channel fd(s)")
    p.add_argument("--writable", required=True, help="RingWritable channel fd(s)")
    p.add_argument("--total", type=int, default=0, help="bytes to produce")
    p.add_argument("--spans", default="random:65536", help="fixed:N or random:MAX")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sink", choices=["hash", "copy", "none"], default="hash")
    p.add_argument("--api", choices=["spans", "copy"], default="spans",
                   help="zero-copy spans, or the native copying write_from/read_into")
    p.add_argument("--sleep-prob", type=float, default=0.0)
    p.add_argument("--sleep-max-us", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None, help="max seconds per wait")
    p.add_argument("--no-barrier", action="store_true", help="start without waiting")
    p.add_argument("--mutant-no-clear", action="store_true", help="wait wrongly (tests)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    arena = Arena.from_env()
    layout = RingLayout.from_json(json.loads(args.layout))
    ring = Ring.open(arena, layout)
    readable = open_wake(args.wake, args.readable, READABLE_EVENT)
    writable = open_wake(args.wake, args.writable, WRITABLE_EVENT)
    if not args.no_barrier:
        print("ready", flush=True)
        sys.stdin.readline()
    status = 0
    try:
        run = produce if args.role == "producer" else consume
        res = run(ring, args, readable, writable)
    except WakeTimeout as exc:
        res, status = Result(args.role, error=str(exc)), EXIT_TIMEOUT
    except RingFaulted as exc:
        res, status = Result(args.role, error="faulted", reason=exc.reason.value), EXIT_FAULTED
    print(json.dumps(res.__dict__), flush=True)
    ring.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
