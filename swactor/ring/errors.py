"""Typed errors of the ring binding; each carries its spec §37 `RingFaultReason`.

- `RingError`: base; `reason` is the RingFaultReason, `ring_id` the ring (or None).
- `UnsupportedRingVersion`: bad magic, version or header length on open.
- `RingLayoutInvalid`: offsets outside the arena, misalignment, capacity or ring id not
  as planned.
- `RingAdvanceError`: an advance beyond the bytes available (a caller bug; reason
  RingStateInvalid).
- `RingFaulted`: a blocking helper found the ring Faulted (by its peer, by the peer
  watcher, or because a cursor was corrupted); `reason` is the recorded fault reason.
- `RingClosedError`: a write to a ring whose producer already signalled EOF.
"""

from __future__ import annotations

from swactor.wire import RingFaultReason


class RingError(Exception):
    """A ring operation failed; `reason` is the spec §37 RingFaultReason."""

    reason: RingFaultReason = RingFaultReason.RingStateInvalid

    def __init__(self, detail: str, ring_id: int | None = None) -> None:
        self.detail = detail
        self.ring_id = ring_id
        where = f"ring {ring_id}: " if ring_id is not None else ""
        super().__init__(f"{self.reason.value}: {where}{detail}")


class UnsupportedRingVersion(RingError):
    reason = RingFaultReason.UnsupportedRingVersion


class RingLayoutInvalid(RingError):
    reason = RingFaultReason.RingLayoutInvalid


class RingAdvanceError(RingError):
    reason = RingFaultReason.RingStateInvalid


class RingClosedError(RingError):
    reason = RingFaultReason.RingStateInvalid


class RingFaulted(RingError):
    """The ring is Faulted; `reason` is the reason recorded in its state word."""

    def __init__(self, reason: RingFaultReason, ring_id: int | None = None) -> None:
        self.reason = reason
        super().__init__("ring is faulted", ring_id)
