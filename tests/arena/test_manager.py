"""ArenaManager: example tests and a Hypothesis stateful test against the table.

The stateful test keeps its own model - live leases as plain ranges, the FIFO of
queued requests, the table state - and an independent oracle for "fits": an aligned
gap among the live ranges (it never looks at the manager's free list).  After every
step: two live leases never overlap, every layout is aligned and inside the ceiling,
free + leased bytes add up to the ceiling, and a range comes back only through a
proof minted by the teardown path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from swactor import faults
from swactor.arena import (
    Arena,
    ArenaDown,
    ArenaError,
    ArenaManager,
    ArenaManagerError,
    ArenaUnmapped,
    ArenaUp,
    Cancelled,
    Granted,
    ProofRefused,
    Queued,
    Rejected,
    Released,
    ReleaseRefused,
)
from swactor.faults import Faults
from swactor.fsm.generated.arena_manager import LeaseRing, State
from swactor.fsm.runtime import CancelTimer, ProtocolError, StartTimer
from swactor.ring import Ring
from swactor.wire import (
    ArenaFailure,
    EdgeId,
    HostPinning,
    LeaseRequestId,
    QuiescenceProof,
    QuiescenceProofKind,
    RingDirection,
    RingId,
    RingSpec,
    WakeCoalescing,
)

KiB, MiB = 1 << 10, 1 << 20
PAGE = 4096
CEILING = 1 * MiB


def spec(capacity: int, alignment: int = 64) -> RingSpec:
    return RingSpec(
        data_capacity=capacity,
        alignment=alignment,
        direction=RingDirection.Ingress,
        host_pinning=HostPinning.Pageable,
        wake_coalescing=WakeCoalescing.PendingBit,
    )


def lease(m: ArenaManager, rid: int, capacity: int, alignment: int = 64) -> list[object]:
    return list(
        m.lease(LeaseRequestId(rid), f"rec{rid}", EdgeId(rid), RingDirection.Ingress,
                spec(capacity, alignment))
    )  # fmt: skip


def ready(ceiling: int = CEILING) -> ArenaManager:
    m = ArenaManager(ceiling, shutdown_grace_s=2.0)
    assert m.construct() == [ArenaUp()]
    assert m.state is State.Ready
    return m


def granted(outputs: list[object]) -> Granted:
    (out,) = outputs
    assert isinstance(out, Granted), outputs
    return out


# -- examples -------------------------------------------------------------------------------


def test_grant_writes_a_header_that_the_worker_side_can_open() -> None:
    m = ready()
    g = granted(lease(m, 1, 64 * KiB))
    assert g.requester == "rec1" and g.layout.ring_id == RingId(1)
    assert g.layout.data_offset == g.layout.arena_offset + PAGE
    assert m.arena is not None
    ring = Ring.open(m.arena, g.layout)
    assert ring.capacity == 64 * KiB and ring.commit == 0
    ring.close()


def test_boot_failure_reports_and_absorbs() -> None:
    def broken(size: int) -> Arena:
        raise ArenaError(ArenaFailure.MemfdFailed, "no memfd here")

    m = ArenaManager(CEILING, create_arena=broken)
    assert m.construct() == [ArenaDown(ArenaFailure.MemfdFailed)]
    assert m.state is State.Failed
    assert lease(m, 1, 4 * KiB) == []  # terminal: absorbed, no answer


def test_queue_is_served_in_order_when_space_comes_back() -> None:
    m = ready()
    minter = m.take_minter()
    a = granted(lease(m, 1, 700 * KiB))  # 704 KiB with its header page
    granted(lease(m, 4, 200 * KiB))  # 204 KiB: 116 KiB left
    assert lease(m, 2, 500 * KiB) == [Queued(LeaseRequestId(2), "rec2")]
    assert lease(m, 3, 150 * KiB) == [Queued(LeaseRequestId(3), "rec3")]
    granted(lease(m, 5, 50 * KiB))  # fits now: granted although others are queued
    out = m.release(a.layout.ring_id, minter.after_teardown(
        a.layout.ring_id, pump_stopped=True, ring_quiesced=True))  # fmt: skip
    assert out[0] == Released(a.layout.ring_id)
    grants = [o for o in out[1:] if isinstance(o, Granted)]
    assert len(grants) == len(out) - 1 == 2
    assert [g.request_id for g in grants] == [2, 3]  # in queue order
    assert m.queued_requests() == []


class _Pressure(Faults):
    """A Faults port whose arena.pressure is switched by the test; counts its asks."""

    def __init__(self) -> None:
        self.on = False
        self.asks = 0

    def lease_pressure(self) -> bool:
        self.asks += 1
        return self.on


def test_arena_pressure_comes_from_the_faults_port_before_the_event() -> None:
    port = _Pressure()
    m = ArenaManager(CEILING, faults=port)
    assert m.construct() == [ArenaUp()]
    minter = m.take_minter()
    a = granted(lease(m, 1, 4 * KiB))
    port.on = True
    assert lease(m, 2, 4 * KiB) == [Queued(LeaseRequestId(2), "rec2")]
    asks = port.asks
    event = LeaseRing(LeaseRequestId(3), "rec3", EdgeId(3), RingDirection.Ingress,
                      spec(4 * KiB))
    assert m.fits_now(event) is False and m.can_ever_fit(event) is True
    assert port.asks == asks  # the guards read the ledger, they never ask the port
    port.on = False
    out = m.release(a.layout.ring_id, minter.never_installed(a.layout.ring_id))
    assert out[0] == Released(a.layout.ring_id)
    assert granted(out[1:]).request_id == 2  # the release retried the queue


def test_fits_now_reads_no_fault_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    armed = tmp_path / "faults.json"
    faults.arm(armed, {"point": "arena.pressure"})
    monkeypatch.setenv(faults.ENV_FILE, str(armed))
    m = ready()  # the default port, NO_FAULTS: no pressure whatever the file says
    event = LeaseRing(LeaseRequestId(1), "rec1", EdgeId(1), RingDirection.Ingress,
                      spec(4 * KiB))
    assert m.fits_now(event) is True
    granted(lease(m, 1, 4 * KiB))
    file_port = ArenaManager(CEILING, faults=faults.from_env())  # what a node passes
    file_port.construct()
    assert lease(file_port, 1, 4 * KiB) == [Queued(LeaseRequestId(1), "rec1")]


def test_never_fits_is_rejected_and_ring_ids_are_not_reused() -> None:
    m = ready()
    minter = m.take_minter()
    assert lease(m, 1, CEILING) == [
        Rejected(LeaseRequestId(1), "rec1", ArenaFailure.LeaseNeverFits)
    ]
    g = granted(lease(m, 2, 4 * KiB))
    m.release(g.layout.ring_id, minter.never_installed(g.layout.ring_id))
    g2 = granted(lease(m, 3, 4 * KiB))
    assert g2.layout.arena_offset == g.layout.arena_offset  # same range, reused
    assert g2.layout.ring_id > g.layout.ring_id  # never the same id


def test_cancel_removes_a_queued_request_and_names_an_already_granted_ring() -> None:
    m = ready()
    minter = m.take_minter()
    a = granted(lease(m, 1, 900 * KiB))
    assert lease(m, 2, 500 * KiB) == [Queued(LeaseRequestId(2), "rec2")]
    assert m.cancel(LeaseRequestId(2)) == [Cancelled(LeaseRequestId(2), None)]
    assert m.queued_requests() == []
    # cancelled after grant: the reply names the ring; the requester releases it unused
    assert m.cancel(LeaseRequestId(1)) == [Cancelled(LeaseRequestId(1), a.layout.ring_id)]
    assert m.live_leases()[0].cancelled is True
    out = m.release(a.layout.ring_id, minter.never_installed(a.layout.ring_id))
    assert out == [Released(a.layout.ring_id)]
    assert m.live_leases() == [] and m.free_extents == [(0, CEILING)]


def test_only_minted_proofs_release() -> None:
    m = ready()
    minter = m.take_minter()
    with pytest.raises(ArenaManagerError):
        m.take_minter()
    a = granted(lease(m, 1, 4 * KiB))
    b = granted(lease(m, 2, 4 * KiB))
    forged = QuiescenceProof(ring_id=a.layout.ring_id, kind=QuiescenceProofKind.WorkerReaped)
    assert m.release(a.layout.ring_id, forged) == [ReleaseRefused(a.layout.ring_id)]
    for_b = minter.worker_reaped(b.layout.ring_id, returncode=-9)
    assert m.release(a.layout.ring_id, for_b) == [ReleaseRefused(a.layout.ring_id)]
    with pytest.raises(ProofRefused):
        minter.after_teardown(a.layout.ring_id, pump_stopped=True, ring_quiesced=False)
    with pytest.raises(ProofRefused):
        minter.worker_reaped(a.layout.ring_id, returncode=None)
    assert len(m.live_leases()) == 2  # nothing was released
    proof = minter.after_teardown(a.layout.ring_id, pump_stopped=True, ring_quiesced=True)
    assert m.release(a.layout.ring_id, proof) == [Released(a.layout.ring_id)]
    assert m.release(a.layout.ring_id, proof) == [ReleaseRefused(a.layout.ring_id)]  # replay


def test_shutdown_rejects_then_stops_after_the_last_release() -> None:
    m = ready()
    minter = m.take_minter()
    a = granted(lease(m, 1, 900 * KiB))
    assert lease(m, 2, 500 * KiB) == [Queued(LeaseRequestId(2), "rec2")]
    out = m.shutdown()
    assert out == [
        Rejected(LeaseRequestId(2), "rec2", ArenaFailure.ShuttingDown),
        StartTimer("ShutdownTimeout", 2.0),
    ]
    assert lease(m, 3, 4 * KiB) == [
        Rejected(LeaseRequestId(3), "rec3", ArenaFailure.ShuttingDown)
    ]
    out = m.release(a.layout.ring_id, minter.never_installed(a.layout.ring_id))
    assert out == [Released(a.layout.ring_id), ArenaUnmapped(()), CancelTimer("ShutdownTimeout")]
    assert m.state is State.Stopped and m.arena is not None and m.arena.closed


def test_shutdown_timeout_abandons_live_leases() -> None:
    m = ready()
    a = granted(lease(m, 1, 4 * KiB))
    assert m.shutdown() == [StartTimer("ShutdownTimeout", 2.0)]
    assert m.timer_fired("ShutdownTimeout") == [
        ArenaUnmapped((a.layout.ring_id,)),
        CancelTimer("ShutdownTimeout"),
    ]
    assert m.state is State.Stopped


def test_bad_calls_get_typed_errors() -> None:
    m = ArenaManager(CEILING)
    with pytest.raises(ProtocolError):
        m.cancel(LeaseRequestId(1))  # Booting: no row
    m.construct()
    granted(lease(m, 1, 4 * KiB))
    with pytest.raises(ArenaManagerError):
        lease(m, 1, 4 * KiB)  # same request id while live


# -- stateful -------------------------------------------------------------------------------

CAPACITIES = [4 * KiB, 64 * KiB, 200 * KiB, 256 * KiB, 448 * KiB, 2 * MiB]
ALIGNMENTS = [64, 4096, 64 * KiB, 256 * KiB]


def geometry(capacity: int, alignment: int) -> tuple[int, int]:
    """(lease bytes, data alignment) as the manager documents it: a header page, then
    page-rounded data aligned to max(alignment, page)."""
    return PAGE + -(-capacity // PAGE) * PAGE, max(alignment, PAGE)


def oracle_fits(live: list[tuple[int, int]], size: int, align: int, ceiling: int) -> bool:
    cursor = 0
    for start, length in [*sorted(live), (ceiling, 0)]:
        s = -(-(cursor + PAGE) // align) * align - PAGE  # data (s + PAGE) aligned
        if s + size <= start:
            return True
        cursor = max(cursor, start + length)
    return False


@dataclass
class Req:
    rid: int
    capacity: int
    alignment: int


class ArenaManagerStateful(RuleBasedStateMachine):
    @initialize()
    def boot(self) -> None:
        self.m = ArenaManager(CEILING, shutdown_grace_s=1.0)
        assert self.m.construct() == [ArenaUp()]
        self.minter = self.m.take_minter()
        self.state = State.Ready
        self.live: dict[int, tuple[Req, Granted]] = {}
        self.queue: list[Req] = []
        self.released: list[tuple[int, QuiescenceProof]] = []
        self.next_rid = 1
        self.max_ring_id = 0

    def teardown(self) -> None:
        if self.m.arena is not None and not self.m.arena.closed:
            self.m.arena.close()

    def live_ranges(self) -> list[tuple[int, int]]:
        return [(g.layout.arena_offset, g.layout.total_len) for _, g in self.live.values()]

    def accept_grant(self, req: Req, out: object) -> None:
        assert isinstance(out, Granted) and out.request_id == req.rid, out
        lay = out.layout
        size, align = geometry(req.capacity, req.alignment)
        assert lay.total_len == size and lay.data_capacity == req.capacity
        assert lay.data_offset % align == 0 and lay.header_offset % 64 == 0
        assert lay.data_offset == lay.arena_offset + PAGE
        assert lay.arena_offset >= 0 and lay.arena_offset + lay.total_len <= CEILING
        for start, length in self.live_ranges():  # placed in a gap, never on a live lease
            assert lay.arena_offset + size <= start or start + length <= lay.arena_offset
        assert int(lay.ring_id) > self.max_ring_id  # never reused
        self.max_ring_id = int(lay.ring_id)
        self.live[int(lay.ring_id)] = (req, out)

    @rule(capacity=st.sampled_from(CAPACITIES), alignment=st.sampled_from(ALIGNMENTS))
    def lease(self, capacity: int, alignment: int) -> None:
        capacity = -(-capacity // alignment) * alignment  # RingSpec: a multiple of it
        req = Req(self.next_rid, capacity, alignment)
        self.next_rid += 1
        out = lease(self.m, req.rid, capacity, alignment)
        if self.state is State.Stopped:
            assert out == []
            return
        if self.state is State.ShuttingDown:
            assert out == [Rejected(LeaseRequestId(req.rid), f"rec{req.rid}",
                                    ArenaFailure.ShuttingDown)]  # fmt: skip
            return
        size, align = geometry(capacity, alignment)
        if oracle_fits(self.live_ranges(), size, align, CEILING):
            (g,) = out
            self.accept_grant(req, g)
        elif oracle_fits([], size, align, CEILING):
            assert out == [Queued(LeaseRequestId(req.rid), f"rec{req.rid}")]
            self.queue.append(req)
            event("lease queued")
        else:
            assert out == [Rejected(LeaseRequestId(req.rid), f"rec{req.rid}",
                                    ArenaFailure.LeaseNeverFits)]  # fmt: skip

    @precondition(lambda self: self.state in (State.Ready, State.ShuttingDown))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.next_rid == 1:
            return
        rid = data.draw(st.integers(1, self.next_rid - 1))
        out = self.m.cancel(LeaseRequestId(rid))
        live = [k for k, (r, _) in self.live.items() if r.rid == rid]
        assert out == [Cancelled(LeaseRequestId(rid), RingId(live[0]) if live else None)]
        self.queue = [r for r in self.queue if r.rid != rid]

    def retry(self, outs: list[object]) -> None:
        """The queue is retried in order: each request that now fits is granted."""
        waiting, self.queue = self.queue, []
        for req in waiting:
            size, align = geometry(req.capacity, req.alignment)
            if oracle_fits(self.live_ranges(), size, align, CEILING):
                self.accept_grant(req, outs.pop(0))
                event("queued lease granted on release")
            else:
                self.queue.append(req)
        assert outs == []

    @precondition(lambda self: bool(self.live) and self.state is not State.Stopped)
    @rule(data=st.data(), kind=st.sampled_from(["teardown", "reaped", "never"]))
    def release(self, data: st.DataObject, kind: str) -> None:
        ring_id = data.draw(st.sampled_from(sorted(self.live)))
        if kind == "teardown":
            proof = self.minter.after_teardown(ring_id, pump_stopped=True, ring_quiesced=True)
        elif kind == "reaped":
            proof = self.minter.worker_reaped(ring_id, returncode=0)
        else:
            proof = self.minter.never_installed(ring_id)
        out = self.m.release(RingId(ring_id), proof)
        assert out[0] == Released(RingId(ring_id))
        del self.live[ring_id]
        self.released.append((ring_id, proof))
        if self.state is State.Ready:
            self.retry(list(out[1:]))
        elif not self.live:  # ShuttingDown, last lease back
            assert out[1:] == [ArenaUnmapped(()), CancelTimer("ShutdownTimeout")]
            self.state = State.Stopped
        else:
            assert out[1:] == []

    @precondition(lambda self: bool(self.live) and self.state is not State.Stopped)
    @rule(data=st.data(), forge=st.sampled_from(["equal", "other", "replay"]))
    def release_without_valid_proof(self, data: st.DataObject, forge: str) -> None:
        ring_id = data.draw(st.sampled_from(sorted(self.live)))
        if forge == "equal":
            proof = QuiescenceProof(ring_id=RingId(ring_id), kind=QuiescenceProofKind.WorkerReaped)
        elif forge == "other" or not self.released:
            proof = QuiescenceProof(ring_id=RingId(ring_id + 1000),
                                    kind=QuiescenceProofKind.NeverInstalled)  # fmt: skip
        else:
            proof = self.released[-1][1]
        assert self.m.release(RingId(ring_id), proof) == [ReleaseRefused(RingId(ring_id))]

    @precondition(lambda self: self.state is State.Ready)
    @rule()
    def shutdown(self) -> None:
        out = self.m.shutdown()
        rejected = [Rejected(LeaseRequestId(r.rid), f"rec{r.rid}", ArenaFailure.ShuttingDown)
                    for r in self.queue]  # fmt: skip
        self.queue = []
        if self.live:
            assert out == [*rejected, StartTimer("ShutdownTimeout", 1.0)]
            self.state = State.ShuttingDown
        else:
            assert out == [*rejected, ArenaUnmapped(())]
            self.state = State.Stopped

    @precondition(lambda self: self.state is State.ShuttingDown)
    @rule()
    def grace_runs_out(self) -> None:
        out = self.m.timer_fired("ShutdownTimeout")
        abandoned = tuple(RingId(k) for k in sorted(self.live))
        assert out == [ArenaUnmapped(abandoned), CancelTimer("ShutdownTimeout")]
        self.state = State.Stopped

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "m"):
            return
        assert self.m.state is self.state
        assert [int(r) for r in self.m.queued_requests()] == [r.rid for r in self.queue]
        assert sorted(int(x.ring_id) for x in self.m.live_leases()) == sorted(self.live)
        ranges = sorted(self.live_ranges())
        for (s1, l1), (s2, _) in itertools.pairwise(ranges):
            assert s1 + l1 <= s2, "two live leases overlap"
        free = self.m.free_extents
        assert sum(n for _, n in free) + sum(n for _, n in ranges) == CEILING
        for fs, fl in free:  # free never covers a live lease
            for ls, ll in ranges:
                assert fs + fl <= ls or ls + ll <= fs


ArenaManagerStateful.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None
)
test_arena_manager_stateful = ArenaManagerStateful.TestCase
