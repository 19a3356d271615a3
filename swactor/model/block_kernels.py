"""Matrices computed from the GGUF file's own blocks in tinygrad (``--weights blocks``).

Theory of operation. A :class:`~swactor.model.dequant.QuantMatrix` (the file's bytes of
one 2-D tensor) goes to the device as the arrays :func:`~swactor.model.dequant.block_fields`
cuts from its blocks (:class:`DeviceQuant`): the packed codes as they are in the file and
the block scales (K-quants: two arrays, codes and scales, the f16 scales kept as bytes
and widened in the kernel). Nothing dense is kept. :func:`scaled_codes` is a lazy
tinygrad expression of the weights as ``w0 + offset`` and :func:`dequant_expr` their sum,
the dense ``float32 [rows, cols]`` matrix; neither is realised on its own: a decode
matrix-vector product consumes the sum, a prefill matrix product
(:func:`block_matmul`) the two terms apart, and each kernel reads the codes and widens
them in registers. (tinygrad materialised the whole widened matrix when a prefill
product's widening read four or more buffers, or the sum of both terms.)

What each type computes (float32 results bit-identical to ``gguf.quants.dequantize``):

* ``Q8_0`` (32 weights per block): ``w = q * d``, ``q`` int8.
* ``Q4_0`` / ``Q4_1``: 16 bytes hold 32 codes, weight ``j`` in the low nibble of byte
  ``j``, weight ``j + 16`` in its high nibble; ``w = d * (q - 8)`` / ``w = d * q + m``.
* ``Q5_0`` / ``Q5_1``: the Q4_0/Q4_1 nibbles plus a fifth bit: bit ``j`` of the block's
  little-endian 32-bit ``qh`` (bit ``j % 8`` of byte ``j // 8``) is the high bit of
  weight ``j`` (``q + 16 * bit``); ``w = d * (q - 16)`` / ``w = d * q + m``.
* ``Q4_K`` (256 weights per super-block, 8 sub-blocks of 32): ``qs`` is 4 chunks of 32
  bytes; chunk ``c`` holds sub-block ``2c`` in its low nibbles and ``2c + 1`` in its high
  nibbles; ``w = d * (sc * q) - dmin * mn`` per sub-block (gguf-py computes
  ``(d * sc) * q``: both partial products are exact in float32, so the one rounding is
  the same).
* ``Q5_K``: as Q4_K plus a fifth bit: bit ``i`` of ``qh[j]`` is the high bit of weight
  ``j`` of sub-block ``i`` (``q + 16 * bit``).
* ``Q6_K`` (16 sub-blocks of 16, int8 scales): ``ql`` is 2 halves of 64 bytes, ``qh`` 2
  halves of 32; in half ``h`` weight ``64 s + p`` takes nibble ``s`` of ``ql[h][p]`` and
  bits ``2t..2t+1`` of ``qh[h][p % 32]`` with ``t = 2 s + p // 32``; ``w = d * (sc *
  (q - 32))``.

* ``Q2_K`` (16 sub-blocks of 16, 4-bit scales and mins packed in one byte each): ``qs``
  is 2 halves of 32 bytes; in half ``h`` weight ``32 j + p`` is bits ``2j..2j+1`` of
  ``qs[h][p]``; ``w = d * (sc * q) - dmin * mn`` per sub-block.
* ``Q3_K`` (16 sub-blocks of 16, 6-bit scales unpacked at load to int8 ``sc - 32``): the
  low two bits as Q2_K's, the third from ``hmask`` (bit ``i`` of ``hmask[p]`` for weight
  ``32 i + p``); ``w = d * (sc * (q - 4))`` with ``q`` the three bits.
* ``F16`` / ``BF16``: blocks of one weight, widened (BF16: its bits shifted 16 up).

f16 scales widen to f32 with integer bit moves (exact for every finite f16; on CPU
clang renders ``__fp16`` conversions as scalar code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as Q
from tinygrad.device import Buffer, Device
from tinygrad.dtype import _from_np_dtype, dtypes
from tinygrad.tensor import Tensor

from swactor.model import prefill_gemm
from swactor.model.dequant import QuantMatrix, block_fields


def widen_f16(tensor: Tensor, cpu: bool) -> Tensor:
    """``tensor`` (float16) as float32; on CPU through integer bit moves."""
    if not cpu:
        return tensor.float()
    bits = tensor.bitcast(dtypes.uint16).cast(dtypes.uint32)
    moved = ((bits & 0x8000) << 16) | ((bits & 0x7FFF) << 13)
    # exact for every finite f16, subnormals included (no flush-to-zero on CPU)
    return moved.bitcast(dtypes.float32) * 2.0**112


@dataclass
class DeviceQuant:
    """One matrix's block arrays on the device (see the module docstring)."""

    type_id: int
    shape: tuple[int, int]
    fields: dict[str, Tensor]

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.fields.values())

    @property
    def type_name(self) -> str:
        return Q(self.type_id).name

    @property
    def device(self) -> str:
        return str(next(iter(self.fields.values())).device)

    def row_slice(self, start: int, count: int) -> DeviceQuant:
        fields = {k: v[start : start + count] for k, v in self.fields.items()}
        return DeviceQuant(self.type_id, (count, self.shape[1]), fields)


