"""In-process tests of the Ring binding: header ABI, validation, spans, state, wake bits."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swactor.arena import Arena, ArenaBusyError
from swactor.ring import (
    VERSION_COMPACT,
    VERSION_SPLIT,
    Ring,
    RingAdvanceError,
    RingClosedError,
    RingLayoutInvalid,
    RingState,
    UnsupportedRingVersion,
    header_len,
)
from swactor.testing.ring_rig import make_layout
from swactor.wire import RingFaultReason, RingId, RingLayout

# Independent transcription of the ABI table in native/ring.h:
# version -> (header_len, commit, consume, state, wake offsets)
ABI = {1: (64, 24, 32, 40, 44), 2: (256, 64, 128, 192, 196)}
MAGIC = b"SWRG"


@pytest.fixture
def arena() -> Iterator[Arena]:
    a = Arena.create(1 << 20)
    yield a
    a.close()


@pytest.mark.parametrize("version", [VERSION_COMPACT, VERSION_SPLIT])
def test_header_bytes_follow_the_abi(arena: Arena, version: int) -> None:
    hlen, c_off, k_off, s_off, w_off = ABI[version]
    assert header_len(version) == hlen
    layout = make_layout(4096, ring_id=0x1122334455667788)
    ring = Ring.init(arena, layout, version)
    h = layout.header_offset
    hdr = bytes(arena.view[h : h + hlen])
    assert hdr[:4] == MAGIC
    assert struct.unpack_from("<HHQQ", hdr, 4) == (version, hlen, 0x1122334455667788, 4096)
    span = ring.writable_span(100)
    span[:] = b"x" * 100
    span.release()
    ring.advance_commit(100)
    ring.advance_consume(40)
    ring.mark_writable_pending()
    ring.close_producer()
    hdr = bytes(arena.view[h : h + hlen])
    assert struct.unpack_from("<Q", hdr, c_off)[0] == 100
    assert struct.unpack_from("<Q", hdr, k_off)[0] == 40
    assert struct.unpack_from("<I", hdr, s_off)[0] == 2  # Closed
    assert struct.unpack_from("<I", hdr, w_off)[0] == 2  # writable pending bit
    if version == VERSION_SPLIT:  # commit, consume, state on distinct cache lines
        assert len({c_off // 64, k_off // 64, s_off // 64}) == 3
    ring.close()


def test_spans_are_contiguous_and_wrap(arena: Arena) -> None:
    layout = make_layout(1024)
    prod = Ring.init(arena, layout)
    cons = Ring.open(arena, layout)
    w = prod.writable_span()
    assert len(w) == 1024
    w[:1000] = bytes(range(250)) * 4
    w.release()
    prod.advance_commit(1000)
    r = cons.readable_span(600)
    assert bytes(r) == (bytes(range(250)) * 4)[:600]
    r.release()
    cons.advance_consume(600)
    # free = 624, but only 24 contiguous bytes before the wrap
    w = prod.writable_span()
    assert len(w) == 24
    w[:] = b"A" * 24
    w.release()
    prod.advance_commit(24)
    w = prod.writable_span()
    assert len(w) == 600  # the rest, from physical 0
    w[:10] = b"B" * 10
    w.release()
    prod.advance_commit(10)
    r = cons.readable_span()
    assert len(r) == 424 and bytes(r[-24:]) == b"A" * 24
    r.release()
    cons.advance_consume(424)
    r = cons.readable_span()
    assert bytes(r) == b"B" * 10
    r.release()
    assert (cons.commit, cons.consume) == (1034, 1024)
    prod.close()
    cons.close()


def test_advance_beyond_the_span_is_refused(arena: Arena) -> None:
    layout = make_layout(256)
    ring = Ring.init(arena, layout)
    with pytest.raises(RingAdvanceError):
        ring.advance_commit(257)
    ring.advance_commit(200)
    with pytest.raises(RingAdvanceError):
        ring.advance_commit(57)  # only 56 free
    with pytest.raises(RingAdvanceError):
        ring.advance_consume(201)
    ring.advance_consume(200)
    assert (ring.commit, ring.consume) == (200, 200)
    ring.close()


def test_open_rejects_bad_magic_and_version(arena: Arena) -> None:
    layout = make_layout(4096)
    Ring.init(arena, layout).close()
    h = layout.header_offset
    arena.view[h : h + 4] = b"XXXX"
    with pytest.raises(UnsupportedRingVersion) as info:
        Ring.open(arena, layout)
    assert info.value.reason is RingFaultReason.UnsupportedRingVersion
    Ring.init(arena, layout).close()
    arena.view[h + 4 : h + 6] = struct.pack("<H", 9)
    with pytest.raises(UnsupportedRingVersion):
        Ring.open(arena, layout)
    Ring.init(arena, layout).close()
    arena.view[h + 6 : h + 8] = struct.pack("<H", 128)  # header_len not the version's
    with pytest.raises(UnsupportedRingVersion):
        Ring.open(arena, layout)
    with pytest.raises(UnsupportedRingVersion):
        Ring.init(arena, layout, version=7)


@dataclass(frozen=True)
class RawLayout:
    """A layout that skips wire validation, to reach the helper's own checks."""

    ring_id: int
    arena_offset: int
    total_len: int
    header_offset: int
    data_offset: int
    data_capacity: int
    alignment: int


