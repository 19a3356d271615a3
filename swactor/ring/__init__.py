"""Shared-memory SPSC rings: the cffi binding of `native/ring.c` (spec §20-§22).

- `Ring` (ring.py): zero-copy spans and cursor publication over the native helper.
- `stream` (stream.py): blocking producer/consumer steps with the pending-bit protocol.
- `Doorbell`, `JsonLineWake` (wake.py): wake-hint channels; the eventfd doorbell is the
  hot path (see wake.py for the measured choice).
- `PeerWatch`, `fault_and_wake` (liveness.py): fault a dead peer's rings, wake survivors.
- errors.py: typed errors carrying spec §37 RingFaultReason.
"""

from swactor.ring.errors import (
    RingAdvanceError,
    RingClosedError,
    RingError,
    RingFaulted,
    RingLayoutInvalid,
    UnsupportedRingVersion,
)
from swactor.ring.liveness import PeerWatch, fault_and_wake
from swactor.ring.ring import (
    ABI_VERSION,
    DEFAULT_VERSION,
    VERSION_COMPACT,
    VERSION_SPLIT,
    Ring,
    RingState,
    check_abi,
    header_len,
)
from swactor.ring.wake import (
    WAKE_FDS_ENV,
    Doorbell,
    JsonLineWake,
    MalformedWake,
    Wake,
    WakeTimeout,
    WorkerDoorbells,
)

__all__ = [
    "ABI_VERSION",
    "DEFAULT_VERSION",
    "VERSION_COMPACT",
    "VERSION_SPLIT",
    "WAKE_FDS_ENV",
    "Doorbell",
    "JsonLineWake",
    "MalformedWake",
    "PeerWatch",
    "Ring",
    "RingAdvanceError",
    "RingClosedError",
    "RingError",
    "RingFaulted",
    "RingLayoutInvalid",
    "RingState",
    "UnsupportedRingVersion",
    "Wake",
    "WakeTimeout",
    "WorkerDoorbells",
    "check_abi",
    "fault_and_wake",
    "header_len",
]
