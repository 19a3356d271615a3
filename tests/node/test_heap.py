"""`swactor.heap`: what a run leaves is given back at the run boundary.

Real: this process's glibc heap, its resident size in /proc, and Python's collector.
`trim`: blocks of 16 KiB (below glibc's mmap threshold, so they live in the heap) are
allocated and every other one freed; the holes are not at the top of the heap, so
`free` cannot return them and resident memory stays up until `trim` releases their
pages. `release`: a reference cycle (what a stopped actor cell and its task leave) is
gone after it, without waiting for Python's own full collection. `settle`: what is
alive then is frozen out of later collections.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from swactor import heap

BLOCK = 16 << 10
BLOCKS = 2048  # 32 MiB, half of it freed


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_trim_releases_the_pages_of_freed_blocks() -> None:
    heap.trim()
    blocks = [bytearray(b"x" * BLOCK) for _ in range(BLOCKS)]
    del blocks[::2]
    held = rss_kib()
    assert heap.trim() is True
    released = held - rss_kib()
    assert released > BLOCKS // 2 * BLOCK // 1024 // 2, released  # most of the 16 MiB
    assert len(blocks) == BLOCKS // 2


class Cell:
    """A stand-in for a per-run object caught in a reference cycle."""

    def __init__(self) -> None:
        self.me = self


def test_release_collects_a_runs_cycles() -> None:
    gc.disable()  # no automatic collection in between: only release() may free it
    try:
        cell = Cell()
        gone = weakref.ref(cell)
        del cell
        assert gone() is not None  # a cycle: reference counting cannot free it
        heap.release()
        assert gone() is None
    finally:
        gc.enable()


def test_settle_freezes_what_is_alive() -> None:
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