def raw(layout: RingLayout) -> RawLayout:
    return RawLayout(
        int(layout.ring_id), layout.arena_offset, layout.total_len, layout.header_offset,
        layout.data_offset, layout.data_capacity, layout.alignment,
    )  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        {"data_capacity": 8192},  # capacity not as planned (header says 4096)
        {"ring_id": 99},  # another ring's header
        {"arena_offset": 1 << 20, "header_offset": 1 << 20},  # outside the arena
        {"total_len": 1 << 20},  # lease ends past the arena
        {"header_offset": (1 << 16) + 32},  # header misaligned
        {"data_offset": (1 << 16) + 4096 + 32},  # data misaligned
        {"alignment": 96},  # not a power of two
        {"data_offset": (1 << 16) + 128},  # split header (256 B) does not fit
        {"data_capacity": 0},
    ],
)
def test_open_rejects_bad_layouts(arena: Arena, change: dict[str, int]) -> None:
    layout = make_layout(4096)
    Ring.init(arena, layout, VERSION_SPLIT).close()
    with pytest.raises(RingLayoutInvalid) as info:
        Ring.open(arena, replace(raw(layout), **change))
    assert info.value.reason is RingFaultReason.RingLayoutInvalid


def test_init_rejects_a_layout_outside_the_arena(arena: Arena) -> None:
    layout = make_layout(4096, offset=arena.size - 4096)
    with pytest.raises(RingLayoutInvalid):
        Ring.init(arena, layout)


def test_state_transitions_and_first_fault_wins(arena: Arena) -> None:
    layout = make_layout(4096)
    a = Ring.init(arena, layout)
    b = Ring.open(arena, layout)
    assert b.state is RingState.Open and b.fault_reason is None
    a.close_producer()
    a.close_producer()  # idempotent
    assert b.state is RingState.Closed  # type: ignore[comparison-overlap]
    assert b.fault(RingFaultReason.HeaderMalformed) is True
    assert a.fault(RingFaultReason.WorkerProcessExited) is False
    assert a.state is RingState.Faulted
    assert a.fault_reason is RingFaultReason.HeaderMalformed
    with pytest.raises(RingClosedError):
        a.close_producer()
    a.close()
    b.close()


def test_pending_bits_coalesce_until_cleared(arena: Arena) -> None:
    ring = Ring.init(arena, make_layout(4096))
    assert ring.mark_readable_pending() is True
    assert ring.mark_readable_pending() is False
    assert ring.mark_writable_pending() is True  # independent bit
    ring.clear_readable_pending()
    assert ring.mark_readable_pending() is True
    assert ring.mark_writable_pending() is False
    ring.close()


