"""The orchestrator's token-out consumer: the generated ingress_ring machine over host memory.

Theory of operation. The last stage's send pump streams token objects to this process,
whose recv pump fills the token-out ring. The ring's consumer here runs the same table
as a stage worker's ingress parser (`fsm/ingress_ring.yaml`, spec §17 record checks,
§32), so a token-out record is checked exactly as any ingress record is: the header is
unpacked (bad magic, version, header_len: HeaderRejected), its extent is checked against
the edge's ObjectSpec *before* any memory is set aside for it (ExtentExceedsMax,
ExtentAlignmentInvalid), its sequence against the edge's SequencePolicy, a ring its
producer closed mid-record is EofMidObject, and a Faulted shared ring state is a
RingFault. The binding only does the byte work:

- ParseAvailable: clear the readable-pending bit, move committed bytes into a 40-byte
  header buffer (advancing `consume` as they are copied out), unpack a whole header;
  feed RingClosed when the producer closed the ring and every byte was consumed.
- AllocateDeviceObject: a host buffer of exactly `extent` bytes (the machine reaches this
  effect only after the extent guards passed). CopyAvailable: copy committed payload
  prefixes into it and advance `consume`; PayloadComplete at the extent.
  AwaitCopyCompletion: host copies are complete at once (CopyCompleted).
- EmitObjectLoaded: decode the u32 token ids and hand them, with the header's flags
  (a serving run's sequence tag), to `loaded`; the payload bytes go no further.
  EmitObjectFailed / EmitRingFault: `failed` with the §36 reason
  (the same §37 -> §36 map a stage uses for its ingress edge).
- UninstallRing (endpoint stop): drop any partial buffer; the ring handle itself is the
  installer's and is closed by its uninstall, so CloseRing does nothing here.

Every `consume` advance marks the writable-pending bit and calls `writable` only when
the bit was clear (spec §21 coalescing): the driver's recv pump resumes on it.
`readable()` is what the endpoint calls on each wake hint: it feeds RingReadable, which
the machine ignores outside NeedHeader / NeedPayload. `consume` is the endpoint's loop:
clear the wake event, read what the ring holds, and sleep until the next hint
(`WakeWatch.wait`, whose safety net asks `has_work`) only while more may come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from swactor.fsm.generated import ingress_ring as ir
from swactor.fsm.host import MachineHost
from swactor.orchestrator.tokens import TokenObjectError, decode_token_ids
from swactor.orchestrator.wake_watch import WakeWatch
from swactor.ring import Ring, RingError, RingState
from swactor.wire import (
    OBJECT_FAULTS,
    DeviceObjectHandle,
    EdgeId,
    InstallRing,
    ObjectFailure,
    ObjectHeader,
    ObjectHeaderError,
    ObjectId,
    PortId,
    RingFaultReason,
    RingId,
    RunFaultReason,
    Sequence,
    SequenceGate,
    UninstallReason,
    WorkerGeneration,
)
from swactor.worker.ingress_guards import IngressGuards

log = logging.getLogger("swactor.orchestrator.token_out")

HEADER_LEN = ObjectHeader.LEN
_CONSUMING = frozenset({ir.State.NeedHeader, ir.State.NeedPayload})

Loaded = Callable[[ObjectId, Sequence, tuple[int, ...], int], None]
"""(object id, sequence, token ids, header flags): the run checks the flags (a serving
run's sequence tag) against what it injected for that step."""
Failed = Callable[[RunFaultReason, str], None]


class TokenOutReader(IngressGuards, ir.IngressRingEffects[None]):
    """Consumer of the token-out ring: its IngressRingGuards and Effects (module doc)."""

    def __init__(
        self,
        command: InstallRing,
        ring: Ring,
        *,
        writable: Callable[[], None],
        loaded: Loaded,
        failed: Failed,
    ) -> None:
        self.command = command
        self.spec = command.object_spec
        self.ring = ring
        self._writable = writable
        self._loaded = loaded
        self._failed = failed
        self.machine = ir.IngressRingMachine(
            self, ring_id=command.ring_id, edge_id=command.edge_id, port_id=command.port_id
        )
        self._host = MachineHost(self.machine, ir.bind(self))
        self._header = bytearray()
        self._gate = SequenceGate(self.spec.sequence_policy)
        self._decoded: ObjectHeader | None = None
        self._payload: bytearray | None = None
        self._copied = 0
        self._objects = 0

    @property
    def consuming(self) -> bool:
        """Whether more records may come: not faulted, not uninstalled, and not closed
        by the producer at a record boundary (a clean end, which the table idles in)."""
        state = self.machine.state
        if state not in _CONSUMING or self.ring.closed:
            return False
        return bool(self._header) or state is not ir.State.NeedHeader or (
            not self._closed_and_drained())

    # -- what the endpoint calls ------------------------------------------------------

    def install(self) -> None:
        self.feed(self.command)  # the table takes the command itself

    def readable(self) -> None:
        """A wake hint: parse or copy what the producer committed."""
        self.feed(ir.RingReadable(self.command.ring_id))

    def has_work(self) -> bool:
        """Whether the ring holds committed bytes not taken yet, or is no longer Open:
        what a wake hint would have announced (`WakeWatch`'s check)."""
        ring = self.ring
        if ring.closed:
            return False
        if ring.state is not RingState.Open:
            return True
        with ring.readable_span(1) as span:  # released at once: never pins the arena
            return len(span) > 0

    async def consume(self, wake: asyncio.Event, watch: WakeWatch) -> None:
        """Read records (after `install`) until no more can come: each pass clears `wake`
        (set by the driver's hint) *before* reading, so a hint for bytes committed after
        the read wakes the next wait at once; the read clears the ring's pending bit
        before it looks at the cursors (spec §21)."""
        what = f"token-out ring {int(self.command.ring_id)}"
        while self.consuming:
            wake.clear()
            self.readable()
            if self.consuming:
                await watch.wait(wake, self.has_work, what)

    def uninstall(self) -> None:
        self.feed(ir.UninstallRing(self.command.ring_id, UninstallReason.EdgeStopped))

    def feed(self, event: ir.Event) -> None:
        self._host.feed(event)

    # -- guards -----------------------------------------------------------------------

    def layout_valid(self, event: ir.InstallRing) -> bool:
        return not self.ring.closed  # the installer opened the handle on this layout

    # -- effects (IngressRingEffects) -------------------------------------------------
    # The installer answered the establisher and owns the ring handle: installing,
    # closing and quiescing have nothing to do here.

    def emit_ring_installed(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId) -> None:
        pass

    def parse_available(self, ring_id: RingId) -> None:
        self._parse()

    def allocate_device_object(self, object_id: ObjectId, sequence: Sequence,
                               extent: int) -> None:
        assert self._decoded is not None
        self._gate.admit(self._decoded)
        self._payload = bytearray(extent)  # the extent guards passed: bounded
        self._copied = 0

    def copy_available(self, ring_id: RingId) -> None:
        self._copy()

    def await_copy_completion(self, ring_id: RingId) -> None:
        decoded = self._decoded
        assert decoded is not None
        self._objects += 1
        handle = DeviceObjectHandle(WorkerGeneration(0), self._objects)
        self.feed(ir.CopyCompleted(decoded.object_id, decoded.sequence, decoded.extent, handle))

    def emit_object_loaded(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                           object_id: ObjectId, sequence: Sequence, extent: int,
                           device_handle: DeviceObjectHandle) -> None:
        self._deliver(object_id, sequence)

    def emit_object_failed(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                           object_id: ObjectId | None, sequence: Sequence | None,
                           reason: ObjectFailure) -> None:
        self._payload = None
        self._failed(OBJECT_FAULTS[reason], f"token-out record: {reason.value}")

    def emit_ring_fault(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                        reason: RingFaultReason) -> None:
        self._failed(RunFaultReason.RingFault, f"token-out ring: {reason.value}")

    def free_partial_object(self, ring_id: RingId) -> None:
        self._payload = None

    def drain_copies(self, ring_id: RingId) -> None:
        self._payload = None
        self.feed(ir.CopiesDrained())

    def close_ring(self, ring_id: RingId) -> None:
        pass

    def emit_ring_quiesced(self, ring_id: RingId) -> None:
        pass

    def _deliver(self, object_id: ObjectId, sequence: Sequence) -> None:
        payload, self._payload = self._payload, None
        decoded = self._decoded
        assert payload is not None and decoded is not None
        try:
            ids = decode_token_ids(payload, self.spec)
        except TokenObjectError as error:
            log.error("token-out: %s", error)
            self._failed(RunFaultReason.ObjectHeaderMalformed, str(error))
            return
        self._loaded(object_id, sequence, ids, decoded.flags)

    # -- byte work --------------------------------------------------------------------

    def _live(self) -> bool:
        """False after feeding RingError for a Faulted shared ring state."""
        ring = self.ring
        if ring.state is RingState.Faulted:
            self.feed(ir.RingError(ring.fault_reason or RingFaultReason.RingStateInvalid))
            return False
        return True

    def _consumed(self, n: int) -> None:
        if self.ring.consume_and_mark(n):
            self._writable()

    def _closed_and_drained(self) -> bool:
        ring = self.ring
        return ring.state is RingState.Closed and len(ring.readable_span(1)) == 0

    def _parse(self) -> None:
        if not self._live():
            return
        ring, header = self.ring, self._header
        try:
            ring.clear_readable_pending()
            while len(header) < HEADER_LEN:
                span = ring.readable_span(HEADER_LEN - len(header))
                n = len(span)
                if n == 0:
                    break
                header += span
                span.release()
                self._consumed(n)
            if len(header) < HEADER_LEN:
                if self._closed_and_drained():
                    self.feed(ir.RingClosed())
                return
        except RingError as error:
            self.feed(ir.RingError(error.reason))
            return
        try:
            decoded = ObjectHeader.unpack(bytes(header))
        except ObjectHeaderError as error:
            self.feed(ir.HeaderRejected(error.reason))
            return
        header.clear()
        self._decoded = decoded
        self.feed(ir.HeaderDecoded(decoded.object_id, decoded.sequence, decoded.extent))

    def _copy(self) -> None:
        payload, decoded = self._payload, self._decoded
        if payload is None or decoded is None or not self._live():
            return
        ring, extent = self.ring, decoded.extent
        try:
            ring.clear_readable_pending()
            while self._copied < extent:
                span = ring.readable_span(extent - self._copied)
                n = len(span)
                if n == 0:
                    break
                payload[self._copied:self._copied + n] = span
                span.release()
                self._copied += n
                self._consumed(n)
            if self._copied == extent:
                self.feed(ir.PayloadComplete())
            elif self._closed_and_drained():
                self.feed(ir.RingClosed())
        except RingError as error:
            self.feed(ir.RingError(error.reason))
