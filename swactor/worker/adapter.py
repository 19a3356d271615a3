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
GpuWorkerCtl sees events in order as they happen.
"""

from __future__ import annotations

from typing import BinaryIO

from swactor.fsm.generated import worker_process as wp
from swactor.wire import (
    MAX_CONTROL_LINE,
    ConfigureRole,
    ExecuteStep,
    InitializeWorker,
    InstallRing,
    ReleaseDeviceObject,
    RingReadable,
    RingWritable,
    ShutdownWorker,
    UninstallRing,
    WireError,
    WorkerEvent,
    decode_command,
    encode_event,
)

#: What `parse_command` gives for one line: the machine event and, for
#: InitializeWorker, the command itself (its `backend` is not a machine field).
Parsed = tuple[wp.Event, InitializeWorker | None]


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


def parse_command(line: bytes) -> Parsed:
    """The machine event for one stdin line (total: MalformedCommand for bad input)."""
    try:
        command = decode_command(line)
    except (WireError, ValueError, TypeError, RecursionError):
        return wp.MalformedCommand(), None
    match command:
        case InitializeWorker():
            event: wp.Event = wp.InitializeWorker(
                command.worker_generation, command.arena_ceiling, command.required_ring_helper_abi
            )
            return event, command
        case ConfigureRole():
            return wp.ConfigureRole(command), None
        case InstallRing():
            return wp.InstallRing(command), None
        case UninstallRing():
            return wp.UninstallRing(command.ring_id, command.reason), None
        case ExecuteStep():
            return wp.ExecuteStep(command), None
        case ShutdownWorker():
            return wp.ShutdownWorker(command.mode), None
    if isinstance(command, ReleaseDeviceObject):
        return wp.ReleaseDeviceObject(command.device_handle), None
    if isinstance(command, RingReadable):
        return wp.RingReadable(command.ring_id), None
    if isinstance(command, RingWritable):
        return wp.RingWritable(command.ring_id), None
    return wp.MalformedCommand(), None


class EventWriter:
    """Writes worker events to stdout, one flushed line each."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.broken = False

    def __call__(self, event: WorkerEvent) -> None:
        if self.broken:
            return
        try:
            self._stream.write(encode_event(event).encode())
            self._stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True  # GpuWorkerCtl is gone; ControlClosed follows on stdin
