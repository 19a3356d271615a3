"""GGUF tensor bytes: dequantised once at load, or kept in the file's blocks.

Theory of operation: a stage reads each tensor's raw bytes once. Dense mode calls
:func:`dequantize`: the result is a C-contiguous numpy array in numpy shape order (GGUF
lists dimensions innermost first; we reverse them) and in the compute dtype (``float32``
or ``float16``). F32/F16 are reinterpreted directly; block-quantised types go through
``gguf.quants.dequantize`` (vectorised numpy, ~1 s for all of SmolLM2-135M on one core).
Block mode keeps a 2-D tensor of a :data:`BLOCK_TYPES` type as a :class:`QuantMatrix`
(the file's bytes, one row of blocks per matrix row); :func:`block_fields` cuts its
blocks into the arrays :mod:`swactor.model.block_kernels` computes from.
Only the types in :data:`SUPPORTED_TYPES` are accepted; the reader rejects others with
``UnsupportedTensorType`` before reading any tensor bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

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


BLOCK_TYPES: frozenset[int] = frozenset(
    int(t) for t in (Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K,
                     Q.Q4_K, Q.Q5_K, Q.Q6_K)
)
"""Types a stage can keep in the file's blocks and compute from (``--weights blocks``).
F16 and BF16 count as blocks of one weight: kept as the file's 16-bit values and widened
in the product's kernel, a stage holds their file bytes whatever its compute dtype."""


@dataclass(frozen=True)
class QuantMatrix:
    """A 2-D tensor kept as the file's own bytes: ``raw`` is ``uint8 [rows, row_bytes]``.

    Rows are whole runs of blocks (every type here packs a row into ``cols / block``
    blocks), so a row permutation or a stack of matrices of one type is a permutation or
    a concatenation of ``raw``'s rows. :func:`block_fields` splits the blocks into the
    arrays the block kernels read; :meth:`dense_rows` dequantises chosen rows on the host
    (the embedding lookup).
    """

    type_id: int
    shape: tuple[int, int]
    raw: npt.NDArray[np.uint8]

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    @property
    def type_name(self) -> str:
        return Q(self.type_id).name

    def permute_rows(self, order: npt.NDArray[np.intp]) -> QuantMatrix:
        return QuantMatrix(self.type_id, self.shape, np.ascontiguousarray(self.raw[order]))

    def dense_rows(
        self, ids: npt.NDArray[Any], target: type[np.floating[Any]]
    ) -> npt.NDArray[Any]:
        """Rows ``ids`` dequantised (``gguf.quants``), ``[len(ids), cols]`` of ``target``."""
        picked = self.raw[np.asarray(ids, dtype=np.intp)]
        values = quants.dequantize(picked, Q(self.type_id))
        return np.ascontiguousarray(values.reshape(len(picked), self.shape[1]), dtype=target)

    def dense(self, target: type[np.floating[Any]]) -> npt.NDArray[Any]:
        return self.dense_rows(np.arange(self.rows), target)

    @staticmethod
    def stack(parts: list[QuantMatrix]) -> QuantMatrix:
        """Rows of ``parts`` one after another (all of one type and width)."""
        assert len({(p.type_id, p.shape[1]) for p in parts}) == 1
        rows = sum(p.rows for p in parts)
        raw = np.concatenate([p.raw for p in parts])
        return QuantMatrix(parts[0].type_id, (rows, parts[0].shape[1]), raw)


