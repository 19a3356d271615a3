"""Shared-memory SPSC rings: the cffi binding of `native/ring.c` (spec §20-§22).

- `Ring` (ring.py): zero-copy spans and cursor publication over the native helper.
- `Doorbell`, `JsonLineWake` (wake.py): wake-hint channels; the eventfd doorbell is the
  hot path (see wake.py for the measured choice).
- errors.py: typed errors carrying spec §37 RingFaultReason.

Blocking test helpers over these rings (the waiter's side of spec §21, a peer process,
a peer watcher) live in `swactor.testing`.
"""

from swactor.ring.errors import (
    RingAdvanceError,
    RingClosedError,
    RingError,
    RingFaulted,
    RingLayoutInvalid,
    UnsupportedRingVersion,
)
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
    "header_len",
]
