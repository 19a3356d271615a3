"""Helpers for GpuWorkerCtl tests: collector actors and ring layouts in a real arena."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from swactor.actors import Actor, Context
from swactor.arena import Arena
from swactor.ring import Ring, header_len
from swactor.testing.worker_rig import float_spec
from swactor.wire import (
    EdgeId,
    InstallRing,
    PortId,
    RingDirection,
    RingId,
    RingLayout,
    RingReadable,
    RingWritable,
)

T = TypeVar("T")


class Collector(Actor[Any]):
    """Puts every message it receives on a queue."""

    def __init__(self, inbox: asyncio.Queue[Any]) -> None:
        self.inbox = inbox

    async def receive(self, ctx: Context[Any], message: Any) -> None:
        self.inbox.put_nowait(message)


async def take(inbox: asyncio.Queue[Any], kind: type[T], timeout: float = 60.0) -> T:
    """The next message of `kind`, skipping wake hints; any other message fails."""
    async with asyncio.timeout(timeout):
        while True:
            message = await inbox.get()
            if isinstance(message, RingReadable | RingWritable):
                continue
            assert isinstance(message, kind), f"expected {kind.__name__}, got {message!r}"
            return message


def install_command(
    arena: Arena, ring_id: int, direction: RingDirection, capacity: int, offset: int
) -> tuple[InstallRing, Ring]:
    layout = RingLayout.at(ring_id, offset, capacity, header_bytes=header_len())
    ring = Ring.init(arena, layout)
    command = InstallRing(
        RingId(ring_id), EdgeId(100 + ring_id), PortId(ring_id), direction, layout, float_spec()
    )
    return command, ring
