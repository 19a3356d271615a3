"""Dequantisation of GGUF tensor bytes, once at load, into the plan's compute dtype.

Theory of operation: a stage reads each tensor's raw bytes and calls :func:`dequantize`
exactly once; the result is a C-contiguous numpy array in numpy shape order (GGUF lists
dimensions innermost first; we reverse them) and in the compute dtype (``float32`` or
``float16``). F32/F16 are reinterpreted directly; block-quantised types go through
``gguf.quants.dequantize`` (vectorised numpy, ~1 s for all of SmolLM2-135M on one core).
Only the types in :data:`SUPPORTED_TYPES` are accepted; the reader rejects others with
``UnsupportedTensorType`` before reading any tensor bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as Q
from gguf import quants

SUPPORTED_TYPES: frozenset[int] = frozenset(
    int(t)
    for t in (
        Q.F32,
        Q.F16,
        Q.BF16,
        Q.Q4_0,
        Q.Q4_1,
        Q.Q5_0,
        Q.Q5_1,
        Q.Q8_0,
        Q.Q2_K,
        Q.Q3_K,
        Q.Q4_K,
        Q.Q5_K,
        Q.Q6_K,
    )
)


def dequantize(
    raw: npt.NDArray[np.uint8],
    type_id: int,
    shape: tuple[int, ...],
    target: type[np.floating[Any]],
) -> npt.NDArray[Any]:
    """Turn one tensor's raw bytes into a ``shape``-shaped array of ``target`` dtype."""
    qtype = Q(type_id)
    if qtype == Q.F32:
        values: npt.NDArray[Any] = raw.view(np.float32)
    elif qtype == Q.F16:
        values = raw.view(np.float16)
    else:
        rows = quants.quant_shape_to_byte_shape(shape, qtype)
        values = quants.dequantize(raw.reshape(rows), qtype)
    return np.ascontiguousarray(values.reshape(shape), dtype=target)


@dataclass(frozen=True)
class AffineBlocks:
    """A matrix kept in its file's 32-weight blocks: ``w = scale * q + offset`` per block.

    ``codes`` is ``uint8 [rows, blocks, 16]`` when ``nibbles`` (GGUF's 4-bit layout: weight
    ``j`` of a block in the low nibble of byte ``j``, weight ``j + 16`` in its high nibble)
    or ``int8 [rows, blocks, 32]``; ``scale`` and ``offset`` are ``float32 [rows, blocks]``.
    Every value is exactly the file's (its f16 scales widen to f32 exactly and ``scale * q``
    needs at most 19 significant bits).
    """

    codes: npt.NDArray[Any]
    scale: npt.NDArray[np.float32]
    offset: npt.NDArray[np.float32]
    nibbles: bool

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    def permute_rows(self, order: npt.NDArray[np.intp]) -> AffineBlocks:
        return AffineBlocks(
            self.codes[order], self.scale[order], self.offset[order], self.nibbles
        )

    @staticmethod
    def stack(parts: list[AffineBlocks]) -> AffineBlocks:
        """Rows of ``parts`` one after another (all of one code layout)."""
        assert len({p.nibbles for p in parts}) == 1
        return AffineBlocks(
            np.concatenate([p.codes for p in parts]),
            np.concatenate([p.scale for p in parts]),
            np.concatenate([p.offset for p in parts]),
            parts[0].nibbles,
        )


BLOCK_TYPES: frozenset[int] = frozenset(int(t) for t in (Q.Q4_0, Q.Q4_1, Q.Q8_0))


def affine_blocks(
    raw: npt.NDArray[np.uint8], type_id: int, shape: tuple[int, ...]
) -> AffineBlocks | None:
    """The blocks of a 2-D ``Q4_0``/``Q4_1``/``Q8_0`` tensor; ``None`` for any other."""
    if type_id not in BLOCK_TYPES or len(shape) != 2 or shape[1] % 32:
        return None
    qtype = Q(type_id)
    rows, groups = shape[0], shape[1] // 32
    block_bytes = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q8_0: 34}[qtype]
    blocks = raw.reshape(rows, groups, block_bytes)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == Q.Q8_0:
        codes = blocks[..., 2:].copy().view(np.int8)
        return AffineBlocks(codes, scale, np.zeros_like(scale), nibbles=False)
    if qtype == Q.Q4_1:
        offset = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        return AffineBlocks(blocks[..., 4:].copy(), scale, offset, nibbles=True)
    return AffineBlocks(blocks[..., 2:].copy(), scale, -8.0 * scale, nibbles=True)
