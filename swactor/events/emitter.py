"""Emitting events: stamp a record with time and process, hand it to every sink.

An `Emitter` belongs to one process (or, in an in-process test cluster, to one simulated
node). `emit(record)` stamps `mono`, `wall`, `pid` and the process label (`mono` may be given:
an event another process on this host timed), writes the
`Emitted` line to each sink, and returns it. `emit_all(records)` does the same for several
records that happened together (a stage's step: four events per token) and hands them to
each sink at once, so a JSON Lines file gets one write and one flush for all of them. A
sink that fails (disk full, closed stream) is reported once in the log and skipped:
observability never takes a node down.

`swactor.events.emit(record)` uses the process-wide default emitter; `configure(...)` or
`configure_from_args(args, proc)` (with the flags of `add_event_arguments`) replaces it.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterable
from typing import Protocol

from swactor.cliargs import at_least
from swactor.events.schema import Emitted, LifecycleEvent
from swactor.events.sinks import JsonlSink, StderrSink

log = logging.getLogger("swactor.events")


class Sink(Protocol):
    """Where emitted events go. A sink may also have `write_all(events)`, which
    `Emitter.emit_all` then calls once for its events (one `write` each otherwise)."""

    def write(self, emitted: Emitted) -> None: ...

    def close(self) -> None: ...


class Emitter:
    """Stamps and fans out the events of one process."""

    def __init__(self, proc: str, sinks: Iterable[Sink] = ()) -> None:
        if not proc:
            raise ValueError("Emitter: proc label is empty")
        self.proc = proc
        self.sinks: list[Sink] = list(sinks)
        self._failed: set[int] = set()

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def remove_sink(self, sink: Sink) -> None:
        self.sinks.remove(sink)

    def emit(self, event: LifecycleEvent, mono_ns: int | None = None) -> Emitted:
        """Stamp and write `event`; `mono_ns` (`time.monotonic_ns()` of this host) says
        when it happened when that was earlier than now (another process on this host
        saw it: a worker's step), its `wall` then moved back by as much."""
        now_mono, wall = time.monotonic_ns(), time.time_ns()
        if mono_ns is not None:
            wall -= max(0, now_mono - mono_ns)
            now_mono = mono_ns
        emitted = Emitted(event, now_mono, wall, os.getpid(), self.proc)
        for sink in self.sinks:
            try:
                sink.write(emitted)
            except (OSError, ValueError) as error:
                self._sink_failed(sink, error)
        return emitted

    def emit_all(self, events: Iterable[tuple[LifecycleEvent, int | None]]
                 ) -> list[Emitted]:
        """`emit` for each (event, mono_ns) in order, handed to every sink in one call."""
        now_mono, wall, pid = time.monotonic_ns(), time.time_ns(), os.getpid()
        batch = [Emitted(event, now_mono if mono is None else mono,
                         wall if mono is None else wall - max(0, now_mono - mono),
                         pid, self.proc) for event, mono in events]
        for sink in self.sinks:
            try:
                write_all = getattr(sink, "write_all", None)
                if write_all is not None:
                    write_all(batch)
                else:
                    for emitted in batch:
                        sink.write(emitted)
            except (OSError, ValueError) as error:
                self._sink_failed(sink, error)
        return batch

    def _sink_failed(self, sink: Sink, error: Exception) -> None:
        if id(sink) not in self._failed:
            self._failed.add(id(sink))
            log.error("event sink %r failed: %s (further failures not logged)", sink, error)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


_default = Emitter("swactor")


def default_emitter() -> Emitter:
    return _default


def set_default_emitter(emitter: Emitter) -> Emitter:
    """Install `emitter` as the process default; returns the previous one."""
    global _default
    previous, _default = _default, emitter
    return previous


def emit(event: LifecycleEvent) -> Emitted:
    """Emit through the process-wide default emitter."""
    return _default.emit(event)


def configure(
    proc: str,
    jsonl_path: str | None = None,
    max_bytes: int = 64 << 20,
    keep: int = 3,
    verbosity: int | None = 1,
) -> Emitter:
    """Build and install the default emitter: a JSON Lines file and/or stderr lines."""
    sinks: list[Sink] = []
    if jsonl_path:
        sinks.append(JsonlSink(jsonl_path, max_bytes, keep))
    if verbosity is not None and verbosity >= 0:
        sinks.append(StderrSink(verbosity))
    emitter = Emitter(proc, sinks)
    set_default_emitter(emitter)
    return emitter


def add_event_arguments(parser: argparse.ArgumentParser) -> None:
    """The event flags every long-running subcommand takes."""
    group = parser.add_argument_group("lifecycle events")
    group.add_argument("--events-file", metavar="PATH",
                       help="write lifecycle events as JSON Lines to PATH")
    group.add_argument("--events-max-bytes", type=at_least(1), default=64 << 20, metavar="N",
                       help="rotate the events file when it would pass N bytes (default "
                       "64MiB)")
    group.add_argument("--events-keep", type=at_least(0), default=3, metavar="K",
                       help="rotated events files to keep (PATH.1 ... PATH.K; default 3)")
    group.add_argument("--event-verbosity", type=int, choices=(-1, 0, 1, 2), default=1,
                       help="events on stderr: -1 none, 0 faults, 1 lifecycle, 2 per step "
                       "(default 1)")


def configure_from_args(args: argparse.Namespace, proc: str) -> Emitter:
    """`configure` from the flags of `add_event_arguments`."""
    return configure(proc, args.events_file, args.events_max_bytes, args.events_keep,
                     args.event_verbosity)
