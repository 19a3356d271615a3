"""A ring handle and its arena left to the garbage collector must not crash it.

CPython 3.11 segfaults when the collector breaks a reference cycle that holds a
memoryview with a live buffer export (gh-77894): `tp_clear` drops the view's managed
buffer, and freeing the view once the export goes away dereferences it.  A `Ring` pins
the arena mapping with a cffi `from_buffer` export; taken from `arena.view`, an arena and
ring that teardown left unclosed (a busy `Arena.close()` is suppressed there) crashed a
later, unrelated garbage collection in the test process.  The scenario runs in a child
interpreter so that a crash fails this test instead of killing pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from swactor.arena import Arena, ArenaBusyError
from swactor.ring import Ring
from swactor.testing.ring_rig import make_layout

CYCLE = textwrap.dedent(
    """
    import gc
    from swactor.arena import Arena
    from swactor.ring import Ring
    from swactor.testing.ring_rig import make_layout

    class Holder:
        pass

    def leave_for_the_collector() -> None:
        arena = Arena.create(1 << 20)
        gc.collect()  # the arena and its view become older than the ring: cleared first
        ring = Ring.init(arena, make_layout(1 << 16, 1, 1 << 16))
        holder = Holder()
        holder.me, holder.arena, holder.ring = holder, arena, ring

    leave_for_the_collector()
    found = gc.collect()
    print("collected", found)
    """
)


def test_collecting_an_unclosed_arena_and_ring_cycle_does_not_crash() -> None:
    child = subprocess.run([sys.executable, "-X", "faulthandler", "-c", CYCLE],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert child.stdout.startswith("collected "), child.stdout
    collected = int(child.stdout.split()[1])
    assert collected > 0  # the cycle really was garbage, found by the collector
    assert "tp_clear" not in child.stderr, child.stderr  # no export left on a memoryview


def test_closing_an_arena_under_an_open_ring_is_refused_as_busy() -> None:
    arena = Arena.create(1 << 20)
    ring = Ring.init(arena, make_layout(1 << 16, 1, 1 << 16))
    with pytest.raises(ArenaBusyError):
        arena.close()
    assert not arena.closed
    assert ring.write_from(b"still mapped") == (12, True)  # the refusal changed nothing
    out = bytearray(12)
    assert ring.read_into(out)[0] == 12 and bytes(out) == b"still mapped"
    ring.close()
    arena.close()
    assert arena.closed
