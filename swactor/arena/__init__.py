"""The node's memfd arena (arena.py) and the ArenaManager that leases rings in it."""

from swactor.arena.arena import (
    ENV_ARENA_BYTES,
    ENV_ARENA_FD,
    Arena,
    ArenaBusyError,
    ArenaError,
)

__all__ = ["ENV_ARENA_BYTES", "ENV_ARENA_FD", "Arena", "ArenaBusyError", "ArenaError"]
