"""The egress producer: binding of the generated egress_ring machine (spec §32, §34).

Theory of operation
-------------------
One `EgressRing` per installed egress ring; this producer writes, the node's send-pump
consumes. The step runner hands it one output at a time (`produce`): a device
allocation and its OutputBinding. The machine checks the binding against the
ObjectSpec (guard `extent_valid`), then:

- WriteHeader: pack the ObjectHeader and write it into writable spans (a header may
  straddle the wrap), committing what was written;
- CopyPayload: device-to-host copy each writable span's worth of payload straight into
  the ring and commit it once the host bytes are valid; PayloadCommitted at the extent;
- ContinueWrite (on RingWritable): clear the writable-pending bit, reload `consume`,
  and continue whichever phase was waiting for space.

An object whose header and payload fit in one contiguous writable span (a decode step's
activations, a token id) is written whole and committed once: one RingReadable at most,
and the send pump moves it in one stream write, not a header and then a payload.

No space means the output (and so its step) waits for the send-pump to drain:
that is the backpressure path. Before it waits, the producer clears the writable-pending
bit and looks again (spec §21), so the consumer's next consume sends the RingWritable
that resumes it; while the producer is not waiting the bit stays set and consumes send
no hint. Each commit marks the readable-pending bit and emits
RingReadable only when it was clear (spec §21). The step runner hears the outcome
through `OutputListener`: `output_done` after ObjectProduced was emitted, or
`output_failed(reason)` (RejectOutput / FailOutput).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from swactor.arena import Arena
from swactor.faults import NO_FAULTS, Faults
from swactor.fsm.generated import egress_ring as er
from swactor.fsm.host import MachineHost
from swactor.ring import Ring
from swactor.wire import (
    EdgeId,
    InstallRing,
    ObjectFailure,
    ObjectHeader,
    ObjectId,
    ObjectProduced,
    OutputBinding,
    PortId,
    RingFault,
    RingFaultReason,
    RingId,
    RingInstalled,
    RingQuiesced,
    RingReadable,
    Sequence,
    StepFailure,
    WorkerEvent,
)
from swactor.worker.bridge import DeviceAllocation, DeviceBridge, DeviceError
from swactor.worker.ring_record import RingRecord

log = logging.getLogger(__name__)

WHOLE_MAX = 1 << 20
"""Objects up to this many payload bytes are written whole when they fit (module doc)."""


class OutputListener(Protocol):
    """The step that offered the output being written."""

    def output_done(self) -> None: ...

    def output_failed(self, reason: StepFailure) -> None: ...


class EgressRing(RingRecord, er.EgressRingEffects[None]):
    """Producer of one egress ring: its EgressRingGuards and EgressRingEffects."""

    def __init__(
        self,
        command: InstallRing,
        arena: Arena,
        bridge: DeviceBridge,
        emit: Callable[[WorkerEvent], None],
        faults: Faults = NO_FAULTS,
    ) -> None:
        super().__init__(command, arena, bridge, emit, faults)
        self.machine = er.EgressRingMachine(
            self, ring_id=command.ring_id, edge_id=command.edge_id, port_id=command.port_id
        )
        self._host = MachineHost(self.machine, er.bind(self))
        self._source: DeviceAllocation | None = None
        self._listener: OutputListener | None = None
        self._header = b""
        self._header_written = 0
        self._produced = 0
        self._pending: tuple[ObjectId, Sequence, int] = (ObjectId(0), Sequence(0), 0)
        self._phase = ""

    @property
    def done(self) -> bool:
        return self.machine.state is er.State.Quiesced

    @property
    def idle(self) -> bool:
        return self.machine.state is er.State.WaitingForOutput

    def refusal(self, extent: int) -> ObjectFailure | None:
        """Why an output of `extent` bytes breaks this ring's ObjectSpec, or None."""
        return self.spec.extent_failure(extent)

    def produce(
        self, binding: OutputBinding, source: DeviceAllocation, listener: OutputListener
    ) -> None:
        """Write `source` as the object `binding` declares; the listener hears the end."""
        source.object_id = int(binding.object_id)
        self._source, self._listener = source, listener
        self.feed(
            er.ProduceOutput(binding.object_id, binding.sequence, binding.extent, binding.flags)
        )

    # -- guards -----------------------------------------------------------------------

    def extent_valid(self, event: er.ProduceOutput) -> bool:
        source = self._source
        return (
            self.refusal(event.extent) is None
            and source is not None
            and source.extent == event.extent
        )

    # -- feeding ----------------------------------------------------------------------

    def feed(self, event: er.Event) -> None:
        self._host.feed(event)

    # -- effects (EgressRingEffects) ----------------------------------------------------

    def emit_ring_installed(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId) -> None:
        self._emit(RingInstalled(ring_id, edge_id, port_id))

    def write_header(self, object_id: ObjectId, sequence: Sequence, extent: int,
                     flags: int) -> None:
        header = ObjectHeader(object_id, sequence, extent, flags)
        packed = self.faults.header_bytes(
            header.pack(),
            int(sequence),
            lambda s: ObjectHeader(object_id, Sequence(s), extent, flags).pack(),
        )
        self._header, self._header_written, self._produced = packed, 0, 0
        self._pending = (object_id, sequence, extent)
        self._phase = "header"
        self._write_header()

    def continue_write(self, ring_id: RingId) -> None:
        if self.ring is not None:
            self.ring.clear_writable_pending()
        if self._phase == "header":
            self._write_header()
        elif self._phase == "payload":
            self._copy_payload()

    def copy_payload(self, ring_id: RingId) -> None:
        self._phase = "payload"
        self._copy_payload()

    def emit_object_produced(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                             object_id: ObjectId, sequence: Sequence, extent: int) -> None:
        self._phase = ""
        self._emit(ObjectProduced(ring_id, edge_id, port_id, object_id, sequence, extent))
        self._finish(None)

    def reject_output(self, object_id: ObjectId, reason: StepFailure) -> None:
        self._finish(reason)

    def fail_output(self, reason: StepFailure) -> None:
        self._phase = ""
        self._finish(reason)

    def emit_ring_fault(self, ring_id: RingId, edge_id: EdgeId, port_id: PortId,
                        reason: RingFaultReason) -> None:
        self._emit(RingFault(ring_id, edge_id, port_id, reason))

    def drain_copies(self, ring_id: RingId) -> None:
        self._bridge.synchronize()
        self.feed(er.CopiesDrained())

    def close_ring(self, ring_id: RingId) -> None:
        if self.ring is not None:
            self.ring.close()

    def emit_ring_quiesced(self, ring_id: RingId) -> None:
        self._emit(RingQuiesced(ring_id))

    def _finish(self, reason: StepFailure | None) -> None:
        listener, self._listener, self._source = self._listener, None, None
        if listener is None:
            return
        if reason is None:
            listener.output_done()
        else:
            listener.output_failed(reason)

    # -- byte work ----------------------------------------------------------------------

    def _live_ring(self) -> Ring | None:
        ring = self.ring
        assert ring is not None
        if self.faults.ring_faults("egress"):
            ring.fault(RingFaultReason.WorkerInternal)
        reason = self.fault_reason(ring)
        if reason is not None:
            self.feed(er.RingError(reason))
            return None
        return ring

    def _committed(self, ring: Ring, n: int) -> None:
        if ring.commit_and_mark(n):
            self._emit(RingReadable(self.command.ring_id))

    def _write_whole(self, ring: Ring) -> bool:
        """Header and payload into one contiguous span, one commit; False if they do not
        fit (or the copy failed: the payload phase then reports it)."""
        source = self._source
        header = self._header
        extent = self._pending[2]
        if source is None or self._header_written or extent > WHOLE_MAX:
            return False
        total = len(header) + extent
        span = ring.writable_span(total)
        try:
            if len(span) < total:
                return False
            if extent:
                self._bridge.device_to_host(source, 0, span[len(header):total])
            span[: len(header)] = header
        except DeviceError:
            return False
        finally:
            span.release()
        self._header_written, self._produced = len(header), extent
        self._committed(ring, total)
        return True

    def _space(self, ring: Ring, want: int) -> memoryview:
        """A writable span; when there is none, clear the writable-pending bit and look
        again, so a consume after this sends the hint that resumes the wait (§21)."""
        span = ring.writable_span(want)
        if len(span) == 0:
            span.release()
            ring.clear_writable_pending()
            span = ring.writable_span(want)
        return span

    def _write_header(self) -> None:
        ring = self._live_ring()
        if ring is None:
            return
        if self._write_whole(ring):
            self.feed(er.HeaderCommitted())
            return
        while self._header_written < len(self._header):
            span = self._space(ring, len(self._header) - self._header_written)
            n = len(span)
            if n == 0:
                span.release()
                return  # wait for RingWritable
            span[:] = self._header[self._header_written : self._header_written + n]
            span.release()
            self._header_written += n
            self._committed(ring, n)
        self.feed(er.HeaderCommitted())

    def _copy_payload(self) -> None:
        source = self._source
        ring = self._live_ring()
        if ring is None or source is None:
            return
        object_id, sequence, extent = self._pending
        while self._produced < extent:
            span = self._space(ring, extent - self._produced)
            n = len(span)
            if n == 0:
                span.release()
                return  # wait for RingWritable
            try:
                self._bridge.device_to_host(source, self._produced, span)
            except DeviceError as exc:
                log.warning("ring %s: %s", int(self.command.ring_id), exc)
                self.feed(er.CopyFailed())
                return
            finally:
                span.release()
            self._produced += n
            self._committed(ring, n)
        self.feed(er.PayloadCommitted(object_id, sequence, extent))
