"""Two-node transport harness: endpoints, drivers, rings and worker-like ring ends.

`Node` wires an endpoint and a driver, records every driver event, and routes the
driver's wake hints to per-ring asyncio events that the test's producer and consumer
coroutines (standing in for the worker) wait on.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from swactor.transport.config import TransportConfig
from swactor.transport.driver import Driver
from swactor.transport.endpoint import QuicEndpoint
from swactor.transport.identity import NodeIdentity
from swactor.transport.messages import DriverEvent, RingReadable, StreamFault, WakeHint
from tests.transport.fakering import FakeRing

T = TypeVar("T")


@dataclass
class Node:
    identity: NodeIdentity
    endpoint: QuicEndpoint
    driver: Driver
    events: list[DriverEvent] = field(default_factory=list)
    wakes: dict[int, asyncio.Event] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

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


async def make_node(
    config: TransportConfig, identity: NodeIdentity | None = None, allowed: tuple[int, ...] = ()
) -> Node:
    ident = identity or NodeIdentity.generate()
    endpoint = QuicEndpoint(ident, config, allowed=allowed)
    await endpoint.start()
    holder: dict[str, Node] = {}

    def emit(event: DriverEvent) -> None:
        holder["node"].events.append(event)
        holder["node"].changed.set()

    def wake(hint: WakeHint) -> None:
        holder["node"].wake_event(hint.ring_id).set()

    node = Node(ident, endpoint, Driver(endpoint, emit, wake))
    holder["node"] = node
    return node


async def make_pair(config: TransportConfig) -> tuple[Node, Node]:
    """Sender `a` and receiver `b`, each allowing the other, `a` knowing `b`'s address."""
    ida, idb = NodeIdentity.generate(), NodeIdentity.generate()
    a = await make_node(config, ida, allowed=(idb.node_id,))
    b = await make_node(config, idb, allowed=(ida.node_id,))
    sock = b.endpoint._transport.get_extra_info("sockname")  # type: ignore[union-attr]
    a.endpoint.address_book[idb.node_id] = (sock[0], sock[1])
    return a, b


async def fail_on_fault(nodes: tuple[Node, ...], work: Awaitable[T], timeout: float) -> T:
    """Await `work`, failing at once when any node reports a StreamFault (or on timeout)."""

    async def first_fault() -> None:
        while True:
            for node in nodes:
                faults = node.of_type(StreamFault)
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


async def produce(node: Node, ring: FakeRing, ring_id: int, chunks: list[bytes]) -> str:
    """Worker-side egress producer: write `chunks` into `ring`, then close it."""
    digest = hashlib.sha256()
    writable = node.wake_event(ring_id)
    for data in chunks:
        digest.update(data)
        view = memoryview(data)
        while view:
            span = ring.writable_span()
            if not len(span):
                writable.clear()
                ring.clear_writable_pending()
                if not len(ring.writable_span()):
                    await writable.wait()
                continue
            n = min(len(span), len(view))
            span[:n] = view[:n]
            ring.advance_commit(n)
            view = view[n:]
            if ring.mark_readable_pending():
                node.driver.ring_readable(ring_id)
        await asyncio.sleep(0)
    ring.close_producer()
    if ring.mark_readable_pending():
        node.driver.ring_readable(ring_id)
    return digest.hexdigest()


@dataclass
class Consumer:
    """Worker-side ingress consumer: drains the ring, optionally stalling first."""

    node: Node
    ring: FakeRing
    ring_id: int
    received: int = 0
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    async def drain(self, stall_s: float = 0.0, stall_after: int = 0) -> str:
        readable = self.node.wake_event(self.ring_id)
        stalled = False
        while True:
            if not stalled and stall_s and self.received >= stall_after:
                stalled = True
                await asyncio.sleep(stall_s)
            span = self.ring.readable_span()
            if not len(span):
                if self.ring.producer_closed() and not len(self.ring.readable_span()):
                    return self.digest.hexdigest()
                readable.clear()
                self.ring.clear_readable_pending()
                if not len(self.ring.readable_span()) and not self.ring.producer_closed():
                    await readable.wait()
                continue
            self.digest.update(span)
            n = len(span)
            self.ring.advance_consume(n)
            self.received += n
            if self.ring.mark_writable_pending():
                self.node.driver.ring_writable(self.ring_id)


__all__ = [
    "Consumer",
    "Node",
    "RingReadable",
    "fail_on_fault",
    "make_node",
    "make_pair",
    "payload_chunks",
    "produce",
]