def upload(array: npt.NDArray[np.generic], device: str) -> Tensor:
    """A realised tensor on ``device`` holding ``array``'s values.

    The buffer is allocated and the bytes copied in through the device's allocator, as
    the worker's bridge copies ring objects: no schedule. ``Tensor(array).realize()``
    would plan and run a copy kernel per tensor (~10 ms of Python each on a small CPU,
    hundreds of tensors per stage). The tensor is the same kind of buffer tensor either
    way. Host-to-device copies return with the source no longer needed
    (tinygrad stages host memory itself on GPUs); the caller synchronises once at the end
    of a load (:func:`synchronize`).
    """
    array = np.require(array, requirements=("C", "W"))  # tinygrad's copy wants writable memory
    if array.size == 0 or array.ndim == 0:
        return Tensor(array, device=device).realize()
    tensor = Tensor.empty(*array.shape, dtype=_from_np_dtype(array.dtype), device=device)
    buffer = tensor.uop.buffer
    assert isinstance(buffer, Buffer)
    buffer.ensure_allocated()
    Device[device].allocator._copyin(buffer._buf, array.reshape(-1).view(np.uint8).data)
    return tensor


def synchronize(device: str) -> None:
    """Wait until every copy :func:`upload` queued on ``device`` is done."""
    Device[device].synchronize()  # type: ignore[no-untyped-call]


def to_device(matrix: QuantMatrix, device: str) -> DeviceQuant:
    """Move ``matrix``'s block arrays to ``device`` (:func:`upload`; host copies are
    dropped)."""
    fields = {name: upload(array, device) for name, array in block_fields(matrix).items()}
    return DeviceQuant(matrix.type_id, matrix.shape, fields)


def _f16_at(raw: Tensor, at: int) -> Tensor:
    """The f16 stored little-endian in bytes ``at``, ``at + 1`` of ``raw``'s last axis, as
    float32 (integer bit moves: exact for every finite f16)."""
    bits = raw[..., at].cast(dtypes.uint32) | (raw[..., at + 1].cast(dtypes.uint32) << 8)
    moved = ((bits & 0x8000) << 16) | ((bits & 0x7FFF) << 13)
    return moved.bitcast(dtypes.float32) * 2.0**112


def _ramp(count: int, step: int, device: str) -> Tensor:
    """``uint8 [0, step, 2 step, ...]`` (``count`` values): per-slice shift amounts."""
    return (Tensor.arange(count, dtype=dtypes.uint8) * step).to(device)