@pytest.mark.parametrize("version", [VERSION_COMPACT, VERSION_SPLIT])
def test_corrupted_cursors_fault_the_ring(arena: Arena, version: int) -> None:
    layout = make_layout(4096)
    ring = Ring.init(arena, layout, version)
    _, c_off, k_off, _, _ = ABI[version]
    h = layout.header_offset
    arena.view[h + k_off : h + k_off + 8] = struct.pack("<Q", 10)  # consume > commit
    assert len(ring.readable_span()) == 0
    assert ring.state is RingState.Faulted
    assert ring.fault_reason is RingFaultReason.RingStateInvalid
    ring.close()
    ring = Ring.init(arena, layout, version)
    arena.view[h + c_off : h + c_off + 8] = struct.pack("<Q", 5000)  # beyond capacity
    assert len(ring.writable_span()) == 0
    assert ring.fault_reason is RingFaultReason.RingStateInvalid
    ring.close()


def test_closed_handle_and_busy_arena(arena: Arena) -> None:
    ring = Ring.init(arena, make_layout(4096))
    span = ring.writable_span()
    ring.close()
    ring.close()  # idempotent
    for call in (ring.writable_span, ring.readable_span, lambda: ring.advance_commit(1)):
        with pytest.raises(RingClosedError):
            call()
    with pytest.raises(RingClosedError):
        _ = ring.state
    with pytest.raises(ArenaBusyError):
        arena.close()  # `span` still views the mapping
    span.release()


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.sampled_from([64, 192, 1024]),
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=0, max_value=2100)),
        min_size=1,
        max_size=80,
    ),
)
def test_random_ops_match_a_byte_queue_model(capacity: int, ops: list[tuple[bool, int]]) -> None:
    """Writes and reads of random sizes against a plain FIFO model: a read never sees
    bytes that were not written, and a write never lands on unread bytes."""
    with Arena.create(1 << 20) as arena:
        layout = make_layout(capacity)
        prod = Ring.init(arena, layout)
        cons = Ring.open(arena, layout)
        model = bytearray()
        counter = 0
        for is_write, size in ops:
            if is_write:
                span = prod.writable_span(size)
                assert len(span) <= min(size, capacity - len(model))
                data = bytes((counter + i) % 251 for i in range(len(span)))
                counter += len(span)
                span[:] = data
                span.release()
                prod.advance_commit(len(data))
                model += data
            else:
                span = cons.readable_span(size)
                assert len(span) > 0 or not model or size == 0
                assert bytes(span) == bytes(model[: len(span)])
                n = len(span)
                span.release()
                cons.advance_consume(n)
                del model[:n]
            assert cons.commit - cons.consume == len(model)
        prod.close()
        cons.close()


def test_layout_ring_id_type_roundtrip(arena: Arena) -> None:
    layout = make_layout(4096, ring_id=2**64 - 1)
    ring = Ring.init(arena, layout)
    assert ring.ring_id == 2**64 - 1 and isinstance(layout.ring_id, RingId)
    ring.close()


def test_copying_calls_cross_the_wrap_and_report_wakes(arena: Arena) -> None:
    layout = make_layout(1024)
    prod = Ring.init(arena, layout)
    cons = Ring.open(arena, layout)
    assert prod.write_from(bytes(1000)) == (1000, True)  # readable bit was clear
    assert cons.read_into(bytearray(900)) == (900, True)  # writable bit was clear
    data = bytes(range(256)) * 4  # 1024 bytes; 924 free, wrapping at 1024
    assert prod.write_from(data) == (924, False)  # still pending: no second hint
    out = bytearray(2000)
    n, wake = cons.read_into(out)
    assert (n, wake) == (1024, False)
    assert bytes(out[:100]) == bytes(100) and bytes(out[100:1024]) == data[:924]
    assert prod.write_from(b"") == (0, False)
    assert (cons.commit, cons.consume) == (1924, 1924)
    prod.close()
    cons.close()


def test_abi_check_compares_the_compiled_helper_with_the_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from swactor.ring import ring as ring_module

    ring_module.check_abi()  # the installed extension matches
    monkeypatch.setattr(ring_module, "ABI_VERSION", 2)
    with pytest.raises(UnsupportedRingVersion):
        ring_module.check_abi()
