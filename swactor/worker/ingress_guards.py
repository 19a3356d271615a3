"""The ingress_ring table's record guards, shared by both of its bindings.

The worker's `IngressRing` and the orchestrator's token-out reader both parse §17
records off an ingress ring through the generated ingress_ring machine, so they answer
its guards the same way: from the ring's `ObjectSpec` (extent bounds and alignment), the
`SequenceGate` of its sequence policy, and the header bytes gathered so far. A binding
that mixes in `IngressGuards` keeps those three as `spec`, `_gate` and `_header`.
"""

from __future__ import annotations

from swactor.fsm.generated import ingress_ring as ir
from swactor.wire import ObjectFailure, ObjectSpec, SequenceGate


class IngressGuards:
    """The record guards of ingress_ring (part of `IngressRingGuards`; module doc)."""

    spec: ObjectSpec
    _gate: SequenceGate
    _header: bytearray

    def extent_exceeds_max(self, event: ir.HeaderDecoded) -> bool:
        return self.spec.extent_failure(event.extent) is ObjectFailure.ExtentExceedsMax

    def extent_misaligned(self, event: ir.HeaderDecoded) -> bool:
        return self.spec.extent_failure(event.extent) is ObjectFailure.ExtentAlignmentInvalid

    def sequence_out_of_order(self, event: ir.HeaderDecoded) -> bool:
        return not self._gate.admits(event.sequence)

    def header_partial(self, event: ir.RingClosed) -> bool:
        return len(self._header) > 0
