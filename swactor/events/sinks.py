"""Where emitted events go: a JSON Lines file, a human line on stderr, memory.

- `JsonlSink(path, max_bytes, keep)`: one JSON line per event, appended and flushed at
  once (a node killed a moment later still leaves its last events on disk); the events
  of one `write_all` (`Emitter.emit_all`) go out in one write and one flush. When the
  next line would take the file past `max_bytes`, the file is rotated: `path.(keep-1)`
  is dropped, `path.k` becomes `path.(k+1)`, `path` becomes `path.1`, and a new `path`
  starts. `swactor events path path.1 ...` merges them back by time.
- `StderrSink(verbosity)`: a short human line per event at or below the verbosity:
  0 = faults only, 1 = lifecycle milestones as well (default), 2 = per-object and
  per-step events as well (`EVENT_LEVELS`).
- `MemorySink()`: keeps every event in a list and wakes `wait_for_event` callers; the
  in-process source for tests.

A sink's `write` is called on the emitting thread; `MemorySink` hands its wake-ups to
each waiter's event loop thread-safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from swactor.events.names import EventName
from swactor.events.schema import FAULT_EVENTS, IDENTITY_TYPES, Emitted

_E = EventName
EVENT_LEVELS: Mapping[EventName, int] = {
    name: 0 if name in FAULT_EVENTS else 2 if name in {
        _E.prompt_injected, _E.object_loaded, _E.execute_step_started,
        _E.object_produced, _E.step_completed, _E.token_received,
    } else 1
    for name in EventName
}
"""The lowest stderr verbosity at which each event is shown."""

_SHORT = {
    "node_id": "node", "run_id": "run", "stage_index": "stage", "edge_id": "edge",
    "ring_id": "ring", "object_id": "obj", "sequence": "seq", "step_id": "step",
    "worker_generation": "gen",
}


def format_wall(wall_ns: int) -> str:
    """UTC wall time with milliseconds: 2026-11-29T17:51:05.123Z."""
    stamp = datetime.datetime.fromtimestamp(wall_ns / 1e9, tz=datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def describe(emitted: Emitted) -> str:
    """`key=value` pairs of the record: identities (short names), then the rest."""
    data = emitted.event.to_json()
    parts = [f"{_SHORT[key]}={data[key]}" for key in IDENTITY_TYPES if key in data]
    for key, value in data.items():
        if key in IDENTITY_TYPES:
            continue
        if key == "detail":
            parts.extend(f"{k}={v}" for k, v in value.items())
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def human_line(emitted: Emitted) -> str:
    """One short line: time, process, event, fields."""
    clock = format_wall(emitted.wall)[11:23]
    return f"{clock} {emitted.proc}[{emitted.pid}] {emitted.name.value} {describe(emitted)}"


class JsonlSink:
    """Appends one JSON line per event to `path`, rotating by size."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 64 << 20, keep: int = 3):
        if max_bytes < 1 or keep < 0:
            raise ValueError("JsonlSink: max_bytes >= 1 and keep >= 0")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - held open for appends
        self._size = self._file.tell()

    def write(self, emitted: Emitted) -> None:
        self._append((emitted.to_line() + "\n").encode())

    def write_all(self, emitted: Sequence[Emitted]) -> None:
        """Several events in one write and one flush, rotating between lines as `write`
        would (so a file never passes `max_bytes` by more than one line)."""
        lines = [(e.to_line() + "\n").encode() for e in emitted]
        with self._lock:
            start = 0
            size = self._size
            for end, line in enumerate(lines):
                if size and size + len(line) > self.max_bytes:
                    self._write_locked(b"".join(lines[start:end]))
                    self._rotate()
                    start, size = end, 0
                size += len(line)
            self._write_locked(b"".join(lines[start:]))

    def _append(self, data: bytes) -> None:
        with self._lock:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            self._write_locked(data)

    def _write_locked(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self._file.flush()
            self._size += len(data)

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _rotate(self) -> None:
        self._file.close()
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            for index in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0


class StderrSink:
    """Writes `human_line` for each event at or below `verbosity` (0, 1 or 2)."""

    def __init__(self, verbosity: int = 1, stream: IO[str] | None = None) -> None:
        self.verbosity = verbosity
        self._stream = stream

    def write(self, emitted: Emitted) -> None:
        self.write_all((emitted,))

    def write_all(self, emitted: Sequence[Emitted]) -> None:
        """The shown lines of several events, in one write and one flush (none: nothing)."""
        lines = [human_line(e) + "\n" for e in emitted
                 if EVENT_LEVELS[e.name] <= self.verbosity]
        if lines:
            stream = self._stream or sys.stderr
            stream.write("".join(lines))
            stream.flush()

    def close(self) -> None:
        pass


class MemorySink:
    """Keeps every event; `wait_for_event` reads it and sleeps on `changed`."""

    def __init__(self) -> None:
        self.events: list[Emitted] = []
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()

    def write(self, emitted: Emitted) -> None:
        self.write_all((emitted,))

    def write_all(self, emitted: Sequence[Emitted]) -> None:
        with self._lock:
            self.events.extend(emitted)
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    def close(self) -> None:
        pass

    def cursor(self) -> int:
        """Position after the last event so far: pass as `since=` to see only later ones."""
        return len(self.events)

    def read_since(self, cursor: int) -> tuple[list[Emitted], int]:
        with self._lock:
            return self.events[cursor:], len(self.events)

    async def changed(self, timeout: float) -> None:
        """Return when an event arrives (or after `timeout`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, future))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    def names(self) -> list[str]:
        return [e.name.value for e in self.events]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
