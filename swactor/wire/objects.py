"""Object specs, the fixed object header, and the edge stream preamble (spec §17, §23).

Theory of operation
-------------------
An edge stream is `EdgePreamble` once, then object records: an `ObjectHeader` followed
by exactly `header.extent` payload bytes. Both headers have fixed little-endian layouts:

ObjectHeader, 40 bytes, `struct` format `<IHHQQQII`::

    offset size field       value
    0      4    magic       OBJECT_MAGIC = 0x424F5753 (bytes b"SWOB")
    4      2    version     OBJECT_VERSION = 1
    6      2    header_len  OBJECT_HEADER_LEN = 40
    8      8    object_id
    16     8    sequence    inference-step index (spec §6)
    24     8    extent      payload bytes that follow
    32     4    flags       opaque to transport (role-defined; 0 if unused)
    36     4    reserved    must be 0

EdgePreamble, 16 bytes, `struct` format `<4sHHQ`::

    0      4    magic       PREAMBLE_MAGIC = b"SWED"
    4      2    version     PREAMBLE_VERSION = 1
    6      2    reserved    must be 0
    8      8    edge_id

`ObjectHeader.unpack` maps problems to the spec §37 `ObjectFailure` reasons:

- fewer than 40 bytes given             -> HeaderMalformed (a stream that *ends* there
  is EofMidObject; only the caller knows it ended, so it says so)
- magic is not OBJECT_MAGIC             -> UnsupportedObjectVersion ("magic or version is
  unsupported", spec §17)
- version is not OBJECT_VERSION         -> UnsupportedObjectVersion
- header_len is not 40                  -> HeaderMalformed
- reserved is not 0                     -> HeaderMalformed

`ObjectHeader.check_against(spec)` adds ExtentExceedsMax and ExtentAlignmentInvalid, and
`SequenceGate` enforces the edge's `SequencePolicy` (SequenceViolation).

`EdgePreamble.unpack` uses `StreamFaultReason`: short -> PreambleTruncated, bad magic or
non-zero reserved -> PreambleGarbage, unknown version -> PreambleVersionUnsupported.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar

from swactor.wire.codec import WireStruct
from swactor.wire.enums import (
    DTYPE_WIDTHS,
    DTypeFamily,
    LayoutRule,
    ObjectFailure,
    ObjectKind,
    SequencePolicy,
    ShapeRule,
    StreamFaultReason,
)
from swactor.wire.errors import ObjectHeaderError, PreambleError
from swactor.wire.ids import EdgeId, ObjectId, Sequence

OBJECT_MAGIC = 0x424F5753
OBJECT_VERSION = 1
OBJECT_HEADER_FORMAT = "<IHHQQQII"
OBJECT_HEADER_LEN = 40

PREAMBLE_MAGIC = b"SWED"
PREAMBLE_VERSION = 1
PREAMBLE_FORMAT = "<4sHHQ"
PREAMBLE_LEN = 16

_HEADER = struct.Struct(OBJECT_HEADER_FORMAT)
_PREAMBLE = struct.Struct(PREAMBLE_FORMAT)
assert _HEADER.size == OBJECT_HEADER_LEN and _PREAMBLE.size == PREAMBLE_LEN

MAX_OBJECT_ALIGNMENT = 1 << 24


@dataclass(frozen=True, slots=True)
class ObjectSpec(WireStruct):
    """The validation contract of every object on one edge (spec §17).

    `alignment` is the extent granule in bytes: every extent is a whole multiple of it
    (0 included). For `ShapeRule.Vector` it equals `dtype_width_bytes`; for
    `ShapeRule.Rows` it is one row (activations: `hidden_dim * dtype_width_bytes`).
    `max_extent` is a positive multiple of `alignment`.
    """

    kind: ObjectKind
    max_extent: int
    dtype_family: DTypeFamily
    dtype_width_bytes: int
    shape: ShapeRule
    layout: LayoutRule
    alignment: int
    sequence_policy: SequencePolicy

    def _validate(self) -> None:
        self._check_u64("max_extent")
        self._check_u32("dtype_width_bytes")
        self._check_u32("alignment")
        widths = DTYPE_WIDTHS[self.dtype_family]
        if self.dtype_width_bytes not in widths:
            self._fail(
                "dtype_width_bytes",
                f"{self.dtype_width_bytes} is not a {self.dtype_family.value} width "
                f"{sorted(widths)}",
            )
        if not 1 <= self.alignment <= MAX_OBJECT_ALIGNMENT:
            self._fail("alignment", f"{self.alignment} is outside 1..{MAX_OBJECT_ALIGNMENT}")
        if self.alignment % self.dtype_width_bytes:
            self._fail("alignment", "must be a multiple of dtype_width_bytes")
        if self.shape is ShapeRule.Vector and self.alignment != self.dtype_width_bytes:
            self._fail("alignment", "a Vector object's granule is one element")
        if self.max_extent < 1:
            self._fail("max_extent", "must be at least 1")
        if self.max_extent % self.alignment:
            self._fail("max_extent", "must be a multiple of alignment")

    def extent_failure(self, extent: int) -> ObjectFailure | None:
        """The §37 reason `extent` is invalid for this spec, or None if it is valid."""
        if extent > self.max_extent:
            return ObjectFailure.ExtentExceedsMax
        if extent % self.alignment:
            return ObjectFailure.ExtentAlignmentInvalid
        return None


@dataclass(frozen=True, slots=True)
class ObjectHeader(WireStruct):
    """The fixed 40-byte record header (spec §17); see the module doc for the layout."""

    object_id: ObjectId
    sequence: Sequence
    extent: int
    flags: int = 0
    magic: int = OBJECT_MAGIC
    version: int = OBJECT_VERSION
    header_len: int = OBJECT_HEADER_LEN
    reserved: int = 0

    LEN: ClassVar[int] = OBJECT_HEADER_LEN

    def _validate(self) -> None:
        self._check_u64("extent")
        self._check_u32("flags")
        if self.magic != OBJECT_MAGIC:
            raise ObjectHeaderError(
                ObjectFailure.UnsupportedObjectVersion, "magic", f"{self.magic:#010x} unknown"
            )
        if self.version != OBJECT_VERSION:
            raise ObjectHeaderError(
                ObjectFailure.UnsupportedObjectVersion,
                "version",
                f"{self.version} unsupported (want {OBJECT_VERSION})",
            )
        if self.header_len != OBJECT_HEADER_LEN:
            raise ObjectHeaderError(
                ObjectFailure.HeaderMalformed,
                "header_len",
                f"{self.header_len} is not {OBJECT_HEADER_LEN}",
            )
        if self.reserved != 0:
            raise ObjectHeaderError(ObjectFailure.HeaderMalformed, "reserved", "must be 0")

    def pack(self) -> bytes:
        """The 40 little-endian bytes of this header."""
        return _HEADER.pack(
            self.magic,
            self.version,
            self.header_len,
            self.object_id,
            self.sequence,
            self.extent,
            self.flags,
            self.reserved,
        )

    def pack_into(self, buffer: bytearray | memoryview, offset: int = 0) -> None:
        """Write the 40 header bytes into `buffer` at `offset`."""
        _HEADER.pack_into(
            buffer,
            offset,
            self.magic,
            self.version,
            self.header_len,
            self.object_id,
            self.sequence,
            self.extent,
            self.flags,
            self.reserved,
        )

    @classmethod
    def unpack(cls, buffer: bytes | bytearray | memoryview, offset: int = 0) -> ObjectHeader:
        """Parse the header at `offset`; raise `ObjectHeaderError` with its §37 reason.

        This is the per-object hot path of the ingress parser: the struct's fixed field
        widths already guarantee every range, so after the magic/version/length/reserved
        checks the instance is filled in directly instead of through `__post_init__`.
        """
        available = len(buffer) - offset
        if offset < 0 or available < OBJECT_HEADER_LEN:
            raise ObjectHeaderError(
                ObjectFailure.HeaderMalformed,
                "header_len",
                f"{max(available, 0)} bytes available, header needs {OBJECT_HEADER_LEN}",
            )
        magic, version, header_len, object_id, sequence, extent, flags, reserved = (
            _HEADER.unpack_from(buffer, offset)
        )
        if (
            magic != OBJECT_MAGIC
            or version != OBJECT_VERSION
            or header_len != OBJECT_HEADER_LEN
            or reserved != 0
        ):
            # The slow path raises the precise ObjectHeaderError.
            return cls(
                ObjectId(object_id),
                Sequence(sequence),
                extent,
                flags,
                magic,
                version,
                header_len,
                reserved,
            )
        header = object.__new__(cls)
        fill = object.__setattr__
        fill(header, "object_id", int.__new__(ObjectId, object_id))
        fill(header, "sequence", int.__new__(Sequence, sequence))
        fill(header, "extent", extent)
        fill(header, "flags", flags)
        fill(header, "magic", magic)
        fill(header, "version", version)
        fill(header, "header_len", header_len)
        fill(header, "reserved", reserved)
        return header

    def check_against(self, spec: ObjectSpec) -> None:
        """Raise `ObjectHeaderError` (ExtentExceedsMax/ExtentAlignmentInvalid) if bad."""
        failure = spec.extent_failure(self.extent)
        if failure is ObjectFailure.ExtentExceedsMax:
            raise ObjectHeaderError(
                failure, "extent", f"{self.extent} exceeds max_extent {spec.max_extent}"
            )
        if failure is not None:
            raise ObjectHeaderError(
                failure, "extent", f"{self.extent} is not a multiple of {spec.alignment}"
            )


class SequenceGate:
    """Enforces one edge's `SequencePolicy` over the headers it sees, in order."""

    __slots__ = ("last", "policy")

    def __init__(self, policy: SequencePolicy) -> None:
        self.policy = policy
        self.last: Sequence | None = None

    def admits(self, sequence: int) -> bool:
        """Whether `sequence` may follow the last admitted one (does not record it)."""
        if self.policy is SequencePolicy.Contiguous:
            return sequence == (0 if self.last is None else self.last + 1)
        return self.last is None or sequence > self.last

    def admit(self, header: ObjectHeader) -> None:
        """Record `header.sequence`, or raise `ObjectHeaderError(SequenceViolation)`."""
        if not self.admits(header.sequence):
            raise ObjectHeaderError(
                ObjectFailure.SequenceViolation,
                "sequence",
                f"{int(header.sequence)} may not follow "
                f"{'nothing' if self.last is None else int(self.last)} "
                f"under {self.policy.value}",
            )
        self.last = header.sequence


