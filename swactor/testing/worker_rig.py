"""Test and benchmark rig: a memfd arena, real rings, a real `python -m swactor.worker`.

The rig plays the node: it creates the arena, lays rings out by hand (as ArenaManager
would), writes their headers, spawns the worker with the arena fd inherited, writes
command lines on its stdin and reads event lines from its stdout (a reader thread feeds
a queue, so every wait has a timeout). Wake hints the worker emits are collected apart
from the other events. With `doorbells=True` the worker gets a `WorkerDoorbells` set, as
GpuWorkerCtl gives it: `wake` then rings `to_worker` instead of writing a JSON hint.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import TypeVar

from swactor.arena import Arena
from swactor.ring import Ring, WorkerDoorbells, header_len
from swactor.wire import (
    AwaitedInput,
    DTypeFamily,
    EdgeId,
    GrantSteps,
    InitializeWorker,
    InstallRing,
    JsonValue,
    LayoutRule,
    ObjectHeader,
    ObjectId,
    ObjectKind,
    ObjectSpec,
    OutputBinding,
    PortId,
    RingDirection,
    RingId,
    RingInstalled,
    RingLayout,
    RingReadable,
    RingWritable,
    RoleId,
    Sequence,
    SequencePolicy,
    ShapeRule,
    StepId,
    WireStruct,
    WorkerEvent,
    WorkerGeneration,
    WorkerReady,
    decode_event,
    encode_line,
)
from swactor.worker.process import ring_helper_abi

E = TypeVar("E")

EVENT_TIMEOUT_S = 30.0


def float_spec(
    max_extent: int = 1 << 20, policy: SequencePolicy = SequencePolicy.Contiguous
) -> ObjectSpec:
    return ObjectSpec(
        kind=ObjectKind.Activation,
        max_extent=max_extent,
        dtype_family=DTypeFamily.Float,
        dtype_width_bytes=4,
        shape=ShapeRule.Vector,
        layout=LayoutRule.RowMajor,
        alignment=4,
        sequence_policy=policy,
    )


def grant(role: int, first_step: int, *, ring: int = 1, sequence: int = 0,
          row_bytes: int = 4, out_ring: int = 2, object_id: int = 11,
          extent: int | None = None, flags: int = 0) -> GrantSteps:
    """A standing grant: role `role` runs step `first_step` + k on the object of sequence
    `sequence` + k that ingress ring `ring` loads (port 1), writing object `object_id` + k
    of that sequence on egress ring `out_ring` (port 1): `extent` bytes, or by default
    `row_bytes` per input row (as a stage controller grants an activation stage)."""
    output = OutputBinding(
        PortId(1), RingId(out_ring), ObjectId(object_id), Sequence(sequence),
        row_bytes if extent is None else extent, flags, per_input_row=extent is None)
    return GrantSteps(RoleId(role), StepId(first_step),
                      AwaitedInput(PortId(1), RingId(ring), Sequence(sequence), row_bytes),
                      output)


def record(object_id: int, sequence: int, payload: bytes, flags: int = 0) -> bytes:
    header = ObjectHeader(ObjectId(object_id), Sequence(sequence), len(payload), flags)
    return header.pack() + payload


@dataclass
class WorkerRig:
    arena_bytes: int = 1 << 22
    backend: JsonValue = None
    doorbells: bool = False
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the worker (e.g. `SWACTOR_FAULT_INJECT`, `swactor.faults`)."""
    bells: WorkerDoorbells | None = field(init=False, default=None)
    arena: Arena = field(init=False)
    proc: subprocess.Popen[bytes] = field(init=False)
    events: queue.Queue[WorkerEvent | BaseException | None] = field(init=False)
    wakes: list[WorkerEvent] = field(init=False)
    stderr: list[str] = field(init=False)
    rings: dict[int, Ring] = field(init=False)
    _next_offset: int = field(init=False, default=1 << 16)

    def __post_init__(self) -> None:
        self.arena = Arena.create(self.arena_bytes)
        self.events = queue.Queue()
        self.wakes = []
        self.stderr = []
        self.rings = {}
        self.spawn()

    def spawn(self) -> None:
        env = {**os.environ, **self.env, **self.arena.child_env()}
        fds = [self.arena.fd]
        if self.doorbells:
            self.bells = WorkerDoorbells.create()
            env.update(self.bells.env())
            fds += self.bells.fds()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "swactor.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=fds,
            env=env,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(decode_event(line))
            except Exception as exc:  # a malformed line fails the test that waits
                self.events.put(exc)
        self.events.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.decode(errors="replace"))

    # -- commands and events -----------------------------------------------------------

    def send(self, command: WireStruct) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_line(command).encode())
        self.proc.stdin.flush()

    def wake(self, hint: RingReadable | RingWritable) -> None:
        """A wake hint to the worker: its doorbell when it has one, else a JSON line."""
        if self.bells is not None:
            self.bells.to_worker.notify()
        else:
            self.send(hint)

    def send_raw(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def next_event(self, timeout: float = EVENT_TIMEOUT_S) -> WorkerEvent | None:
        """The next non-wake event; None once stdout closed."""
        while True:
            try:
                item = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no worker event in {timeout}s; stderr:\n{''.join(self.stderr[-20:])}"
                ) from None
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, RingReadable | RingWritable):
                self.wakes.append(item)
                continue
            return item

    def expect(self, kind: type[E], timeout: float = EVENT_TIMEOUT_S) -> E:
        event = self.next_event(timeout)
        assert isinstance(event, kind), f"expected {kind.__name__}, got {event!r}"
        return event

    def initialize(self, generation: int = 1) -> WorkerReady:
        self.send(
            InitializeWorker(
                WorkerGeneration(generation), self.arena.size, ring_helper_abi(), self.backend
            )
        )
        return self.expect(WorkerReady)

    def add_ring(
        self,
        ring_id: int,
        direction: RingDirection,
        capacity: int,
        spec: ObjectSpec | None = None,
        edge_id: int | None = None,
        port_id: int | None = None,
    ) -> Ring:
        """Lay out, initialise and install a ring; return the node side's handle."""
        offset = self._next_offset
        layout = RingLayout.at(ring_id, offset, capacity, header_bytes=header_len())
        self._next_offset = (layout.end_offset + 4095) // 4096 * 4096
        ring = Ring.init(self.arena, layout)
        self.rings[ring_id] = ring
        self.send(
            InstallRing(
                RingId(ring_id),
                EdgeId(edge_id if edge_id is not None else 100 + ring_id),
                PortId(port_id if port_id is not None else ring_id),
                direction,
                layout,
                spec or float_spec(),
            )
        )
        installed = self.expect(RingInstalled)
        assert installed.ring_id == ring_id
        return ring

    def wait_exit(self, timeout: float = EVENT_TIMEOUT_S) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        for ring in self.rings.values():
            ring.close()
        if self.bells is not None:
            self.bells.close()
        self.arena.close()


