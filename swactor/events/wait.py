"""Waiting for events in tests: `await wait_for_event(source, timeout, **fields)`.

Tests follow progress through events, never by scraping logs. A source is anything with
`read_since(cursor) -> (new events, new cursor)` and `async changed(timeout)`:
`MemorySink` for in-process tests, `JsonlFollower(paths)` for other processes' JSON Lines
files (it polls, follows rotation, and rejects bad lines with `EventSchemaError`).

`wait_for_event` returns the first event since `since` (default: from the beginning, so
an event that happened before the call still counts) whose fields equal every given
field (`event="run_faulted", run_id=3, reason=RunFaultReason.WorkerCrashed`; enum and
identity values compare by their JSON value) and that satisfies `where`, if given. A
field name no event has is a `TypeError` at once (a typo must not read as a timeout). On
timeout it raises `EventTimeout` naming the fields and the last events it saw.
"""

from __future__ import annotations

import asyncio
import enum
import os
from collections.abc import Callable
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import IO, Any, Protocol

from swactor.events.names import EventName
from swactor.events.schema import (
    CAUSE_ENUMS,
    ENVELOPE_KEYS,
    EVENT_CLASSES,
    Emitted,
    validate_line,
)


class EventSource(Protocol):
    def read_since(self, cursor: int) -> tuple[list[Emitted], int]: ...

    async def changed(self, timeout: float) -> None: ...


class EventTimeout(TimeoutError):
    """No matching event arrived in time."""

    def __init__(self, wanted: dict[str, Any], timeout_s: float, recent: list[str]) -> None:
        super().__init__(
            f"no event matching {wanted} within {timeout_s:g} s; last seen: {recent or 'none'}"
        )
        self.wanted = wanted
        self.recent = recent


MATCHABLE = frozenset(ENVELOPE_KEYS) | {
    f.name for cls in EVENT_CLASSES.values() for f in dataclass_fields(cls)
}


def _json_value(value: object) -> object:
    if isinstance(value, EventName):
        return value.value
    if isinstance(value, enum.Enum):
        if CAUSE_ENUMS.get(type(value).__name__) is type(value):
            return f"{type(value).__name__}.{value.name}"
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def matches(emitted: Emitted, wanted: dict[str, object]) -> bool:
    """True if every wanted field of `emitted` has the wanted JSON value."""
    for key, value in wanted.items():
        try:
            if emitted.value(key) != value:
                return False
        except KeyError:
            return False
    return True


async def wait_for_event(
    source: EventSource,
    timeout: float,
    *,
    since: int = 0,
    where: Callable[[Emitted], bool] | None = None,
    **fields: object,
) -> Emitted:
    """The first event from `since` on matching `fields` (and `where`); see the module doc."""
    unknown = sorted(set(fields) - MATCHABLE)
    if unknown:
        raise TypeError(f"wait_for_event: no event has the field(s) {unknown}")
    wanted = {key: _json_value(value) for key, value in fields.items()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    cursor = since
    recent: list[str] = []
    while True:
        batch, cursor = source.read_since(cursor)
        for emitted in batch:
            if matches(emitted, wanted) and (where is None or where(emitted)):
                return emitted
            recent = [*recent, emitted.name.value][-8:]
        left = deadline - loop.time()
        if left <= 0:
            raise EventTimeout(wanted, timeout, recent)
        await source.changed(left)


class JsonlFollower:
    """Tails JSON Lines event files written by other processes (rotation-aware)."""

    def __init__(self, *paths: str | os.PathLike[str], poll_s: float = 0.02) -> None:
        self.paths = [Path(p) for p in paths]
        self.poll_s = poll_s
        self.events: list[Emitted] = []
        self._open: dict[Path, tuple[IO[bytes], int]] = {}
        self._partial: dict[Path, bytes] = {}

    def read_since(self, cursor: int) -> tuple[list[Emitted], int]:
        for path in self.paths:
            self._poll(path)
        return self.events[cursor:], len(self.events)

    async def changed(self, timeout: float) -> None:
        await asyncio.sleep(min(self.poll_s, max(timeout, 0.0)))

    def close(self) -> None:
        for handle, _inode in self._open.values():
            handle.close()
        self._open.clear()

    def _poll(self, path: Path) -> None:
        current = self._open.get(path)
        if current is not None:
            self._drain(path, current[0])
            try:
                inode = path.stat().st_ino
            except FileNotFoundError:
                return
            if inode == current[1]:
                return
            self._drain(path, current[0])  # lines written just before the rotation
            current[0].close()  # rotated: the old file is drained, follow the new one
            del self._open[path]
            self._partial.pop(path, None)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - kept open while following
        except FileNotFoundError:
            return
        self._open[path] = (handle, os.fstat(handle.fileno()).st_ino)
        self._drain(path, handle)

    def _drain(self, path: Path, handle: IO[bytes]) -> None:
        data = self._partial.pop(path, b"") + handle.read()
        *lines, rest = data.split(b"\n")
        if rest:
            self._partial[path] = rest
        for line in lines:
            if line.strip():
                self.events.append(validate_line(line))
