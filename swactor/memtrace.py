"""Memory tracing hook for soak diagnosis: off unless `SWACTOR_MEMTRACE` names a folder.

Theory of operation. `install(role)` is called once at the start of a `swactor node`
process and of a worker process. Without the environment variable it does nothing but
one `os.environ` lookup. With `SWACTOR_MEMTRACE=DIR` it starts `tracemalloc` (keeping
`SWACTOR_MEMTRACE_FRAMES` frames per allocation, default 12; 0 leaves tracemalloc off,
for RSS and object counts without its overhead) and installs a SIGUSR2 handler. Each
SIGUSR2 runs a full `gc.collect()` and writes, under DIR, two files named `ROLE-PID-N`
(N counts the signals this process received):

- `.tm`: the `tracemalloc` snapshot (`tracemalloc.Snapshot.load` reads it back; compare
  two with `compare_to(older, "traceback")`);
- `.json`: resident memory (VmRSS, KiB), glibc's `mallinfo2` (arena, in-use and free
  bytes), live objects grouped by type (`gc.get_objects`, module-qualified names), the
  timer handles queued in the process's asyncio loop (by callback; a node) and,
  with `SWACTOR_MEMTRACE_TRIM=1`, VmRSS again after `malloc_trim(0)`: how much of the
  resident memory was freed heap that glibc had not returned.

The handler runs on the main thread between bytecodes (Python signal semantics), so the
snapshot sees a consistent heap; it holds no payload bytes, only allocation sites and
counts. `tests/faults/soak.py --trace DIR` drives it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import os
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

from swactor import heap

ENV_DIR = "SWACTOR_MEMTRACE"
ENV_FRAMES = "SWACTOR_MEMTRACE_FRAMES"
ENV_TRIM = "SWACTOR_MEMTRACE_TRIM"

_state: dict[str, object] = {}


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def rss_kib() -> int:
    """This process's VmRSS in KiB (0 where /proc is not readable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def malloc_info() -> dict[str, int]:
    """glibc `mallinfo2`: heap arena, in-use and free bytes ({} without glibc)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"arena": info.arena, "in_use": info.uordblks, "free": info.fordblks,
            "mmapped": info.hblkhd}


def type_counts() -> dict[str, int]:
    """Live GC-tracked objects grouped by module-qualified type name."""
    counts: Counter[str] = Counter()
    for item in gc.get_objects():
        kind = type(item)
        counts[f"{kind.__module__}.{kind.__qualname__}"] += 1
    return dict(counts)


def pending_timers() -> dict[str, int]:
    """Timer handles queued in this thread's running asyncio loop, by callback and by
    whether they were cancelled ({} outside a loop)."""
    loop = asyncio._get_running_loop()
    scheduled = getattr(loop, "_scheduled", None)
    if loop is None or not isinstance(scheduled, list):
        return {}
    counts: Counter[str] = Counter()
    for handle in scheduled:
        callback = getattr(handle, "_callback", None)
        name = getattr(callback, "__qualname__", type(callback).__name__)
        due = handle.when() - loop.time()
        state = "cancelled" if handle.cancelled() else "due < 60 s" if due < 60 else "later"
        counts[f"{name} ({state})"] += 1
    return dict(counts)


def dump(folder: Path, role: str) -> Path:
    """Write one snapshot pair (module doc); the path without its suffix."""
    count = int(str(_state.get("dumps", 0))) + 1
    _state["dumps"] = count
    stem = folder / f"{role}-{os.getpid()}-{count:03d}"
    gc.collect()
    record: dict[str, object] = {"role": role, "pid": os.getpid(), "dump": count,
                                 "rss_kib": rss_kib(), "malloc": malloc_info(),
                                 "types": type_counts(), "timers": pending_timers()}
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(stem) + ".tm")
    if os.environ.get(ENV_TRIM) == "1":
        heap.trim()
        record["rss_kib_trimmed"] = rss_kib()
    Path(str(stem) + ".json").write_text(json.dumps(record))
    return stem


def install(role: str) -> None:
    """Start tracing and arm SIGUSR2 when `SWACTOR_MEMTRACE` names a folder (module doc)."""
    folder_name = os.environ.get(ENV_DIR)
    if not folder_name:
        return
    folder = Path(folder_name)
    folder.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get(ENV_FRAMES, "12"))
    if frames > 0:
        tracemalloc.start(frames)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        dump(folder, role)

    signal.signal(signal.SIGUSR2, on_signal)