def write_all(rig: WorkerRig, ring: Ring, data: bytes, timeout: float = EVENT_TIMEOUT_S) -> None:
    """Producer side of an ingress ring: write `data`, waking the worker after each
    commit and waiting for the space it frees (RingWritable) when the ring is full."""
    import time

    sent = 0
    deadline = time.monotonic() + timeout
    while sent < len(data):
        n, _ = ring.write_from(memoryview(data)[sent:])
        sent += n
        rig.wake(RingReadable(RingId(ring.ring_id)))
        if n == 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"ring {ring.ring_id} stayed full; {sent} bytes written")
            time.sleep(0.002)


def read_all(
    rig: WorkerRig, ring: Ring, length: int, timeout: float = EVENT_TIMEOUT_S
) -> bytes:
    """Consumer side of an egress ring: read `length` bytes, waking the worker after
    each release of space."""
    import time

    out = bytearray(length)
    got = 0
    deadline = time.monotonic() + timeout
    while got < length:
        n, _ = ring.read_into(memoryview(out)[got:])
        got += n
        if n:
            rig.wake(RingWritable(RingId(ring.ring_id)))
        elif time.monotonic() > deadline:
            raise AssertionError(f"ring {ring.ring_id}: {got} of {length} bytes arrived")
        else:
            time.sleep(0.002)
    return bytes(out)
