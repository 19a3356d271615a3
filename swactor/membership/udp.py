"""One SWIM member on a real UDP socket, run by its own thread.

Theory of operation
-------------------
`MembershipNode` owns a UDP socket on its own port and a thread that is the only user of
its `SwimCore` and `Codec`. The thread sleeps in `select()` until a datagram arrives,
the core's next deadline passes, or another thread asks something of it (a byte on a
wake-up socket pair); then it verifies and handles datagrams, runs due timers, sends
what the core returns and hands membership events to `on_event`. Because probes are
answered and sent from this thread, a busy asyncio (QUIC) loop in the same process does
not make the node look dead: only the GIL is shared, and CPython hands it over every
few milliseconds.

Other threads talk to it through `update_meta`, `leave`, `view` and `stop`, which post
commands and wake the thread; `view()` returns a snapshot taken under a lock.
`on_event` is called on the membership thread: hand events to asyncio with
`loop.call_soon_threadsafe` (`asyncio_events` does exactly that into a queue).

Bad input never leaves the receive loop: a datagram that is malformed (over
`MAX_DATAGRAM` bytes, wrong version or length, bad JSON...) is dropped and counted
(`malformed`); one that is refused by the wire layer (forged, not in the pool, stale,
replayed, misdirected) is dropped, counted by reason (`forged`) and reported as a
`ForgedMessage` event; a message the core refuses (`Refused`: table full, a claim too
far ahead, a PingReq for a stranger, an ack from the wrong responder) is counted by
reason (`refused`). Each datagram is handled on its own, so one bad datagram in a batch
costs the others nothing. Events about refusals go to the listeners and the log at most
`REPORTS_PER_S` times a second; the counters count them all. Answers to datagrams that
are not authenticated (see `swactor.membership.wire`) are capped at the size of the
datagram that asked.

Pool admission: `allowed_keys` is the pool's allow-list, the full raw 32-byte Ed25519
public keys of its members (`swactor.membership.wire.public_key_raw`), pinned; None means an
open pool. With it, a datagram or gossip update sent or authored by any other key is
refused (`ForgeryReason.NotInPool`) before its signature is even verified. `allowed`
(64-bit node ids) is the older, weaker list: a node id is only a hash of the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence

from swactor.membership.config import SwimConfig
from swactor.membership.core import MemberView, SwimCore
from swactor.membership.messages import (
    Address,
    ForgedMessage,
    ForgeryReason,
    MemberMeta,
    MembershipEvent,
    Outgoing,
    RefusalReason,
    Refused,
)
from swactor.membership.wire import MAX_DATAGRAM, Codec, MembershipWireError, Signer
from swactor.transport.identity import NodeIdentity
from swactor.wire import NodeId

log = logging.getLogger(__name__)

EventCallback = Callable[[MembershipEvent], None]

REPORTS_PER_S = 20
"""Refusal reports (events and log lines) per second at most; the rest are only counted."""


class MembershipNode:
    """A SWIM participant on UDP `bind`, in its own thread (see the module docstring)."""

    def __init__(
        self,
        identity: NodeIdentity,
        config: SwimConfig,
        meta: MemberMeta,
        *,
        seeds: Sequence[Address] = (),
        allowed: Collection[NodeId] | None = None,
        allowed_keys: frozenset[bytes] | None = None,
        on_event: EventCallback | None = None,
        bind: Address = ("127.0.0.1", 0),
        rng: random.Random | None = None,
    ) -> None:
        self.node_id = NodeId(identity.node_id)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(bind)
        self._sock.setblocking(False)
        host, port = self._sock.getsockname()[:2]
        self.address: Address = (str(host), int(port))
        meta = MemberMeta(
            swim_host=meta.swim_host or self.address[0], swim_port=self.address[1],
            quic_host=meta.quic_host, quic_port=meta.quic_port, boot_health=meta.boot_health,
            device_kind=meta.device_kind, memory_bytes=meta.memory_bytes, role=meta.role,
        )
        self._codec = Codec(Signer(identity.private_key), allowed, allowed_keys=allowed_keys)
        self._core = SwimCore(config, self.node_id, meta, rng or random.Random())
        self._seeds = tuple(seeds)
        self._listeners: list[EventCallback] = [] if on_event is None else [on_event]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._commands: list[Callable[[float], list[Outgoing]]] = []
        self._lock = threading.Lock()
        self._view: dict[NodeId, MemberView] = self._core.view()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"swim-{self.node_id:016x}",
                                        daemon=True)
        self.malformed = 0
        self.forged: Counter[ForgeryReason] = Counter()
        self.refused: Counter[RefusalReason] = Counter()
        self._report_second = 0
        self._reports = 0

    # ------------------------------------------------------------ other threads

    def start(self) -> None:
        """Start the membership thread and contact the seeds."""
        self._post(lambda now: self._core.start(now, self._seeds))
        self._thread.start()

    def add_listener(self, callback: EventCallback) -> None:
        """Also hand every membership event to `callback` (call before `start`)."""
        self._listeners.append(callback)

    def update_meta(self, meta: MemberMeta) -> None:
        """Publish new metadata (boot health, endpoint); the SWIM address is kept."""
        def apply(now: float) -> list[Outgoing]:
            current = self._core.meta
            self._core.update_meta(
                MemberMeta(current.swim_host, current.swim_port, meta.quic_host, meta.quic_port,
                           meta.boot_health, meta.device_kind, meta.memory_bytes, meta.role),
                now)
            return []
        self._post(apply)

    def view(self) -> dict[NodeId, MemberView]:
        """A snapshot of the membership view (refreshed after every step of the thread)."""
        with self._lock:
            return dict(self._view)

    @property
    def meta(self) -> MemberMeta:
        return self._core.meta

    def stop(self, leave: bool = True, timeout: float = 2.0) -> None:
        """Announce a graceful leave (optionally), stop the thread, close the socket."""
        if leave and self._thread.is_alive():
            self._post(self._core.leave)
        self._stopping = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> MembershipNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _post(self, command: Callable[[float], list[Outgoing]]) -> None:
        with self._lock:
            self._commands.append(command)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # ------------------------------------------------------------ membership thread

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._step()
            except Exception:  # a bug in one step must not silence the member for good
                log.exception("SWIM member %016x: step failed; continuing", self.node_id)
                time.sleep(0.01)
        try:
            self._step(block=False)  # carry out a final leave
        except Exception:
            log.exception("SWIM member %016x: final step failed", self.node_id)

    def _step(self, block: bool = True) -> None:
        core = self._core
        now = time.monotonic()
        timeout = max(0.0, min(core.next_deadline() - now, 1.0)) if block else 0.0
        readable, _, _ = select.select([self._sock, self._wake_r], [], [], timeout)
        now = time.monotonic()
        out: list[Outgoing] = []
        if self._wake_r in readable:
            with contextlib.suppress(OSError):
                self._wake_r.recv(4096)
        with self._lock:
            commands, self._commands = self._commands, []
        for command in commands:
            out.extend(command(now))
        if self._sock in readable:
            out.extend(self._receive(now))
        out.extend(core.tick(now))
        self._send(out)
        self._publish()

    def _receive(self, now: float) -> list[Outgoing]:
        out: list[Outgoing] = []
        for _ in range(256):
            try:
                datagram, source = self._sock.recvfrom(MAX_DATAGRAM + 1)
            except BlockingIOError:
                break
            except OSError:
                break  # e.g. ICMP port unreachable reported on a later recv
            address: Address = (str(source[0]), int(source[1]))
            out.extend(self._one(datagram, address, now))
        return out

    def _one(self, datagram: bytes, address: Address, now: float) -> list[Outgoing]:
        """Check and handle one datagram; whatever is wrong with it stays with it."""
        try:
            decoded = self._codec.decode(datagram, address, now)
        except MembershipWireError as error:
            self.malformed += 1
            if self._may_report(now):
                log.info("dropped a malformed SWIM datagram from %s:%d: %s",
                         address[0], address[1], error)
            return []
        except Exception:  # a codec bug must not drop the rest of the batch
            self.malformed += 1
            log.exception("SWIM datagram from %s:%d could not be decoded", *address)
            return []
        for forged in decoded.forged:
            self._forged(forged, "datagram" if decoded.message is None else "update", now)
        if decoded.message is None:
            return []
        try:
            return self._core.handle(decoded.message, address, now,
                                     None if decoded.authenticated else decoded.size)
        except Exception:
            log.exception("SWIM message from %s:%d could not be handled", *address)
            return []

    def _forged(self, forged: ForgedMessage, what: str, now: float) -> None:
        self.forged[forged.reason] += 1
        if self._may_report(now):
            log.warning("dropped a SWIM %s claiming node %016x from %s:%d (%s)", what,
                        forged.claimed, forged.source[0], forged.source[1],
                        forged.reason.value)
            self._emit(forged)

    def _refused(self, refused: Refused, now: float) -> None:
        self.refused[refused.reason] += 1
        if self._may_report(now):
            log.warning("refused a SWIM message from node %016x about node %016x (%s)",
                        refused.sender, refused.node_id, refused.reason.value)

    def _may_report(self, now: float) -> bool:
        second = int(now)
        if second != self._report_second:
            self._report_second, self._reports = second, 0
        self._reports += 1
        return self._reports <= REPORTS_PER_S

    def _send(self, out: list[Outgoing]) -> None:
        for item in out:
            for datagram in self._codec.encode(item.message, item.to, item.budget):
                try:
                    self._sock.sendto(datagram, item.address)
                except OSError as error:
                    log.debug("SWIM send to %s failed: %s", item.address, error)

    def _publish(self) -> None:
        events = self._core.take_events()
        if events:
            view = self._core.view()
            with self._lock:
                self._view = view
        for event in events:
            if isinstance(event, Refused):
                self._refused(event, time.monotonic())
            else:
                self._emit(event)

    def _emit(self, event: MembershipEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a faulty observer must not stop probing
                log.exception("membership event callback failed")


def asyncio_events(loop: asyncio.AbstractEventLoop,
                   queue: asyncio.Queue[MembershipEvent]) -> EventCallback:
    """An `on_event` callback that puts each event into `queue` on `loop`'s thread."""
    def deliver(event: MembershipEvent) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)
    return deliver
