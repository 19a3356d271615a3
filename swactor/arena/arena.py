"""The node's shared-memory arena: one sealed memfd, mapped once per process (spec §19).

Theory of operation
-------------------
The node process calls `Arena.create(ceiling)`: `memfd_create` (close-on-exec; the
worker gets the fd explicitly through `subprocess.Popen(pass_fds=...)`), `ftruncate`
to the ceiling (tmpfs is sparse: pages cost memory only once touched), then the seals
`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`.  With the size frozen no peer can shrink
the file under our mapping (which would SIGBUS us on the next touch) and nobody can
add further seals.  The file is mapped once, shared, read-write.

The worker calls `Arena.attach(fd, size)` (or `Arena.from_env()`, reading
`SWACTOR_ARENA_FD` / `SWACTOR_ARENA_BYTES`): it checks that the fd is a file of exactly
`size` bytes that is sealed against shrinking, then maps it once.  Nobody remaps or
resizes the arena during the node's lifetime.

The arena is address space only: it knows nothing of leases, rings or flow control.
`view` is a writable memoryview of the whole mapping; rings slice it (zero copy) and
hand the native helper its address.  `close()` unmaps and closes the fd; it refuses
(`ArenaBusyError`) while a slice of the mapping is still alive, since unmapping under
a live view would turn the next access into a crash.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Mapping

from swactor.wire import ArenaFailure, ReasonError

ENV_ARENA_FD = "SWACTOR_ARENA_FD"
ENV_ARENA_BYTES = "SWACTOR_ARENA_BYTES"

#: seals every arena carries: fixed size, and no further seals (F_SEAL_WRITE included)
REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class ArenaError(ReasonError[ArenaFailure]):
    """An arena could not be created or mapped; `reason` is the ArenaFailure."""


class ArenaBusyError(RuntimeError):
    """`close()` was called while views into the mapping are still alive."""


class Arena:
    """One memfd mapping: `fd`, `size`, and `view`, a writable memoryview of it all."""

    __slots__ = ("_map", "_owns_fd", "fd", "size", "view")

    def __init__(self, fd: int, size: int, mapping: mmap.mmap, owns_fd: bool) -> None:
        self.fd = fd
        self.size = size
        self._map = mapping
        self.view = memoryview(mapping)
        self._owns_fd = owns_fd

    @classmethod
    def create(cls, ceiling_bytes: int, name: str = "swactor-arena") -> Arena:
        """Create, size, seal and map a fresh arena of `ceiling_bytes` (owner side)."""
        if ceiling_bytes <= 0 or ceiling_bytes % mmap.PAGESIZE != 0:
            raise ArenaError(
                ArenaFailure.TruncateFailed,
                f"ceiling {ceiling_bytes} must be a positive multiple of {mmap.PAGESIZE}",
            )
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except OSError as exc:
            raise ArenaError(ArenaFailure.MemfdFailed, exc.strerror or str(exc)) from exc
        try:
            try:
                os.ftruncate(fd, ceiling_bytes)
            except OSError as exc:
                raise ArenaError(ArenaFailure.TruncateFailed, exc.strerror or str(exc)) from exc
            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
            except OSError as exc:
                raise ArenaError(ArenaFailure.SealFailed, exc.strerror or str(exc)) from exc
            return cls(fd, ceiling_bytes, _map(fd, ceiling_bytes), owns_fd=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int, size: int) -> Arena:
        """Map an inherited arena fd once (worker side); the caller keeps owning `fd`
        until `close()`, which closes it."""
        try:
            actual = os.fstat(fd).st_size
        except OSError as exc:
            raise ArenaError(ArenaFailure.MmapFailed, f"fd {fd}: {exc.strerror}") from exc
        if actual != size:
            raise ArenaError(
                ArenaFailure.MmapFailed, f"fd {fd} holds {actual} bytes, expected {size}"
            )
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            raise ArenaError(ArenaFailure.SealFailed, f"fd {fd}: {exc.strerror}") from exc
        if seals & fcntl.F_SEAL_SHRINK == 0:
            raise ArenaError(ArenaFailure.SealFailed, f"fd {fd} is not sealed against shrinking")
        return cls(fd, size, _map(fd, size), owns_fd=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Arena:
        """Attach the arena named by `SWACTOR_ARENA_FD` / `SWACTOR_ARENA_BYTES`."""
        env = os.environ if environ is None else environ
        try:
            fd = int(env[ENV_ARENA_FD])
            size = int(env[ENV_ARENA_BYTES])
        except (KeyError, ValueError) as exc:
            raise ArenaError(
                ArenaFailure.MmapFailed, f"{ENV_ARENA_FD} / {ENV_ARENA_BYTES} missing or not int"
            ) from exc
        return cls.attach(fd, size)

    def child_env(self) -> dict[str, str]:
        """Environment entries that let a child started with `pass_fds=[arena.fd]` attach."""
        return {ENV_ARENA_FD: str(self.fd), ENV_ARENA_BYTES: str(self.size)}

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        """Unmap and close the fd; idempotent.  Raises ArenaBusyError while views live."""
        if self._map.closed:
            return
        try:
            self.view.release()  # refused while something holds an export on the view
        except BufferError as exc:
            raise ArenaBusyError("a buffer export of the arena view is still alive") from exc
        try:
            self._map.close()
        except BufferError as exc:
            self.view = memoryview(self._map)
            raise ArenaBusyError("arena views or ring handles are still alive") from exc
        if self._owns_fd:
            os.close(self.fd)

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map(fd: int, size: int) -> mmap.mmap:
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as exc:
        raise ArenaError(ArenaFailure.MmapFailed, str(exc)) from exc
