"""Two-node transport harness: endpoints, drivers, real memfd arenas and cffi rings.

`Node` wires an endpoint, an arena and a driver, records every driver event, and routes
the driver's wake hints to per-ring asyncio events. `produce` and `Consumer` play the
worker's side of the rings (their own `Ring` handles on the same arena), waiting on
those events with the pending-bit protocol of spec §21.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from swactor.arena import Arena
from swactor.ring import Ring, RingState
from swactor.testing.ring_rig import make_layout
from swactor.transport.config import TransportConfig
from swactor.transport.driver import Driver
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import DriverEvent, StreamFault, StreamRefused, WakeHint
from swactor.transport.udp import OutboundPath
from swactor.wire import RingLayout

T = TypeVar("T")
ARENA_BYTES = 32 << 20


@dataclass
class Node:
    identity: NodeIdentity
    endpoint: QuicEndpoint
    arena: Arena
    driver: Driver = field(init=False)
    events: list[DriverEvent] = field(default_factory=list)
    wakes: dict[int, asyncio.Event] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    next_offset: int = 1 << 16
    next_ring_id: int = 1
    handles: list[Ring] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.driver = Driver(self.endpoint, self.arena, self._emit, self._wake)

    def _emit(self, event: DriverEvent) -> None:
        self.events.append(event)
        self.changed.set()

    def _wake(self, hint: WakeHint) -> None:
        self.wake_event(hint.ring_id).set()

    def new_ring(self, capacity: int) -> tuple[int, RingLayout, Ring]:
        """Lease a ring by hand: layout, header written (installer), worker-side handle."""
        ring_id = self.next_ring_id
        self.next_ring_id += 1
        layout = make_layout(capacity, ring_id=ring_id, offset=self.next_offset)
        self.next_offset = (layout.end_offset + 65535) // 65536 * 65536
        assert self.next_offset <= self.arena.size, "harness arena too small"
        handle = Ring.init(self.arena, layout)
        self.handles.append(handle)
        return ring_id, layout, handle

    def wake_event(self, ring_id: int) -> asyncio.Event:
        return self.wakes.setdefault(ring_id, asyncio.Event())

    def of_type(self, kind: type) -> list[DriverEvent]:
        return [event for event in self.events if isinstance(event, kind)]

    async def wait_for(self, kind: type, timeout: float = 10.0) -> DriverEvent:
        async def scan() -> DriverEvent:
            while True:
                found = self.of_type(kind)
                if found:
                    return found[0]
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def close(self) -> None:
        await self.driver.close()
        await self.endpoint.close()
        for handle in self.handles:
            handle.close()


async def make_node(
    config: TransportConfig,
    identity: NodeIdentity | None = None,
    allowed: tuple[int, ...] = (),
    host: str = "127.0.0.1",
    outbound: OutboundPath | None = None,
) -> Node:
    ident = identity or NodeIdentity.generate()
    endpoint = QuicEndpoint(ident, config, allowed=allowed, outbound=outbound)
    await endpoint.start(host)
    return Node(ident, endpoint, Arena.create(ARENA_BYTES))


def address_of(node: Node) -> tuple[str, int]:
    return node.endpoint.address


async def make_pair(
    config: TransportConfig, outbound: OutboundPath | None = None
) -> tuple[Node, Node]:
    """Sender `a` and receiver `b`, each allowing the other, `a` knowing `b`'s address;
    both send through `outbound` when given."""
    ida, idb = NodeIdentity.generate(), NodeIdentity.generate()
    a = await make_node(config, ida, allowed=(idb.node_id,), outbound=outbound)
    b = await make_node(config, idb, allowed=(ida.node_id,), outbound=outbound)
    a.endpoint.address_book[idb.node_id] = address_of(b)
    return a, b


async def fail_on_fault(nodes: tuple[Node, ...], work: Awaitable[T], timeout: float) -> T:
    """Await `work`, failing at once when any node reports a StreamFault (or on timeout)."""

    async def first_fault() -> None:
        while True:
            for node in nodes:
                faults = [*node.of_type(StreamFault), *node.of_type(StreamRefused)]
                if faults:
                    raise AssertionError(f"stream fault on {node.identity.node_id:#x}: {faults}")
            await asyncio.sleep(0.02)

    watcher = asyncio.ensure_future(first_fault())
    job = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait(
            {watcher, job}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if job in done:
            return job.result()
        if watcher in done:
            watcher.result()
        raise AssertionError(f"no result within {timeout} s")
    finally:
        watcher.cancel()
        job.cancel()
        await asyncio.gather(watcher, job, return_exceptions=True)


def payload_chunks(total: int, seed: int, chunk: int = 1 << 20) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    left = total
    while left:
        n = min(chunk, left)
        out.append(rng.randbytes(n))
        left -= n
    return out


async def produce(
    node: Node, ring: Ring, ring_id: int, chunks: list[bytes], close: bool = True
) -> str:
    """Worker-side egress producer: write `chunks` into `ring`, then close it."""
    digest = hashlib.sha256()
    writable = node.wake_event(ring_id)
    for data in chunks:
        digest.update(data)
        view = memoryview(data)
        while view:
            span = ring.writable_span(len(view))
            if not len(span):
                writable.clear()
                ring.clear_writable_pending()
                if not len(ring.writable_span()):
                    await writable.wait()
                continue
            n = len(span)
            span[:] = view[:n]
            del span
            view = view[n:]
            if ring.commit_and_mark(n):
                node.driver.ring_readable(ring_id)
        await asyncio.sleep(0)
    if close:
        ring.close_producer()
        if ring.mark_readable_pending():
            node.driver.ring_readable(ring_id)
    return digest.hexdigest()


@dataclass
class Consumer:
    """Worker-side ingress consumer: drains the ring, optionally stalling first."""

    node: Node
    ring: Ring
    ring_id: int
    received: int = 0
    high_fill: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    async def drain(self, stall_s: float = 0.0, stall_after: int = 0) -> str:
        readable = self.node.wake_event(self.ring_id)
        ring = self.ring
        stalled = False
        while True:
            if not stalled and stall_s and self.received >= stall_after:
                stalled = True
                await asyncio.sleep(stall_s)
            self.high_fill = max(self.high_fill, ring.commit - ring.consume)
            span = ring.readable_span()
            if not len(span):
                if ring.state is RingState.Closed and not len(ring.readable_span()):
                    return self.digest.hexdigest()
                readable.clear()
                ring.clear_readable_pending()
                if not len(ring.readable_span()) and ring.state is RingState.Open:
                    await readable.wait()
                continue
            self.digest.update(span)
            n = len(span)
            del span
            self.received += n
            if ring.consume_and_mark(n):
                self.node.driver.ring_writable(self.ring_id)


__all__ = [
    "Consumer",
    "Node",
    "address_of",
    "fail_on_fault",
    "make_node",
    "make_pair",
    "payload_chunks",
    "produce",
]
