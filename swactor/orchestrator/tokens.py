"""Token objects at the orchestrator's token endpoints: ids <-> payload bytes (spec §17).

Theory of operation. A token edge carries `TokenIds` objects: a vector of u32 token ids,
little endian, no header of its own (the object header around it carries the sequence
and the extent). The token-in producer writes the prompt at step 0 and one id per later
step; the token-out consumer reads one sampled id per step. Both check the edge's
`ObjectSpec` exactly as a worker would: an extent over `max_extent` is
`ExtentExceedsMax`, an extent that is not a whole number of ids is
`ExtentAlignmentInvalid`; an id outside u32 cannot be encoded. Failures raise
`TokenObjectError` carrying the §37 `ObjectFailure` (or None for a bad id) and a message
that names sizes and counts only, never the bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from swactor.wire import DTypeFamily, ObjectFailure, ObjectKind, ObjectSpec
from swactor.wire.ids import U32_MAX

TOKEN_WIDTH = 4


class TokenObjectError(ValueError):
    """A token object cannot be encoded or decoded; `reason` is the §37 failure if any."""

    def __init__(self, reason: ObjectFailure | None, message: str) -> None:
        super().__init__(f"{reason.value}: {message}" if reason else message)
        self.reason = reason


def _check_spec(spec: ObjectSpec) -> None:
    if (spec.kind, spec.dtype_family, spec.dtype_width_bytes) != (
        ObjectKind.TokenIds, DTypeFamily.UInt, TOKEN_WIDTH
    ):
        raise TokenObjectError(None, f"edge carries {spec.kind.value} "
                               f"{spec.dtype_family.value}{8 * spec.dtype_width_bytes}, "
                               "not u32 token ids")


def _check_extent(spec: ObjectSpec, extent: int) -> None:
    failure = spec.extent_failure(extent)
    if failure is not None:
        raise TokenObjectError(failure, f"{extent} bytes against max_extent {spec.max_extent} "
                               f"and granule {spec.alignment}")


def encode_token_ids(token_ids: Sequence[int], spec: ObjectSpec) -> bytes:
    """The payload of a token object holding `token_ids` (u32 little endian)."""
    _check_spec(spec)
    for position, token in enumerate(token_ids):
        if not 0 <= token <= U32_MAX:
            raise TokenObjectError(None, f"token id at position {position} is not a u32")
    _check_extent(spec, TOKEN_WIDTH * len(token_ids))
    return struct.pack(f"<{len(token_ids)}I", *token_ids)


def decode_token_ids(payload: bytes | bytearray | memoryview, spec: ObjectSpec) -> tuple[int, ...]:
    """The token ids a token object's payload holds."""
    _check_spec(spec)
    _check_extent(spec, len(payload))
    return struct.unpack(f"<{len(payload) // TOKEN_WIDTH}I", payload)