def _nibbles(packed: Tensor, axis: int) -> Tensor:
    """Low then high nibbles of ``packed`` (uint8), stacked as a new axis ``axis``."""
    return Tensor.stack(packed & 15, packed >> 4, dim=axis)


def scaled_codes(matrix: DeviceQuant, cpu: bool) -> tuple[Tensor, Tensor | None, int]:
    """``(w0, offset, group)``: the weights are ``w0 + offset`` with ``w0`` a lazy
    ``float32 [rows, cols]`` expression and ``offset`` (None when every offset is 0) a
    ``float32 [rows, cols / group]`` one, each offset shared by ``group`` weights.

    A product consumes the two apart (``x @ w0.T + sums(x) @ offset.T``): tinygrad fused
    either into a matrix product, but materialised their sum as a dense matrix.
    """
    f = matrix.fields
    rows, cols = matrix.shape
    qtype = Q(matrix.type_id)
    offset: Tensor | None = None
    if qtype == Q.F16:
        w = widen_f16(f["w"], cpu)
    elif qtype == Q.BF16:
        w = (f["w"].cast(dtypes.uint32) << 16).bitcast(dtypes.float32)
    elif qtype == Q.Q8_0:
        w = f["qs"].float() * widen_f16(f["d"], cpu).unsqueeze(-1)
    elif qtype in (Q.Q4_0, Q.Q4_1):
        d = widen_f16(f["d"], cpu)
        q = _nibbles(f["qs"], -2).reshape(rows, -1, 32).float()
        if qtype == Q.Q4_0:
            w = d.unsqueeze(-1) * (q - 8.0)
        else:
            w = d.unsqueeze(-1) * q
            offset = widen_f16(f["m"], cpu)
    elif qtype in (Q.Q5_0, Q.Q5_1):
        codes = f["codes"]
        low = _nibbles(codes[..., 4:], -2).reshape(rows, -1, 32)
        # bit j of the little-endian qh is the fifth bit of weight j
        qh = codes[..., :4].reshape(rows, -1, 4, 1)
        high = ((qh >> _ramp(8, 1, matrix.device)) & 1).reshape(rows, -1, 32)
        q = (low + (high << 4)).float()
        d = widen_f16(f["d"], cpu).unsqueeze(-1)
        if qtype == Q.Q5_0:
            w = d * (q - 16.0)
        else:
            w = d * q
            offset = widen_f16(f["m"], cpu)
    elif qtype == Q.Q2_K:
        codes, scales = f["codes"], f["scales"]
        qs = codes.reshape(rows, -1, 2, 1, 32)
        q = ((qs >> _ramp(4, 2, matrix.device).reshape(4, 1)) & 3).reshape(rows, -1, 16, 16)
        packed = scales[..., 4:20]
        # d * (sc * q): exact products, the one rounding gguf-py's (d * sc) * q has
        w = _f16_at(scales, 0).reshape(rows, -1, 1, 1) * (
            (packed & 15).float().unsqueeze(-1) * q.float())
        offset = -(_f16_at(scales, 2).unsqueeze(-1) * (packed >> 4).float())
    elif qtype == Q.Q3_K:
        codes, scales = f["codes"], f["scales"]
        qs = codes[..., 32:].reshape(rows, -1, 2, 1, 32)
        low = ((qs >> _ramp(4, 2, matrix.device).reshape(4, 1)) & 3).reshape(rows, -1, 8, 32)
        # bit i of hmask[p] is the third bit of weight 32 i + p (set: no -4 offset)
        hmask = codes[..., :32].reshape(rows, -1, 1, 32)
        high = (hmask >> _ramp(8, 1, matrix.device).reshape(8, 1)) & 1
        values = (low + (high << 2)).reshape(rows, -1, 16, 16).float() - 4.0
        sc = scales[..., 2:18].bitcast(dtypes.int8).float()
        w = _f16_at(scales, 0).reshape(rows, -1, 1, 1) * (sc.unsqueeze(-1) * values)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        codes, scales = f["codes"], f["scales"]
        qs = codes[..., -128:].reshape(rows, -1, 4, 32)
        q = _nibbles(qs, -2).reshape(rows, -1, 8, 32)
        if qtype == Q.Q5_K:
            # bit i of qh[j] is the fifth bit of weight j of sub-block i
            qh = codes[..., :32].reshape(rows, -1, 1, 32)
            high = (qh >> _ramp(8, 1, matrix.device).reshape(8, 1)) & 1
            q = q + (high << 4)
        d = _f16_at(scales, 0)
        # d * (sc * q): sc * q and d * sc are exact in float32, so this is the same
        # single rounding as gguf-py's (d * sc) * q
        w = d.reshape(rows, -1, 1, 1) * (scales[..., 4:12].float().unsqueeze(-1) * q.float())
        offset = -(_f16_at(scales, 2).unsqueeze(-1) * scales[..., 12:20].float())
    elif qtype == Q.Q6_K:
        codes, scales = f["codes"], f["scales"]
        ql = _nibbles(codes[..., :128].reshape(rows, -1, 2, 64), -2).reshape(rows, -1, 8, 32)
        qh = codes[..., 128:].reshape(rows, -1, 2, 1, 32)
        high = (qh >> _ramp(4, 2, matrix.device).reshape(4, 1)) & 3
        q = ql + (high.reshape(rows, -1, 8, 32) << 4)
        values = q.reshape(rows, -1, 16, 16).float() - 32.0
        sc = scales[..., 2:18].bitcast(dtypes.int8).float()
        w = _f16_at(scales, 0).reshape(rows, -1, 1, 1) * (sc.unsqueeze(-1) * values)
    else:
        raise ValueError(f"{qtype.name} has no block kernel")
    w = w.reshape(rows, cols)
    if offset is None:
        return w, None, cols
    offset = offset.reshape(rows, -1)
    return w, offset, cols // int(offset.shape[1])