def quant_matrix(
    raw: npt.NDArray[np.uint8], type_id: int, shape: tuple[int, ...]
) -> QuantMatrix | None:
    """The file's blocks of a 2-D tensor of a :data:`BLOCK_TYPES` type (a copy of ``raw``,
    so the read buffer can go); ``None`` for any other tensor."""
    if type_id not in BLOCK_TYPES or len(shape) != 2:
        return None
    block, size = GGML_QUANT_SIZES[Q(type_id)]
    rows, cols = shape
    if cols % block or raw.size != rows * cols // block * size:
        return None
    return QuantMatrix(type_id, (rows, cols), raw.reshape(rows, cols // block * size).copy())


def _f16(blocks: npt.NDArray[np.uint8], at: int) -> npt.NDArray[np.float16]:
    return blocks[..., at : at + 2].copy().view(np.float16)[..., 0]


def _k_scale_min(
    scales: npt.NDArray[np.uint8],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Q4_K/Q5_K's eight 6-bit scales and mins from their 12 packed bytes (last axis)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return np.ascontiguousarray(sc), np.ascontiguousarray(mins)


def _q3_k_scales(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """Q3_K's sixteen 6-bit scales (0..63, stored ``scale + 32``) from their 12 packed
    bytes (last axis): scale ``k``'s low 4 bits are nibble ``k // 8`` of byte ``k % 8``,
    its high 2 bits bits ``2 (k // 4)`` of byte ``8 + k % 4``."""
    low = np.concatenate([packed[..., 0:8] & 0x0F, packed[..., 0:8] >> 4], axis=-1)
    high = np.concatenate([(packed[..., 8:12] >> shift) & 3 for shift in (0, 2, 4, 6)],
                          axis=-1)
    return np.ascontiguousarray(low | (high << 4))


def _q3_k_pack(scales: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """The 12 packed bytes of Q3_K's sixteen 6-bit scales (last axis): the inverse of
    :func:`_q3_k_scales`."""
    low = (scales[..., 0:8] & 0x0F) | ((scales[..., 8:16] & 0x0F) << 4)
    high = scales >> 4
    packed = high[..., 0:4] | (high[..., 4:8] << 2) | (high[..., 8:12] << 4) | (
        high[..., 12:16] << 6)
    return np.concatenate([low, packed], axis=-1).astype(np.uint8)


def block_fields(matrix: QuantMatrix) -> dict[str, npt.NDArray[Any]]:
    """The arrays a block kernel reads, each ``[rows, blocks, ...]`` and C-contiguous.

    Bytes are the file's, cut apart. F16/BF16: ``w``, the values (BF16 as ``uint16``
    bits). Q4_0/Q4_1/Q8_0: ``d``/``m`` f16 scales and ``qs``
    codes. Q5_0/Q5_1: ``d``/``m`` and ``codes``, the block's 4 bytes of fifth bits then
    its 16 bytes of nibbles, as in the file (one array, so a product reads the codes and
    ``d`` only). K-quants: ``codes`` (the block's packed codes as in the file) and ``scales``
    (the f16 super-block scales as bytes, then the sub-block scales: Q4_K/Q5_K's eight
    6-bit scales and eight mins unpacked to one byte each, 16 bytes instead of 12 per
    256 weights; Q6_K's sixteen int8; Q2_K's sixteen bytes of packed 4-bit scales and
    mins as they are; Q3_K's sixteen 6-bit scales unpacked to int8 ``scale - 32``, 16
    bytes instead of 12), two arrays so that a kernel reads two buffers
    (tinygrad would not fuse a widened matrix of four into a matrix product).
    :mod:`swactor.model.block_kernels` documents what each type computes.
    """
    qtype = Q(matrix.type_id)
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = matrix.shape
    b = matrix.raw.reshape(rows, cols // block, size)
    if qtype == Q.Q8_0:
        return {"d": _f16(b, 0), "qs": b[..., 2:].copy().view(np.int8)}
    if qtype == Q.Q4_0:
        return {"d": _f16(b, 0), "qs": b[..., 2:].copy()}
    if qtype == Q.Q4_1:
        return {"d": _f16(b, 0), "m": _f16(b, 2), "qs": b[..., 4:].copy()}
    if qtype == Q.Q5_0:
        return {"d": _f16(b, 0), "codes": b[..., 2:].copy()}  # qh (4 bytes) then qs (16)
    if qtype == Q.Q5_1:
        return {"d": _f16(b, 0), "m": _f16(b, 2), "codes": b[..., 4:].copy()}
    if qtype in (Q.F16, Q.BF16):
        return {"w": b.copy().view(np.float16 if qtype == Q.F16 else np.uint16)[..., 0]}
    if qtype == Q.Q2_K:
        # d, dmin (f16 bytes), then the 16 bytes of 4-bit scale (low) and min (high)
        return {"scales": np.ascontiguousarray(np.concatenate([b[..., 80:84], b[..., 0:16]],
                                                              axis=-1)),
                "codes": b[..., 16:80].copy()}  # qs (64 bytes)
    if qtype == Q.Q3_K:
        scales = (_q3_k_scales(b[..., 96:108]) - 32).astype(np.int8).view(np.uint8)
        return {"scales": np.ascontiguousarray(np.concatenate([b[..., 108:110], scales],
                                                              axis=-1)),  # d (f16), 16 int8
                "codes": b[..., 0:96].copy()}  # hmask (32 bytes) then qs (64)
    if qtype in (Q.Q4_K, Q.Q5_K):
        sc, mins = _k_scale_min(b[..., 4:16])
        # d, dmin (f16 bytes), 8 scales, 8 mins: one array, so a kernel reads two buffers
        scales = np.concatenate([b[..., 0:4], sc, mins], axis=-1)
        return {"scales": np.ascontiguousarray(scales),
                "codes": b[..., 16:].copy()}  # Q5_K: qh (32 bytes) then qs (128)
    if qtype == Q.Q6_K:
        return {
            "codes": b[..., 0:192].copy(),  # ql (128 bytes) then qh (64)
            "scales": np.ascontiguousarray(np.concatenate([b[..., 208:210], b[..., 192:208]],
                                                          axis=-1)),  # d (f16), 16 int8
        }
    raise ValueError(f"{qtype.name} has no block form")


def _k_pack(sc: npt.NDArray[np.uint8], mins: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """The 12 packed bytes of Q4_K/Q5_K's eight 6-bit scales and mins (last axis)."""
    d = sc[..., 0:4] | ((sc[..., 4:8] & 0x30) << 2)
    m = mins[..., 0:4] | ((mins[..., 4:8] & 0x30) << 2)
    m_d = (sc[..., 4:8] & 0x0F) | ((mins[..., 4:8] & 0x0F) << 4)
    return np.concatenate([d, m, m_d], axis=-1)


def raw_from_fields(type_id: int, fields: dict[str, npt.NDArray[np.generic]]
                    ) -> npt.NDArray[np.uint8]:
    """The file's block bytes, ``uint8 [rows, row_bytes]``, from :func:`block_fields`'s
    arrays (of every row or of chosen rows): its inverse."""
    qtype = Q(type_id)

    def raw(name: str) -> npt.NDArray[np.uint8]:
        array = np.ascontiguousarray(fields[name])
        if array.dtype != np.uint8:  # f16 scales, int8 codes: their bytes
            array = array.view(np.uint8).reshape(*array.shape[:-1], -1)
        return array

    if qtype in (Q.F16, Q.BF16):
        parts = [raw("w").reshape(*fields["w"].shape, 2)]
    elif qtype == Q.Q2_K:
        scales = raw("scales")
        parts = [scales[..., 4:20], raw("codes"), scales[..., 0:4]]
    elif qtype == Q.Q3_K:
        scales = raw("scales")
        six_bit = (scales[..., 2:18].view(np.int8).astype(np.int16) + 32).astype(np.uint8)
        parts = [raw("codes"), _q3_k_pack(six_bit), scales[..., 0:2]]
    elif qtype in (Q.Q8_0, Q.Q4_0):
        parts = [raw("d").reshape(*fields["d"].shape, 2), raw("qs")]
    elif qtype == Q.Q4_1:
        parts = [raw("d").reshape(*fields["d"].shape, 2), raw("m").reshape(
            *fields["m"].shape, 2), raw("qs")]
    elif qtype == Q.Q5_0:
        parts = [raw("d").reshape(*fields["d"].shape, 2), raw("codes")]
    elif qtype == Q.Q5_1:
        parts = [raw("d").reshape(*fields["d"].shape, 2), raw("m").reshape(
            *fields["m"].shape, 2), raw("codes")]
    elif qtype in (Q.Q4_K, Q.Q5_K):
        scales = raw("scales")
        parts = [scales[..., 0:4], _k_pack(scales[..., 4:12], scales[..., 12:20]),
                 raw("codes")]
    elif qtype == Q.Q6_K:
        scales = raw("scales")
        parts = [raw("codes"), scales[..., 2:18], scales[..., 0:2]]
    else:
        raise ValueError(f"{qtype.name} has no block form")
    blocks = np.concatenate(parts, axis=-1)
    return np.ascontiguousarray(blocks.reshape(blocks.shape[0], -1))


# bytes per block of the arrays block_fields makes (Q3_K/Q4_K/Q5_K: 12 packed scale
# bytes become 16, one per 6-bit scale or min)
_HELD_BLOCK_BYTES = {Q.F16: 2, Q.BF16: 2, Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24,
                     Q.Q8_0: 34, Q.Q2_K: 84, Q.Q3_K: 114, Q.Q4_K: 148, Q.Q5_K: 180,
                     Q.Q6_K: 210}


def block_bytes(type_id: int, shape: tuple[int, ...]) -> int:
    """Bytes :func:`block_fields` holds for a ``shape`` tensor of block type ``type_id``."""
    qtype = Q(type_id)
    block, _ = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * _HELD_BLOCK_BYTES[qtype]
