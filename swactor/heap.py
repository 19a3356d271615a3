"""Give a run's freed memory back at run boundaries: collect its cycles, trim the heap.

Theory of operation. A node or worker process serves run after run, and each run leaves
two kinds of memory that are free in principle but still resident:

- cyclic garbage (actor cells and their tasks, futures, exceptions with tracebacks,
  tinygrad graphs): Python frees it only in a full (generation 2) collection, which its
  heuristic runs only once the survivors pending since the last one exceed a quarter of
  all long-lived objects, so with a large heap (tinygrad, aioquic, numpy) runs pile up
  for a long time in between;
- freed C-heap blocks (QUIC/TLS state, decoded control messages, GGUF reads on a
  helper thread): glibc keeps freed pages resident unless they sit at the top of an
  arena.

`just soak` measured both as linear RSS growth (node +15-22 KiB per run, worker +4,
after the retention fixes; `just soak 50 --trace DIR --frames 0 --trim` separates them).
`release()` runs `gc.collect()` and then glibc's `malloc_trim(0)`, which returns every
free page of every arena (also free pages inside the heap, by `madvise`); the node calls
it once per run after teardown and the worker when a run's last ring is gone, so the
pause never lands on a step. `settle()` is called once after a process booted: a full
collection, then `gc.freeze()`, which moves every object alive then (imported modules,
the boot's long-lived state) out of the collector's reach, so each later `release()`
scans only what was made since (node: ~5 ms instead of ~100-200 ms here). Objects that
exist at boot live as long as the process, so freezing them frees nothing later. The
worker settles again after each role it builds: a model stage's role is some 360,000
tracked objects (weights, kernels, schedule caches) that live as long as the role, and
unfrozen they made each run boundary's collection 0.23-0.35 s (SmolLM2, a 10-block
stage, at load 6-7; 0.001 s frozen), which the worker spent before it answered the
node's teardown. A build that replaces a role first thaws everything
(`settle(thaw=True)`: `gc.unfreeze()`), so the replaced role's cycles are collected.
`trim()` alone is `malloc_trim(0)`; without glibc (musl, macOS) it does nothing.
`keep_free_pages()` (called when a QUIC endpoint starts) raises glibc's trim and mmap
thresholds so that the packet path's short-lived buffers stop page-faulting; `trim()`
at run boundaries still gives the kept pages back.

The release shifts the node's timing at run boundaries; it must not be what decides
whether a message reaches the orchestrator. A stage's StageReady goes out on the newest
control link to a returning orchestrator (the endpoint's link cache keeps the newest
link, `swactor.transport.endpoint`), never on the previous session's link that is
closing, whatever the release's timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import cache
from typing import Any


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def trim() -> bool:
    """Release free heap pages to the kernel; True when glibc released any."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


M_TRIM_THRESHOLD = -1  # mallopt parameters (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
KEEP_TRIM = 256 << 20
KEEP_MMAP = 4 << 20


def keep_free_pages() -> bool:
    """Make glibc keep freed heap pages and serve blocks below 4 MiB from the heap.

    The QUIC bulk path allocates and frees tens of KiB per packet batch (sealed
    datagrams, opened plaintext, send-buffer chunks). With glibc's defaults a free at
    the top of the heap beyond 128 KiB is returned to the kernel at once (and blocks
    over the dynamic mmap threshold are mmapped fresh), so the next batch page-faults
    its way through memory it just had: measured at 16383-byte datagrams, half of the
    receiver's CPU and a third of the sender's. Pages kept this way are still returned
    by `trim()` at each run boundary. True when glibc took both settings."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    ok = libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM) == 1
    return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_MMAP) == 1 and ok)


def release() -> None:
    """At a run boundary: collect the run's cyclic garbage, then trim the heap."""
    gc.collect()
    trim()


def settle(thaw: bool = False) -> None:
    """After boot (and in the worker, after each role it builds): collect, then freeze
    what is alive; `thaw`: unfreeze everything first, when something frozen may have
    become garbage (a replaced role) (module doc)."""
    if thaw:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
