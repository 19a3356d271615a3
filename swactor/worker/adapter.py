"""The worker's side of the I/O adapter: stdin command lines in, stdout event lines out.

Theory of operation
-------------------
Spec §28: one JSON object per line; commands on stdin, events on stdout, logs on stderr;
payload bytes never in JSON. `read_command_line` reads one line with a length bound (a
line that never ends cannot grow memory); `parse_command` turns it into the
worker_process machine's event: a decoded command, or `MalformedCommand` for anything
that is not valid JSON of a known command shape (`ControlMessageError` or the body's
`WireError`). It is total: no input escapes as an exception. End of stdin is
`ControlClosed`. `EventWriter` writes one `encode_event` line per event and flushes, so
GpuWorkerCtl sees events in order as they happen; with `buffered=True` it keeps the
lines until `flush()`, which the worker's loop calls before it waits for input and the
step runner before a step's compute, so the events of one burst (an object produced,
its step completed, its input released) cost the node one pipe wake instead of one each.

`LineReader` is `read_command_line` over a raw fd for a loop that polls stdin beside its
doorbells (`swactor.ring.WorkerDoorbells`): it reads what the fd has, hands out whole
lines from its buffer, and applies the same bound (a line over `MAX_CONTROL_LINE` is
skipped to its newline and given as b"\xff").
"""

from __future__ import annotations

import os
from typing import BinaryIO

from swactor.fsm.generated import worker_process as wp
from swactor.wire import (
    MAX_CONTROL_LINE,
    ConfigureRole,
    GrantSteps,
    InitializeWorker,
    InstallRing,
    ReleaseDeviceObject,
    RevokeSteps,
    RingReadable,
    RingWritable,
    ShutdownWorker,
    UninstallRing,
    WireError,
    WorkerEvent,
    decode_command,
    encode_event,
)


def read_command_line(stream: BinaryIO) -> bytes | None:
    """One line without its newline; None at end of input; b"\\xff" marks an overlong one."""
    line = stream.readline(MAX_CONTROL_LINE + 1)
    if not line:
        return None
    if not line.endswith(b"\n"):
        if len(line) > MAX_CONTROL_LINE:
            while (rest := stream.readline(MAX_CONTROL_LINE)) and not rest.endswith(b"\n"):
                pass
            return b"\xff"
        return line  # last line without a newline
    return line[:-1]


def parse_command(line: bytes) -> wp.Event:
    """The machine event for one stdin line, carrying all the command says (total:
    MalformedCommand for bad input)."""
    try:
        command = decode_command(line)
    except (WireError, ValueError, TypeError, RecursionError):
        return wp.MalformedCommand()
    match command:
        case InitializeWorker():
            return wp.InitializeWorker(command.worker_generation, command.arena_ceiling,
                                       command.required_ring_helper_abi, command.backend)
        case ConfigureRole():
            return wp.ConfigureRole(command)
        case InstallRing():
            return wp.InstallRing(command)
        case UninstallRing() | RingReadable() | RingWritable() | RevokeSteps():
            return command  # the table's own events
        case GrantSteps():
            return wp.GrantSteps(command)
        case ShutdownWorker():
            return wp.ShutdownWorker(command.mode)
    if isinstance(command, ReleaseDeviceObject):
        return wp.ReleaseDeviceObject(command.device_handle)
    return wp.MalformedCommand()


class LineReader:
    """Bounded command lines from a raw fd (module doc); `fill` after poll said readable."""

    def __init__(self, fd: int, limit: int = MAX_CONTROL_LINE) -> None:
        self.fd = fd
        self.limit = limit
        self.eof = False
        self._buf = bytearray()
        self._skipping = False

    def fill(self) -> None:
        """Read what the fd has (one read); end of input sets `eof`."""
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof = True
        self._buf += chunk

    def next_line(self) -> bytes | None:
        """The next whole line without its newline (b"\xff" for an overlong one), or None
        when the buffer holds none (at `eof`, a last line without a newline is given)."""
        while True:
            end = self._buf.find(b"\n")
            if self._skipping:
                if end < 0:
                    self._buf.clear()
                    return None
                del self._buf[: end + 1]
                self._skipping = False
                return b"\xff"
            if end < 0:
                if len(self._buf) > self.limit:
                    self._buf.clear()
                    self._skipping = True
                    continue
                if self.eof and self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                return None
            if end > self.limit:
                del self._buf[: end + 1]
                return b"\xff"
            line = bytes(self._buf[:end])
            del self._buf[: end + 1]
            return line


class EventWriter:
    """Writes worker events to stdout, one line each; flushed at once unless `buffered`."""

    def __init__(self, stream: BinaryIO, buffered: bool = False) -> None:
        self._stream = stream
        self.buffered = buffered
        self.broken = False
        self._pending: list[bytes] = []

    def __call__(self, event: WorkerEvent) -> None:
        if self.broken:
            return
        self._pending.append(encode_event(event).encode())
        if not self.buffered:
            self.flush()

    def flush(self) -> None:
        """Write the lines kept so far, in one write."""
        if not self._pending or self.broken:
            self._pending.clear()
            return
        data = b"".join(self._pending)
        self._pending.clear()
        try:
            self._stream.write(data)
            self._stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True  # GpuWorkerCtl is gone; ControlClosed follows on stdin
