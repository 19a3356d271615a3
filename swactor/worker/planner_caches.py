"""Drop the per-plan allocators that tinygrad's memory planner leaves in method caches.

Theory of operation. tinygrad 0.14's `memory_plan_rewrite` (`tinygrad/schedule/memory.py`)
builds fresh `TLSFAllocator`s for every schedule it plans: every realize outside a
captured jit, such as each run's prefill and the jit's own capture calls. The
allocator's `lv1` and `lv2` methods are `functools.cache`d, so their caches key on
`(self, size)` and keep every allocator of every plan, with its free-list storage, for
the life of the process (tracemalloc in `just soak` workers: about one allocator, ~10
KiB, per run, in `runtime/support/memory.py`). The cached values are pure bit
arithmetic on `size`, so clearing both caches after a step changes no result; the next
plan recomputes a few hundred trivial calls. A tinygrad without these caches is left
alone.
"""

from __future__ import annotations

from tinygrad.runtime.support.memory import TLSFAllocator

CACHED_METHODS = ("lv1", "lv2")


def drop_planner_caches() -> None:
    """Clear `TLSFAllocator.lv1` / `.lv2` caches, releasing the allocators they hold."""
    for name in CACHED_METHODS:
        clear = getattr(getattr(TLSFAllocator, name, None), "cache_clear", None)
        if callable(clear):
            clear()
