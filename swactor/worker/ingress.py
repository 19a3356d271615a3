"""The ingress parser: binding of the generated ingress_ring machine (spec §17, §32, §34).

Theory of operation
-------------------
One `IngressRing` per installed ingress ring; the node's recv-pump produces, this
parser consumes. The machine decides, this binding does the byte work:

- ParseAvailable: clear the readable-pending bit, then move committed bytes into a
  40-byte local header buffer (a header may straddle the wrap), advancing `consume`
  as they are copied out. A whole header is unpacked (`ObjectHeader.unpack`: bad magic,
  version, header_len or reserved -> HeaderRejected with its §37 reason), else
  HeaderDecoded, whose extent and sequence the machine checks through the guards below
  (ExtentExceedsMax, ExtentAlignmentInvalid, SequenceViolation). A ring closed by its
  producer with every byte consumed is RingClosed (EofMidObject if a header was begun).
- AllocateDeviceObject: admit the sequence, allocate `extent` bytes on the device.
- CopyAvailable: copy each committed payload prefix to the device at its offset and
  only then advance `consume` (copies are synchronous, so the bytes are no longer
  needed); PayloadComplete at the extent. An object ten times the ring streams through.
- AwaitCopyCompletion: device barrier, then the allocation gets its handle and
  ObjectLoaded is emitted. Compute never sees a partial object.

Every `consume` advance marks the writable-pending bit and emits RingWritable only when
the bit was clear (spec §21 coalescing). Events the binding feeds back go through a
queue, so a ring holding many small objects is parsed in a loop, not by recursion.
A Faulted shared ring state (set by the node or a dead peer's watcher) is RingError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from swactor.arena import Arena
from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import ingress_ring as ir
from swactor.fsm.host import MachineHost
from swactor.ring import Ring, RingState
from swactor.wire import (
    DeviceObjectHandle,
    EdgeId,
    InstallRing,
    ObjectFailed,
    ObjectFailure,
    ObjectHeader,
    ObjectHeaderError,
    ObjectId,
    ObjectLoaded,
    PortId,
    RingFault,
    RingFaultReason,
    RingId,
    RingInstalled,
    RingQuiesced,
    RingWritable,
    Sequence,
    SequenceGate,
    WorkerEvent,
)
from swactor.worker.bridge import DeviceAllocation, DeviceBridge, DeviceError
from swactor.worker.ingress_guards import IngressGuards
from swactor.worker.ring_record import RingRecord

log = logging.getLogger(__name__)

HEADER_LEN = ObjectHeader.LEN


class IngressRing(IngressGuards, RingRecord, ir.IngressRingEffects[None]):
    """Parser and device loader of one ingress ring: its IngressRingGuards and Effects."""

    def __init__(
        self,
        command: InstallRing,
        arena: Arena,
        bridge: DeviceBridge,
        emit: Callable[[WorkerEvent], None],
        faults: Faults = NO_FAULTS,
    ) -> None:
        super().__init__(command, arena, bridge, emit, faults)
        self.machine = ir.IngressRingMachine(
            self, ring_id=command.ring_id, edge_id=command.edge_id, port_id=command.port_id
        )
        self._host = MachineHost(self.machine, ir.bind(self))
        self._header = bytearray()
        self._gate = SequenceGate(self.spec.sequence_policy)
        self._object: DeviceAllocation | None = None
        self._decoded: ObjectHeader | None = None
        self._copied = 0

    @property
    def done(self) -> bool:
        return self.machine.state is ir.State.Quiesced

    # -- feeding ----------------------------------------------------------------------

    def feed(self, event: ir.Event) -> None:
        """Hand one event to the machine and carry out its effects (and theirs)."""
        self._host.feed(event)

    # -- effects (IngressRingEffects) ---------------------------------------------------

    def emit_ring_installed(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId) -> None:
        self._emit(RingInstalled(ring_id, edge_id, port_id))

    def parse_available(self, ring_id: RingId) -> None:
        self._parse()

    def allocate_device_object(self, object_id: ObjectId, sequence: Sequence,
                               extent: int) -> None:
        self._allocate(object_id, sequence, extent)

    def copy_available(self, ring_id: RingId) -> None:
        self._copy()

    def await_copy_completion(self, ring_id: RingId) -> None:
        self._complete()

    def emit_object_loaded(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                           object_id: ObjectId, sequence: Sequence, extent: int,
                           device_handle: DeviceObjectHandle) -> None:
        self._emit(ObjectLoaded(ring_id, edge_id, port_id, object_id, sequence, extent,
                                device_handle))

    def emit_object_failed(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                           object_id: ObjectId | None, sequence: Sequence | None,
                           reason: ObjectFailure) -> None:
        self._emit(ObjectFailed(ring_id, edge_id, port_id, object_id, sequence, reason))

    def emit_ring_fault(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                        reason: RingFaultReason) -> None:
        self._emit(RingFault(ring_id, edge_id, port_id, reason))

    def free_partial_object(self, ring_id: RingId) -> None:
        self._free_partial()

    def drain_copies(self, ring_id: RingId) -> None:
        self._bridge.synchronize()
        self._free_partial()
        self.feed(ir.CopiesDrained())

    def close_ring(self, ring_id: RingId) -> None:
        if self.ring is not None:
            self.ring.close()

    def emit_ring_quiesced(self, ring_id: RingId) -> None:
        self._emit(RingQuiesced(ring_id))

    # -- byte work ----------------------------------------------------------------------

    def _live_ring(self) -> Ring | None:
        """The ring, or None after feeding RingError for a faulted shared state."""
        ring = self.ring
        assert ring is not None
        if self.faults.ring_faults("ingress"):
            ring.fault(RingFaultReason.WorkerInternal)
        reason = self.fault_reason(ring)
        if reason is not None:
            self.feed(ir.RingError(reason))
            return None
        return ring

    def _consumed(self, ring: Ring, n: int) -> None:
        if ring.consume_and_mark(n):
            self._emit(RingWritable(self.command.ring_id))

    def _closed_and_drained(self, ring: Ring) -> bool:
        state = ring.state
        return state is RingState.Closed and len(ring.readable_span(1)) == 0

    def _parse(self) -> None:
        ring = self._live_ring()
        if ring is None:
            return
        ring.clear_readable_pending()
        header = self._header
        while len(header) < HEADER_LEN:
            span = ring.readable_span(HEADER_LEN - len(header))
            n = len(span)
            if n == 0:
                break
            header += span
            span.release()
            self._consumed(ring, n)
        if len(header) < HEADER_LEN:
            if self._closed_and_drained(ring):
                self.feed(ir.RingClosed())
            return
        try:
            decoded = ObjectHeader.unpack(bytes(header))
        except ObjectHeaderError as exc:
            self.feed(ir.HeaderRejected(exc.reason))
            return
        header.clear()
        self._decoded = decoded
        self.feed(ir.HeaderDecoded(decoded.object_id, decoded.sequence, decoded.extent))

    def _allocate(self, object_id: int, sequence: int, extent: int) -> None:
        assert self._decoded is not None
        self._gate.admit(self._decoded)
        try:
            self._object = self._bridge.alloc(extent, object_id)
        except DeviceError as exc:
            log.warning("ring %s: %s", int(self.command.ring_id), exc)
            self.feed(ir.AllocationFailed(self._decoded.object_id, self._decoded.sequence))
            return
        self._copied = 0

    def _copy(self) -> None:
        target, decoded = self._object, self._decoded
        if target is None or decoded is None:
            return  # allocation failed; AllocationFailed is queued
        ring = self._live_ring()
        if ring is None:
            return
        ring.clear_readable_pending()
        extent = decoded.extent
        while self._copied < extent:
            span = ring.readable_span(extent - self._copied)
            n = len(span)
            if n == 0:
                break
            try:
                self._bridge.host_to_device(span, target, self._copied)
            except DeviceError as exc:
                log.warning("ring %s: %s", int(self.command.ring_id), exc)
                self.feed(ir.CopyFailed(decoded.object_id, decoded.sequence))
                return
            finally:
                span.release()
            self._copied += n
            self._consumed(ring, n)
        if self._copied == extent:
            self.feed(ir.PayloadComplete())
        elif self._closed_and_drained(ring):
            self.feed(ir.RingClosed())

    def _complete(self) -> None:
        target, decoded = self._object, self._decoded
        assert target is not None and decoded is not None
        try:
            self._bridge.synchronize()
        except (RuntimeError, OSError) as exc:
            log.warning("ring %s: copy completion: %s", int(self.command.ring_id), exc)
            self.feed(ir.CopyFailed(decoded.object_id, decoded.sequence))
            return
        target.flags = decoded.flags  # the step that reads it copies them onward
        handle = self._bridge.register(target)
        self._object = None
        self.feed(ir.CopyCompleted(decoded.object_id, decoded.sequence, decoded.extent, handle))

    def _free_partial(self) -> None:
        if self._object is not None:
            self._bridge.free(self._object)
            self._object = None