def dequant_expr(matrix: DeviceQuant, cpu: bool) -> Tensor:
    """The dense ``float32 [rows, cols]`` weights of ``matrix`` as a lazy expression."""
    w, offset, group = scaled_codes(matrix, cpu)
    if offset is None:
        return w
    rows, cols = matrix.shape
    return (w.reshape(rows, -1, group) + offset.unsqueeze(-1)).reshape(rows, cols)


def block_matmul(x: Tensor, matrix: DeviceQuant, cpu: bool) -> Tensor:
    """``x @ W.T`` for ``x`` ``float32 [tokens, cols]`` (prefill): ``x @ w0.T`` plus each
    row's sums over offset groups times the offsets (:func:`scaled_codes`), each one
    kernel that widens the codes in registers; no dense matrix is materialised.

    On a CPU device (:func:`~swactor.model.prefill_gemm.usable`) the weights are widened
    once into transient panels and multiplied by a tiled C kernel instead
    (:mod:`swactor.model.prefill_gemm`): 4-5x faster for a prompt's rows; Q4_1 and Q8_0
    panels are widened inside that kernel (:func:`~swactor.model.prefill_gemm.block_matmul`)."""
    if cpu and prefill_gemm.usable(matrix.device, int(x.shape[0]), matrix.rows):
        if prefill_gemm.widens_blocks(matrix.type_id, matrix.shape[1]):
            return prefill_gemm.block_matmul(x, matrix.type_id, matrix.shape, matrix.fields)
        return prefill_gemm.panel_matmul(x, dequant_expr(matrix, cpu))
    w0, offset, group = scaled_codes(matrix, cpu)
    out = x.matmul(w0.T)
    if offset is None:
        return out
    tokens = int(x.shape[0])
    return out + x.reshape(tokens, -1, group).sum(-1).matmul(offset.T)