@dataclass(frozen=True, slots=True)
class EdgePreamble(WireStruct):
    """The fixed 16-byte preamble that opens an edge stream (spec §23)."""

    edge_id: EdgeId
    version: int = PREAMBLE_VERSION

    LEN: ClassVar[int] = PREAMBLE_LEN

    def _validate(self) -> None:
        if self.version != PREAMBLE_VERSION:
            raise PreambleError(
                StreamFaultReason.PreambleVersionUnsupported,
                "version",
                f"{self.version} unsupported (want {PREAMBLE_VERSION})",
            )

    def pack(self) -> bytes:
        """The 16 little-endian bytes of this preamble."""
        return _PREAMBLE.pack(PREAMBLE_MAGIC, self.version, 0, self.edge_id)

    @classmethod
    def unpack(cls, buffer: bytes | bytearray | memoryview) -> EdgePreamble:
        """Parse the first 16 bytes of `buffer`; raise `PreambleError` with its reason."""
        if len(buffer) < PREAMBLE_LEN:
            raise PreambleError(
                StreamFaultReason.PreambleTruncated,
                "",
                f"{len(buffer)} bytes, preamble needs {PREAMBLE_LEN}",
            )
        magic, version, reserved, edge_id = _PREAMBLE.unpack_from(buffer, 0)
        if magic != PREAMBLE_MAGIC:
            raise PreambleError(StreamFaultReason.PreambleGarbage, "magic", "not SWED")
        if reserved != 0:
            raise PreambleError(StreamFaultReason.PreambleGarbage, "reserved", "must be 0")
        return cls(edge_id=EdgeId(edge_id), version=version)
