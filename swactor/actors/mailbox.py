"""One actor's mailbox: a FIFO with a soft capacity for senders that can wait.

Control messages must never be lost or block their sender, so `put_nowait` always
appends, whatever the length. Bulk producers (a process actor relaying a child's output
lines, a pump reporting progress) instead `await put(...)`, which waits while the mailbox
holds `capacity` or more items: a slow consumer then slows its producer down instead of
letting memory grow. Ordering is FIFO over all senders, hence per sender.

There is exactly one consumer (the actor's run loop). `close()` ends the mailbox: it
returns what was still queued (the caller turns those into dead letters) and wakes every
waiting producer with `MailboxClosed`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class MailboxClosed(Exception):
    """The mailbox was closed: its actor has terminated."""


class Mailbox(Generic[T]):
    """A single-consumer FIFO; `capacity` bounds only the waiting `put`."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"mailbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[T] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def put_nowait(self, item: T) -> None:
        """Append now, regardless of capacity. Raises MailboxClosed after close()."""
        if self._closed:
            raise MailboxClosed
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def put(self, item: T) -> None:
        """Append once the mailbox holds fewer than `capacity` items."""
        while self.capacity is not None and len(self._items) >= self.capacity:
            if self._closed:
                raise MailboxClosed
            waiter = asyncio.get_running_loop().create_future()
            self._putters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._putters:
                    self._putters.remove(waiter)
        self.put_nowait(item)

    async def get(self) -> T:
        """Wait for and remove the oldest item."""
        while not self._items:
            if self._closed:
                raise MailboxClosed
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        item = self._items.popleft()
        self._wake_one_putter()
        return item

    def close(self) -> list[T]:
        """Close and return the items still queued."""
        self._closed = True
        left = list(self._items)
        self._items.clear()
        for waiter in self._putters:
            if not waiter.done():
                waiter.set_exception(MailboxClosed())
        self._putters.clear()
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)
        return left

    def _wake_one_putter(self) -> None:
        while self._putters:
            waiter = self._putters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
