"""Ring specs, arena ring layouts and quiescence proofs (spec §18, §19, §38).

Theory of operation
-------------------
`RingSpec` is what an edge asks for: a data capacity, an alignment, a direction, and
pinning and wake policies. `RingLayout` is what ArenaManager mints after a lease: arena
offsets only, never process pointers. All offsets in a layout are absolute offsets into
the arena (each process adds its own mapping base):

    arena_offset                                   arena_offset + total_len
    |-- ... --|== ring header ==|-- ... --|======== data ========|-- ... --|
              header_offset               data_offset            data_offset + data_capacity

Layout rules (each violation raises `RingLayoutError` naming the field):

- `alignment` is a power of two, at least `RING_HEADER_ALIGN` (64) and at most 2 MiB;
- `arena_offset` and `header_offset` are multiples of 64 (spec §20 `align(64)` header);
- `header_offset >= arena_offset` and the `RING_HEADER_BYTES` (64) header ends at or
  before `data_offset`;
- `data_offset` is a multiple of `alignment`; `data_capacity > 0` and a multiple of
  `alignment`;
- the data region ends within `arena_offset + total_len`, which fits in a u64.

`RingLayout.at` builds the one layout every lease uses: the header at the lease's start,
the data region at the next `RING_HEADER_PAGE` boundary after the header's bytes.

`QuiescenceProof` is the token ReleaseRing needs: which ring, and why it is quiet. Who
may mint one is the arena's business; this module only defines the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from swactor.wire.codec import WireStruct
from swactor.wire.enums import HostPinning, QuiescenceProofKind, RingDirection, WakeCoalescing
from swactor.wire.errors import RingLayoutError
from swactor.wire.ids import U64_MAX, RingId

RING_HEADER_ALIGN = 64
RING_HEADER_BYTES = 64
RING_HEADER_PAGE = 4096
"""A lease's data region starts this many bytes (or whole multiples) after its header."""
MIN_RING_ALIGNMENT = 64
MAX_RING_ALIGNMENT = 1 << 21


def is_power_of_two(value: int) -> bool:
    """Whether `value` is a positive power of two."""
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True)
class RingSpec(WireStruct):
    """The requested operating shape of a ring (spec §18).

    `data_capacity` is a positive multiple of `alignment`; `alignment` is a power of two
    in 64..2 MiB (cache-line aligned so cross-process atomics never share a line).
    """

    data_capacity: int
    alignment: int
    direction: RingDirection
    host_pinning: HostPinning
    wake_coalescing: WakeCoalescing

    def _validate(self) -> None:
        self._check_u64("data_capacity")
        self._check_u32("alignment")
        if not is_power_of_two(self.alignment) or not (
            MIN_RING_ALIGNMENT <= self.alignment <= MAX_RING_ALIGNMENT
        ):
            self._fail(
                "alignment",
                f"{self.alignment} is not a power of two in "
                f"{MIN_RING_ALIGNMENT}..{MAX_RING_ALIGNMENT}",
            )
        if self.data_capacity < 1 or self.data_capacity % self.alignment:
            self._fail("data_capacity", "must be a positive multiple of alignment")


@dataclass(frozen=True, slots=True)
class RingLayout(WireStruct):
    """Arena-relative ring layout minted by ArenaManager (spec §18); see module doc."""

    ring_id: RingId
    arena_offset: int
    total_len: int
    header_offset: int
    data_offset: int
    data_capacity: int
    alignment: int

    def _validate(self) -> None:
        for name in ("arena_offset", "total_len", "header_offset", "data_offset"):
            self._check_u64(name)
        self._check_u64("data_capacity")
        self._check_u32("alignment")
        if not is_power_of_two(self.alignment) or not (
            MIN_RING_ALIGNMENT <= self.alignment <= MAX_RING_ALIGNMENT
        ):
            self._bad(
                "alignment",
                f"{self.alignment} is not a power of two in "
                f"{MIN_RING_ALIGNMENT}..{MAX_RING_ALIGNMENT}",
            )
        if self.arena_offset % RING_HEADER_ALIGN:
            self._bad("arena_offset", f"must be a multiple of {RING_HEADER_ALIGN}")
        if self.header_offset % RING_HEADER_ALIGN:
            self._bad("header_offset", f"must be a multiple of {RING_HEADER_ALIGN}")
        if self.header_offset < self.arena_offset:
            self._bad("header_offset", "lies before arena_offset")
        if self.header_offset + RING_HEADER_BYTES > self.data_offset:
            self._bad("data_offset", f"overlaps the {RING_HEADER_BYTES}-byte ring header")
        if self.data_offset % self.alignment:
            self._bad("data_offset", "must be a multiple of alignment")
        if self.data_capacity < 1 or self.data_capacity % self.alignment:
            self._bad("data_capacity", "must be a positive multiple of alignment")
        end = self.arena_offset + self.total_len
        if end > U64_MAX:
            self._bad("total_len", "arena_offset + total_len overflows u64")
        if self.data_offset + self.data_capacity > end:
            self._bad("data_capacity", "data region ends past arena_offset + total_len")

    def _bad(self, field: str, rule: str) -> None:
        raise RingLayoutError("RingLayout", field, rule)

    @classmethod
    def at(
        cls,
        ring_id: RingId | int,
        offset: int,
        data_capacity: int,
        *,
        alignment: int = RING_HEADER_ALIGN,
        header_bytes: int = RING_HEADER_BYTES,
        total_len: int | None = None,
    ) -> RingLayout:
        """The layout of a lease at arena `offset`: the ring header there, the data region
        at the next `RING_HEADER_PAGE` boundary past its `header_bytes` (at least one
        page), the lease `total_len` bytes long (default: up to the data's end)."""
        pages = max(1, -(-header_bytes // RING_HEADER_PAGE))
        data_offset = offset + pages * RING_HEADER_PAGE
        if total_len is None:
            total_len = data_offset - offset + data_capacity
        return cls(RingId(ring_id), offset, total_len, offset, data_offset, data_capacity,
                   alignment)

    @property
    def end_offset(self) -> int:
        """First arena byte after this lease."""
        return self.arena_offset + self.total_len

    def satisfies(self, spec: RingSpec) -> bool:
        """Whether this layout gives at least the capacity and alignment `spec` asks."""
        return self.data_capacity >= spec.data_capacity and self.alignment >= spec.alignment

    def overlaps(self, other: RingLayout) -> bool:
        """Whether two leases share any arena byte."""
        return self.arena_offset < other.end_offset and other.arena_offset < self.end_offset


@dataclass(frozen=True, slots=True)
class QuiescenceProof(WireStruct):
    """Proof that nothing reads or writes `ring_id` any more (spec §38 release rule)."""

    ring_id: RingId
    kind: QuiescenceProofKind
