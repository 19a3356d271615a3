"""The node's memfd arena and the ArenaManager that leases rings in it (spec §19).

- `Arena` (arena.py): one sealed memfd, mapped once per process.
- `FreeList` (allocator.py): aligned first-fit free list with coalescing.
- `ArenaManager` (manager.py): binding of the generated arena_manager machine; outputs
  `Granted`, `Queued`, `Rejected`, `Cancelled`, `Released`, `ReleaseRefused`, ...
- `QuiescenceMinter` (proofs.py): the teardown path's capability to mint release proofs.
"""

from swactor.arena.allocator import AllocatorError, FreeList
from swactor.arena.arena import (
    ENV_ARENA_BYTES,
    ENV_ARENA_FD,
    Arena,
    ArenaBusyError,
    ArenaError,
)
from swactor.arena.manager import (
    HEADER_PAGE,
    ArenaDown,
    ArenaManager,
    ArenaManagerError,
    ArenaUnmapped,
    ArenaUp,
    Cancelled,
    Granted,
    LiveLease,
    Output,
    Queued,
    Rejected,
    Released,
    ReleaseRefused,
)
from swactor.arena.proofs import ProofRefused, QuiescenceMinter

__all__ = [
    "ENV_ARENA_BYTES",
    "ENV_ARENA_FD",
    "HEADER_PAGE",
    "AllocatorError",
    "Arena",
    "ArenaBusyError",
    "ArenaDown",
    "ArenaError",
    "ArenaManager",
    "ArenaManagerError",
    "ArenaUnmapped",
    "ArenaUp",
    "Cancelled",
    "FreeList",
    "Granted",
    "LiveLease",
    "Output",
    "ProofRefused",
    "Queued",
    "QuiescenceMinter",
    "Rejected",
    "ReleaseRefused",
    "Released",
]
